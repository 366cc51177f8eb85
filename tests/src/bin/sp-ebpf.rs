//! `sp-ebpf`: the ebpf mode's smoke test, for a kernel the development machine does not run
//! (the qemu VM's): loads and attaches the programs to a cgroup this process is in, syncs three
//! Services and connects through them with real sockets on 127.0.0.1, over IPv4 and IPv6.
//!
//! ```text
//! sp-ebpf --cgroup /sys/fs/cgroup/node --bpf-root /sys/fs/bpf
//! ```
//!
//! Prints one `ok: …` line per check; exits 1 at the first that fails, saying why (a program the
//! kernel refused names the verifier's last line).

use anyhow::{Context, Result, ensure};
use clap::Parser;
use splitproxy_dataplane::ServicePort;
use splitproxy_dataplane::ebpf::{Config, EbpfBackend};
use splitproxy_dataplane::{Dataplane, Endpoint, Protocol, ProxyState, Service, ServiceKey};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The smoke test's flags.
#[derive(Parser)]
struct Flags {
    /// The cgroup v2 folder to attach to; this process must be in it.
    #[arg(long)]
    cgroup: PathBuf,
    /// The BPF filesystem for the pins.
    #[arg(long)]
    bpf_root: PathBuf,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(smoke(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sp-ebpf: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn smoke(flags: Flags) -> Result<()> {
    let tcp = TcpListener::bind("127.0.0.1:0")?;
    let tcp_endpoint = tcp.local_addr()?;
    std::thread::spawn(move || {
        for stream in tcp.incoming().flatten() {
            let mut stream = stream;
            let _ = stream.write_all(b"tcp-endpoint");
        }
    });
    let udp = UdpSocket::bind("127.0.0.1:0")?;
    let udp_endpoint = udp.local_addr()?;
    std::thread::spawn(move || {
        let mut buffer = [0; 64];
        while let Ok((_, from)) = udp.recv_from(&mut buffer) {
            let _ = udp.send_to(b"udp-endpoint", from);
        }
    });
    let state: ProxyState = [
        service("web", "10.96.0.10", Protocol::Tcp, &[tcp_endpoint]),
        service("dns", "10.96.0.53", Protocol::Udp, &[udp_endpoint]),
        service("empty", "10.96.0.20", Protocol::Tcp, &[]),
    ]
    .into_iter()
    .collect();
    let mut backend = EbpfBackend::new(Config {
        bpf_root: flags.bpf_root,
        cgroup: flags.cgroup,
        node_port_addresses: None,
        devices: Some(Vec::new()),
        masquerade_mark: 0x4000,
    });
    let report = backend.sync(&state).await.context("the first sync")?;
    println!("ok: programs attached, {:?} entries", report.rules_total());

    // IPv4, then the IPv6 programs: a dual-stack socket aimed at the mapped address.
    for (what, service) in [
        ("TCP", "10.96.0.10:80"),
        ("TCP over IPv6", "[::ffff:10.96.0.10]:80"),
    ] {
        let service: SocketAddr = service.parse()?;
        let peer = expect_tcp_endpoint(service).with_context(|| format!("{what} to {service}"))?;
        println!("ok: {what} to {service} reached {tcp_endpoint}, peer read as {peer}");
    }

    let dns: SocketAddr = "10.96.0.53:80".parse()?;
    let client = UdpSocket::bind("0.0.0.0:0")?;
    client.set_read_timeout(Some(Duration::from_secs(10)))?;
    client.send_to(b"q", dns)?;
    let mut buffer = [0; 64];
    let (length, from) = client.recv_from(&mut buffer).context("the UDP answer")?;
    ensure!(
        &buffer[..length] == b"udp-endpoint" && from == dns,
        "UDP: answered from {from}"
    );
    println!("ok: UDP to {dns} answered from {from}");

    let refused = TcpStream::connect("10.96.0.20:80").map(drop);
    ensure!(
        refused
            .as_ref()
            .is_err_and(|err| err.kind() == ErrorKind::ConnectionRefused),
        "a Service without endpoints: {refused:?}"
    );
    println!("ok: a Service without endpoints refused");
    Ok(())
}

/// Connects to `service`, expects the TCP endpoint's answer and the Service as the socket's
/// peer; returns the peer.
fn expect_tcp_endpoint(service: SocketAddr) -> Result<SocketAddr> {
    let mut stream = TcpStream::connect(service)?;
    let peer = stream.peer_addr()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    ensure!(
        answer == "tcp-endpoint" && peer == service,
        "{answer:?} from peer {peer}"
    );
    Ok(peer)
}

fn service(name: &str, cluster_ip: &str, protocol: Protocol, endpoints: &[SocketAddr]) -> Service {
    let endpoints = endpoints
        .iter()
        .map(|address| Endpoint::ready(*address))
        .collect();
    Service::new(
        ServiceKey::new("smoke", name),
        vec![cluster_ip.parse().expect("an IP address")],
        vec![ServicePort::new("p", protocol, 80, None, endpoints)],
    )
}
