//! The pure render step: a [`ProxyState`](crate::ProxyState) and an [`IpFamily`] in, the filter
//! and nat tables' `iptables-restore` (or `ip6tables-restore`) payloads out.
//!
//! The layout is kube-proxy's (`pkg/proxy/iptables/proxier.go`), so the troubleshooting operators
//! know (`iptables -t nat -L KUBE-SERVICES`) works unchanged:
//!
//! ```text
//! PREROUTING/OUTPUT → KUBE-SERVICES ─┬─ cluster IP:port ──────→ KUBE-SVC-… (or KUBE-SVL-… for iTP Local)
//!                                    ├─ external IP:port ─────→ KUBE-EXT-…
//!                                    ├─ load-balancer IP:port → KUBE-EXT-… (KUBE-FW-… with source ranges)
//!                                    └─ (last) dst LOCAL → KUBE-NODEPORTS → KUBE-EXT-…
//! KUBE-EXT-… → KUBE-SVC-… (eTP Cluster, masqueraded) or KUBE-SVL-… (eTP Local, client IP kept)
//! KUBE-SVC-…/KUBE-SVL-… → KUBE-SEP-… (DNAT), sticky clients first with session affinity
//! POSTROUTING → KUBE-POSTROUTING (MASQUERADE what KUBE-MARK-MASQ marked)
//! ```
//!
//! Which endpoints a port uses is [`crate::endpoints`]' decision; `plan` turns it into the
//! per-port choices both tables share. Ports without a usable endpoint get no nat rules;
//! [`render_filter`] REJECTs them instead (or DROPs, when only a `Local` traffic policy finds
//! none).
//!
//! [`RenderOptions`] carry the node's configuration beyond its state: kube-proxy's
//! `--cluster-cidr` (the `ClusterCIDR` local-traffic detector) and `--masquerade-all`, which decide
//! which cluster-IP traffic is masqueraded and whether pod traffic to an external destination
//! skips the `Local` traffic policy.
//!
//! As upstream's per-family proxiers, each render sees only its family's cluster IPs, external IPs,
//! load-balancer IPs, source ranges, endpoints and cluster CIDR; chain names and hashes do not
//! depend on the family, so both tables use the same names. [`render_filter`] and [`render_nat`]
//! render IPv4.
//!
//! Every chain written is declared (`:CHAIN - [0:0]`), which flushes it, so with
//! `iptables-restore --noflush` the payload replaces exactly the chains it names. Stale per-service
//! chains are declared too, then deleted with `-X`.

mod filter;
mod nat;
mod plan;

pub use filter::{FilterRules, render_filter, render_filter_for};
pub(crate) use filter::{ServiceFilter, assemble as assemble_filter};
pub(crate) use nat::{
    AssembledNat, Chain, ServiceNat, assemble as assemble_nat, assemble_full as assemble_nat_full,
};
pub use nat::{NatRules, render_nat, render_nat_for};

pub(crate) use plan::PortPlan;

use crate::Cidr;
use crate::conntrack::IpFamily;
use crate::local_traffic::{LocalMatch, PodInterfaces};
use std::net::IpAddr;

/// The nat chain every Service dispatch starts from (jumped to from PREROUTING and OUTPUT).
pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
/// The nat chain matching node ports; the last rule of [`KUBE_SERVICES`] jumps to it.
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
/// The nat chain that marks a packet for masquerading.
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
/// The nat chain that masquerades marked packets (jumped to from POSTROUTING).
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
/// kube-proxy's default `--iptables-masquerade-bit`: the mark 0x4000.
pub const DEFAULT_MASQUERADE_BIT: u8 = 14;
/// The filter chain rejecting cluster IPs without endpoints (jumped to from FORWARD and OUTPUT).
pub const FILTER_KUBE_SERVICES: &str = "KUBE-SERVICES";
/// The filter chain rejecting external IPs, load-balancer IPs and node ports without endpoints
/// (jumped to from INPUT and FORWARD).
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
/// The filter chain accepting forwarded Service traffic (jumped to from FORWARD).
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
/// The filter chain dropping load-balancer traffic from sources outside
/// `loadBalancerSourceRanges` (kube-proxy jumps to it from INPUT, OUTPUT and FORWARD, for new
/// connections).
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";

/// kubelet's filter chain, which kube-proxy writes too: with localhost node ports, it drops
/// packets to 127.0.0.0/8 from elsewhere that `route_localnet` would otherwise let in.
pub const KUBE_FIREWALL: &str = "KUBE-FIREWALL";

/// How the node is configured, beyond the Services it programs: what kube-proxy takes from
/// `--cluster-cidr` and `--masquerade-all`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderOptions {
    /// The cluster's pod CIDRs (`--cluster-cidr`). Traffic from inside one is pod traffic
    /// (kube-proxy's `ClusterCIDR` local-traffic detector): cluster-IP traffic from outside is
    /// masqueraded (`! -s <cidr> -j KUBE-MARK-MASQ` first in the Service chain), and pod traffic to
    /// an `externalTrafficPolicy: Local` destination goes to every endpoint, as if it had left the
    /// cluster and come back through a load balancer.
    ///
    /// kube-proxy takes one CIDR per IP family; each family's render uses the first CIDR of its
    /// family and ignores the rest. Empty (the default): no detector, so cluster-IP traffic from
    /// outside the cluster is not masqueraded, as upstream without one.
    pub cluster_cidrs: Vec<Cidr>,
    /// The fwmark bit that marks packets for masquerading (`masqueradeBit`, 0 to 31; default
    /// [`DEFAULT_MASQUERADE_BIT`]).
    pub masquerade_bit: u8,
    /// The interfaces pod traffic arrives on (`BridgeInterface`, `InterfaceNamePrefix`): when
    /// set, the detector instead of [`cluster_cidrs`](Self::cluster_cidrs).
    pub pod_interfaces: Option<PodInterfaces>,
    /// Masquerade every packet sent to a cluster IP, whatever its source (`--masquerade-all`);
    /// it wins over the cluster CIDR for cluster-IP traffic and changes nothing else. Off by
    /// default, as upstream.
    pub masquerade_all: bool,
    /// The node addresses that take node ports (`--nodeport-addresses`, resolved to the node's
    /// addresses); `None` (the default) for every local address, as upstream without the flag.
    /// A family's unspecified address (`0.0.0.0`, `::`) in the list stands for every local
    /// address of that family, as upstream's catch-all CIDR. Each family's render uses its own.
    pub node_port_addresses: Option<Vec<IpAddr>>,
    /// The node's own IPs (kube-proxy's node IP, `--bind-address`). When one is inside a
    /// Service's `loadBalancerSourceRanges`, connections from the load-balancer IPs themselves are
    /// accepted too: a node that holds its VIP as a local address reaches it from that address.
    /// Empty (the default): no such rule.
    pub node_ips: Vec<IpAddr>,
    /// Whether IPv4 node ports answer on the node's loopback addresses (kube-proxy's
    /// `localhostNodePorts`, on by default), when they are taken on every address: the agent
    /// sets `route_localnet` for them, and the filter table drops what else reaches
    /// 127.0.0.0/8 from outside. Off, and always in IPv6, the node-port jump leaves loopback
    /// out.
    pub localhost_node_ports: bool,
    /// Whether conntrack tracks TCP liberally (`nf_conntrack_tcp_be_liberal`, read when the
    /// agent starts, as upstream reads it): then `KUBE-FORWARD` drops no INVALID packets.
    pub tcp_be_liberal: bool,
}

impl Default for RenderOptions {
    /// kube-proxy's defaults: no detector, no masquerade-all, node ports on every local
    /// address, loopback included.
    fn default() -> Self {
        Self {
            cluster_cidrs: Vec::new(),
            masquerade_bit: DEFAULT_MASQUERADE_BIT,
            pod_interfaces: None,
            masquerade_all: false,
            node_port_addresses: None,
            node_ips: Vec::new(),
            localhost_node_ports: true,
            tcp_be_liberal: false,
        }
    }
}

impl RenderOptions {
    /// Sets [`localhost_node_ports`](Self::localhost_node_ports).
    #[must_use]
    pub fn with_localhost_node_ports(mut self, localhost: bool) -> Self {
        self.localhost_node_ports = localhost;
        self
    }

    /// Sets [`tcp_be_liberal`](Self::tcp_be_liberal).
    #[must_use]
    pub fn with_tcp_be_liberal(mut self, liberal: bool) -> Self {
        self.tcp_be_liberal = liberal;
        self
    }

    /// Sets [`cluster_cidrs`](Self::cluster_cidrs).
    #[must_use]
    pub fn with_cluster_cidrs(mut self, cidrs: impl IntoIterator<Item = Cidr>) -> Self {
        self.cluster_cidrs = cidrs.into_iter().collect();
        self
    }

    /// Sets [`masquerade_bit`](Self::masquerade_bit).
    #[must_use]
    pub fn with_masquerade_bit(mut self, bit: u8) -> Self {
        self.masquerade_bit = bit;
        self
    }

    /// Sets [`pod_interfaces`](Self::pod_interfaces).
    #[must_use]
    pub fn with_pod_interfaces(mut self, interfaces: Option<PodInterfaces>) -> Self {
        self.pod_interfaces = interfaces;
        self
    }

    /// Sets [`node_ips`](Self::node_ips).
    #[must_use]
    pub fn with_node_ips(mut self, ips: impl IntoIterator<Item = IpAddr>) -> Self {
        self.node_ips = ips.into_iter().collect();
        self
    }

    /// Sets [`masquerade_all`](Self::masquerade_all).
    #[must_use]
    pub fn with_masquerade_all(mut self, masquerade_all: bool) -> Self {
        self.masquerade_all = masquerade_all;
        self
    }

    /// Sets [`node_port_addresses`](Self::node_port_addresses).
    #[must_use]
    pub fn with_node_port_addresses(mut self, addresses: Option<Vec<IpAddr>>) -> Self {
        self.node_port_addresses = addresses;
        self
    }
}

/// [`RenderOptions`] as one family's render uses them: the addresses and CIDR of that family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FamilyOptions {
    /// The family rendered.
    pub family: IpFamily,
    /// [`RenderOptions::masquerade_all`].
    pub masquerade_all: bool,
    /// The masquerade mark as the tools print it (`0x4000`).
    pub masquerade_mark: String,
    /// How the family's pod traffic is told apart (the local-traffic detector), if it is.
    pub local: Option<LocalMatch>,
    /// The family's addresses taking node ports; `None` for every local address of the family.
    pub node_port_addresses: Option<Vec<IpAddr>>,
    /// The node's addresses of the family ([`RenderOptions::node_ips`]).
    pub node_ips: Vec<IpAddr>,
    /// [`RenderOptions::localhost_node_ports`], in IPv4 only.
    pub localhost_node_ports: bool,
    /// [`RenderOptions::tcp_be_liberal`].
    pub tcp_be_liberal: bool,
}

impl FamilyOptions {
    /// `options` for the `family` render.
    pub fn new(family: IpFamily, options: &RenderOptions) -> Self {
        let of_family = |ips: &[IpAddr]| -> Vec<IpAddr> {
            ips.iter()
                .copied()
                .filter(|ip| family.contains(ip))
                .collect()
        };
        let node_port_addresses = options
            .node_port_addresses
            .as_deref()
            .map(of_family)
            .filter(|ips| !ips.iter().any(IpAddr::is_unspecified));
        Self {
            family,
            masquerade_all: options.masquerade_all,
            masquerade_mark: format!("{:#x}", 1_u32 << (options.masquerade_bit & 31)),
            local: LocalMatch::for_family(
                family,
                options.pod_interfaces.as_ref(),
                &options.cluster_cidrs,
            ),
            // As upstream: only when node ports are taken on every address, loopback included.
            localhost_node_ports: family == IpFamily::V4
                && options.localhost_node_ports
                && node_port_addresses.is_none(),
            node_port_addresses,
            node_ips: of_family(&options.node_ips),
            tcp_be_liberal: options.tcp_be_liberal,
        }
    }
}

/// What one Service adds to a family's nat and filter tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServiceRules {
    /// Its nat rules and chains.
    pub nat: ServiceNat,
    /// Its filter rules.
    pub filter: ServiceFilter,
}

/// Renders `service` for `options.family`. As upstream's per-family service tracker, a Service
/// without a cluster IP of the family gets no rule at all, not even a REJECT for its node port.
pub(crate) fn render_service(service: &crate::Service, options: &FamilyOptions) -> ServiceRules {
    let mut rules = ServiceRules::default();
    if !service
        .cluster_ips
        .iter()
        .any(|ip| options.family.contains(ip))
    {
        return rules;
    }
    for port in &service.ports {
        let plan = PortPlan::new(service, port, options.family);
        rules.nat.add(&plan, options);
        rules.filter.add(&plan);
    }
    rules
}

/// One table's `iptables-restore` input as it is written, from `*table` to `COMMIT`, and how
/// many rules it holds. Lines go straight into the text: a sync at tens of thousands of rules
/// copies each line once.
struct TableText {
    text: String,
    rules: usize,
}

impl TableText {
    fn new(table: &str) -> Self {
        Self {
            text: format!("*{table}\n"),
            rules: 0,
        }
    }

    /// Declares `chain`, which creates or flushes it.
    fn declare(&mut self, chain: &str) {
        self.text.push(':');
        self.text.push_str(chain);
        self.text.push_str(" - [0:0]\n");
    }

    /// Appends a `-A …` line.
    fn rule(&mut self, rule: &str) {
        self.text.push_str(rule);
        self.text.push('\n');
        self.rules += 1;
    }

    fn rules<'a>(&mut self, rules: impl IntoIterator<Item = &'a String>) {
        for rule in rules {
            self.rule(rule);
        }
    }

    /// Deletes `chain`, declared before.
    fn delete(&mut self, chain: &str) {
        self.text.push_str("-X ");
        self.text.push_str(chain);
        self.text.push('\n');
    }

    /// The payload, closed with `COMMIT`, and its rule count.
    fn finish(mut self) -> (String, u32) {
        self.text.push_str("COMMIT\n");
        (self.text, u32::try_from(self.rules).unwrap_or(u32::MAX))
    }
}

/// The REJECT target: the ICMP error each family's tool defaults to, written out for IPv6 so the
/// payload reads as `ip6tables-save` prints it (IPv4 keeps kube-proxy's plain `REJECT`).
fn reject(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "REJECT",
        IpFamily::V6 => "REJECT --reject-with icmp6-port-unreachable",
    }
}

/// The `--probability` of picking one of `remaining` endpoints, as Go's `%0.10f` prints it.
fn probability(remaining: usize) -> String {
    // Endpoint counts are far below 2^52, so the conversion is exact.
    let remaining = remaining as f64;
    format!("{:.10}", 1.0 / remaining)
}

/// A `--comment` argument as kube-proxy writes it: quoted only when it contains whitespace.
pub(crate) fn comment(text: &str) -> String {
    if text.contains(char::is_whitespace) {
        format!("\"{text}\"")
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn probability_is_printed_with_ten_decimals() {
        assert_eq!(probability(3), "0.3333333333");
        assert_eq!(probability(2), "0.5000000000");
        assert_eq!(probability(7), "0.1428571429");
        assert_eq!(probability(1), "1.0000000000");
    }

    #[test]
    fn the_first_cluster_cidr_of_each_family_is_used_with_its_host_bits_cleared() {
        let mixed = [
            "fd00:10:244:7::1/48",
            "10.244.7.1/16",
            "10.0.0.0/8",
            "fd00::/8",
        ];
        let everything = ["1.2.3.4/0", "fd00::1/0"];
        let hosts = ["1.2.3.4/32", "fd00::1/128"];
        for (cidrs, family, expected) in [
            (&mixed[..], IpFamily::V4, Some("10.244.0.0/16")),
            (&mixed[..], IpFamily::V6, Some("fd00:10:244::/48")),
            (&everything[..], IpFamily::V4, Some("0.0.0.0/0")),
            (&everything[..], IpFamily::V6, Some("::/0")),
            (&hosts[..], IpFamily::V4, Some("1.2.3.4/32")),
            (&hosts[..], IpFamily::V6, Some("fd00::1/128")),
            (&["10.0.0.0/8"][..], IpFamily::V6, None),
            (&[][..], IpFamily::V4, None),
        ] {
            let options = RenderOptions::default()
                .with_cluster_cidrs(cidrs.iter().map(|cidr| cidr.parse().unwrap()));
            let local = FamilyOptions::new(family, &options).local;
            assert_eq!(
                local.as_ref().map(LocalMatch::iptables),
                expected.map(|cidr| format!("-s {cidr}")),
                "{cidrs:?} {family:?}"
            );
        }
    }

    #[test]
    fn comments_are_quoted_only_when_they_contain_spaces() {
        assert_eq!(comment("ns1/svc1:p80"), "ns1/svc1:p80");
        assert_eq!(
            comment("ns1/svc1:p80 cluster IP"),
            "\"ns1/svc1:p80 cluster IP\""
        );
    }
}
