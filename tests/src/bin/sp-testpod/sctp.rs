//! `sctp-serve` and `sctp-hit`: the first half of SCTP associations over raw IP sockets (see
//! `splitproxy_e2e::sctp` for why raw sockets, and for the packets).

use std::io::{ErrorKind, Read};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use rand::Rng;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use splitproxy_e2e::sctp::{Chunk, Datagram, IPPROTO_SCTP, Packet, refuses};

use super::Pace;

/// A raw IPv4 socket receiving every SCTP packet for this namespace, and sending SCTP packets
/// whose IP header the kernel writes.
fn raw_socket() -> Result<Socket> {
    Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(IPPROTO_SCTP)))
        .context("cannot open a raw SCTP socket (needs root or CAP_NET_RAW)")
}

/// Sends `packet` to `to`.
fn send(socket: &Socket, to: Ipv4Addr, packet: &Packet) -> Result<()> {
    // A raw socket ignores the port; the SCTP header carries it.
    let address = SockAddr::from(SocketAddrV4::new(to, 0));
    socket
        .send_to(&packet.encode(), &address)
        .with_context(|| format!("cannot send to {to}"))?;
    Ok(())
}

/// How long one read waits before the client looks at the other socket.
const POLL: Duration = Duration::from_millis(20);

/// A raw IPv4 socket receiving every ICMP message for this namespace, for refusals.
fn icmp_socket() -> Result<Socket> {
    let socket = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))
        .context("cannot open a raw ICMP socket (needs root or CAP_NET_RAW)")?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// Answers every INIT to `port` with an INIT-ACK whose state cookie is `name`, forever; with
/// `with_client`, `name` and the client address it saw (`pod-a 10.244.2.10`), as the HTTP
/// server answers `/source`.
pub fn serve(name: &str, port: u16, with_client: bool) -> Result<()> {
    let mut socket = raw_socket()?;
    println!("sp-testpod {name} answering SCTP INITs to port {port}");
    let mut buf = [0_u8; 2048];
    let mut rng = rand::rng();
    loop {
        let n = match socket.read(&mut buf) {
            Ok(n) => n,
            Err(e) => {
                eprintln!("sp-testpod: receive failed: {e}");
                continue;
            }
        };
        let Some(datagram) = Datagram::decode(&buf[..n]) else {
            continue;
        };
        let init = datagram.packet;
        let Chunk::Init { initiate_tag } = init.chunk else {
            continue;
        };
        if init.destination_port != port {
            continue;
        }
        println!("{}:{} INIT", datagram.source, init.source_port);
        let ack = Packet {
            source_port: port,
            destination_port: init.source_port,
            verification_tag: initiate_tag,
            chunk: Chunk::InitAck {
                initiate_tag: rng.random_range(1..=u32::MAX),
                cookie: if with_client {
                    format!("{name} {}", datagram.source).into_bytes()
                } else {
                    name.as_bytes().to_vec()
                },
            },
        };
        if let Err(e) = send(&socket, datagram.source, &ack) {
            eprintln!("sp-testpod: {e:#}");
        }
    }
}

/// Sends `count` INITs to `address`, each from a fresh source port and tag (a new association,
/// so a proxy balances every one), and prints who answered.
pub fn hit(address: SocketAddrV4, count: u32, pace: &Pace) -> Result<()> {
    let mut socket = raw_socket()?;
    let mut icmp = icmp_socket()?;
    super::hit(count, pace, |timeout| {
        associate(&mut socket, &mut icmp, address, timeout)
    });
    Ok(())
}

/// One INIT to `address`; returns the name in the INIT-ACK's cookie. An answer from any other
/// address or port than `address` (a reply the proxy did not translate back) is an error, and so
/// is an ICMP port unreachable about the INIT (a refusal, as a TCP client's RST).
fn associate(
    socket: &mut Socket,
    icmp: &mut Socket,
    address: SocketAddrV4,
    timeout: Duration,
) -> Result<String> {
    let mut rng = rand::rng();
    let source_port = rng.random_range(32_768..61_000);
    let tag = rng.random_range(1..=u32::MAX);
    let init = Packet {
        source_port,
        destination_port: address.port(),
        verification_tag: 0,
        chunk: Chunk::Init { initiate_tag: tag },
    };
    send(socket, *address.ip(), &init)?;
    let deadline = Instant::now() + timeout;
    let mut buf = [0_u8; 2048];
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        ensure!(
            !remaining.is_zero(),
            "no INIT-ACK from {address}: timed out after {timeout:?}"
        );
        while let Ok(n) = icmp.read(&mut buf) {
            ensure!(
                !refuses(&buf[..n], source_port, address),
                "connection refused: ICMP port unreachable for the INIT to {address}"
            );
        }
        socket.set_read_timeout(Some(remaining.min(POLL)))?;
        let n = match socket.read(&mut buf) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) => return Err(e).with_context(|| format!("receive from {address}")),
        };
        // The socket sees every SCTP packet of the namespace; only the answer to this INIT counts.
        let Some(answer) = Datagram::decode(&buf[..n]) else {
            continue;
        };
        let packet = answer.packet;
        if packet.destination_port != source_port || packet.verification_tag != tag {
            continue;
        }
        let Chunk::InitAck { cookie, .. } = packet.chunk else {
            bail!(
                "{address} answered with {:?}, not an INIT-ACK",
                packet.chunk
            );
        };
        let from = SocketAddrV4::new(answer.source, packet.source_port);
        ensure!(
            from == address,
            "the INIT-ACK came from {from}, not {address}"
        );
        return Ok(String::from_utf8_lossy(&cookie).into_owned());
    }
}
