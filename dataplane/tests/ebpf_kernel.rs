//! Real-kernel checks of the eBPF mode's socket programs, with real sockets: `BPF_PROG_TEST_RUN`
//! cannot run cgroup socket-address programs, so each test puts its own process in a fresh
//! cgroup, attaches the programs there (never at the machine's cgroup root) and connects.
//!
//! The test thread also moves to a fresh network namespace with only `lo` up: the endpoints
//! listen on 127.0.0.1 and the Service addresses are routed nowhere, so a connection reaches an
//! endpoint only through the programs, and nothing leaves the namespace. Needs root, `ip`, a
//! cgroup v2 hierarchy and a kernel with `CONFIG_CGROUP_BPF`.
#![allow(clippy::unwrap_used)]

use splitproxy_dataplane::ebpf::{Config, EbpfBackend, kernel, layout};
use splitproxy_dataplane::{Dataplane, Endpoint, Protocol, ProxyState, Service, ServiceKey};
use splitproxy_dataplane::{ServicePort, TrafficPolicy};
use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Moving the process to a cgroup moves every thread: one lab at a time per test process.
static ONE_LAB: Mutex<()> = Mutex::new(());

/// A cgroup holding this process, a BPF filesystem for the pins and a network namespace for
/// the test thread; the process goes back to its cgroup and both are removed when dropped.
struct Lab {
    cgroup: PathBuf,
    home_cgroup: PathBuf,
    bpf_root: PathBuf,
    _one: MutexGuard<'static, ()>,
}

impl Lab {
    fn new(test: &str) -> Self {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the eBPF kernel tests need root"
        );
        let one = ONE_LAB
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        run("ip", &["link", "set", "lo", "up"]);
        let (mount, home) = cgroup2_home();
        let cgroup = mount.join(format!("sp-ebpf-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&cgroup).unwrap();
        std::fs::write(cgroup.join("cgroup.procs"), std::process::id().to_string()).unwrap();
        let bpf_root = std::env::temp_dir().join(format!("sp-bpffs-{test}-{}", std::process::id()));
        Self {
            cgroup,
            home_cgroup: mount.join(home.trim_start_matches('/')),
            bpf_root,
            _one: one,
        }
    }

    fn config(&self) -> Config {
        Config {
            bpf_root: self.bpf_root.clone(),
            cgroup: self.cgroup.clone(),
            node_port_addresses: None,
            devices: Some(Vec::new()),
            masquerade_mark: 0x4000,
        }
    }

    /// The folder of the current layout's pins.
    fn pins(&self) -> PathBuf {
        self.bpf_root.join("splitproxy").join(layout::VERSION)
    }

    /// The pinned links of the current layout, by file name.
    fn links(&self) -> BTreeSet<String> {
        let links = self.pins().join("links");
        std::fs::read_dir(links)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let pid = std::process::id().to_string();
        let _ = std::fs::write(self.home_cgroup.join("cgroup.procs"), &pid);
        let _ = kernel::remove_pins(&self.bpf_root);
        let _ = Command::new("umount").arg(&self.bpf_root).status();
        let _ = std::fs::remove_dir(&self.bpf_root);
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

/// The cgroup v2 mount point and this process's cgroup under it.
fn cgroup2_home() -> (PathBuf, String) {
    let mount = kernel::cgroup2_mount()
        .unwrap()
        .expect("a cgroup v2 hierarchy is mounted");
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let home = cgroups
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .expect("this process has a cgroup v2 path")
        .to_owned();
    (mount, home)
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).status().unwrap();
    assert!(status.success(), "{program} {args:?}: {status}");
}

/// A TCP endpoint on 127.0.0.1 that answers each connection with `name` and closes it.
fn tcp_endpoint(name: &'static str) -> SocketAddr {
    tcp_endpoint_at("127.0.0.1:0", name)
}

/// A TCP endpoint on `address` that answers each connection with `name` and closes it.
fn tcp_endpoint_at(address: &str, name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind(address).unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let _ = stream.unwrap().write_all(name.as_bytes());
        }
    });
    address
}

/// A TCP endpoint on 127.0.0.1 that sends back what each connection sends it.
fn tcp_echo_endpoint() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let stream = stream.unwrap();
            std::thread::spawn(move || {
                let mut reader = stream.try_clone().unwrap();
                let mut writer = stream;
                let _ = std::io::copy(&mut reader, &mut writer);
            });
        }
    });
    address
}

/// A UDP endpoint on 127.0.0.1 that answers each datagram with `name`.
fn udp_endpoint(name: &'static str) -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let address = socket.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buffer = [0; 64];
        while let Ok((_, from)) = socket.recv_from(&mut buffer) {
            let _ = socket.send_to(name.as_bytes(), from);
        }
    });
    address
}

fn service(name: &str, cluster_ip: &str, protocol: Protocol, endpoints: &[SocketAddr]) -> Service {
    let endpoints = endpoints
        .iter()
        .map(|address| Endpoint::ready(*address))
        .collect();
    Service::new(
        ServiceKey::new("ns", name),
        vec![cluster_ip.parse().unwrap()],
        vec![ServicePort::new("p", protocol, 80, None, endpoints)],
    )
}

fn state(services: Vec<Service>) -> ProxyState {
    services.into_iter().collect()
}

/// What the endpoint a TCP connection to `address` reached answered, and the peer the socket
/// reports.
fn tcp_answer(address: &str) -> std::io::Result<(String, SocketAddr)> {
    let mut stream = TcpStream::connect(address)?;
    let peer = stream.peer_addr()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok((answer, peer))
}

#[tokio::test(flavor = "current_thread")]
async fn a_connection_to_a_cluster_ip_reaches_its_endpoints_and_reads_as_the_service() {
    let lab = Lab::new("tcp");
    let (a, b) = (tcp_endpoint("a"), tcp_endpoint("b"));
    assert_eq!(
        TcpStream::connect("10.96.0.10:80").unwrap_err().kind(),
        ErrorKind::NetworkUnreachable,
        "without the programs the Service address is routed nowhere"
    );
    let mut backend = EbpfBackend::new(lab.config());
    assert_eq!(backend.mode(), "ebpf");
    let report = backend
        .sync(&state(vec![service(
            "web",
            "10.96.0.10",
            Protocol::Tcp,
            &[a, b],
        )]))
        .await
        .unwrap();
    assert_eq!(report.rules_total(), vec![("services".to_owned(), 3)]);

    let mut answers = BTreeSet::new();
    for _ in 0..64 {
        let (answer, peer) = tcp_answer("10.96.0.10:80").unwrap();
        assert_eq!(
            peer,
            "10.96.0.10:80".parse().unwrap(),
            "getpeername reads as the Service"
        );
        answers.insert(answer);
    }
    assert_eq!(
        answers,
        BTreeSet::from(["a".to_owned(), "b".to_owned()]),
        "both endpoints serve"
    );
    assert_eq!(
        TcpStream::connect("10.96.0.10:81").unwrap_err().kind(),
        ErrorKind::NetworkUnreachable,
        "another port of the address is no Service"
    );

    // One endpoint goes: new connections reach only the other. Only the changed Service's
    // entries are written: its first slot, then its count, then the slot no longer counted.
    let report = backend
        .sync(&state(vec![service(
            "web",
            "10.96.0.10",
            Protocol::Tcp,
            &[b],
        )]))
        .await
        .unwrap();
    assert!(!report.full);
    assert_eq!(report.rules_written(), vec![("services".to_owned(), 3)]);
    assert_eq!(report.rules_total(), vec![("services".to_owned(), 2)]);
    for _ in 0..16 {
        assert_eq!(tcp_answer("10.96.0.10:80").unwrap().0, "b");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn udp_datagrams_to_a_cluster_ip_are_answered_from_the_service_address() {
    let lab = Lab::new("udp");
    let endpoint = udp_endpoint("dns");
    let mut backend = EbpfBackend::new(lab.config());
    backend
        .sync(&state(vec![service(
            "dns",
            "10.96.0.53",
            Protocol::Udp,
            &[endpoint],
        )]))
        .await
        .unwrap();
    let vip: SocketAddr = "10.96.0.53:80".parse().unwrap();
    let timeout = Some(Duration::from_secs(10));

    // Unconnected: sendto() per datagram, recvfrom() names the Service.
    let client = UdpSocket::bind("0.0.0.0:0").unwrap();
    client.set_read_timeout(timeout).unwrap();
    client.send_to(b"q", vip).unwrap();
    let mut buffer = [0; 64];
    let (length, from) = client.recv_from(&mut buffer).unwrap();
    assert_eq!((&buffer[..length], from), (&b"dns"[..], vip));

    // Connected: connect() picks the endpoint once, and the peer reads as the Service.
    let connected = UdpSocket::bind("0.0.0.0:0").unwrap();
    connected.set_read_timeout(timeout).unwrap();
    connected.connect(vip).unwrap();
    assert_eq!(connected.peer_addr().unwrap(), vip);
    connected.send(b"q").unwrap();
    let length = connected.recv(&mut buffer).unwrap();
    assert_eq!(&buffer[..length], b"dns");
}

#[tokio::test(flavor = "current_thread")]
async fn ipv6_cluster_ips_and_an_ipv6_socket_aimed_at_an_ipv4_one_reach_their_endpoints() {
    let lab = Lab::new("ipv6");
    let v6_endpoint = tcp_endpoint_at("[::1]:0", "v6");
    let v4_endpoint = tcp_endpoint("v4");
    let udp = {
        let socket = UdpSocket::bind("[::1]:0").unwrap();
        let address = socket.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buffer = [0; 64];
            while let Ok((_, from)) = socket.recv_from(&mut buffer) {
                let _ = socket.send_to(b"dns6", from);
            }
        });
        address
    };
    assert_eq!(
        TcpStream::connect("[fd00:96::10]:80").unwrap_err().kind(),
        ErrorKind::NetworkUnreachable,
        "without the programs the Service address is routed nowhere"
    );
    let mut backend = EbpfBackend::new(lab.config());
    let report = backend
        .sync(&state(vec![
            service("web6", "fd00:96::10", Protocol::Tcp, &[v6_endpoint]),
            service("web4", "10.96.0.60", Protocol::Tcp, &[v4_endpoint]),
            service("dns6", "fd00:96::53", Protocol::Udp, &[udp]),
        ]))
        .await
        .unwrap();
    assert_eq!(report.rules_total(), vec![("services".to_owned(), 6)]);
    let (answer, peer) = tcp_answer("[fd00:96::10]:80").unwrap();
    assert_eq!(answer, "v6");
    assert_eq!(peer, "[fd00:96::10]:80".parse().unwrap());
    let (answer, peer) = tcp_answer("[::ffff:10.96.0.60]:80").unwrap();
    assert_eq!(answer, "v4", "a dual-stack socket reaches the IPv4 Service");
    assert_eq!(peer, "[::ffff:10.96.0.60]:80".parse().unwrap());

    let vip: SocketAddr = "[fd00:96::53]:80".parse().unwrap();
    let client = UdpSocket::bind("[::]:0").unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    client.send_to(b"q", vip).unwrap();
    let mut buffer = [0; 64];
    let (length, from) = client.recv_from(&mut buffer).unwrap();
    assert_eq!((&buffer[..length], from), (&b"dns6"[..], vip));
}

#[tokio::test(flavor = "current_thread")]
async fn node_ports_on_the_nodes_addresses_and_external_ips_reach_the_endpoints() {
    let lab = Lab::new("nodeport");
    // The node's address, on an interface of its own: node ports are taken on every address
    // the interfaces have (no `--nodeport-addresses`), loopback aside.
    run(
        "ip",
        &[
            "link",
            "add",
            "node0",
            "type",
            "veth",
            "peer",
            "name",
            "node0-peer",
        ],
    );
    run("ip", &["address", "add", "10.99.0.1/32", "dev", "node0"]);
    run("ip", &["link", "set", "node0", "up"]);
    let endpoint = tcp_endpoint("web");
    let mut web = service("web", "10.96.0.40", Protocol::Tcp, &[endpoint]);
    web.ports[0].node_port = Some(30080);
    web.external_ips = vec!["192.168.99.1".parse().unwrap()];
    assert_eq!(
        TcpStream::connect("10.99.0.1:30080").unwrap_err().kind(),
        ErrorKind::ConnectionRefused,
        "without the programs nothing listens on the node port"
    );
    let mut backend = EbpfBackend::new(lab.config());
    let report = backend.sync(&state(vec![web.clone()])).await.unwrap();
    // A header and a slot for each of the three addresses, then for the node port and the
    // external IP again, as traffic from outside reaches them.
    assert_eq!(report.rules_total(), vec![("services".to_owned(), 10)]);
    for address in ["10.99.0.1:30080", "192.168.99.1:80", "10.96.0.40:80"] {
        let (answer, peer) = tcp_answer(address).unwrap();
        assert_eq!(answer, "web", "{address}");
        assert_eq!(peer, address.parse().unwrap(), "{address} reads as itself");
    }
    assert_eq!(
        TcpStream::connect("127.0.0.1:30080").unwrap_err().kind(),
        ErrorKind::ConnectionRefused,
        "loopback takes no node port: a pod's own loopback stays its own"
    );

    // The node gains an address: the next sync writes the node port there too.
    run("ip", &["address", "add", "10.99.0.2/32", "dev", "node0"]);
    let report = backend.sync(&state(vec![web])).await.unwrap();
    assert!(report.full, "new node addresses rewrite every node port");
    assert_eq!(tcp_answer("10.99.0.2:30080").unwrap().0, "web");
}

#[tokio::test(flavor = "current_thread")]
async fn under_session_affinity_a_client_keeps_its_endpoint_while_it_serves() {
    let lab = Lab::new("affinity");
    let endpoints = [
        tcp_endpoint_at("127.0.0.1:9001", "9001"),
        tcp_endpoint_at("127.0.0.1:9002", "9002"),
        tcp_endpoint_at("127.0.0.1:9003", "9003"),
    ];
    let web = |endpoints: &[SocketAddr]| {
        let mut web = service("web", "10.96.0.50", Protocol::Tcp, endpoints);
        web.session_affinity = Some(Duration::from_secs(10_800));
        state(vec![web])
    };
    let answers = |count: usize| -> BTreeSet<String> {
        (0..count)
            .map(|_| tcp_answer("10.96.0.50:80").unwrap().0)
            .collect()
    };
    let mut backend = EbpfBackend::new(lab.config());
    backend.sync(&web(&endpoints[1..])).await.unwrap();
    // Without affinity 32 connections would reach one endpoint of two with chance 2⁻³¹.
    let kept = answers(32);
    assert_eq!(kept.len(), 1, "one client, one endpoint: {kept:?}");

    // An endpoint that comes and goes in slot 1 moves the others each time: the client's is
    // found where it went (a new pick would keep it with chance ⅓ per move).
    for _ in 0..5 {
        backend.sync(&web(&endpoints)).await.unwrap();
        assert_eq!(answers(4), kept);
        backend.sync(&web(&endpoints[1..])).await.unwrap();
        assert_eq!(answers(4), kept);
    }

    // Its endpoint goes: the client gets another one and keeps that.
    let others: Vec<SocketAddr> = endpoints
        .iter()
        .copied()
        .filter(|endpoint| !kept.contains(&endpoint.port().to_string()))
        .collect();
    backend.sync(&web(&others)).await.unwrap();
    let moved = answers(32);
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert!(moved.is_disjoint(&kept));
}

#[tokio::test(flavor = "current_thread")]
async fn a_port_without_endpoints_refuses_and_one_without_local_endpoints_drops() {
    let lab = Lab::new("empty");
    let elsewhere = tcp_endpoint("elsewhere");
    let mut local_only = service("local", "10.96.0.21", Protocol::Tcp, &[elsewhere]);
    local_only.internal_traffic_policy = TrafficPolicy::Local;
    let mut backend = EbpfBackend::new(lab.config());
    backend
        .sync(&state(vec![
            service("empty", "10.96.0.20", Protocol::Tcp, &[]),
            service("empty-udp", "10.96.0.22", Protocol::Udp, &[]),
            local_only,
        ]))
        .await
        .unwrap();
    assert_eq!(
        TcpStream::connect("10.96.0.20:80").unwrap_err().kind(),
        ErrorKind::ConnectionRefused,
        "as kube-proxy's REJECT"
    );
    let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
    assert_eq!(
        udp.connect("10.96.0.22:80").unwrap_err().kind(),
        ErrorKind::ConnectionRefused
    );
    assert_eq!(
        TcpStream::connect("10.96.0.21:80").unwrap_err().kind(),
        ErrorKind::PermissionDenied,
        "the endpoint on another node is not used under internalTrafficPolicy Local"
    );
}

/// One round trip on each: a line echoed over `stream`, a datagram answered on `udp`, whose
/// peer still reads as `service`.
fn round_trip(stream: &mut TcpStream, udp: &UdpSocket, service: SocketAddr) {
    stream.write_all(b"ping\n").unwrap();
    let mut line = [0; 5];
    stream.read_exact(&mut line).unwrap();
    assert_eq!(&line, b"ping\n");
    udp.send(b"q").unwrap();
    let mut buffer = [0; 64];
    let length = udp.recv(&mut buffer).unwrap();
    assert_eq!(&buffer[..length], b"dns");
    assert_eq!(udp.peer_addr().unwrap(), service);
}

#[tokio::test(flavor = "current_thread")]
async fn a_long_lived_tcp_connection_and_a_connected_udp_client_outlive_an_agent_restart() {
    let lab = Lab::new("established");
    let services = state(vec![
        service("echo", "10.96.0.70", Protocol::Tcp, &[tcp_echo_endpoint()]),
        service("dns", "10.96.0.71", Protocol::Udp, &[udp_endpoint("dns")]),
    ]);
    let dns: SocketAddr = "10.96.0.71:80".parse().unwrap();
    let timeout = Some(Duration::from_secs(10));
    let mut first = EbpfBackend::new(lab.config());
    first.sync(&services).await.unwrap();
    let mut stream = TcpStream::connect("10.96.0.70:80").unwrap();
    stream.set_read_timeout(timeout).unwrap();
    let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
    udp.set_read_timeout(timeout).unwrap();
    udp.connect(dns).unwrap();
    round_trip(&mut stream, &udp, dns);

    drop(first);
    round_trip(&mut stream, &udp, dns);
    // A new agent attaches its programs and unpins the old ones': the sockets carry on.
    let mut second = EbpfBackend::new(lab.config());
    second.sync(&services).await.unwrap();
    round_trip(&mut stream, &udp, dns);
}

#[tokio::test(flavor = "current_thread")]
async fn the_services_outlive_the_agent_and_a_new_agent_takes_over_its_maps() {
    let lab = Lab::new("restart");
    let (a, b) = (tcp_endpoint("a"), tcp_endpoint("b"));
    let web = |endpoints: &[SocketAddr]| {
        state(vec![service("web", "10.96.0.30", Protocol::Tcp, endpoints)])
    };
    let mut first = EbpfBackend::new(lab.config());
    first.sync(&web(&[a])).await.unwrap();
    let first_links = lab.links();
    assert_eq!(first_links.len(), 8, "{first_links:?}");
    drop(first);
    assert_eq!(
        tcp_answer("10.96.0.30:80").unwrap().0,
        "a",
        "no agent: the pins still serve"
    );

    let mut second = EbpfBackend::new(lab.config());
    let report = second.sync(&web(&[a])).await.unwrap();
    assert!(report.full, "a new agent reads the map first");
    assert_eq!(
        report.rules_written(),
        vec![("services".to_owned(), 0)],
        "its entries were right"
    );
    let second_links = lab.links();
    assert_eq!(second_links.len(), 8, "{second_links:?}");
    assert!(
        first_links.is_disjoint(&second_links),
        "the old links are unpinned"
    );
    assert_eq!(tcp_answer("10.96.0.30:80").unwrap().0, "a");

    second.sync(&web(&[b])).await.unwrap();
    assert_eq!(tcp_answer("10.96.0.30:80").unwrap().0, "b");

    // Entries deleted behind the agent's back come back at the next full sync (the first of
    // an agent, and hourly).
    let pinned = aya::maps::MapData::from_pin(lab.pins().join(layout::SERVICES_MAP)).unwrap();
    let mut services: aya::maps::HashMap<_, [u8; layout::KEY_LEN], [u8; layout::VALUE_LEN]> =
        aya::maps::HashMap::try_from(aya::maps::Map::HashMap(pinned)).unwrap();
    let keys: Vec<[u8; layout::KEY_LEN]> = services.keys().map(Result::unwrap).collect();
    assert_eq!(keys.len(), 2);
    for key in &keys {
        services.remove(key).unwrap();
    }
    assert_eq!(
        TcpStream::connect("10.96.0.30:80").unwrap_err().kind(),
        ErrorKind::NetworkUnreachable,
        "an emptied map serves nothing"
    );
    let mut third = EbpfBackend::new(lab.config());
    let report = third.sync(&web(&[b])).await.unwrap();
    assert_eq!(report.rules_written(), vec![("services".to_owned(), 2)]);
    assert_eq!(tcp_answer("10.96.0.30:80").unwrap().0, "b");

    // The kernel releases an unpinned link after a grace period: wait for the detach.
    assert!(kernel::remove_pins(&lab.bpf_root).unwrap());
    let detached = (0..100).any(|_| {
        let refused = TcpStream::connect("10.96.0.30:80")
            .is_err_and(|err| err.kind() == ErrorKind::NetworkUnreachable);
        if !refused {
            std::thread::sleep(Duration::from_millis(100));
        }
        refused
    });
    assert!(detached, "with the pins removed the programs are detached");
}

#[test]
fn a_folder_outside_cgroup_v2_is_refused_by_name() {
    let lab = Lab::new("refused");
    let not_cgroup = Path::new("/proc");
    let err = kernel::Attached::new(&lab.bpf_root, not_cgroup, 0x4000).unwrap_err();
    assert!(
        err.to_string()
            .contains("/proc is not a cgroup v2 hierarchy"),
        "{err}"
    );
}

/// A network namespace `name` (under `/run/netns`) joined to the test's by a veth pair:
/// `here` on the test's side with `here_address`, `eth0` there with `there_address` and a
/// default route through `here_address`'s host. Removed when dropped.
struct Neighbour {
    name: String,
}

impl Neighbour {
    fn new(name: &str, here: &str, here_address: &str, there_address: &str) -> Self {
        let name = format!("{name}-{}", std::process::id());
        let gateway = here_address.split('/').next().unwrap();
        run("ip", &["netns", "add", &name]);
        run(
            "ip",
            &[
                "link", "add", here, "type", "veth", "peer", "name", "eth0", "netns", &name,
            ],
        );
        run("ip", &["addr", "add", here_address, "dev", here]);
        run("ip", &["link", "set", here, "up"]);
        for args in [
            &["addr", "add", there_address, "dev", "eth0"][..],
            &["link", "set", "eth0", "up"],
            &["link", "set", "lo", "up"],
            &["route", "add", "default", "via", gateway],
        ] {
            run("ip", &[&["-n", name.as_str()][..], args].concat());
        }
        Self { name }
    }

    /// Runs `f` on a thread inside the namespace.
    fn enter<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let namespace = std::fs::File::open(format!("/run/netns/{}", self.name)).unwrap();
        std::thread::spawn(move || {
            nix::sched::setns(namespace, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            f()
        })
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// The source port of [`outside_answer`]'s UDP client.
const OUTSIDE_UDP_PORT: u16 = 40053;

/// What a client in `outside` got from a TCP connection to `address` (UDP: from one datagram
/// there, sent from [`OUTSIDE_UDP_PORT`] by python3, which `scripts/test.sh` uses too, and the
/// port it came back from), made by a process in `home_cgroup` (outside the lab's cgroup, so the socket programs
/// do not see it, as they do not see a client on another machine): the endpoint's answer, or
/// the error.
fn outside_answer(
    outside: &Neighbour,
    home_cgroup: &Path,
    protocol: Protocol,
    address: SocketAddr,
) -> String {
    let (ip, port) = (address.ip(), address.port());
    let client = match protocol {
        // From one source port each time, as a DNS client's socket keeps it.
        Protocol::Udp => format!(
            "exec python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
             s.bind((\"0.0.0.0\", {OUTSIDE_UDP_PORT})); s.settimeout(3); \
             s.sendto(b\"hi\", (\"{ip}\", {port})); answer, source = s.recvfrom(64); \
             print(answer.decode(), \"from\", source[1], end=\"\")'"
        ),
        _ => format!("exec 3<>/dev/tcp/{ip}/{port} && cat <&3"),
    };
    let output = Command::new("sh")
        .args([
            "-c",
            r#"echo $$ > "$0/cgroup.procs" && exec "$@""#,
            &home_cgroup.display().to_string(),
            "ip",
            "netns",
            "exec",
            &outside.name,
            "timeout",
            "5",
            "bash",
            "-c",
            &client,
        ])
        .output()
        .unwrap();
    if output.status.success() {
        String::from_utf8_lossy(&output.stdout).into_owned()
    } else {
        format!(
            "failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_node_port_from_outside_reaches_a_pod_masqueraded_under_cluster_policy_and_with_the_client_ip_under_local()
 {
    let lab = Lab::new("outside");
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").unwrap();
    let outside = Neighbour::new("sp-outside", "ext0", "198.51.100.1/24", "198.51.100.7/24");
    let pod = Neighbour::new("sp-pod", "pod0", "10.244.0.1/24", "10.244.0.2/24");
    run(
        "ip",
        &[
            "-n",
            &pod.name,
            "addr",
            "add",
            "10.244.0.3/24",
            "dev",
            "eth0",
        ],
    );
    // The pod's endpoints answer each connection with the client address they see, each
    // datagram with their own address and the client's.
    let listening = std::sync::mpsc::channel();
    pod.enter(move || {
        let listener = TcpListener::bind("10.244.0.2:8080").unwrap();
        for address in ["10.244.0.2:5353", "10.244.0.3:5353"] {
            let udp = UdpSocket::bind(address).unwrap();
            std::thread::spawn(move || {
                let mut buffer = [0; 64];
                while let Ok((_, from)) = udp.recv_from(&mut buffer) {
                    let _ = udp.send_to(format!("{address} saw {}", from.ip()).as_bytes(), from);
                }
            });
        }
        listening.0.send(()).unwrap();
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            let peer = stream.peer_addr().unwrap().ip();
            let _ = stream.write_all(peer.to_string().as_bytes());
        }
    });
    listening.1.recv().unwrap();
    let node_port: SocketAddr = "198.51.100.1:30080".parse().unwrap();
    let udp_node_port: SocketAddr = "198.51.100.1:30053".parse().unwrap();
    let answer = |protocol, address| outside_answer(&outside, &lab.home_cgroup, protocol, address);
    assert!(
        answer(Protocol::Tcp, node_port).starts_with("failed"),
        "without the programs nothing answers on the node port"
    );

    let web_to = |policy: TrafficPolicy, local: bool, dns: &str| {
        let endpoint = |address: &str| {
            let mut endpoint = Endpoint::ready(address.parse().unwrap());
            endpoint.is_local = local;
            vec![endpoint]
        };
        let mut service = Service::new(
            ServiceKey::new("ns", "web"),
            vec!["10.96.0.40".parse().unwrap()],
            vec![
                ServicePort::new(
                    "p",
                    Protocol::Tcp,
                    80,
                    Some(30080),
                    endpoint("10.244.0.2:8080"),
                ),
                ServicePort::new("dns", Protocol::Udp, 53, Some(30053), endpoint(dns)),
                ServicePort::new("dns-alt", Protocol::Udp, 5353, Some(30054), endpoint(dns)),
            ],
        );
        service.external_traffic_policy = policy;
        state(vec![service])
    };
    let web = |policy, local| web_to(policy, local, "10.244.0.2:5353");
    let mut backend = EbpfBackend::new(Config {
        node_port_addresses: Some(vec![node_port.ip()]),
        devices: Some(vec!["ext0".to_owned()]),
        ..lab.config()
    });
    backend
        .sync(&web(TrafficPolicy::Cluster, true))
        .await
        .unwrap();
    assert_eq!(
        answer(Protocol::Tcp, node_port),
        "10.244.0.1",
        "externalTrafficPolicy Cluster: the pod sees the node's address"
    );
    assert_eq!(
        answer(Protocol::Udp, udp_node_port),
        "10.244.0.2:5353 saw 10.244.0.1 from 30053",
        "UDP too, the answer from the node port"
    );
    // The UDP endpoint moves: the client, from the same port, moves with it.
    backend
        .sync(&web_to(TrafficPolicy::Cluster, true, "10.244.0.3:5353"))
        .await
        .unwrap();
    assert_eq!(
        answer(Protocol::Udp, udp_node_port),
        "10.244.0.3:5353 saw 10.244.0.1 from 30053",
        "a UDP flow to a removed endpoint is forgotten"
    );
    // The same client port to another node port on the same endpoint, then back: each answer
    // comes from the port asked.
    let other_node_port: SocketAddr = "198.51.100.1:30054".parse().unwrap();
    for (asked, from) in [(other_node_port, 30054), (udp_node_port, 30053)] {
        assert_eq!(
            answer(Protocol::Udp, asked),
            format!("10.244.0.3:5353 saw 10.244.0.1 from {from}")
        );
    }
    let links = lab.links();
    assert!(
        links
            .iter()
            .any(|link| link.starts_with("sp_from_outside-"))
            && links.iter().any(|link| link.starts_with("sp_to_outside-")),
        "{links:?}"
    );

    backend
        .sync(&web(TrafficPolicy::Local, true))
        .await
        .unwrap();
    assert_eq!(
        answer(Protocol::Tcp, node_port),
        "198.51.100.7",
        "externalTrafficPolicy Local: the pod sees the client"
    );

    // Local, with the endpoint on another node: dropped (the client times out), not refused.
    backend
        .sync(&web(TrafficPolicy::Local, false))
        .await
        .unwrap();
    let dropped = answer(Protocol::Tcp, node_port);
    assert!(
        dropped.starts_with("failed") && !dropped.contains("refused"),
        "{dropped}"
    );

    // A new agent takes the links over and the node port keeps answering.
    drop(backend);
    let mut next = EbpfBackend::new(Config {
        node_port_addresses: Some(vec![node_port.ip()]),
        devices: Some(vec!["ext0".to_owned()]),
        ..lab.config()
    });
    next.sync(&web(TrafficPolicy::Cluster, true)).await.unwrap();
    assert_eq!(answer(Protocol::Tcp, node_port), "10.244.0.1");
    assert_eq!(
        lab.links().len(),
        links.len(),
        "the earlier agent's links are unpinned"
    );
}
