use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A listener on loopback, the connections `admission` keeps of it, and its address.
async fn listening(
    admission: Admission,
) -> (
    SocketAddr,
    Pin<Box<dyn Stream<Item = io::Result<Admitted>> + Send>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("bound");
    (address, Box::pin(admission.incoming(listener)))
}

/// Connects to `address`; returns the client's end and the server's admitted end, if kept.
async fn connect(
    address: SocketAddr,
    incoming: &mut Pin<Box<dyn Stream<Item = io::Result<Admitted>> + Send>>,
) -> (TcpStream, Option<Admitted>) {
    let client = TcpStream::connect(address).await.expect("connect");
    let admitted = tokio::time::timeout(Duration::from_millis(300), incoming.next()).await;
    let admitted = admitted.ok().flatten().map(|r| r.expect("accepted"));
    (client, admitted)
}

/// Whether the server closed `client`: a read ends (EOF or reset) within a generous bound.
async fn closed(client: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(30), client.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn a_connection_without_an_authenticated_stream_fails_its_reads_at_its_deadline() {
    let (address, mut incoming) = listening(Admission::new(8, Duration::from_millis(200))).await;
    let (mut client, admitted) = connect(address, &mut incoming).await;
    let mut admitted = admitted.expect("kept");
    client.write_all(b"x").await.expect("write");
    let mut buf = [0u8; 8];
    assert_eq!(
        admitted
            .read(&mut buf)
            .await
            .expect("data before the deadline"),
        1
    );
    let late = tokio::time::timeout(Duration::from_secs(30), admitted.read(&mut buf)).await;
    let err = late
        .expect("the read ends")
        .expect_err("fails at the deadline");
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
}

#[tokio::test]
async fn an_authenticated_connection_outlives_the_deadline() {
    let (address, mut incoming) = listening(Admission::new(8, Duration::from_millis(100))).await;
    let (mut client, admitted) = connect(address, &mut incoming).await;
    let mut admitted = admitted.expect("kept");
    admitted.ticket.authenticated();
    let mut buf = [0u8; 8];
    let waiting = tokio::time::timeout(Duration::from_millis(500), admitted.read(&mut buf)).await;
    assert!(waiting.is_err(), "the read ended: {waiting:?}");
    client.write_all(b"yz").await.expect("write");
    assert_eq!(admitted.read(&mut buf).await.expect("still open"), 2);
}

#[tokio::test]
async fn past_the_replicas_limit_a_connection_is_closed_and_a_freed_slot_takes_the_next() {
    let (address, mut incoming) = listening(Admission::new(2, AUTHENTICATE_WITHIN)).await;
    let (_a, first) = connect(address, &mut incoming).await;
    let (_b, second) = connect(address, &mut incoming).await;
    assert!(first.is_some() && second.is_some());
    let (mut c, third) = connect(address, &mut incoming).await;
    assert!(third.is_none(), "a third connection was kept");
    assert!(closed(&mut c).await, "the third connection is still open");

    drop(first);
    let (_d, fourth) = connect(address, &mut incoming).await;
    assert!(fourth.is_some(), "the freed slot was not taken");
}

#[tokio::test]
async fn one_address_holds_a_bounded_number_of_unauthenticated_connections() {
    let (address, mut incoming) = listening(Admission::new(100, AUTHENTICATE_WITHIN)).await;
    let mut held = Vec::new();
    for _ in 0..MAX_UNAUTHENTICATED_PER_ADDRESS {
        let (client, admitted) = connect(address, &mut incoming).await;
        held.push((client, admitted.expect("within the address's share")));
    }
    let (mut refused, none) = connect(address, &mut incoming).await;
    assert!(
        none.is_none(),
        "one more unauthenticated connection was kept"
    );
    assert!(closed(&mut refused).await);

    // One that authenticates counts no more; one that closes neither.
    held[0].1.ticket.authenticated();
    let (_e, kept) = connect(address, &mut incoming).await;
    assert!(kept.is_some(), "an authenticated connection still counted");
    held.pop();
    let (_f, kept) = connect(address, &mut incoming).await;
    assert!(kept.is_some(), "a closed connection still counted");
}
