//! The iptables rules kube-proxy's IPVS mode writes for one IP family, from its ipsets
//! ([`super::sets`]): masquerading, node ports, the load-balancer source-range firewall, and the
//! filter that keeps `kube-ipvs0` addresses from exposing the node's own ports.
//!
//! IPVS forwards, but netfilter still decides what is masqueraded and what is dropped. Rules
//! match sets (`-m set --match-set KUBE-CLUSTER-IP dst,dst`), so their number does not grow
//! with the cluster. The layout is upstream's (`pkg/proxy/ipvs/proxier.go`,
//! `writeIptablesRules`, `createAndLinkKubeChain`, `iptablesJumpChain`,
//! `ipsetWithIptablesChain`):
//!
//! ```text
//! PREROUTING/OUTPUT → KUBE-SERVICES ─┬─ from loopback: RETURN
//!                                    ├─ load-balancer IP:port → KUBE-LOAD-BALANCER (RETURN under eTP Local, else mark)
//!                                    ├─ cluster IP:port, external IP:port → KUBE-MARK-MASQ (per the node's options)
//!                                    ├─ dst LOCAL → KUBE-NODE-PORT (RETURN under eTP Local, else mark)
//!                                    └─ cluster and load-balancer IP:port: ACCEPT
//! POSTROUTING → KUBE-POSTROUTING: MASQUERADE hairpin traffic and what KUBE-MARK-MASQ marked
//! INPUT/FORWARD → KUBE-PROXY-FIREWALL → KUBE-SOURCE-RANGES-FIREWALL: DROP sources out of range
//! INPUT → KUBE-IPVS-FILTER: REJECT new connections to a kube-ipvs0 address on another port
//! OUTPUT → KUBE-IPVS-OUT-FILTER: DROP the node's connections to load-balancer IPs closed to it
//! ```
//!
//! A rule matching a set is written only while the set has entries, as upstream; the
//! `KUBE-IPVS-FILTER` rules and the health-check ACCEPT are written always. Every chain is
//! declared (`:CHAIN - [0:0]`), so `iptables-restore --noflush` replaces exactly these chains;
//! [`JUMPS`] are the rules that hook them into the built-in chains. Rules are written as
//! `iptables-save` prints them (negations and addresses first, protocols as numbers in the
//! `ipvs` match, REJECT with its ICMP type), but for `MARK --or-mark`/`--xor-mark`, kept as
//! the iptables mode writes them (saved as `--set-xmark`).

use super::sets::{IpSets, SetId};
use crate::IpFamily;
use crate::NodeOptions;
use crate::Protocol;
use crate::iptables::Jump;
use crate::iptables::render::{
    FilterRules, KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_POSTROUTING, KUBE_PROXY_FIREWALL,
    KUBE_SERVICES, NatRules, comment,
};
use crate::node_options::FamilyOptions;
use std::net::IpAddr;

/// The nat chain matching node ports (from [`KUBE_SERVICES`]), and the filter chain accepting
/// health-check node ports (from INPUT): the two tables share the name.
pub const KUBE_NODE_PORT: &str = "KUBE-NODE-PORT";
/// The nat chain load-balancer traffic goes through: RETURN under `externalTrafficPolicy:
/// Local`, else marked for masquerading.
pub const KUBE_LOAD_BALANCER: &str = "KUBE-LOAD-BALANCER";
/// The filter chain dropping load-balancer traffic from sources outside its ranges.
pub const KUBE_SOURCE_RANGES_FIREWALL: &str = "KUBE-SOURCE-RANGES-FIREWALL";
/// The filter chain rejecting new connections to `kube-ipvs0` addresses on ports that are not
/// Service ports (kubernetes#72236).
pub const KUBE_IPVS_FILTER: &str = "KUBE-IPVS-FILTER";
/// The filter chain dropping the node's own connections to load-balancer IPs whose source
/// ranges leave it out (kubernetes#119656).
pub const KUBE_IPVS_OUT_FILTER: &str = "KUBE-IPVS-OUT-FILTER";

/// The nat chains, in the order they are declared.
pub const NAT_CHAINS: [&str; 5] = [
    KUBE_SERVICES,
    KUBE_POSTROUTING,
    KUBE_NODE_PORT,
    KUBE_LOAD_BALANCER,
    KUBE_MARK_MASQ,
];

/// The filter chains, in the order they are declared.
pub const FILTER_CHAINS: [&str; 6] = [
    KUBE_FORWARD,
    KUBE_NODE_PORT,
    KUBE_PROXY_FIREWALL,
    KUBE_SOURCE_RANGES_FIREWALL,
    KUBE_IPVS_FILTER,
    KUBE_IPVS_OUT_FILTER,
];

const SERVICE_PORTALS: &str = "kubernetes service portals";
const FIREWALL: &str = "kube-proxy firewall rules";
const ACCESS_FILTER: &str = "kubernetes ipvs access filter";
/// KUBE-FORWARD's ACCEPT of marked traffic carries its jump's comment, as upstream's.
const FORWARDING: &str = "kubernetes forwarding rules";

/// The jumps into our chains, in upstream's order, none for new connections only; each is
/// inserted as its chain's first rule when missing (so with all missing, the last of a chain
/// ends up first).
pub(crate) const JUMPS: [Jump; 9] = [
    Jump::nat("OUTPUT", SERVICE_PORTALS, KUBE_SERVICES),
    Jump::nat("PREROUTING", SERVICE_PORTALS, KUBE_SERVICES),
    Jump::nat(
        "POSTROUTING",
        "kubernetes postrouting rules",
        KUBE_POSTROUTING,
    ),
    Jump::filter("FORWARD", false, FORWARDING, KUBE_FORWARD),
    Jump::filter(
        "INPUT",
        false,
        "kubernetes health check rules",
        KUBE_NODE_PORT,
    ),
    Jump::filter("INPUT", false, FIREWALL, KUBE_PROXY_FIREWALL),
    Jump::filter("FORWARD", false, FIREWALL, KUBE_PROXY_FIREWALL),
    Jump::filter("INPUT", false, ACCESS_FILTER, KUBE_IPVS_FILTER),
    Jump::filter("OUTPUT", false, ACCESS_FILTER, KUBE_IPVS_OUT_FILTER),
];

/// Both tables' `iptables-restore --noflush` payloads (`ip6tables-restore` for IPv6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsRules {
    /// The nat table, `*nat` to `COMMIT`.
    pub nat: NatRules,
    /// The filter table, `*filter` to `COMMIT`.
    pub filter: FilterRules,
}

/// Renders the nat and filter tables for `sets` (their family) under `options` (cluster CIDR,
/// masquerade-all).
///
/// Cluster-IP traffic is marked for masquerading when it comes from outside the family's
/// cluster CIDR, all of it with `masquerade_all`; with neither, only the node's connections
/// from a Service address (`src,dst`: the kernel picks a `kube-ipvs0` address as the source
/// when the node reaches a VIP), as upstream without a local-traffic detector.
#[must_use]
pub fn render(sets: &IpSets, options: &NodeOptions) -> IpvsRules {
    let options = FamilyOptions::new(sets.family(), options);
    IpvsRules {
        nat: render_nat(sets, &options),
        filter: render_filter(sets, &options),
    }
}

/// A rule jumping from `chain` to `target` for packets matching `set` with `flags`
/// (`dst,dst`…): what upstream writes for each set whose match is the whole rule.
struct SetRule {
    set: SetId,
    chain: &'static str,
    protocol: Option<Protocol>,
    flags: &'static str,
    target: &'static str,
}

const fn set_rule(
    set: SetId,
    chain: &'static str,
    protocol: Option<Protocol>,
    flags: &'static str,
    target: &'static str,
) -> SetRule {
    SetRule {
        set,
        chain,
        protocol,
        flags,
        target,
    }
}

/// The nat rules of `ipsetWithIptablesChain`, in its order: each eTP Local node-port set before
/// its catch-all one, so local traffic RETURNs before being marked.
const NAT_SET_RULES: [SetRule; 9] = [
    set_rule(
        SetId::LoopBack,
        KUBE_POSTROUTING,
        None,
        "dst,dst,src",
        "MASQUERADE",
    ),
    set_rule(
        SetId::LoadBalancer,
        KUBE_SERVICES,
        None,
        "dst,dst",
        KUBE_LOAD_BALANCER,
    ),
    set_rule(
        SetId::LoadBalancerLocal,
        KUBE_LOAD_BALANCER,
        None,
        "dst,dst",
        "RETURN",
    ),
    set_rule(
        SetId::NodePortLocalTcp,
        KUBE_NODE_PORT,
        Some(Protocol::Tcp),
        "dst",
        "RETURN",
    ),
    set_rule(
        SetId::NodePortTcp,
        KUBE_NODE_PORT,
        Some(Protocol::Tcp),
        "dst",
        KUBE_MARK_MASQ,
    ),
    set_rule(
        SetId::NodePortLocalUdp,
        KUBE_NODE_PORT,
        Some(Protocol::Udp),
        "dst",
        "RETURN",
    ),
    set_rule(
        SetId::NodePortUdp,
        KUBE_NODE_PORT,
        Some(Protocol::Udp),
        "dst",
        KUBE_MARK_MASQ,
    ),
    set_rule(
        SetId::NodePortLocalSctp,
        KUBE_NODE_PORT,
        Some(Protocol::Sctp),
        "dst,dst",
        "RETURN",
    ),
    set_rule(
        SetId::NodePortSctp,
        KUBE_NODE_PORT,
        Some(Protocol::Sctp),
        "dst,dst",
        KUBE_MARK_MASQ,
    ),
];

/// The filter rules of `ipsetWithIptablesChain`, in its order.
const FILTER_SET_RULES: [SetRule; 3] = [
    set_rule(
        SetId::LoadBalancerFw,
        KUBE_PROXY_FIREWALL,
        None,
        "dst,dst",
        KUBE_SOURCE_RANGES_FIREWALL,
    ),
    set_rule(
        SetId::LoadBalancerSourceCidr,
        KUBE_SOURCE_RANGES_FIREWALL,
        None,
        "dst,dst,src",
        "RETURN",
    ),
    set_rule(
        SetId::LoadBalancerSourceIp,
        KUBE_SOURCE_RANGES_FIREWALL,
        None,
        "dst,dst,src",
        "RETURN",
    ),
];

/// Our comment on the rules matching `set`.
fn set_comment(set: SetId) -> &'static str {
    match set {
        SetId::LoopBack => "endpoint reaching itself, to masquerade",
        SetId::ClusterIp => "cluster IP:port to masquerade",
        SetId::ExternalIp => "external IP:port",
        SetId::ExternalIpLocal => "external IP:port with eTP Local",
        SetId::LoadBalancer => "load-balancer IP:port",
        SetId::LoadBalancerLocal => "load-balancer IP:port with eTP Local",
        SetId::LoadBalancerFw => "load-balancer IP:port with source ranges",
        SetId::LoadBalancerSourceIp => "node reaching its own load-balancer IP:port",
        SetId::LoadBalancerSourceCidr => "load-balancer IP:port from an allowed range",
        SetId::NodePortTcp => "TCP node port",
        SetId::NodePortLocalTcp => "TCP node port with eTP Local",
        SetId::NodePortUdp => "UDP node port",
        SetId::NodePortLocalUdp => "UDP node port with eTP Local",
        SetId::NodePortSctp => "SCTP node port",
        SetId::NodePortLocalSctp => "SCTP node port with eTP Local",
        SetId::HealthCheckNodePort => "health check node port",
        SetId::IpvsIps => "kube-ipvs0 address",
    }
}

/// One table's payload as it is written.
struct Table {
    text: String,
    rules: usize,
}

impl Table {
    fn new(table: &str, chains: &[&str]) -> Self {
        let mut text = format!("*{table}\n");
        for chain in chains {
            text.push(':');
            text.push_str(chain);
            text.push_str(" - [0:0]\n");
        }
        Self { text, rules: 0 }
    }

    /// Appends `-A <chain> <rest>`.
    fn rule(&mut self, chain: &str, rest: &str) {
        self.text.push_str("-A ");
        self.text.push_str(chain);
        self.text.push(' ');
        self.text.push_str(rest);
        self.text.push('\n');
        self.rules += 1;
    }

    /// Appends the rules of `rules` whose set has entries.
    fn set_rules(&mut self, sets: &IpSets, rules: &[SetRule]) {
        for rule in rules.iter().filter(|rule| !is_empty(sets, rule.set)) {
            let protocol = rule
                .protocol
                .map(|protocol| format!("-p {protocol} "))
                .unwrap_or_default();
            self.rule(
                rule.chain,
                &format!(
                    "{protocol}{} {} -j {}",
                    comment_match(rule.set),
                    set_match(sets, rule.set, rule.flags),
                    rule.target
                ),
            );
        }
    }

    fn finish(mut self) -> (String, u32) {
        self.text.push_str("COMMIT\n");
        (self.text, u32::try_from(self.rules).unwrap_or(u32::MAX))
    }
}

fn render_nat(sets: &IpSets, options: &FamilyOptions) -> NatRules {
    let mut nat = Table::new("nat", &NAT_CHAINS);
    let loopback = match options.family {
        IpFamily::V4 => "127.0.0.0/8",
        IpFamily::V6 => "::1/128",
    };
    nat.rule(KUBE_SERVICES, &format!("-s {loopback} -j RETURN"));
    nat.set_rules(sets, &NAT_SET_RULES);

    if !is_empty(sets, SetId::ClusterIp) {
        let (source, flags) = match (options.masquerade_all, &options.local) {
            (true, _) => (String::new(), "dst,dst"),
            (false, Some(local)) => (format!("{} ", local.iptables_not()), "dst,dst"),
            // Without a detector only the node's own connections from a VIP are marked.
            (false, None) => (String::new(), "src,dst"),
        };
        nat.rule(
            KUBE_SERVICES,
            &format!(
                "{source}{} {} -j {KUBE_MARK_MASQ}",
                comment_match(SetId::ClusterIp),
                set_match(sets, SetId::ClusterIp, flags)
            ),
        );
    }

    for set in [SetId::ExternalIp, SetId::ExternalIpLocal] {
        if is_empty(sets, set) {
            continue;
        }
        let matched = format!("{} {}", comment_match(set), set_match(sets, set, "dst,dst"));
        // Under eTP Cluster external traffic is masqueraded; under Local it keeps its source.
        if set == SetId::ExternalIp {
            nat.rule(KUBE_SERVICES, &format!("{matched} -j {KUBE_MARK_MASQ}"));
        }
        // Accepted from off the node (not from a bridged pod nor a local process), and when the
        // address is the node's own.
        nat.rule(
            KUBE_SERVICES,
            &format!(
                "{matched} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"
            ),
        );
        nat.rule(
            KUBE_SERVICES,
            &format!("{matched} -m addrtype --dst-type LOCAL -j ACCEPT"),
        );
    }

    nat.rule(
        KUBE_SERVICES,
        &format!("-m addrtype --dst-type LOCAL -j {KUBE_NODE_PORT}"),
    );
    nat.rule(KUBE_LOAD_BALANCER, &format!("-j {KUBE_MARK_MASQ}"));
    // Last in KUBE-SERVICES: Service traffic is accepted, whatever rules follow in the table.
    for set in [SetId::ClusterIp, SetId::LoadBalancer] {
        if !is_empty(sets, set) {
            nat.rule(
                KUBE_SERVICES,
                &format!("{} -j ACCEPT", set_match(sets, set, "dst,dst")),
            );
        }
    }

    nat.rule(
        KUBE_POSTROUTING,
        &format!(
            "-m mark ! --mark {mark}/{mark} -j RETURN",
            mark = options.masquerade_mark
        ),
    );
    nat.rule(
        KUBE_POSTROUTING,
        &format!("-j MARK --xor-mark {}", options.masquerade_mark),
    );
    // As the iptables mode writes it.
    nat.rule(
        KUBE_POSTROUTING,
        &format!(
            "-m comment --comment {} -j MASQUERADE --random-fully",
            comment("kubernetes service traffic requiring SNAT")
        ),
    );
    nat.rule(
        KUBE_MARK_MASQ,
        &format!("-j MARK --or-mark {}", options.masquerade_mark),
    );
    let (payload, rule_count) = nat.finish();
    NatRules {
        payload,
        rule_count,
    }
}

fn render_filter(sets: &IpSets, options: &FamilyOptions) -> FilterRules {
    let mark = &options.masquerade_mark;
    let family = sets.family();
    let mut filter = Table::new("filter", &FILTER_CHAINS);
    filter.set_rules(sets, &FILTER_SET_RULES);
    filter.rule(KUBE_SOURCE_RANGES_FIREWALL, "-j DROP");

    for id in sets.closed_to_node() {
        let vip = host(id.address);
        filter.rule(
            KUBE_IPVS_OUT_FILTER,
            &format!(
                "-s {vip} -m ipvs --vproto {} --vaddr {vip} --vport {} -j DROP",
                protocol_number(id.protocol),
                id.port
            ),
        );
    }

    filter.rule(
        KUBE_FORWARD,
        &format!(
            "-m comment --comment {} -m mark --mark {mark}/{mark} -j ACCEPT",
            comment(FORWARDING)
        ),
    );
    filter.rule(
        KUBE_FORWARD,
        &format!(
            "-m comment --comment {} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            comment("kubernetes forwarding conntrack rule")
        ),
    );
    filter.rule(
        KUBE_NODE_PORT,
        &format!(
            "{} {} -j ACCEPT",
            comment_match(SetId::HealthCheckNodePort),
            set_match(sets, SetId::HealthCheckNodePort, "dst")
        ),
    );

    for (set, flags) in [
        (SetId::LoadBalancer, "dst,dst"),
        (SetId::ClusterIp, "dst,dst"),
        (SetId::ExternalIp, "dst,dst"),
        (SetId::ExternalIpLocal, "dst,dst"),
        (SetId::HealthCheckNodePort, "dst"),
    ] {
        filter.rule(
            KUBE_IPVS_FILTER,
            &format!("{} -j RETURN", set_match(sets, set, flags)),
        );
    }
    let reject = match family {
        IpFamily::V4 => "REJECT --reject-with icmp-port-unreachable",
        IpFamily::V6 => "REJECT --reject-with icmp6-port-unreachable",
    };
    filter.rule(
        KUBE_IPVS_FILTER,
        &format!(
            "-m conntrack --ctstate NEW {} -j {reject}",
            set_match(sets, SetId::IpvsIps, "dst")
        ),
    );
    let (payload, rule_count) = filter.finish();
    FilterRules {
        payload,
        rule_count,
    }
}

fn is_empty(sets: &IpSets, set: SetId) -> bool {
    sets.get(set).entries.is_empty()
}

/// `-m set --match-set <name> <flags>`, with the set's name in the family.
fn set_match(sets: &IpSets, set: SetId, flags: &str) -> String {
    format!("-m set --match-set {} {flags}", sets.get(set).name)
}

/// `-m comment --comment "<our comment on set>"`.
fn comment_match(set: SetId) -> String {
    format!("-m comment --comment {}", comment(set_comment(set)))
}

/// A single address as `iptables-save` prints it in `-s` and the `ipvs` match: with its full
/// prefix length.
fn host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(ip) => format!("{ip}/32"),
        IpAddr::V6(ip) => format!("{ip}/128"),
    }
}

/// The IP protocol number the `ipvs` match prints (`--vproto 6`).
fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

#[cfg(test)]
mod tests;
