//! The shared packet-flow table (`splitproxy_dataplane::testing::flow_table`) with real traffic: each
//! scenario's node, pods and outside clients built as network namespaces, every row's connection
//! made from where the row says it comes from, and what happened compared with what it expects.
//!
//! Every address of a scenario gets a home: the node's addresses go on the root namespace's
//! `eth0`, each pod, endpoint and outside client gets a namespace of its own behind a veth,
//! routed by the node (IPv4 through a proxy-ARP gateway as Calico does, IPv6 through a link-local
//! one). Each endpoint, and each destination a `Pass` row reaches, runs `sp-testpod serve` named
//! after its socket address, so an answer names the endpoint and the client address it saw
//! (masqueraded when that is not the row's source). A refused connection is a `Reject`, one that
//! times out a `Drop`.
//!
//! [`ipvs_expected`] is where kube-proxy's IPVS mode behaves differently from the table (written
//! after kube-proxy's iptables mode), each difference with its reason.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::{IpAddr, SocketAddr},
};

use serde::Serialize;
use splitproxy_dataplane::{
    IpFamily, Protocol, TrafficPolicy,
    ipvs::plan::{Plan, PlanOptions, plan},
    testing::flow_table::{Expected, FlowCase, Origin, Scenario},
};

use crate::HitReport;

/// The node's interface carrying its addresses.
pub const NODE_INTERFACE: &str = "eth0";

/// Who holds which address in a scenario, and who must answer on which port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// The start of every namespace name the topology makes (`h-` in the VM, a lab's prefix on
    /// a shared machine).
    pub prefix: String,
    /// The node's addresses.
    pub node_ips: Vec<IpAddr>,
    /// Every address that is a pod or an outside client: a namespace each.
    pub hosts: BTreeSet<IpAddr>,
    /// The servers: an address (of a host or the node), a protocol and a port.
    pub servers: BTreeSet<(SocketAddr, Protocol)>,
}

impl Topology {
    /// The topology `scenario` needs, its namespaces named `prefix` and the address.
    #[must_use]
    pub fn of(scenario: &Scenario, prefix: &str) -> Self {
        let node_ips = scenario.node_ips.clone();
        let mut topology = Self {
            prefix: prefix.to_owned(),
            node_ips,
            ..Self::default()
        };
        for service in scenario.state.services.values() {
            for port in &service.ports {
                for endpoint in &port.endpoints {
                    topology.hosts.insert(endpoint.ip);
                    topology
                        .servers
                        .insert((SocketAddr::new(endpoint.ip, endpoint.port), port.protocol));
                }
            }
        }
        for case in &scenario.cases {
            let flow = &case.flow;
            if flow.origin != Origin::Node {
                topology.hosts.insert(flow.source);
            }
            if case.expected == Expected::Pass && topology.owns(flow.destination) {
                topology
                    .servers
                    .insert((SocketAddr::new(flow.destination, flow.port), flow.protocol));
            }
        }
        topology
    }

    /// Whether `ip` is the node's (loopback included) or a host's, so a connection to it can be
    /// answered.
    #[must_use]
    pub fn owns(&self, ip: IpAddr) -> bool {
        self.is_node(ip) || self.hosts.contains(&ip)
    }

    /// The network namespace of the pod or outside client holding `ip`.
    #[must_use]
    pub fn namespace(&self, ip: IpAddr) -> String {
        // Namespace names are file names: no `:` or `.`.
        format!("{}{}", self.prefix, ip.to_string().replace([':', '.'], "-"))
    }

    /// Whether `ip` is one of the node's addresses or loopback.
    fn is_node(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.node_ips.contains(&ip)
    }

    /// The shell script (bash) that gives every address its home; run as root in the
    /// node's namespace, where [`NODE_INTERFACE`] exists and is up.
    #[must_use]
    pub fn setup_script(&self) -> String {
        let mut script = String::from(
            "set -eu\n\
             sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1\n",
        );
        for ip in &self.node_ips {
            let _ = writeln!(
                script,
                "ip addr add {ip}/{} dev {NODE_INTERFACE} nodad 2>/dev/null || \
                 ip addr add {ip}/{} dev {NODE_INTERFACE}",
                host_prefix(*ip),
                host_prefix(*ip)
            );
        }
        // Again each time: removing an interface's last IPv4 address takes its routes along.
        let _ = writeln!(
            script,
            "ip route replace default dev {NODE_INTERFACE}\n\
             ip -6 route replace default dev {NODE_INTERFACE}"
        );
        for (index, ip) in self.hosts.iter().enumerate() {
            let ns = self.namespace(*ip);
            let veth = veth(index);
            let _ = writeln!(
                script,
                "ip netns add {ns}\n\
                 ip link add {veth} type veth peer name eth0 netns {ns}\n\
                 ip link set {veth} up\n\
                 ip -n {ns} link set lo up\n\
                 ip -n {ns} link set eth0 up"
            );
            match ip {
                IpAddr::V4(_) => {
                    let _ = writeln!(
                        script,
                        "echo 1 >/proc/sys/net/ipv4/conf/{veth}/proxy_arp\n\
                         ip route add {ip}/32 dev {veth}\n\
                         ip -n {ns} addr add {ip}/32 dev eth0\n\
                         ip -n {ns} route add 169.254.1.1 dev eth0 scope link\n\
                         ip -n {ns} route add default via 169.254.1.1 dev eth0"
                    );
                }
                IpAddr::V6(_) => {
                    let _ = writeln!(
                        script,
                        "ip addr add fe80::1/64 dev {veth} nodad\n\
                         ip route add {ip}/128 dev {veth}\n\
                         ip -n {ns} addr add {ip}/128 dev eth0 nodad\n\
                         ip -n {ns} route add default via fe80::1 dev eth0"
                    );
                }
            }
        }
        script
    }

    /// The script that removes what [`Self::setup_script`] made, so the next scenario starts
    /// from the bare node.
    #[must_use]
    pub fn teardown_script(&self) -> String {
        let mut script = String::new();
        for (index, ip) in self.hosts.iter().enumerate() {
            // The veth first: a namespace's devices go some time after `ip netns del` returns,
            // and the next scenario reuses the name.
            let _ = writeln!(
                script,
                "ip link del {} 2>/dev/null || true\n\
                 ip netns del {} 2>/dev/null || true",
                veth(index),
                self.namespace(*ip)
            );
        }
        for ip in &self.node_ips {
            let _ = writeln!(
                script,
                "ip addr del {ip}/{} dev {NODE_INTERFACE} 2>/dev/null || true",
                host_prefix(*ip)
            );
        }
        script
    }

    /// The command (after `ip netns exec NS` for a host's address) that runs the server at
    /// `address`, named after it.
    #[must_use]
    pub fn server_command(&self, address: SocketAddr, protocol: Protocol) -> Vec<String> {
        let mut words = self.in_namespace_of(address.ip());
        let name = address.to_string();
        let serve: Vec<String> = match protocol {
            // Raw sockets: it answers INITs to the port on every address of its namespace.
            Protocol::Sctp => vec![
                "sctp-serve".into(),
                "--with-client".into(),
                "--name".into(),
                name,
                "--port".into(),
                address.port().to_string(),
            ],
            Protocol::Tcp | Protocol::Udp => ["serve", "--name", &name, "--listen", &name]
                .into_iter()
                .map(str::to_owned)
                .chain((protocol == Protocol::Udp).then(|| "--udp".to_owned()))
                .collect(),
        };
        words.push("sp-testpod".to_owned());
        words.extend(serve);
        words
    }

    /// One connection to the server at `address` from its own host, which it answers once it
    /// listens.
    #[must_use]
    pub fn probe_command(&self, address: SocketAddr, protocol: Protocol) -> Vec<String> {
        let mut words = self.in_namespace_of(address.ip());
        words.extend(hit_words(address, protocol, 1, 500));
        words
    }

    /// `ip netns exec NS` for a host's address; nothing for the node's.
    fn in_namespace_of(&self, ip: IpAddr) -> Vec<String> {
        if self.is_node(ip) {
            Vec::new()
        } else {
            self.netns_exec(ip)
        }
    }

    /// The command that makes `case`'s connections from where they come from, `count` of them,
    /// each given `timeout_ms`: `sp-testpod hit` asking every server for the client address it
    /// saw.
    #[must_use]
    pub fn hit_command(&self, case: &FlowCase, count: u32, timeout_ms: u64) -> Vec<String> {
        let flow = &case.flow;
        let mut words = match flow.origin {
            Origin::Node => Vec::new(),
            Origin::Pod | Origin::External => self.netns_exec(flow.source),
        };
        let destination = SocketAddr::new(flow.destination, flow.port);
        words.extend(hit_words(destination, flow.protocol, count, timeout_ms));
        if flow.origin == Origin::Node {
            words.extend(["--source".to_owned(), flow.source.to_string()]);
        }
        words
    }

    /// The node's interfaces toward the outside clients of `scenario`'s rows (the veths of
    /// their hosts), which a mode balancing traffic from outside on chosen devices watches.
    #[must_use]
    pub fn outside_interfaces(&self, scenario: &Scenario) -> Vec<String> {
        self.hosts
            .iter()
            .enumerate()
            .filter(|(_, ip)| {
                scenario
                    .cases
                    .iter()
                    .any(|case| case.flow.origin == Origin::External && case.flow.source == **ip)
            })
            .map(|(index, _)| veth(index))
            .collect()
    }

    /// `ip netns exec NS` for the host holding `ip`.
    fn netns_exec(&self, ip: IpAddr) -> Vec<String> {
        ["ip", "netns", "exec"]
            .into_iter()
            .map(str::to_owned)
            .chain([self.namespace(ip)])
            .collect()
    }
}

/// The node's end of the veth to the `index`th host.
fn veth(index: usize) -> String {
    format!("veth{index}")
}

/// `/32` for IPv4, `/128` for IPv6.
fn host_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

/// How many connections a row makes: `per_target` for each expected endpoint (2 reach each
/// twice under round robin; a random choice needs more for every endpoint to answer: with 12 per
/// target, some endpoint of three stays silent once in about 700,000 rows), and two for a row
/// that expects none.
#[must_use]
pub fn connections(expected: &Expected, per_target: u32) -> u32 {
    match expected {
        Expected::Endpoints { targets } => u32::try_from(targets.len())
            .unwrap_or(u32::MAX)
            .saturating_mul(per_target),
        _ => 2,
    }
}

/// `sp-testpod hit` (or `sctp-hit`) to `destination`, asking for the client address the server
/// saw.
fn hit_words(
    destination: SocketAddr,
    protocol: Protocol,
    count: u32,
    timeout_ms: u64,
) -> Vec<String> {
    if protocol == Protocol::Sctp {
        return [
            "sp-testpod".to_owned(),
            "sctp-hit".to_owned(),
            "--address".to_owned(),
            destination.to_string(),
            "--count".to_owned(),
            count.to_string(),
            "--timeout-ms".to_owned(),
            timeout_ms.to_string(),
        ]
        .into();
    }
    let url = match protocol {
        Protocol::Udp => format!("udp://{destination}/source"),
        _ => format!("http://{destination}/source"),
    };
    let udp = (protocol == Protocol::Udp).then(|| "--udp".to_owned());
    ["sp-testpod", "hit"]
        .into_iter()
        .map(str::to_owned)
        .chain(udp)
        .chain([
            "--url".to_owned(),
            url,
            "--count".to_owned(),
            count.to_string(),
            "--timeout-ms".to_owned(),
            timeout_ms.to_string(),
        ])
        .collect()
}

/// What a row's connections did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Observed {
    /// Every connection was answered: by these servers, masqueraded or not.
    Answered(BTreeMap<SocketAddr, bool>),
    /// Every connection was refused.
    Refused,
    /// Every connection timed out.
    TimedOut,
    /// Every connection was refused by the client's own kernel (`EPERM`).
    Forbidden,
    /// Anything else: some answered, some failed, an answer that names no server, other errors.
    Mixed(String),
}

/// What `report` says of `case`'s connections.
#[must_use]
pub fn observe(case: &FlowCase, report: &HitReport) -> Observed {
    if report.failures == 0 && !report.answers.is_empty() {
        let mut answered = BTreeMap::new();
        for answer in report.answers.keys() {
            let parsed = answer.split_once(' ').and_then(|(server, client)| {
                Some((
                    server.parse::<SocketAddr>().ok()?,
                    client.parse::<IpAddr>().ok()?,
                ))
            });
            let Some((server, client)) = parsed else {
                return Observed::Mixed(format!("an answer names no server: {answer:?}"));
            };
            let masqueraded = client != case.flow.source;
            if answered.insert(server, masqueraded) == Some(!masqueraded) {
                return Observed::Mixed(format!(
                    "{server} saw the client both masqueraded and not"
                ));
            }
        }
        return Observed::Answered(answered);
    }
    let all_failed = report.answers.is_empty() && report.failures > 0;
    let every_error = |needle: &[&str]| {
        !report.errors.is_empty()
            && report
                .errors
                .iter()
                .all(|e| needle.iter().any(|n| e.contains(n)))
    };
    if all_failed && every_error(&["refused"]) {
        Observed::Refused
    } else if all_failed && every_error(&["timed out", "temporarily unavailable"]) {
        Observed::TimedOut
    } else if all_failed && every_error(&["Operation not permitted"]) {
        Observed::Forbidden
    } else {
        Observed::Mixed(format!("{report:?}"))
    }
}

/// Whether `observed` is what `expected` says. `sticky`: the destination has session affinity,
/// so one client reaches one of the targets, not all of them.
#[must_use]
pub fn fulfils(case: &FlowCase, expected: &Expected, observed: &Observed, sticky: bool) -> bool {
    let reached = |targets: &BTreeMap<SocketAddr, bool>| match observed {
        Observed::Answered(answered) if sticky => {
            answered.len() == 1
                && answered
                    .iter()
                    .all(|(server, masq)| targets.get(server) == Some(masq))
        }
        Observed::Answered(answered) => answered == targets,
        _ => false,
    };
    match expected {
        Expected::Endpoints { targets } => reached(targets),
        // Left alone: the connection reaches the address it was sent to, as sent.
        Expected::Pass => reached(&BTreeMap::from([(
            SocketAddr::new(case.flow.destination, case.flow.port),
            false,
        )])),
        Expected::Reject => *observed == Observed::Refused,
        Expected::Drop => *observed == Observed::TimedOut,
        Expected::Forbidden => *observed == Observed::Forbidden,
    }
}

/// The IPVS plans of `scenario`, one per family of its node addresses.
fn plans(scenario: &Scenario) -> Vec<Plan> {
    [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .filter(|family| scenario.node_ips.iter().any(|ip| family.contains(ip)))
        .map(|family| {
            plan(
                &scenario.state,
                &PlanOptions {
                    family,
                    scheduler: "rr".to_owned(),
                    node_port_addresses: scenario
                        .node_port_addresses
                        .clone()
                        .unwrap_or_else(|| scenario.node_ips.clone()),
                    local_addresses: scenario.node_ips.iter().copied().collect(),
                },
            )
        })
        .collect()
}

/// What kube-proxy's IPVS mode does with `case`, where it differs from the table's expectation,
/// and why; the table's expectation otherwise.
#[must_use]
pub fn ipvs_expected(scenario: &Scenario, case: &FlowCase) -> (Expected, Option<&'static str>) {
    let flow = &case.flow;
    let plans = plans(scenario);
    let server = plans.iter().find_map(|plan| {
        plan.servers
            .iter()
            .find(|(id, _)| {
                id.address == flow.destination
                    && id.port == flow.port
                    && id.protocol == flow.protocol
            })
            .map(|(_, server)| server)
    });
    let bound = plans
        .iter()
        .any(|plan| plan.bound_addresses.contains(&flow.destination));
    let external_local = server.is_some_and(|_| {
        scenario.state.services.values().any(|service| {
            service.external_traffic_policy == TrafficPolicy::Local
                && !service.cluster_ips.contains(&flow.destination)
                && service.ports.iter().any(|port| {
                    port.protocol == flow.protocol
                        && (port.node_port == Some(flow.port)
                            || (port.port == flow.port
                                && (service.external_ips.contains(&flow.destination)
                                    || service.load_balancer_ips.contains(&flow.destination))))
                })
        })
    });
    // iptables mode sends the node's own connections, and pods' when it can tell them (a cluster
    // CIDR), to every endpoint of an externalTrafficPolicy Local destination, as if they had come
    // back through a load balancer.
    let short_circuited = match flow.origin {
        Origin::Node => Some(
            "IPVS mode has one virtual server per address and port, whoever sends: the node's own \
             connection to an externalTrafficPolicy Local destination gets the local endpoints, \
             unmasqueraded (the Local sets RETURN before the mark), where iptables mode sends it \
             to every endpoint masqueraded",
        ),
        Origin::Pod if !scenario.cluster_cidrs.is_empty() => Some(
            "IPVS mode has one virtual server per address and port, whoever sends: a pod \
             reaching an externalTrafficPolicy Local destination gets the local endpoints, \
             where iptables mode short-circuits pod traffic to every endpoint",
        ),
        _ => None,
    };
    if external_local
        && let Some(reason) = short_circuited
        && let Some(server) = server
    {
        let expected = if server.real_servers.is_empty() {
            Expected::Reject
        } else {
            Expected::endpoints(
                server
                    .real_servers
                    .iter()
                    .map(|real| (SocketAddr::new(real.address, real.port), false)),
            )
        };
        return (expected, Some(reason));
    }
    match (&case.expected, server) {
        (Expected::Drop, Some(server)) if server.real_servers.is_empty() => (
            Expected::Reject,
            Some(
                "a virtual server without real servers answers ICMP port unreachable: IPVS \
                 mode has no DROP for a Local traffic policy without local endpoints",
            ),
        ),
        (Expected::Pass, None) if marked_as_node_port(scenario, case) => (
            Expected::endpoints([(SocketAddr::new(flow.destination, flow.port), true)]),
            Some(
                "the node-port sets hold ports, not addresses: the node's own connection to a \
                 local address on a node port number is marked and masqueraded, though no \
                 virtual server takes it",
            ),
        ),
        (Expected::Pass, None) if bound => (
            Expected::Reject,
            Some(
                "KUBE-IPVS-FILTER rejects new connections to a kube-ipvs0 address on a port \
                 no Service has (kubernetes#72236)",
            ),
        ),
        (expected, _) => (expected.clone(), None),
    }
}

/// Whether IPVS mode marks `case` for masquerading as node-port traffic: a connection from the
/// node (not from loopback, which KUBE-SERVICES returns first) to one of its own addresses, on
/// a TCP or UDP node port number of a Service of the destination's family (`bitmap:port` sets
/// match the port alone; only the node's own traffic reaches POSTROUTING, where the mark acts).
fn marked_as_node_port(scenario: &Scenario, case: &FlowCase) -> bool {
    let flow = &case.flow;
    let same_family = |ip: &IpAddr| ip.is_ipv4() == flow.destination.is_ipv4();
    flow.origin == Origin::Node
        && !flow.source.is_loopback()
        && (flow.destination.is_loopback() || scenario.node_ips.contains(&flow.destination))
        && flow.protocol != Protocol::Sctp
        && scenario.state.services.values().any(|service| {
            service.cluster_ips.iter().any(same_family)
                && service
                    .ports
                    .iter()
                    .any(|port| port.protocol == flow.protocol && port.node_port == Some(flow.port))
        })
}

/// Why `case` does not apply to the IPVS and nftables modes, if it does not: the runner skips
/// it.
///
/// A pod on another node reaching its own Service goes through its own node's proxy, never
/// this one's; the table still has iptables mode masquerade it when it lands on itself (every
/// endpoint's chain marks its own traffic), but the IPVS and nftables modes masquerade such
/// hairpin traffic only for this node's endpoints (`KUBE-LOOP-BACK`, `hairpin-connections`), so
/// here the connection to itself breaks.
#[must_use]
pub fn remote_hairpin(scenario: &Scenario, case: &FlowCase) -> Option<&'static str> {
    let flow = &case.flow;
    let remote_endpoint_to_own_service = flow.origin == Origin::Pod
        && scenario.state.services.values().any(|service| {
            service.ports.iter().any(|port| {
                port.protocol == flow.protocol
                    && port
                        .endpoints
                        .iter()
                        .any(|e| e.ip == flow.source && !e.is_local)
                    && (service.cluster_ips.contains(&flow.destination) && port.port == flow.port)
            })
        });
    remote_endpoint_to_own_service.then_some(
        "a remote endpoint reaching its own Service never passes this node's proxy, which \
         masquerades hairpin traffic for local endpoints only",
    )
}

/// What kube-proxy's nftables mode does with `case`, where it differs from the table's
/// expectation (written after its iptables mode), and why; the table's expectation otherwise.
#[must_use]
pub fn nftables_expected(scenario: &Scenario, case: &FlowCase) -> (Expected, Option<&'static str>) {
    let flow = &case.flow;
    let cluster_ip = scenario
        .state
        .services
        .values()
        .any(|service| service.cluster_ips.contains(&flow.destination));
    match &case.expected {
        Expected::Pass if cluster_ip => (
            Expected::Reject,
            Some(
                "nftables mode rejects traffic to a cluster IP on a port or protocol its Service \
                 does not define (cluster-ips-check)",
            ),
        ),
        expected => (expected.clone(), None),
    }
}

/// Whether the Service behind `case`'s destination has session affinity.
#[must_use]
pub fn sticky(scenario: &Scenario, case: &FlowCase) -> bool {
    plans(scenario).iter().any(|plan| {
        plan.servers.iter().any(|(id, server)| {
            id.address == case.flow.destination
                && id.port == case.flow.port
                && server.server.timeout > 0
        })
    })
}

/// One row's result, as the runner prints it (a JSON line).
#[derive(Debug, Clone, Serialize)]
pub struct RowResult {
    /// The scenario.
    pub scenario: String,
    /// The row.
    pub row: String,
    /// What the backend must do.
    pub expected: String,
    /// Why that differs from the table's expectation, if it does.
    pub difference: Option<String>,
    /// What the connections did.
    pub observed: Observed,
    /// Whether they did what was expected.
    pub ok: bool,
    /// Why the row does not count yet, if it does not (the table's own pending reason).
    pub pending: Option<String>,
}

/// A run of `sp-flows`, judged from what it printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Rows run.
    pub rows: usize,
    /// Rows that count (not pending).
    pub counted: usize,
    /// Counted rows where the backend differs from the table, with a reason.
    pub differing: usize,
    /// Counted rows that did not do what was expected, as printed.
    pub failed: Vec<String>,
    /// Rows pending in the table.
    pub pending: usize,
    /// Pending rows that already do what is expected.
    pub pending_right: usize,
    /// Rows skipped as not applicable to the backend.
    pub skipped: usize,
}

impl Verdict {
    /// Reads the `ROW` and `SKIPPED` lines of `output`.
    ///
    /// # Errors
    ///
    /// If a `ROW` line is not the JSON the runner prints.
    pub fn of(output: &str) -> anyhow::Result<Self> {
        let mut verdict = Self::default();
        for line in output.lines() {
            if line.starts_with("SKIPPED ") {
                verdict.skipped += 1;
            }
            let Some(json) = line.strip_prefix("ROW ") else {
                continue;
            };
            let row: serde_json::Value =
                serde_json::from_str(json).map_err(|e| anyhow::anyhow!("reading {line:?}: {e}"))?;
            verdict.rows += 1;
            let ok = row["ok"] == true;
            if !row["pending"].is_null() {
                verdict.pending += 1;
                verdict.pending_right += usize::from(ok);
                continue;
            }
            verdict.counted += 1;
            verdict.differing += usize::from(!row["difference"].is_null());
            if !ok {
                verdict.failed.push(json.to_owned());
            }
        }
        Ok(verdict)
    }

    /// Fails unless at least `min_counted` rows counted and none of them failed.
    ///
    /// # Errors
    ///
    /// Naming the failed rows, or saying rows were lost.
    pub fn ensure_held(&self, min_counted: usize) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.counted >= min_counted,
            "only {} rows counted: the runner or the table lost rows",
            self.counted
        );
        anyhow::ensure!(
            self.failed.is_empty(),
            "rows the backend got wrong:\n{}",
            self.failed.join("\n")
        );
        Ok(())
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} rows: {} counted ({} where the backend differs from the table, {} failed), {} \
             pending ({} of them already right), {} skipped as not applicable",
            self.rows,
            self.counted,
            self.differing,
            self.failed.len(),
            self.pending,
            self.pending_right,
            self.skipped
        )
    }
}

pub mod ebpf;
#[cfg(test)]
mod tests;
