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
//! Which endpoints a port uses is [`crate::endpoints`]' decision; `port_plan` turns it into the
//! per-port choices every mode and both tables share, and `chains` names the port's chains. Ports without a usable endpoint get no nat rules;
//! [`render_filter`] REJECTs them instead (or DROPs, when only a `Local` traffic policy finds
//! none).
//!
//! [`NodeOptions`](crate::NodeOptions) carry the node's configuration beyond its state: kube-proxy's
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

mod chains;
mod filter;
mod nat;

pub use filter::{FilterRules, render_filter, render_filter_for};
pub(crate) use filter::{ServiceFilter, assemble as assemble_filter};
pub(crate) use nat::{
    AssembledNat, Chain, ServiceNat, assemble as assemble_nat, assemble_full as assemble_nat_full,
};
pub use nat::{NatRules, render_nat, render_nat_for};

use crate::port_plan::PortPlan;
use chains::PortChains;

use crate::IpFamily;
use crate::node_options::FamilyOptions;

/// The nat chain every Service dispatch starts from (jumped to from PREROUTING and OUTPUT).
pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
/// The nat chain matching node ports; the last rule of [`KUBE_SERVICES`] jumps to it.
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
/// The nat chain that marks a packet for masquerading.
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
/// The nat chain that masquerades marked packets (jumped to from POSTROUTING).
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
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
        let plan = PortChains::new(PortPlan::new(service, port, options.family));
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
    use crate::NodeOptions;
    use crate::local_traffic::LocalMatch;

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
            let options = NodeOptions::default()
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
