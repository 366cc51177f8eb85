//! The fixed part of the table: base chains on the netfilter hooks, the dispatch and check
//! chains they jump to, and the sets and verdict maps Services fill.
//!
//! Hooks and priorities are kube-proxy's: the load-balancer source-range firewall runs before
//! DNAT (`dstnat - 10` on prerouting and output), DNAT at `dstnat` (-100), masquerading at
//! `srcnat` (100), and the drop and reject checks at `filter` priority (0) on input, forward and
//! output, where `reject` is allowed on every kernel.

use super::{Container, Options};
use crate::IpFamily;
use crate::nftables::script::{Script, address_type, family_keyword};
use std::fmt::Write as _;

/// The base chains: name, type, hook, priority.
const BASE_CHAINS: [(&str, &str, &str, i32); 8] = [
    (FILTER_PREROUTING_PRE_DNAT, "filter", "prerouting", -110),
    (FILTER_OUTPUT_PRE_DNAT, "filter", "output", -110),
    (FILTER_INPUT, "filter", "input", 0),
    (FILTER_FORWARD, "filter", "forward", 0),
    (FILTER_OUTPUT, "filter", "output", 0),
    (NAT_PREROUTING, "nat", "prerouting", -100),
    (NAT_OUTPUT, "nat", "output", -100),
    (NAT_POSTROUTING, "nat", "postrouting", 100),
];

const FILTER_PREROUTING_PRE_DNAT: &str = "filter-prerouting-pre-dnat";
const FILTER_OUTPUT_PRE_DNAT: &str = "filter-output-pre-dnat";
const FILTER_INPUT: &str = "filter-input";
const FILTER_FORWARD: &str = "filter-forward";
const FILTER_OUTPUT: &str = "filter-output";
const NAT_PREROUTING: &str = "nat-prerouting";
const NAT_OUTPUT: &str = "nat-output";
const NAT_POSTROUTING: &str = "nat-postrouting";

/// The chain dispatching Service traffic to the Services' chains.
pub const SERVICES: &str = "services";
/// The chain masquerading marked and hairpin traffic.
pub const MASQUERADING: &str = "masquerading";
/// The chain dropping or rejecting traffic to Service IPs no endpoint takes.
pub const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
/// The chain dropping or rejecting traffic to node ports no endpoint takes.
pub const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
/// The chain sending load-balancer traffic with source ranges to its `firewall-…` chain.
pub const FIREWALL_CHECK: &str = "firewall-check";
/// The chain rejecting undefined ports of cluster IPs and dropping unallocated cluster IPs.
pub const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
/// The chain a no-endpoint verdict map element goes to, to reject (a map element cannot).
pub const REJECT_CHAIN: &str = "reject-chain";

/// The regular chains of the fixed part, and what follows their names when created.
const REGULAR_CHAINS: [(&str, &str); 7] = [
    (NODEPORT_ENDPOINTS_CHECK, ""),
    (SERVICE_ENDPOINTS_CHECK, ""),
    (FIREWALL_CHECK, ""),
    (SERVICES, ""),
    (MASQUERADING, ""),
    (CLUSTER_IPS_CHECK, ""),
    (
        REJECT_CHAIN,
        " { comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }",
    ),
];

/// The jumps from base chains: from, condition, to; in upstream's order.
const JUMPS: [(&str, &str, &str); 11] = [
    (FILTER_INPUT, "ct state new ", NODEPORT_ENDPOINTS_CHECK),
    (FILTER_INPUT, "ct state new ", SERVICE_ENDPOINTS_CHECK),
    (FILTER_FORWARD, "ct state new ", SERVICE_ENDPOINTS_CHECK),
    (FILTER_OUTPUT, "ct state new ", SERVICE_ENDPOINTS_CHECK),
    (FILTER_PREROUTING_PRE_DNAT, "ct state new ", FIREWALL_CHECK),
    (FILTER_OUTPUT_PRE_DNAT, "ct state new ", FIREWALL_CHECK),
    (NAT_OUTPUT, "", SERVICES),
    (NAT_PREROUTING, "", SERVICES),
    (NAT_POSTROUTING, "", MASQUERADING),
    (FILTER_FORWARD, "ct state new ", CLUSTER_IPS_CHECK),
    (FILTER_OUTPUT, "ct state new ", CLUSTER_IPS_CHECK),
];

/// Whether `name` is one of the fixed part's chains.
pub(crate) fn is_fixed_chain(name: &str) -> bool {
    BASE_CHAINS.iter().any(|(base, ..)| *base == name)
        || REGULAR_CHAINS.iter().any(|(regular, _)| *regular == name)
}

/// The fixed part of one family's table, as a full sync writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Skeleton {
    /// The commands that create the table if needed and reset it to the fixed part: every
    /// chain's rules flushed (the Services' too), the base chains created again (so a changed
    /// hook or priority applies), every fixed set and map emptied, the fixed rules and the
    /// node-port addresses written. Affinity sets keep their clients.
    pub script: String,
    /// Rules in the fixed chains.
    pub rules: usize,
    /// Fixed chains.
    pub chains: usize,
    /// Elements of the fixed sets the skeleton fills (`nodeport-ips`).
    pub elements: usize,
}

impl Skeleton {
    /// The fixed part for `options`.
    pub(crate) fn new(options: &Options) -> Self {
        let family = options.family();
        let common = options.common();
        let ip = family_keyword(family);
        let mut script = Script::new(family);
        script.add_table();
        script.flush_table();
        // Deleted and created again: an existing base chain's hook or priority cannot change.
        for (name, ..) in BASE_CHAINS {
            script.add_chain(name, "");
            script.delete_chain(name);
        }
        for (name, kind, hook, priority) in BASE_CHAINS {
            script.add_chain(
                name,
                &format!(" {{ type {kind} hook {hook} priority {priority} ; }}"),
            );
        }
        for (name, spec) in REGULAR_CHAINS {
            script.add_chain(name, spec);
        }

        // `None` takes node ports on every local address; otherwise only on those listed (of
        // the family, loopback left out: nftables mode has no localhost node ports).
        let node_port_ips: Option<Vec<_>> = common.node_port_addresses.as_ref().map(|ips| {
            let mut unique = Vec::new();
            for ip in ips.iter().filter(|ip| !ip.is_loopback()) {
                if !unique.contains(ip) {
                    unique.push(*ip);
                }
            }
            unique
        });
        for container in Container::ALL {
            script.add_set(
                container.kind(),
                &container.name(),
                &definition(container, family),
            );
            match (container, &node_port_ips) {
                (Container::NodePortIps, None) => {
                    script.delete_set(container.kind(), &container.name());
                }
                _ => script.flush_set(container.kind(), &container.name()),
            }
        }

        let mut rules = 0;
        let mut rule = |script: &mut Script, chain: &str, text: &str| {
            script.add_rule(chain, text);
            rules += 1;
        };
        for (from, condition, to) in JUMPS {
            rule(&mut script, from, &format!("{condition}jump {to}"));
        }
        let localhost = match family {
            IpFamily::V4 => "127.0.0.0/8",
            IpFamily::V6 => "::1",
        };
        // Which destinations take node ports: every local address but loopback, or those in
        // `nodeport-ips`; the input hook's check needs no `fib` (its traffic is local).
        let (node_ports, node_port_check) = match &node_port_ips {
            None => (
                format!("fib daddr type local {ip} daddr != {localhost}"),
                format!("{ip} daddr != {localhost}"),
            ),
            Some(_) => {
                let listed = format!("{ip} daddr @{}", Container::NodePortIps.name());
                (listed.clone(), listed)
            }
        };
        let dispatch = format!("{ip} daddr . meta l4proto . th dport vmap");
        if common.masquerade_all {
            rule(
                &mut script,
                SERVICES,
                &format!(
                    "{ip} daddr @cluster-ips mark set mark or {} comment \"masquerade all clusterIP traffic\"",
                    common.masquerade_mark
                ),
            );
        } else if let Some(local) = &common.local {
            rule(
                &mut script,
                SERVICES,
                &format!(
                    "{ip} daddr @cluster-ips {} mark set mark or {} comment \"masquerade clusterIP traffic from outside cluster\"",
                    local.nft_not(),
                    common.masquerade_mark
                ),
            );
        }
        rule(&mut script, SERVICES, &format!("{dispatch} @service-ips"));
        rule(
            &mut script,
            SERVICES,
            &format!("{node_ports} meta l4proto . th dport vmap @service-nodeports"),
        );
        rule(
            &mut script,
            SERVICE_ENDPOINTS_CHECK,
            &format!("{dispatch} @no-endpoint-services"),
        );
        rule(
            &mut script,
            NODEPORT_ENDPOINTS_CHECK,
            &format!("{node_port_check} meta l4proto . th dport vmap @no-endpoint-nodeports"),
        );
        rule(
            &mut script,
            FIREWALL_CHECK,
            &format!("{dispatch} @firewall-ips"),
        );
        rule(
            &mut script,
            CLUSTER_IPS_CHECK,
            &format!(
                "{ip} daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\""
            ),
        );
        if !options.service_cidrs().is_empty() {
            let mut cidrs = String::new();
            for (i, cidr) in options.service_cidrs().iter().enumerate() {
                let separator = if i == 0 { "" } else { ", " };
                // Writing to a String cannot fail.
                let _ = write!(cidrs, "{separator}{cidr}");
            }
            rule(
                &mut script,
                CLUSTER_IPS_CHECK,
                &format!(
                    "{ip} daddr {{ {cidrs} }} drop comment \"Drop traffic to unallocated ClusterIPs\""
                ),
            );
        }
        rule(
            &mut script,
            MASQUERADING,
            &format!(
                "mark and {mark} != 0 mark set mark xor {mark} masquerade fully-random",
                mark = common.masquerade_mark
            ),
        );
        rule(
            &mut script,
            MASQUERADING,
            &format!(
                "ct status dnat {ip} saddr . {ip} daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random"
            ),
        );
        rule(&mut script, REJECT_CHAIN, "reject");

        let node_port_elements: Vec<super::Element> = node_port_ips
            .iter()
            .flatten()
            .map(|ip| super::Element {
                container: Container::NodePortIps,
                key: ip.to_string().into(),
                comment: None,
                value: None,
            })
            .collect();
        script.add_elements(&node_port_elements);
        let elements = node_port_elements.len();
        Self {
            script: script.into_text(),
            rules,
            chains: BASE_CHAINS.len() + REGULAR_CHAINS.len(),
            elements,
        }
    }
}

/// What follows a shared set's or map's name when it is created: its type and comment.
pub(crate) fn definition(container: Container, family: IpFamily) -> String {
    let address = address_type(family);
    let (kind, comment) = match container {
        // Typed after the expressions that use it: nft has no named type for numgen's numbers.
        Container::Endpoints(map) => {
            let ip = family_keyword(family);
            let protocol = map.protocol();
            return format!(
                " {{ typeof numgen random mod 1 : {ip} daddr . {protocol} dport ; comment \"endpoints of the {protocol} Service ports picking from {map}\" ; }}"
            );
        }
        Container::ClusterIps => (address.to_owned(), "Active ClusterIPs"),
        Container::NodePortIps => (address.to_owned(), "IPs that accept NodePort traffic"),
        Container::HairpinConnections => (
            format!("{address} . {address} . inet_proto . inet_service"),
            "service hairpin connections",
        ),
        Container::FirewallIps => (
            format!("{address} . inet_proto . inet_service : verdict"),
            "destinations that are subject to LoadBalancerSourceRanges",
        ),
        Container::NoEndpointNodePorts => (
            "inet_proto . inet_service : verdict".to_owned(),
            "vmap to drop or reject packets to service nodeports with no endpoints",
        ),
        Container::NoEndpointServices => (
            format!("{address} . inet_proto . inet_service : verdict"),
            "vmap to drop or reject packets to services with no endpoints",
        ),
        Container::ServiceIps => (
            format!("{address} . inet_proto . inet_service : verdict"),
            "ClusterIP, ExternalIP and LoadBalancer IP traffic",
        ),
        Container::ServiceNodePorts => (
            "inet_proto . inet_service : verdict".to_owned(),
            "NodePort traffic",
        ),
    };
    format!(" {{ type {kind} ; comment \"{comment}\" ; }}")
}
