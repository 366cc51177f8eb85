//! The ipsets kube-proxy's IPVS mode keeps for one IP family, decided from a state, and the
//! `ipset restore` script that brings the kernel's sets to them.
//!
//! The IPVS mode matches traffic against sets rather than writing rules per Service, so its
//! iptables rules ([`super::rules`]) stay the same size whatever the cluster holds. The sets
//! and what fills them are upstream's (`pkg/proxy/ipvs/proxier.go`, `syncProxyRules`;
//! `pkg/proxy/ipvs/ipset.go`):
//!
//! | set | type | entries |
//! |---|---|---|
//! | `KUBE-LOOP-BACK` | `hash:ip,port,ip` | `ep,proto:port,ep` per local endpoint (hairpin) |
//! | `KUBE-CLUSTER-IP` | `hash:ip,port` | `clusterip,proto:port` |
//! | `KUBE-EXTERNAL-IP` | `hash:ip,port` | `externalip,proto:port` under eTP Cluster |
//! | `KUBE-EXTERNAL-IP-LOCAL` | `hash:ip,port` | the same under eTP Local |
//! | `KUBE-LOAD-BALANCER` | `hash:ip,port` | `lbip,proto:port` |
//! | `KUBE-LOAD-BALANCER-LOCAL` | `hash:ip,port` | the same under eTP Local |
//! | `KUBE-LOAD-BALANCER-FW` | `hash:ip,port` | the same with source ranges |
//! | `KUBE-LOAD-BALANCER-SOURCE-IP` | `hash:ip,port,ip` | `lbip,proto:port,lbip` when a node IP is in a range |
//! | `KUBE-LOAD-BALANCER-SOURCE-CIDR` | `hash:ip,port,net` | `lbip,proto:port,range` |
//! | `KUBE-NODE-PORT-TCP`, `-UDP` | `bitmap:port` | node ports |
//! | `KUBE-NODE-PORT-LOCAL-TCP`, `-UDP` | `bitmap:port` | node ports under eTP Local |
//! | `KUBE-NODE-PORT-SCTP-HASH` | `hash:ip,port` | `nodeip,sctp:port` per node-port address |
//! | `KUBE-NODE-PORT-LOCAL-SCTP-HASH` | `hash:ip,port` | the same under eTP Local |
//! | `KUBE-HEALTH-CHECK-NODE-PORT` | `bitmap:port` | health-check node ports |
//! | `KUBE-IPVS-IPS` | `hash:ip` | every address bound to `kube-ipvs0` (the plan's) |
//!
//! Every set exists even when empty, as upstream's fixed filter rules name them. IPv6 sets are
//! named `KUBE-6-…`, cut to ipset's 31 characters as upstream cuts them.
//!
//! Entries are written as `ipset list` prints them, so a set read back from the kernel compares
//! equal: a source range of a single host is its bare address.

use super::ServiceId;
use super::plan::Plan;
use crate::IpFamily;
use crate::{Cidr, Protocol, ProxyState, Service, ServicePort, TrafficPolicy};
use data_encoding::BASE32;
use sha2::{Digest, Sha256};
use std::{collections::BTreeSet, fmt, net::IpAddr};

/// The longest set name the kernel takes (`IPSET_MAXNAMELEN` less its NUL).
pub const MAX_NAME_LEN: usize = 31;

/// The range every `bitmap:port` set covers: all ports, as upstream creates them.
pub const PORT_RANGE: &str = "0-65535";

/// An ipset type, as `ipset create` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetType {
    /// `hash:ip`: addresses.
    HashIp,
    /// `hash:ip,port`: address, protocol and port.
    HashIpPort,
    /// `hash:ip,port,ip`: address, protocol and port, and a second address.
    HashIpPortIp,
    /// `hash:ip,port,net`: address, protocol and port, and a network.
    HashIpPortNet,
    /// `bitmap:port`: ports, over [`PORT_RANGE`].
    BitmapPort,
}

impl SetType {
    /// The name `ipset create` takes (`hash:ip,port`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HashIp => "hash:ip",
            Self::HashIpPort => "hash:ip,port",
            Self::HashIpPortIp => "hash:ip,port,ip",
            Self::HashIpPortNet => "hash:ip,port,net",
            Self::BitmapPort => "bitmap:port",
        }
    }
}

impl fmt::Display for SetType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One of the sets kube-proxy's IPVS mode keeps, whatever its family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetId {
    /// `KUBE-LOOP-BACK`: local endpoints, to masquerade a pod reaching itself.
    LoopBack,
    /// `KUBE-CLUSTER-IP`: cluster IP and port.
    ClusterIp,
    /// `KUBE-EXTERNAL-IP`: external IP and port, `externalTrafficPolicy: Cluster`.
    ExternalIp,
    /// `KUBE-EXTERNAL-IP-LOCAL`: external IP and port, `externalTrafficPolicy: Local`.
    ExternalIpLocal,
    /// `KUBE-LOAD-BALANCER`: load-balancer IP and port.
    LoadBalancer,
    /// `KUBE-LOAD-BALANCER-LOCAL`: load-balancer IP and port, `externalTrafficPolicy: Local`.
    LoadBalancerLocal,
    /// `KUBE-LOAD-BALANCER-FW`: load-balancer IP and port with source ranges.
    LoadBalancerFw,
    /// `KUBE-LOAD-BALANCER-SOURCE-IP`: load-balancer IP and port, and itself as a source.
    LoadBalancerSourceIp,
    /// `KUBE-LOAD-BALANCER-SOURCE-CIDR`: load-balancer IP and port, and an allowed source range.
    LoadBalancerSourceCidr,
    /// `KUBE-NODE-PORT-TCP`: TCP node ports.
    NodePortTcp,
    /// `KUBE-NODE-PORT-LOCAL-TCP`: TCP node ports, `externalTrafficPolicy: Local`.
    NodePortLocalTcp,
    /// `KUBE-NODE-PORT-UDP`: UDP node ports.
    NodePortUdp,
    /// `KUBE-NODE-PORT-LOCAL-UDP`: UDP node ports, `externalTrafficPolicy: Local`.
    NodePortLocalUdp,
    /// `KUBE-NODE-PORT-SCTP-HASH`: node-port address and SCTP node port.
    NodePortSctp,
    /// `KUBE-NODE-PORT-LOCAL-SCTP-HASH`: the same, `externalTrafficPolicy: Local`.
    NodePortLocalSctp,
    /// `KUBE-HEALTH-CHECK-NODE-PORT`: health-check node ports.
    HealthCheckNodePort,
    /// `KUBE-IPVS-IPS`: the addresses bound to `kube-ipvs0`.
    IpvsIps,
}

impl SetId {
    /// Every set, in the order [`IpSets`] holds them: upstream's `ipsetInfo` order, but with
    /// `KUBE-LOAD-BALANCER-LOCAL` before `KUBE-LOAD-BALANCER-FW`.
    pub const ALL: [Self; 17] = [
        Self::LoopBack,
        Self::ClusterIp,
        Self::ExternalIp,
        Self::ExternalIpLocal,
        Self::LoadBalancer,
        Self::LoadBalancerLocal,
        Self::LoadBalancerFw,
        Self::LoadBalancerSourceIp,
        Self::LoadBalancerSourceCidr,
        Self::NodePortTcp,
        Self::NodePortLocalTcp,
        Self::NodePortUdp,
        Self::NodePortLocalUdp,
        Self::NodePortSctp,
        Self::NodePortLocalSctp,
        Self::HealthCheckNodePort,
        Self::IpvsIps,
    ];

    /// The IPv4 set's name, upstream's.
    #[must_use]
    pub fn base_name(self) -> &'static str {
        match self {
            Self::LoopBack => "KUBE-LOOP-BACK",
            Self::ClusterIp => "KUBE-CLUSTER-IP",
            Self::ExternalIp => "KUBE-EXTERNAL-IP",
            Self::ExternalIpLocal => "KUBE-EXTERNAL-IP-LOCAL",
            Self::LoadBalancer => "KUBE-LOAD-BALANCER",
            Self::LoadBalancerLocal => "KUBE-LOAD-BALANCER-LOCAL",
            Self::LoadBalancerFw => "KUBE-LOAD-BALANCER-FW",
            Self::LoadBalancerSourceIp => "KUBE-LOAD-BALANCER-SOURCE-IP",
            Self::LoadBalancerSourceCidr => "KUBE-LOAD-BALANCER-SOURCE-CIDR",
            Self::NodePortTcp => "KUBE-NODE-PORT-TCP",
            Self::NodePortLocalTcp => "KUBE-NODE-PORT-LOCAL-TCP",
            Self::NodePortUdp => "KUBE-NODE-PORT-UDP",
            Self::NodePortLocalUdp => "KUBE-NODE-PORT-LOCAL-UDP",
            Self::NodePortSctp => "KUBE-NODE-PORT-SCTP-HASH",
            Self::NodePortLocalSctp => "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
            Self::HealthCheckNodePort => "KUBE-HEALTH-CHECK-NODE-PORT",
            Self::IpvsIps => "KUBE-IPVS-IPS",
        }
    }

    /// The set's name in `family`: the base name for IPv4; for IPv6 `KUBE-6-` in place of
    /// `KUBE-`, cut to [`MAX_NAME_LEN`] (`KUBE-6-LOAD-BALANCER-SOURCE-CID`), as upstream names
    /// them so both families' sets live side by side.
    #[must_use]
    pub fn name(self, family: IpFamily) -> String {
        let base = self.base_name();
        match family {
            IpFamily::V4 => base.to_owned(),
            IpFamily::V6 => {
                let rest = base.strip_prefix("KUBE-").unwrap_or(base);
                let mut name = format!("KUBE-6-{rest}");
                // Names are ASCII, so any length is a character boundary.
                name.truncate(MAX_NAME_LEN);
                name
            }
        }
    }

    /// The set's type.
    #[must_use]
    pub fn set_type(self) -> SetType {
        match self {
            Self::LoopBack | Self::LoadBalancerSourceIp => SetType::HashIpPortIp,
            Self::LoadBalancerSourceCidr => SetType::HashIpPortNet,
            Self::NodePortTcp
            | Self::NodePortLocalTcp
            | Self::NodePortUdp
            | Self::NodePortLocalUdp
            | Self::HealthCheckNodePort => SetType::BitmapPort,
            Self::IpvsIps => SetType::HashIp,
            Self::ClusterIp
            | Self::ExternalIp
            | Self::ExternalIpLocal
            | Self::LoadBalancer
            | Self::LoadBalancerLocal
            | Self::LoadBalancerFw
            | Self::NodePortSctp
            | Self::NodePortLocalSctp => SetType::HashIpPort,
        }
    }

    /// Its place in [`Self::ALL`] and in [`IpSets`].
    fn index(self) -> usize {
        // The variants are declared in the order of `ALL`, which a test checks.
        self as usize
    }
}

/// One ipset: what `ipset create` needs, and the entries it should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpSet {
    /// The name, at most [`MAX_NAME_LEN`] characters.
    pub name: String,
    /// The type.
    pub set_type: SetType,
    /// The family of its addresses (`family inet|inet6`; `bitmap:port` sets have none).
    pub family: IpFamily,
    /// The entries, as `ipset add` takes them and `ipset list` prints them:
    /// `10.96.0.10,tcp:80`, `10.244.1.20,tcp:8080,10.244.1.20`,
    /// `203.0.113.9,tcp:443,192.0.2.0/24`, `30080`, `fd00::10,tcp:80`.
    pub entries: BTreeSet<String>,
}

impl IpSet {
    /// An empty set of `id` in `family`.
    #[must_use]
    pub fn empty(id: SetId, family: IpFamily) -> Self {
        Self {
            name: id.name(family),
            set_type: id.set_type(),
            family,
            entries: BTreeSet::new(),
        }
    }

    /// The `ipset create` arguments after the name: the type and its options, as upstream
    /// creates the set (`hash:ip,port family inet hashsize 1024 maxelem 65536`,
    /// `bitmap:port range 0-65535`). `create -exist` succeeds only when these match the set the
    /// kernel holds, so they stay upstream's.
    #[must_use]
    pub fn create_options(&self) -> String {
        match self.set_type {
            SetType::BitmapPort => format!("{} range {PORT_RANGE}", self.set_type),
            _ => {
                let family = match self.family {
                    IpFamily::V4 => "inet",
                    IpFamily::V6 => "inet6",
                };
                format!(
                    "{} family {family} hashsize 1024 maxelem 65536",
                    self.set_type
                )
            }
        }
    }
}

/// Every set of one family, each present even when empty, and the load-balancer virtual
/// servers the node itself must not reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpSets {
    family: IpFamily,
    /// Indexed by [`SetId::index`].
    sets: [IpSet; 17],
    closed_to_node: BTreeSet<ServiceId>,
}

impl IpSets {
    /// Every set of `family`, empty.
    #[must_use]
    pub fn empty(family: IpFamily) -> Self {
        Self {
            family,
            sets: SetId::ALL.map(|id| IpSet::empty(id, family)),
            closed_to_node: BTreeSet::new(),
        }
    }

    /// The family.
    #[must_use]
    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// The set `id`.
    #[must_use]
    pub fn get(&self, id: SetId) -> &IpSet {
        &self.sets[id.index()]
    }

    /// Every set, in [`SetId::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = &IpSet> {
        self.sets.iter()
    }

    /// Load-balancer IP, protocol and port with source ranges none of the node's IPs is in:
    /// upstream drops the node's own connections to them (`KUBE-IPVS-OUT-FILTER`), as the
    /// node reaches its IPVS virtual servers without passing the source-range check.
    #[must_use]
    pub fn closed_to_node(&self) -> &BTreeSet<ServiceId> {
        &self.closed_to_node
    }

    fn add(&mut self, id: SetId, entry: String) {
        self.sets[id.index()].entries.insert(entry);
    }
}

/// How a node's sets are decided, beyond its Services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetOptions {
    /// The family decided: only its addresses, endpoints and source ranges count.
    pub family: IpFamily,
    /// The node's addresses taking node ports (as [`super::plan::PlanOptions`] has them); those
    /// of other families are skipped. Without one of the family, node ports get no entries.
    pub node_port_addresses: Vec<IpAddr>,
    /// The node's own IPs (kube-proxy's node IP). A load-balancer IP whose source ranges hold
    /// one accepts connections from itself (`KUBE-LOAD-BALANCER-SOURCE-IP`); one whose ranges
    /// hold none is closed to the node ([`IpSets::closed_to_node`]).
    pub node_ips: Vec<IpAddr>,
}

/// The sets for `state` under `options`, with `plan` the same family's IPVS plan.
///
/// As upstream's per-family proxier, only Services with a cluster IP of the family count, and
/// only their addresses, endpoints and source ranges of the family. `KUBE-IPVS-IPS` holds
/// exactly the plan's [`Plan::bound_addresses`].
#[must_use]
pub fn sets(state: &ProxyState, plan: &Plan, options: &SetOptions) -> IpSets {
    let mut sets = IpSets::empty(options.family);
    for ip in &plan.bound_addresses {
        sets.add(SetId::IpvsIps, ip.to_string());
    }
    for service in state.services.values() {
        if !service
            .cluster_ips
            .iter()
            .any(|ip| options.family.contains(ip))
        {
            continue;
        }
        for port in &service.ports {
            add_port(&mut sets, service, port, options);
        }
    }
    sets
}

fn add_port(sets: &mut IpSets, service: &Service, port: &ServicePort, options: &SetOptions) {
    let family = options.family;
    let proto = port.protocol;
    let local = service.external_traffic_policy == TrafficPolicy::Local;

    // Every local endpoint, whatever its readiness, as upstream walks the whole endpoint list.
    for endpoint in port
        .endpoints
        .iter()
        .filter(|e| e.is_local && family.contains(&e.ip))
    {
        sets.add(
            SetId::LoopBack,
            with_ip(&ip_port(endpoint.ip, proto, endpoint.port), endpoint.ip),
        );
    }

    for ip in family.select(&service.cluster_ips) {
        sets.add(SetId::ClusterIp, ip_port(ip, proto, port.port));
    }

    let external_set = if local {
        SetId::ExternalIpLocal
    } else {
        SetId::ExternalIp
    };
    for ip in family.select(&service.external_ips) {
        sets.add(external_set, ip_port(ip, proto, port.port));
    }

    let ranges = source_ranges(service, family);
    let allow_from_node = ranges
        .iter()
        .any(|range| options.node_ips.iter().any(|ip| range.contains(*ip)));
    for ip in family.select(&service.load_balancer_ips) {
        let entry = ip_port(ip, proto, port.port);
        if local {
            sets.add(SetId::LoadBalancerLocal, entry.clone());
        }
        if !ranges.is_empty() {
            sets.add(SetId::LoadBalancerFw, entry.clone());
            for range in &ranges {
                sets.add(SetId::LoadBalancerSourceCidr, with_net(&entry, *range));
            }
            if allow_from_node {
                sets.add(SetId::LoadBalancerSourceIp, with_ip(&entry, ip));
            } else {
                sets.closed_to_node.insert(ServiceId {
                    protocol: proto,
                    address: ip,
                    port: port.port,
                });
            }
        }
        sets.add(SetId::LoadBalancer, entry);
    }

    if let Some(node_port) = port.node_port {
        let addresses = family.select(&options.node_port_addresses);
        // Upstream skips the rest of the port without a node-port address, health-check node
        // port included.
        if addresses.is_empty() {
            return;
        }
        let (set, local_set, entries) = match proto {
            Protocol::Tcp => (
                SetId::NodePortTcp,
                SetId::NodePortLocalTcp,
                vec![node_port.to_string()],
            ),
            Protocol::Udp => (
                SetId::NodePortUdp,
                SetId::NodePortLocalUdp,
                vec![node_port.to_string()],
            ),
            // `bitmap:port` sets match only TCP and UDP ports, so SCTP node ports go into a hash
            // set, once per node-port address, as upstream.
            Protocol::Sctp => (
                SetId::NodePortSctp,
                SetId::NodePortLocalSctp,
                addresses
                    .iter()
                    .map(|&address| ip_port(address, proto, node_port))
                    .collect(),
            ),
        };
        for entry in entries {
            if local {
                sets.add(local_set, entry.clone());
            }
            sets.add(set, entry);
        }
    }

    if let Some(health_check) = service.health_check_node_port {
        sets.add(SetId::HealthCheckNodePort, health_check.to_string());
    }
}

/// The Service's source ranges of `family`, as blocks; none when one of them is a `/0`, which
/// allows every source, as upstream (and `hash:ip,port,net` cannot hold a `/0`).
fn source_ranges(service: &Service, family: IpFamily) -> Vec<Cidr> {
    let ranges: Vec<Cidr> = service
        .load_balancer_source_ranges
        .iter()
        .filter(|range| family.contains(&range.address))
        .map(Cidr::network)
        .collect();
    if ranges.iter().any(|range| range.prefix == 0) {
        Vec::new()
    } else {
        ranges
    }
}

/// `ip,proto:port`.
fn ip_port(ip: IpAddr, protocol: Protocol, port: u16) -> String {
    format!("{ip},{protocol}:{port}")
}

/// `entry,ip`.
fn with_ip(entry: &str, ip: IpAddr) -> String {
    format!("{entry},{ip}")
}

/// `entry,net`, a single host's network as its bare address, as `ipset list` prints it.
fn with_net(entry: &str, net: Cidr) -> String {
    let host = if net.address.is_ipv4() { 32 } else { 128 };
    if net.prefix == host {
        format!("{entry},{}", net.address)
    } else {
        format!("{entry},{net}")
    }
}

/// The name of the set a changed set's new entries are built in before they are swapped in:
/// `KUBE-TMP-` and 16 characters of `base32(sha256(live))` (25 characters).
///
/// The hash keeps it within [`MAX_NAME_LEN`] whatever the live name, unique per live name (so
/// the IPv4 and IPv6 sets never share one), and never one of upstream's names. Being fixed per
/// live name, a temporary set left behind by an interrupted run is reused, not leaked.
#[must_use]
pub fn temporary_name(live: &str) -> String {
    let digest = Sha256::digest(live.as_bytes());
    let mut encoded = BASE32.encode(&digest);
    encoded.truncate(16);
    format!("KUBE-TMP-{encoded}")
}

/// The input of one `ipset restore` run that makes the kernel's sets `desired`, given the sets
/// it held after the last successful run (`previous`; `None` on the first run, after a failure,
/// or whenever the kernel's sets are not known).
///
/// Only the sets whose entries differ from `previous` are written (every set when it is
/// `None`); `None` when none differs, so the run can be skipped. Each written set is created
/// if missing (`create … -exist`), then either flushed, when it should be empty, or rebuilt in
/// [`temporary_name`] and swapped with the live set, which replaces its entries at once, and
/// the temporary set destroyed. Rules that match the live set never see it half filled.
///
/// `ipset restore` stops at the first failing line and keeps what it did before; a failed run
/// leaves the kernel's sets unknown, so the next run should pass `None`.
#[must_use]
pub fn restore_script(previous: Option<&IpSets>, desired: &IpSets) -> Option<String> {
    let mut script = String::new();
    for set in desired.iter() {
        let unchanged = previous
            .and_then(|previous| previous.iter().find(|p| p.name == set.name))
            .is_some_and(|p| p.set_type == set.set_type && p.entries == set.entries);
        if !unchanged {
            write_set(&mut script, set);
        }
    }
    (!script.is_empty()).then_some(script)
}

/// The lines that give the live `set` its entries.
fn write_set(script: &mut String, set: &IpSet) {
    use std::fmt::Write as _;
    let live = &set.name;
    let options = set.create_options();
    // Writing to a `String` cannot fail.
    let _ = writeln!(script, "create {live} {options} -exist");
    if set.entries.is_empty() {
        let _ = writeln!(script, "flush {live}");
        return;
    }
    let temporary = temporary_name(live);
    let _ = writeln!(script, "create {temporary} {options} -exist");
    let _ = writeln!(script, "flush {temporary}");
    for entry in &set.entries {
        let _ = writeln!(script, "add {temporary} {entry}");
    }
    let _ = writeln!(script, "swap {temporary} {live}");
    let _ = writeln!(script, "destroy {temporary}");
}

#[cfg(test)]
pub(crate) mod tests;
