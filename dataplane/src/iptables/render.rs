//! The pure render step: a [`ProxyState`] in, the nat table's `iptables-restore` payload out.
//!
//! The layout is kube-proxy's (`pkg/proxy/iptables/proxier.go`), so the troubleshooting operators
//! know (`iptables -t nat -L KUBE-SERVICES`) works unchanged:
//!
//! ```text
//! PREROUTING/OUTPUT → KUBE-SERVICES ─┬─ cluster IP:port → KUBE-SVC-… → KUBE-SEP-… (DNAT)
//!                                    └─ (last) dst LOCAL → KUBE-NODEPORTS → KUBE-EXT-… → KUBE-SVC-…
//! POSTROUTING → KUBE-POSTROUTING (MASQUERADE what KUBE-MARK-MASQ marked)
//! ```
//!
//! Ports without a usable endpoint get no nat rules; [`render_filter`] REJECTs them instead.
//!
//! Every chain written is declared (`:CHAIN - [0:0]`), which flushes it, so with
//! `iptables-restore --noflush` the payload replaces exactly the chains it names. Stale per-service
//! chains are declared too, then deleted with `-X`.

use super::chain_names::{endpoint_chain, external_chain, is_owned, service_chain};
use crate::{Endpoint, ProxyState, Service, ServicePort};
use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr},
};

/// The nat chain every Service dispatch starts from (jumped to from PREROUTING and OUTPUT).
pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
/// The nat chain matching node ports; the last rule of [`KUBE_SERVICES`] jumps to it.
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
/// The nat chain that marks a packet for masquerading.
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
/// The nat chain that masquerades marked packets (jumped to from POSTROUTING).
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
/// The masquerade mark: bit 14, kube-proxy's default `--iptables-masquerade-bit`.
pub const MASQUERADE_MARK: &str = "0x4000";
/// The filter chain rejecting cluster IPs without endpoints (jumped to from FORWARD and OUTPUT).
pub const FILTER_KUBE_SERVICES: &str = "KUBE-SERVICES";
/// The filter chain rejecting node ports without endpoints (jumped to from INPUT and FORWARD).
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
/// The filter chain accepting forwarded Service traffic (jumped to from FORWARD).
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";

/// The rendered filter table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterRules {
    /// The `iptables-restore` input, from `*filter` to `COMMIT`, ending with a newline.
    pub payload: String,
    /// The number of rules (`-A` lines) in [`payload`](Self::payload).
    pub rule_count: u32,
}

/// Renders the IPv4 filter table for `state`: a REJECT for every Service port without a usable
/// endpoint (on its cluster IPs, and on its node port for traffic to the node), so clients are
/// refused at once instead of timing out, and kube-proxy's forwarding rules.
///
/// Every chain here is kube-proxy's fixed set and is rewritten whole on each sync.
#[must_use]
pub fn render_filter(state: &ProxyState) -> FilterRules {
    let mut services = Vec::new();
    let mut external = Vec::new();
    for service in state.services.values() {
        for port in service
            .ports
            .iter()
            .filter(|p| usable_endpoints(p).is_empty())
        {
            let port_name = port.port_name(&service.key);
            let proto = port.protocol.as_str();
            let why = comment(&format!("{port_name} has no endpoints"));
            for ip in service.cluster_ips.iter().filter_map(ipv4) {
                services.push(format!(
                    "-A {FILTER_KUBE_SERVICES} -m comment --comment {why} -m {proto} -p {proto} -d {ip} --dport {} -j REJECT",
                    port.port
                ));
            }
            if let Some(node_port) = port.node_port {
                external.push(format!(
                    "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {why} -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {node_port} -j REJECT"
                ));
            }
        }
    }
    let mut lines = vec!["*filter".to_owned()];
    for chain in [FILTER_KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD] {
        lines.push(format!(":{chain} - [0:0]"));
    }
    let first_rule = lines.len();
    lines.extend(services);
    lines.extend(external);
    lines.push(format!(
        "-A {KUBE_FORWARD} -m conntrack --ctstate INVALID -j DROP"
    ));
    lines.push(format!(
        "-A {KUBE_FORWARD} -m comment --comment {} -m mark --mark {MASQUERADE_MARK}/{MASQUERADE_MARK} -j ACCEPT",
        comment("kubernetes forwarding rules"),
    ));
    lines.push(format!(
        "-A {KUBE_FORWARD} -m comment --comment {} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        comment("kubernetes forwarding conntrack rule"),
    ));
    let rule_count = lines.len() - first_rule;
    lines.push("COMMIT".to_owned());
    let mut payload = lines.join("\n");
    payload.push('\n');
    FilterRules {
        payload,
        rule_count: u32::try_from(rule_count).unwrap_or(u32::MAX),
    }
}

/// The rendered nat table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatRules {
    /// The `iptables-restore` input, from `*nat` to `COMMIT`, ending with a newline.
    pub payload: String,
    /// The number of rules (`-A` lines) in [`payload`](Self::payload).
    pub rule_count: u32,
}

/// Renders the IPv4 nat table for `state`.
///
/// `existing_chains` are the nat chain names now in the kernel (any chains: only splitproxy-owned
/// per-service ones, see [`is_owned`], are looked at); those this render does not write are
/// flushed and deleted.
///
/// A Service port is rendered only when it has at least one ready IPv4 endpoint; IPv6 cluster IPs
/// and endpoints are skipped.
#[must_use]
pub fn render_nat(state: &ProxyState, existing_chains: &BTreeSet<String>) -> NatRules {
    let mut nat = NatTable::default();
    for service in state.services.values() {
        for port in &service.ports {
            nat.add_service_port(service, port);
        }
    }
    nat.finish(existing_chains)
}

/// The nat table while it is being rendered: declared chains and rules, per section.
#[derive(Default)]
struct NatTable {
    /// Per-service chains in the order they are written.
    chains: Vec<String>,
    /// `chains` as a set, so a chain is declared once.
    written: BTreeSet<String>,
    /// Rules of `KUBE-SERVICES`, before the final jump to `KUBE-NODEPORTS`.
    services: Vec<String>,
    /// Rules of `KUBE-NODEPORTS`.
    nodeports: Vec<String>,
    /// Rules of the per-service chains.
    service_rules: Vec<String>,
}

impl NatTable {
    fn declare(&mut self, chain: &str) {
        if self.written.insert(chain.to_owned()) {
            self.chains.push(chain.to_owned());
        }
    }

    fn add_service_port(&mut self, service: &Service, port: &ServicePort) {
        let endpoints = usable_endpoints(port);
        if endpoints.is_empty() {
            // Rejected in the filter table instead (`render_filter`).
            return;
        }
        let port_name = port.port_name(&service.key);
        let proto = port.protocol.as_str();
        let svc_chain = service_chain(&port_name, port.protocol);

        for ip in service.cluster_ips.iter().filter_map(ipv4) {
            self.services.push(format!(
                "-A {KUBE_SERVICES} -m comment --comment {} -m {proto} -p {proto} -d {ip} --dport {} -j {svc_chain}",
                comment(&format!("{port_name} cluster IP")),
                port.port,
            ));
        }

        self.declare(&svc_chain);
        let count = endpoints.len();
        for (i, endpoint) in endpoints.iter().enumerate() {
            let target = endpoint.socket_string();
            let sep_chain = endpoint_chain(&port_name, port.protocol, &target);
            let statistic = if i + 1 < count {
                format!(
                    " -m statistic --mode random --probability {}",
                    probability(count - i)
                )
            } else {
                String::new()
            };
            self.service_rules.push(format!(
                "-A {svc_chain} -m comment --comment {}{statistic} -j {sep_chain}",
                comment(&format!("{port_name} -> {target}")),
            ));
        }
        for endpoint in &endpoints {
            let target = endpoint.socket_string();
            let sep_chain = endpoint_chain(&port_name, port.protocol, &target);
            self.declare(&sep_chain);
            let name = comment(&port_name);
            self.service_rules.push(format!(
                "-A {sep_chain} -m comment --comment {name} -s {} -j {KUBE_MARK_MASQ}",
                endpoint.ip,
            ));
            self.service_rules.push(format!(
                "-A {sep_chain} -m comment --comment {name} -m {proto} -p {proto} -j DNAT --to-destination {target}",
            ));
        }

        if let Some(node_port) = port.node_port {
            let ext_chain = external_chain(&port_name, port.protocol);
            self.declare(&ext_chain);
            self.nodeports.push(format!(
                "-A {KUBE_NODEPORTS} -m comment --comment {} -m {proto} -p {proto} --dport {node_port} -j {ext_chain}",
                comment(&port_name),
            ));
            // externalTrafficPolicy: Cluster — masquerade everything, then pick any endpoint.
            self.service_rules.push(format!(
                "-A {ext_chain} -m comment --comment {} -j {KUBE_MARK_MASQ}",
                comment(&format!(
                    "masquerade traffic for {port_name} external destinations"
                )),
            ));
            self.service_rules
                .push(format!("-A {ext_chain} -j {svc_chain}"));
        }
    }

    fn finish(self, existing_chains: &BTreeSet<String>) -> NatRules {
        let stale: Vec<&String> = existing_chains
            .iter()
            .filter(|chain| is_owned(chain) && !self.written.contains(*chain))
            .collect();

        let mut lines = vec!["*nat".to_owned()];
        for chain in [
            KUBE_SERVICES,
            KUBE_NODEPORTS,
            KUBE_MARK_MASQ,
            KUBE_POSTROUTING,
        ]
        .into_iter()
        .chain(self.chains.iter().map(String::as_str))
        .chain(stale.iter().map(|chain| chain.as_str()))
        {
            lines.push(format!(":{chain} - [0:0]"));
        }
        let first_rule = lines.len();

        lines.extend(self.services);
        lines.push(format!(
            "-A {KUBE_SERVICES} -m comment --comment {} -m addrtype --dst-type LOCAL -j {KUBE_NODEPORTS}",
            comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain"),
        ));
        lines.extend(self.nodeports);
        lines.push(format!(
            "-A {KUBE_MARK_MASQ} -j MARK --or-mark {MASQUERADE_MARK}"
        ));
        lines.push(format!(
            "-A {KUBE_POSTROUTING} -m mark ! --mark {MASQUERADE_MARK}/{MASQUERADE_MARK} -j RETURN"
        ));
        lines.push(format!(
            "-A {KUBE_POSTROUTING} -j MARK --xor-mark {MASQUERADE_MARK}"
        ));
        lines.push(format!(
            "-A {KUBE_POSTROUTING} -m comment --comment {} -j MASQUERADE --random-fully",
            comment("kubernetes service traffic requiring SNAT"),
        ));
        lines.extend(self.service_rules);
        let rule_count = lines.len() - first_rule;

        lines.extend(stale.iter().map(|chain| format!("-X {chain}")));
        lines.push("COMMIT".to_owned());

        let mut payload = lines.join("\n");
        payload.push('\n');
        NatRules {
            payload,
            rule_count: u32::try_from(rule_count).unwrap_or(u32::MAX),
        }
    }
}

/// The endpoints that receive new connections: ready, IPv4, each address:port once.
fn usable_endpoints(port: &ServicePort) -> Vec<&Endpoint> {
    let mut seen = BTreeSet::new();
    port.endpoints
        .iter()
        .filter(|endpoint| endpoint.ready && endpoint.ip.is_ipv4())
        .filter(|endpoint| seen.insert((endpoint.ip, endpoint.port)))
        .collect()
}

fn ipv4(ip: &IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V4(v4) => Some(*v4),
        IpAddr::V6(_) => None,
    }
}

/// The `--probability` of picking one of `remaining` endpoints, as Go's `%0.10f` prints it.
fn probability(remaining: usize) -> String {
    // Endpoint counts are far below 2^52, so the conversion is exact.
    let remaining = remaining as f64;
    format!("{:.10}", 1.0 / remaining)
}

/// A `--comment` argument as kube-proxy writes it: quoted only when it contains whitespace.
fn comment(text: &str) -> String {
    if text.contains(char::is_whitespace) {
        format!("\"{text}\"")
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
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
    fn comments_are_quoted_only_when_they_contain_spaces() {
        assert_eq!(comment("ns1/svc1:p80"), "ns1/svc1:p80");
        assert_eq!(
            comment("ns1/svc1:p80 cluster IP"),
            "\"ns1/svc1:p80 cluster IP\""
        );
    }
}
