//! Real-kernel check of the iptables backend: syncs into a fresh network namespace and reads the
//! result back with `iptables-save` (and `ip6tables-save`); and the removal of the other proxy
//! modes' leftovers. Needs root, `ip`, iptables, ip6tables, `nft` and `ipset`.
#![allow(clippy::unwrap_used)]

use splitproxy_dataplane::NodeOptions;
use splitproxy_dataplane::{
    Dataplane, Endpoint, IpFamily, Protocol, ProxyState, Service, ServiceKey, ServicePort,
    TrafficPolicy,
    iptables::{Config, FamilyExecutor, IptablesBackend},
    leftovers::Leftovers,
    testing::{
        flow_table::{Expected, Flow, Origin},
        tracer,
    },
};
use std::{process::Command, time::Duration};

/// A network namespace that is deleted when dropped, also when the test panics.
struct Netns {
    name: String,
}

impl Netns {
    /// Creates `sp-dp-<test>-<pid>`; `test` keeps tests running in parallel apart.
    fn create(test: &str) -> Self {
        require_root();
        let name = format!("sp-dp-{test}-{}", std::process::id());
        run("ip", &["netns", "add", &name]);
        Self { name }
    }

    /// Runs `args` inside the namespace and returns its stdout; panics if it fails.
    fn exec(&self, args: &[&str]) -> String {
        let mut all = vec!["netns", "exec", &self.name];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// `iptables-save -t nat` inside the namespace, without its `#` comment lines.
    fn nat_rules(&self) -> String {
        self.saved("nat")
    }

    /// `iptables-save -t <table>` inside the namespace, without its `#` comment lines.
    fn saved(&self, table: &str) -> String {
        self.saved_by("iptables-save", table)
    }

    /// `<save> -t <table>` (`iptables-save` or `ip6tables-save`) inside the namespace, without
    /// its `#` comment lines.
    fn saved_by(&self, save: &str, table: &str) -> String {
        self.exec(&[save, "-t", table])
            .lines()
            .filter(|line| !line.starts_with('#'))
            .map(|line| format!("{line}\n"))
            .collect()
    }

    fn iptables(&self) -> FamilyExecutor {
        self.iptables_with(NodeOptions::default())
    }

    fn iptables_with(&self, options: NodeOptions) -> FamilyExecutor {
        FamilyExecutor::with_config(self.config().with_node_options(options))
    }

    /// The executor's tools, run inside the namespace.
    fn config(&self) -> Config {
        Config::default()
            .with_command_prefix(["ip", "netns", "exec", &self.name])
            .with_canary_interval(CANARY_INTERVAL)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn require_root() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .unwrap_or("unknown");
    assert_eq!(
        euid, "0",
        "this test creates a network namespace and programs iptables in it: run it as root"
    );
}

fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("could not run {program}: {err}"));
    assert!(
        output.status.success(),
        "{program} {} failed ({}): {}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn endpoint(ip: &str) -> Endpoint {
    Endpoint {
        ip: ip.parse().unwrap(),
        port: 80,
        ready: true,
        serving: true,
        terminating: false,
        is_local: false,
        topology_excluded: false,
    }
}

/// `ns1/svc1:p80`: cluster IP 172.30.0.41:80, node port 30001, endpoints 10.180.0.1-2:80.
fn one_service() -> ProxyState {
    let key = ServiceKey {
        namespace: "ns1".to_owned(),
        name: "svc1".to_owned(),
    };
    let service = Service {
        key: key.clone(),
        cluster_ips: vec!["172.30.0.41".parse().unwrap()],
        ports: vec![ServicePort {
            name: "p80".to_owned(),
            protocol: Protocol::Tcp,
            port: 80,
            node_port: Some(30001),
            endpoints: vec![endpoint("10.180.0.1"), endpoint("10.180.0.2")],
        }],
        ..Default::default()
    };
    [service].into_iter().collect()
}

/// `ns2/svc2:p80` with every Service feature at once: session affinity, an external IP, a
/// load-balancer IP with source ranges, `externalTrafficPolicy: Local` with one local endpoint;
/// and `ns3/svc3:p80`, `internalTrafficPolicy: Local` without a local endpoint.
fn every_feature() -> ProxyState {
    let key = |name: &str| ServiceKey {
        namespace: name.replace("svc", "ns"),
        name: name.to_owned(),
    };
    let port = |endpoints| {
        vec![ServicePort {
            name: "p80".to_owned(),
            protocol: Protocol::Tcp,
            port: 80,
            node_port: None,
            endpoints,
        }]
    };
    let svc2 = Service {
        key: key("svc2"),
        cluster_ips: vec!["172.30.0.42".parse().unwrap()],
        ports: port(vec![
            Endpoint {
                is_local: true,
                ..endpoint("10.180.0.2")
            },
            endpoint("10.180.2.2"),
        ]),
        external_ips: vec!["192.168.99.22".parse().unwrap()],
        load_balancer_ips: vec!["1.2.3.4".parse().unwrap()],
        load_balancer_source_ranges: vec!["203.0.113.0/25".parse().unwrap()],
        session_affinity: Some(Duration::from_secs(10800)),
        external_traffic_policy: TrafficPolicy::Local,
        ..Default::default()
    };
    let svc3 = Service {
        key: key("svc3"),
        cluster_ips: vec!["172.30.0.43".parse().unwrap()],
        ports: port(vec![endpoint("10.180.2.3")]),
        internal_traffic_policy: TrafficPolicy::Local,
        ..Default::default()
    };
    [svc2, svc3].into_iter().collect()
}

const JUMPS: [&str; 3] = [
    r#"-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#,
    r#"-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#,
    r#"-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING"#,
];
const FOREIGN_JUMP: &str = "-A PREROUTING -j CNI-HOSTPORT-DNAT";

/// Someone else's chain and jump in nat (`FOREIGN_JUMP`), which splitproxy must leave alone.
fn add_foreign_jump(netns: &Netns) {
    netns.exec(&["iptables", "-t", "nat", "-N", "CNI-HOSTPORT-DNAT"]);
    netns.exec(&[
        "iptables",
        "-t",
        "nat",
        "-A",
        "PREROUTING",
        "-j",
        "CNI-HOSTPORT-DNAT",
    ]);
}

#[track_caller]
fn assert_jumps_once(saved: &str) {
    for jump in JUMPS.iter().chain([&FOREIGN_JUMP]) {
        let count = saved.lines().filter(|line| line == jump).count();
        assert_eq!(count, 1, "{jump:?} appears {count} times in\n{saved}");
    }
}

fn per_service_chains(saved: &str) -> Vec<&str> {
    saved
        .lines()
        .filter_map(|line| line.strip_prefix(':'))
        .filter_map(|decl| decl.split_whitespace().next())
        .filter(|chain| {
            ["KUBE-SVC-", "KUBE-SEP-", "KUBE-EXT-"]
                .iter()
                .any(|p| chain.starts_with(p))
        })
        .collect()
}

#[tokio::test]
async fn sync_programs_the_nat_table_idempotently_and_removes_stale_chains() {
    let netns = Netns::create("sync");
    add_foreign_jump(&netns);
    let mut iptables = netns.iptables();

    let report = iptables.sync(&one_service()).await.unwrap();

    let first = netns.nat_rules();
    assert_eq!(
        per_service_chains(&first),
        [
            "KUBE-EXT-XPGD46QRK7WJZT7O",
            "KUBE-SEP-LXVODXWDISEETFEF",
            "KUBE-SEP-SXIVWICOYRO3J4NJ",
            "KUBE-SVC-XPGD46QRK7WJZT7O",
        ],
        "{first}"
    );
    assert_jumps_once(&first);
    for expected in [
        "-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment \"ns1/svc1:p80 -> 10.180.0.1:80\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-SXIVWICOYRO3J4NJ",
        "-A KUBE-SEP-LXVODXWDISEETFEF -p tcp -m comment --comment \"ns1/svc1:p80\" -m tcp -j DNAT --to-destination 10.180.0.2:80",
        "-A KUBE-NODEPORTS -p tcp -m comment --comment \"ns1/svc1:p80\" -m tcp --dport 30001 -j KUBE-EXT-XPGD46QRK7WJZT7O",
    ] {
        assert!(
            first.lines().any(|line| line == expected),
            "missing {expected:?} in\n{first}"
        );
    }
    // Every rule we wrote is in the kernel: all -A lines but the jumps from built-in chains.
    let ours = first
        .lines()
        .filter(|line| line.starts_with("-A KUBE-"))
        .count();
    let filter = netns.exec(&["iptables-save", "-t", "filter"]);
    let ours_in_filter = filter
        .lines()
        .filter(|line| line.starts_with("-A KUBE-"))
        .count();
    assert_eq!(
        report.rules_written(),
        [
            ("filter".to_owned(), u32::try_from(ours_in_filter).unwrap()),
            ("nat".to_owned(), u32::try_from(ours).unwrap())
        ]
    );
    assert!(
        filter.contains(
            "-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD"
        ),
        "{filter}"
    );

    iptables.sync(&one_service()).await.unwrap();

    let second = netns.nat_rules();
    assert_eq!(
        second, first,
        "a second sync of the same state changed the rules"
    );
    assert_jumps_once(&second);

    iptables.sync(&ProxyState::default()).await.unwrap();

    let emptied = netns.nat_rules();
    assert_eq!(
        per_service_chains(&emptied),
        Vec::<&str>::new(),
        "{emptied}"
    );
    assert!(!emptied.contains("172.30.0.41"), "{emptied}");
    assert_jumps_once(&emptied);
}

/// A restarted agent's first sync is full, on tables that already hold what it writes: under
/// either backend the tables come out exactly as they were, every jump once and in kube-proxy's
/// order (the full sync finds the jumps in `iptables-save` output instead of `iptables -C`).
#[tokio::test]
async fn a_restarted_agents_full_sync_leaves_every_jump_once_under_either_backend() {
    for backend in ["nft", "legacy"] {
        let netns = Netns::create(&format!("restart-{backend}"));
        let tool = |name: &str| format!("iptables-{backend}{name}");
        let config = Config {
            iptables: tool(""),
            iptables_save: tool("-save"),
            iptables_restore: tool("-restore"),
            ..netns.config()
        };
        let tables = || {
            ["nat", "filter", "mangle"]
                .map(|table| netns.saved_by(&tool("-save"), table))
                .concat()
        };
        FamilyExecutor::with_config(config.clone())
            .sync(&every_feature())
            .await
            .unwrap();
        let first = tables();

        let mut restarted = FamilyExecutor::with_config(config);
        assert!(restarted.sync(&every_feature()).await.unwrap().full);

        assert_eq!(tables(), first, "{backend}");
        assert_jumps_in(&first, &JUMPS);
        let input: Vec<&str> = first
            .lines()
            .filter(|line| line.starts_with("-A INPUT "))
            .collect();
        assert_eq!(
            input,
            [
                "-A INPUT -j KUBE-FIREWALL",
                r#"-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL"#,
                r#"-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS"#,
                r#"-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES"#,
            ],
            "{backend}"
        );
        assert_eq!(first.matches(":KUBE-PROXY-CANARY - [0:0]").count(), 3);
    }
}

#[tokio::test]
async fn kernel_accepts_affinity_external_ips_local_policies_and_source_ranges() {
    let netns = Netns::create("features");
    // With a cluster CIDR, so the kernel also takes the `! -s` and pod-traffic rules.
    let mut iptables = netns
        .iptables_with(NodeOptions::default().with_cluster_cidrs(["10.0.0.0/8".parse().unwrap()]));

    iptables.sync(&every_feature()).await.unwrap();

    // As iptables-save prints them back: options regrouped, defaults spelled out.
    let nat = netns.saved("nat");
    for expected in [
        r#"-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.2:80" -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-RS4RBKLTHTF2IUXJ --mask 255.255.255.255 --rsource -j KUBE-SEP-RS4RBKLTHTF2IUXJ"#,
        r#"-A KUBE-SEP-RS4RBKLTHTF2IUXJ -p tcp -m comment --comment "ns2/svc2:p80" -m recent --set --name KUBE-SEP-RS4RBKLTHTF2IUXJ --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.180.0.2:80"#,
        r#"-A KUBE-SERVICES -d 192.168.99.22/32 -p tcp -m comment --comment "ns2/svc2:p80 external IP" -m tcp --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT"#,
        r#"-A KUBE-SERVICES -d 1.2.3.4/32 -p tcp -m comment --comment "ns2/svc2:p80 loadbalancer IP" -m tcp --dport 80 -j KUBE-FW-GNZBNJ2PO5MGZ6GT"#,
        r#"-A KUBE-FW-GNZBNJ2PO5MGZ6GT -s 203.0.113.0/25 -m comment --comment "ns2/svc2:p80 loadbalancer IP" -j KUBE-EXT-GNZBNJ2PO5MGZ6GT"#,
        r#"-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "route LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-GNZBNJ2PO5MGZ6GT"#,
        "-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -j KUBE-SVL-GNZBNJ2PO5MGZ6GT",
        r#"-A KUBE-SVC-GNZBNJ2PO5MGZ6GT ! -s 10.0.0.0/8 -d 172.30.0.42/32 -p tcp -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ"#,
        r#"-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -s 10.0.0.0/8 -m comment --comment "pod traffic for ns2/svc2:p80 external destinations" -j KUBE-SVC-GNZBNJ2PO5MGZ6GT"#,
    ] {
        assert!(
            nat.lines().any(|line| line == expected),
            "missing {expected:?} in\n{nat}"
        );
    }
    let filter = netns.saved("filter");
    for expected in [
        r#"-A KUBE-PROXY-FIREWALL -d 1.2.3.4/32 -p tcp -m comment --comment "ns2/svc2:p80 traffic not accepted by KUBE-FW-GNZBNJ2PO5MGZ6GT" -m tcp --dport 80 -j DROP"#,
        r#"-A KUBE-SERVICES -d 172.30.0.43/32 -p tcp -m comment --comment "ns3/svc3:p80 has no local endpoints" -m tcp --dport 80 -j DROP"#,
    ] {
        assert!(
            filter.lines().any(|line| line == expected),
            "missing {expected:?} in\n{filter}"
        );
    }

    iptables.sync(&every_feature()).await.unwrap();
    assert_eq!(netns.saved("nat"), nat, "a second sync changed the rules");

    iptables.sync(&ProxyState::default()).await.unwrap();
    let emptied = netns.saved("nat");
    assert!(
        ![
            "KUBE-SVC-",
            "KUBE-SVL-",
            "KUBE-EXT-",
            "KUBE-FW-",
            "KUBE-SEP-"
        ]
        .iter()
        .any(|prefix| emptied.contains(prefix)),
        "{emptied}"
    );
}

/// `one_service()` plus `every_feature()`, with svc1's endpoints replaced by `svc1_endpoints`.
fn both(svc1_endpoints: &[&str]) -> ProxyState {
    let mut services: Vec<Service> = one_service()
        .services
        .values()
        .chain(every_feature().services.values())
        .map(|s| (**s).clone())
        .collect();
    services[0].ports[0].endpoints = svc1_endpoints.iter().map(|ip| endpoint(ip)).collect();
    services.into_iter().collect()
}

/// How often the executors here probe the canary chains.
const CANARY_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

#[tokio::test]
async fn partial_syncs_leave_unchanged_services_alone_until_the_tables_are_flushed() {
    let netns = Netns::create("partial");
    let mut iptables = netns.iptables();
    let first = iptables.sync(&both(&["10.180.0.1"])).await.unwrap();
    assert!(first.full);
    for table in ["mangle", "nat", "filter"] {
        netns.exec(&["iptables", "-t", table, "-S", "KUBE-PROXY-CANARY"]);
    }
    // A mark no render writes, in svc2's chain: a partial sync must not touch that chain.
    let svc2_chain = per_service_chains(&netns.nat_rules())
        .into_iter()
        .find(|chain| chain.starts_with("KUBE-SVC-") && *chain != "KUBE-SVC-XPGD46QRK7WJZT7O")
        .unwrap()
        .to_owned();
    netns.exec(&["iptables", "-t", "nat", "-A", &svc2_chain, "-j", "RETURN"]);
    let tampered = format!("-A {svc2_chain} -j RETURN");

    // svc1's endpoint moves: only its chains are written.
    let second = iptables.sync(&both(&["10.180.0.9"])).await.unwrap();
    assert!(!second.full);
    let saved = netns.nat_rules();
    assert!(saved.contains("--to-destination 10.180.0.9:80"), "{saved}");
    assert!(!saved.contains("10.180.0.1:80"), "{saved}");
    assert!(saved.lines().any(|line| line == tampered), "{saved}");
    let nat_written = |report: &splitproxy_dataplane::SyncReport| report.rules_written()[1].1;
    assert!(nat_written(&second) < nat_written(&first), "{second:?}");
    assert_eq!(second.rules_total(), first.rules_total());

    // A firewall reload deletes every chain: the canary is gone, so everything comes back once
    // it is probed. A sync before the probe is due is partial: it fails on the chains gone, or
    // passes without writing the canary again; either way the next one is full.
    for table in ["nat", "filter"] {
        netns.exec(&["iptables", "-t", table, "-F"]);
        netns.exec(&["iptables", "-t", table, "-X"]);
    }
    let soon = iptables.sync(&both(&["10.180.0.9"])).await;
    tokio::time::sleep(CANARY_INTERVAL).await;
    let third = match soon {
        // Only if the machine stalled past the interval.
        Ok(report) if report.full => report,
        _ => iptables.sync(&both(&["10.180.0.9"])).await.unwrap(),
    };
    let restored = netns.nat_rules();
    assert!(!restored.lines().any(|line| line == tampered), "{restored}");
    assert!(
        restored.contains("--to-destination 10.180.0.9:80"),
        "{restored}"
    );
    for jump in JUMPS {
        assert!(
            restored.lines().any(|line| line == jump),
            "{jump} missing in\n{restored}"
        );
    }
    assert_eq!(third.rules_total(), first.rules_total());
}

/// `ns4/dual:p80`, dual-stack with client-IP affinity, node port 30004 and one endpoint per
/// family; `ns5/six:p80`, IPv6-only without endpoints.
fn dual_stack() -> ProxyState {
    let port = |node_port, endpoints| {
        vec![ServicePort::new(
            "p80",
            Protocol::Tcp,
            80,
            node_port,
            endpoints,
        )]
    };
    let mut dual = Service::new(
        ServiceKey::new("ns4", "dual"),
        vec![
            "172.30.0.44".parse().unwrap(),
            "fd00:172:30::44".parse().unwrap(),
        ],
        port(
            Some(30004),
            vec![endpoint("10.180.0.4"), endpoint("fd00:10:180::4")],
        ),
    );
    dual.session_affinity = Some(Duration::from_secs(10800));
    let six = Service::new(
        ServiceKey::new("ns5", "six"),
        vec!["fd00:172:30::45".parse().unwrap()],
        port(None, Vec::new()),
    );
    [dual, six].into_iter().collect()
}

#[tokio::test]
async fn ip6tables_restore_accepts_the_ipv6_rules_and_each_family_keeps_its_own() {
    let netns = Netns::create("dual");
    let config = Config::default()
        .with_command_prefix(["ip", "netns", "exec", &netns.name])
        .with_node_options(NodeOptions::default().with_cluster_cidrs([
            "10.0.0.0/8".parse().unwrap(),
            "fd00:10::/32".parse().unwrap(),
        ]));
    let mut dataplane = IptablesBackend::detect(&config).await;
    assert_eq!(
        *dataplane.families(),
        IpFamily::ALL,
        "ip6tables is required"
    );

    let report = dataplane.sync(&dual_stack()).await.unwrap();

    // As ip6tables-save prints them back: /128 host masks, the IPv6 recent mask, the REJECT type.
    let nat6 = netns.saved_by("ip6tables-save", "nat");
    for expected in [
        r#"-A KUBE-SERVICES -d fd00:172:30::44/128 -p tcp -m comment --comment "ns4/dual:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-LPKXNINHJOVHPN4W"#,
        r#"-A KUBE-SVC-LPKXNINHJOVHPN4W ! -s fd00:10::/32 -d fd00:172:30::44/128 -p tcp -m comment --comment "ns4/dual:p80 cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ"#,
        r#"-A KUBE-SEP-HSK27BF5GD25W6B7 -s fd00:10:180::4/128 -m comment --comment "ns4/dual:p80" -j KUBE-MARK-MASQ"#,
        r#"-A KUBE-SEP-HSK27BF5GD25W6B7 -p tcp -m comment --comment "ns4/dual:p80" -m recent --set --name KUBE-SEP-HSK27BF5GD25W6B7 --mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff --rsource -m tcp -j DNAT --to-destination [fd00:10:180::4]:80"#,
        r#"-A KUBE-NODEPORTS -p tcp -m comment --comment "ns4/dual:p80" -m tcp --dport 30004 -j KUBE-EXT-LPKXNINHJOVHPN4W"#,
        r#"-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully"#,
    ] {
        assert!(
            nat6.lines().any(|line| line == expected),
            "missing {expected:?} in\n{nat6}"
        );
    }
    assert_jumps_in(&nat6, &JUMPS);
    let filter6 = netns.saved_by("ip6tables-save", "filter");
    let reject = r#"-A KUBE-SERVICES -d fd00:172:30::45/128 -p tcp -m comment --comment "ns5/six:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp6-port-unreachable"#;
    assert!(filter6.lines().any(|line| line == reject), "{filter6}");

    // Each family holds only its own addresses, under the same chain names.
    let nat4 = netns.saved("nat");
    let filter4 = netns.saved("filter");
    assert!(nat4.contains("-d 172.30.0.44/32"), "{nat4}");
    assert!(nat4.contains(":KUBE-SVC-LPKXNINHJOVHPN4W"), "{nat4}");
    for ipv4_table in [&nat4, &filter4] {
        assert!(!ipv4_table.contains("fd00:"), "{ipv4_table}");
    }
    assert!(
        !nat6.contains("172.30.0.") && !nat6.contains("10.180.0."),
        "{nat6}"
    );
    assert!(!filter6.contains("ns4/dual"), "{filter6}");
    let count = |saved: &str| {
        u32::try_from(
            saved
                .lines()
                .filter(|line| line.starts_with("-A KUBE-"))
                .count(),
        )
        .unwrap()
    };
    assert_eq!(
        report.family_rules,
        [
            (IpFamily::V4, "filter".to_owned(), count(&filter4)),
            (IpFamily::V4, "nat".to_owned(), count(&nat4)),
            (IpFamily::V6, "filter".to_owned(), count(&filter6)),
            (IpFamily::V6, "nat".to_owned(), count(&nat6)),
        ]
    );

    // The tracer reads what the kernel holds: an IPv6 pod reaches the IPv6 endpoint only.
    let kernel = format!("{filter6}{nat6}");
    let pod = Flow {
        name: "IPv6 pod to the dual-stack cluster IP",
        source: "fd00:10:244::5".parse().unwrap(),
        destination: "fd00:172:30::44".parse().unwrap(),
        protocol: Protocol::Tcp,
        port: 80,
        origin: Origin::Pod,
    };
    let node_ips = ["fd00:198:18::11".parse().unwrap()];
    assert_eq!(
        tracer::trace(&kernel, &pod, &node_ips).unwrap(),
        Expected::endpoints([("[fd00:10:180::4]:80".parse().unwrap(), false)])
    );
    let rejected = Flow {
        name: "IPv6 pod to the IPv6-only cluster IP without endpoints",
        destination: "fd00:172:30::45".parse().unwrap(),
        ..pod
    };
    assert_eq!(
        tracer::trace(&kernel, &rejected, &node_ips).unwrap(),
        Expected::Reject
    );

    dataplane.sync(&dual_stack()).await.unwrap();
    assert_eq!(
        netns.saved_by("ip6tables-save", "nat"),
        nat6,
        "a second sync changed the IPv6 rules"
    );

    dataplane.sync(&ProxyState::default()).await.unwrap();
    let emptied = netns.saved_by("ip6tables-save", "nat");
    assert!(
        !emptied.contains("KUBE-SVC-") && !emptied.contains("KUBE-SEP-"),
        "{emptied}"
    );
    assert_jumps_in(&emptied, &JUMPS);
}

#[track_caller]
fn assert_jumps_in(saved: &str, jumps: &[&str]) {
    for jump in jumps {
        let count = saved.lines().filter(|line| line == jump).count();
        assert_eq!(count, 1, "{jump:?} appears {count} times in\n{saved}");
    }
}

#[tokio::test]
async fn cleanup_removes_every_rule_of_the_layout_and_nothing_else() {
    let netns = Netns::create("cleanup");
    add_foreign_jump(&netns);
    let mut iptables = netns.iptables();
    iptables.sync(&both(&["10.180.0.1"])).await.unwrap();
    // An IPVS-mode kube-proxy's own chains, hooked in with its own comments.
    for (table, chain, from) in [
        ("filter", "KUBE-IPVS-FILTER", "INPUT"),
        ("nat", "KUBE-LOAD-BALANCER", "PREROUTING"),
    ] {
        netns.exec(&["iptables", "-t", table, "-N", chain]);
        netns.exec(&["iptables", "-t", table, "-A", chain, "-j", "RETURN"]);
        let comment = "kubernetes ipvs leftover";
        netns.exec(&[
            "iptables",
            "-t",
            table,
            "-A",
            from,
            "-m",
            "comment",
            "--comment",
            comment,
            "-j",
            chain,
        ]);
    }

    let cleaned = iptables.cleanup().await.unwrap();
    assert_eq!(cleaned.jumps, 14, "{cleaned:?}");
    assert!(cleaned.chains > 10, "{cleaned:?}");
    for table in ["mangle", "nat", "filter"] {
        let saved = netns.saved(table);
        // kubelet's KUBE-FIREWALL stays, as kube-proxy's cleanup leaves it.
        let ours = saved
            .lines()
            .filter(|line| line.contains("KUBE-") && !line.contains("KUBE-FIREWALL"))
            .count();
        assert_eq!(ours, 0, "{table} still holds\n{saved}");
    }
    let nat = netns.nat_rules();
    assert!(nat.lines().any(|line| line == FOREIGN_JUMP), "{nat}");
    assert!(nat.contains(":CNI-HOSTPORT-DNAT"), "{nat}");

    // Nothing left: a second run removes nothing and succeeds.
    let again = iptables.cleanup().await.unwrap();
    assert_eq!((again.jumps, again.chains), (0, 0));
}

/// Upstream-shaped leftovers of kube-proxy's nftables mode (both families' tables, a base chain
/// jumping to a chain with a rule) and IPVS mode (`kube-ipvs0` holding a cluster IP, ipsets of
/// both families), each next to an unrelated object of the same kind that must stay.
fn add_other_modes_leftovers(netns: &Netns) {
    for command in [
        "add table ip kube-proxy",
        "add chain ip kube-proxy services",
        "add rule ip kube-proxy services ip daddr 10.96.0.10 tcp dport 80 counter",
        "add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }",
        "add rule ip kube-proxy nat-prerouting jump services",
        "add table ip6 kube-proxy",
        "add chain ip6 kube-proxy services",
        "add table ip other-firewall",
        "add chain ip other-firewall input { type filter hook input priority 0 ; }",
    ] {
        netns.exec(&["nft", command]);
    }
    add_dummy(netns, "kube-ipvs0");
    netns.exec(&["ip", "addr", "add", "10.96.0.10/32", "dev", "kube-ipvs0"]);
    add_dummy(netns, "other0");
    netns.exec(&["ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port"]);
    netns.exec(&["ipset", "add", "KUBE-CLUSTER-IP", "10.96.0.10,tcp:80"]);
    let v6 = [
        "ipset",
        "create",
        "KUBE-6-CLUSTER-IP",
        "hash:ip,port",
        "family",
        "inet6",
    ];
    netns.exec(&v6);
    netns.exec(&["ipset", "create", "other-hosts", "hash:ip"]);
}

/// A dummy interface `name`, as kube-proxy makes `kube-ipvs0`; a bridge where the kernel has no
/// dummy driver (as the development VMs' kernel): another link without a lower device, which
/// holds addresses the same way.
fn add_dummy(netns: &Netns, name: &str) {
    let dummy = Command::new("ip")
        .args([
            "netns",
            "exec",
            &netns.name,
            "ip",
            "link",
            "add",
            name,
            "type",
            "dummy",
        ])
        .status()
        .is_ok_and(|status| status.success());
    if !dummy {
        netns.exec(&["ip", "link", "add", name, "type", "bridge"]);
    }
}

fn leftovers_in(netns: &Netns) -> Leftovers {
    Leftovers::new(&["ip", "netns", "exec", &netns.name].map(String::from))
}

/// The nftables tables, interfaces and ipsets in the namespace, one name a line each.
fn other_modes_objects(netns: &Netns) -> (String, String, String) {
    let interfaces = netns
        .exec(&["ip", "-o", "link", "show"])
        .lines()
        .filter_map(|line| line.split(": ").nth(1))
        .map(|name| format!("{name}\n"))
        .collect();
    let ipsets = netns.exec(&["ipset", "list", "-n"]);
    (netns.exec(&["nft", "list", "tables"]), interfaces, ipsets)
}

#[tokio::test]
async fn switching_to_iptables_mode_removes_the_nftables_tables_and_kube_ipvs0() {
    let netns = Netns::create("switch");
    add_other_modes_leftovers(&netns);

    let removed = leftovers_in(&netns)
        .remove_for_iptables_mode()
        .await
        .unwrap();
    assert_eq!(removed.nft_tables, ["ip kube-proxy", "ip6 kube-proxy"]);
    assert_eq!(removed.interfaces, ["kube-ipvs0"]);
    let (tables, interfaces, ipsets) = other_modes_objects(&netns);
    assert_eq!(tables, "table ip other-firewall\n");
    assert_eq!(interfaces, "lo\nother0\n");
    // The IPVS mode's iptables rules, which iptables mode leaves alone, may still use them.
    assert!(ipsets.contains("KUBE-CLUSTER-IP\n"), "{ipsets}");

    let again = leftovers_in(&netns)
        .remove_for_iptables_mode()
        .await
        .unwrap();
    assert!(again.is_empty(), "{again:?}");
}

#[tokio::test]
async fn cleanup_removes_the_other_modes_leftovers_and_nothing_else() {
    let netns = Netns::create("leftovers");
    add_other_modes_leftovers(&netns);

    let mut removed = leftovers_in(&netns).remove_all().await.unwrap();
    removed.ipsets.sort();
    assert_eq!(removed.nft_tables, ["ip kube-proxy", "ip6 kube-proxy"]);
    assert_eq!(removed.interfaces, ["kube-ipvs0"]);
    assert_eq!(removed.ipsets, ["KUBE-6-CLUSTER-IP", "KUBE-CLUSTER-IP"]);
    assert!(removed.skipped.is_empty(), "{removed:?}");
    let (tables, interfaces, ipsets) = other_modes_objects(&netns);
    assert_eq!(tables, "table ip other-firewall\n");
    assert_eq!(interfaces, "lo\nother0\n");
    assert_eq!(ipsets, "other-hosts\n");

    let again = leftovers_in(&netns).remove_all().await.unwrap();
    assert!(again.is_empty(), "{again:?}");
}

#[tokio::test]
async fn an_ipset_still_used_by_a_rule_fails_the_cleanup_clearly() {
    let netns = Netns::create("inuse");
    netns.exec(&["ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port"]);
    let rule = "-m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT";
    let mut args = vec!["iptables", "-A", "INPUT"];
    args.extend(rule.split(' '));
    netns.exec(&args);

    let err = leftovers_in(&netns).remove_all().await.unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("ipset destroy KUBE-CLUSTER-IP") && message.contains("in use"),
        "{message}"
    );
}
