use super::*;
use crate::{b1::serve_manifests, cluster::Shape};
use std::net::SocketAddr;
use tokio::{
    net::{TcpListener, TcpStream},
    task::JoinSet,
};

/// A loopback port forwarding each connection to the current backend; cutting drops every
/// forwarded connection at once, as a controller's death does.
#[derive(Clone)]
struct Forwarder {
    backend: Arc<Mutex<SocketAddr>>,
    connections: Arc<Mutex<JoinSet<()>>>,
}

impl Forwarder {
    async fn start(backend: SocketAddr) -> (Self, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("bound"));
        let forwarder = Self {
            backend: Arc::new(Mutex::new(backend)),
            connections: Arc::default(),
        };
        let accepting = forwarder.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let backend = *accepting.backend.lock().expect("lock");
                accepting
                    .connections
                    .lock()
                    .expect("lock")
                    .spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(backend).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
            }
        });
        (forwarder, url)
    }

    /// Sends new connections to `backend` and drops the open ones.
    fn switch_to(&self, backend: SocketAddr) {
        *self.backend.lock().expect("lock") = backend;
        self.connections.lock().expect("lock").abort_all();
    }
}

/// Starts a controller serving `dir`; returns its address.
async fn controller(dir: &std::path::Path) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("bound");
    tokio::spawn(serve_manifests(
        listener,
        dir.to_owned(),
        Default::default(),
    ));
    address
}

/// Waits up to a minute for `done` to hold of `record`.
async fn until(record: &Recorder, what: &str, done: impl Fn(&Record) -> bool) -> Record {
    for _ in 0..600 {
        let now = record.lock().expect("lock").clone();
        if done(&now) {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: not within a minute");
}

#[tokio::test]
async fn a_thin_client_is_served_as_an_agent_and_resumes_on_another_controller_without_a_reset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shape = Shape {
        services: 4,
        endpoints: 8,
        nodes: 2,
        zones: 0,
    };
    shape.write(dir.path()).expect("manifests");
    let (forwarder, url) = Forwarder::start(controller(dir.path()).await).await;
    let shared = Arc::new(Shared {
        keys: Keys::default(),
        changes: Changes::default(),
        services: shape.services,
        started: std::time::Instant::now(),
        urls: vec![url],
        periods: SyncPeriods::default(),
        sync_time: Duration::from_millis(10),
    });
    let record = Recorder::default();
    let client = tokio::spawn(run("node-0".into(), shared.clone(), record.clone()));
    let synced = until(&record, "first full sync", |r| r.full_sync.is_some()).await;
    assert_eq!(synced.resets, 1, "the first revision is a reset");

    // One endpoint of svc-2 stops being ready: the client sees that change, not before.
    let first = shape.endpoint_range(2).start;
    shared.changes.push(Change {
        key: shared.keys.id(&pb::ObjectKey {
            namespace: crate::cluster::NAMESPACE.into(),
            name: Shape::service_name(2),
        }),
        ip: Shape::endpoint_ip(first).to_string(),
        written: std::time::Instant::now(),
    });
    shape.rewrite(dir.path(), 2, false).expect("rewrite");
    until(&record, "the change", |r| {
        r.latencies.first().is_some_and(Option::is_some)
    })
    .await;

    // Another controller, with another epoch: the client's digests, taken over the bytes it
    // received, match what that controller computes, so it resumes with a delta.
    let before = record.lock().expect("lock").clone();
    forwarder.switch_to(controller(dir.path()).await);
    let resumed = until(&record, "resuming", |r| {
        r.applied_epoch != before.applied_epoch
    })
    .await;
    assert_eq!(resumed.resets, 1, "resumed from digests, without a reset");
    assert_eq!(resumed.upserts, before.upserts, "and nothing sent again");
    client.abort();
}
