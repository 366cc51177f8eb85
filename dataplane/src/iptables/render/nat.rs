//! The nat table: dispatch from `KUBE-SERVICES` and `KUBE-NODEPORTS` to the per-service chains,
//! endpoint selection, DNAT, and masquerading.

use super::super::chain_names::{endpoint_chain, is_owned};
use super::plan::PortPlan;
use super::{
    KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_SERVICES, MASQUERADE_MARK,
    RenderOptions, comment, finish, probability, services_of,
};
use crate::conntrack::IpFamily;
use crate::{Endpoint, ProxyState};
use std::{collections::BTreeSet, net::IpAddr};

/// The rendered nat table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatRules {
    /// The `iptables-restore` input, from `*nat` to `COMMIT`, ending with a newline.
    pub payload: String,
    /// The number of rules (`-A` lines) in [`payload`](Self::payload).
    pub rule_count: u32,
}

/// Renders the IPv4 nat table for `state`: [`render_nat_for`] IPv4.
#[must_use]
pub fn render_nat(
    state: &ProxyState,
    options: &RenderOptions,
    existing_chains: &BTreeSet<String>,
) -> NatRules {
    render_nat_for(IpFamily::V4, state, options, existing_chains)
}

/// Renders the `family` nat table for `state`.
///
/// `existing_chains` are the nat chain names now in the kernel (any chains: only splitproxy-owned
/// per-service ones, see [`is_owned`], are looked at); those this render does not write are
/// flushed and deleted.
///
/// Only Services with a cluster IP of `family` are rendered, and a port of one gets nat rules
/// only when it has a usable endpoint of `family` (see [`crate::endpoints`]); addresses and
/// endpoints of the other family are skipped, and the cluster CIDR is the family's own. `options`
/// decide which cluster-IP traffic is masqueraded and whether pod traffic skips
/// `externalTrafficPolicy: Local` (see [`RenderOptions`]).
#[must_use]
pub fn render_nat_for(
    family: IpFamily,
    state: &ProxyState,
    options: &RenderOptions,
    existing_chains: &BTreeSet<String>,
) -> NatRules {
    let mut nat = NatTable {
        masquerade_all: options.masquerade_all,
        cluster_cidr: options.cluster_cidr(family),
        node_port_addresses: options.node_port_addresses.as_ref().map(|addresses| {
            addresses
                .iter()
                .copied()
                .filter(|ip| family.contains(ip))
                .collect()
        }),
        node_ips: options
            .node_ips
            .iter()
            .copied()
            .filter(|ip| family.contains(ip))
            .collect(),
        ..NatTable::default()
    };
    for service in services_of(family, state) {
        for port in &service.ports {
            nat.add(&PortPlan::new(service, port, family));
        }
    }
    nat.finish(existing_chains)
}

/// The nat table while it is being rendered: declared chains and rules, per section.
#[derive(Default)]
struct NatTable {
    /// [`RenderOptions::masquerade_all`].
    masquerade_all: bool,
    /// The family's cluster CIDR pod traffic comes from (the local-traffic detector), if known.
    cluster_cidr: Option<String>,
    /// The family's addresses taking node ports; `None` for every local address.
    node_port_addresses: Option<Vec<IpAddr>>,
    /// The node's addresses of the family ([`RenderOptions::node_ips`]).
    node_ips: Vec<IpAddr>,
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

    fn rule(&mut self, chain: &str, rest: &str) {
        self.service_rules.push(format!("-A {chain} {rest}"));
    }

    fn add(&mut self, plan: &PortPlan<'_>) {
        if !plan.has_endpoints {
            // Rejected in the filter table instead (`render_filter`).
            return;
        }
        let port_name = &plan.port_name;
        let proto = plan.proto;
        let port = plan.port.port;

        if plan.has_internal_endpoints {
            let to = plan.internal_chain();
            for ip in &plan.cluster_ips {
                self.services.push(format!(
                    "-A {KUBE_SERVICES} -m comment --comment {} -m {proto} -p {proto} -d {ip} --dport {port} -j {to}",
                    comment(&format!("{port_name} cluster IP")),
                ));
            }
        }
        for ip in &plan.external_ips {
            self.services.push(format!(
                "-A {KUBE_SERVICES} -m comment --comment {} -m {proto} -p {proto} -d {ip} --dport {port} -j {}",
                comment(&format!("{port_name} external IP")),
                plan.external_chain,
            ));
        }
        for ip in &plan.load_balancer_ips {
            self.services.push(format!(
                "-A {KUBE_SERVICES} -m comment --comment {} -m {proto} -p {proto} -d {ip} --dport {port} -j {}",
                comment(&format!("{port_name} loadbalancer IP")),
                plan.load_balancer_chain(),
            ));
        }
        if let Some(node_port) = plan.port.node_port {
            self.nodeports.push(format!(
                "-A {KUBE_NODEPORTS} -m comment --comment {} -m {proto} -p {proto} --dport {node_port} -j {}",
                comment(port_name),
                plan.external_chain,
            ));
        }

        if plan.uses_cluster_chain {
            self.declare(&plan.cluster_chain);
            self.masquerade_cluster_ip(plan, &plan.cluster_chain);
            self.spread(plan, &plan.cluster_chain, &plan.cluster_endpoints);
        }
        if plan.uses_local_chain {
            self.declare(&plan.local_chain);
            self.masquerade_cluster_ip(plan, &plan.local_chain);
            self.spread(plan, &plan.local_chain, &plan.local_endpoints);
        }
        for endpoint in &plan.reachable {
            self.endpoint(plan, endpoint);
        }
        if plan.uses_external_chain {
            self.external(plan);
        }
        if plan.uses_firewall_chain {
            self.firewall(plan);
        }
    }

    /// The first rule of the chain cluster-IP traffic goes to (`KUBE-SVL-…` under
    /// `internalTrafficPolicy: Local`, else `KUBE-SVC-…`), as upstream writes it: with
    /// `masquerade_all` every packet to the cluster IP is marked for masquerading; with a cluster
    /// CIDR only those from outside it (`! -s <cidr>`: the node itself, or an off-cluster client
    /// routing the Service range through this node), so replies come back through this node
    /// whichever node the endpoint is on. Without either, nothing is marked here.
    fn masquerade_cluster_ip(&mut self, plan: &PortPlan<'_>, chain: &str) {
        if !plan.has_internal_endpoints || chain != plan.internal_chain() {
            return;
        }
        let from = match (&self.cluster_cidr, self.masquerade_all) {
            (_, true) => String::new(),
            (Some(cidr), false) => format!(" ! -s {cidr}"),
            (None, false) => return,
        };
        let why = comment(&format!("{} cluster IP", plan.port_name));
        let proto = plan.proto;
        let port = plan.port.port;
        for ip in &plan.cluster_ips {
            self.rule(
                chain,
                &format!(
                    "-m comment --comment {why} -m {proto} -p {proto} -d {ip} --dport {port}{from} -j {KUBE_MARK_MASQ}"
                ),
            );
        }
    }

    /// The rules of a `KUBE-SVC-…` or `KUBE-SVL-…` chain: sticky clients first, then an even
    /// random spread over `endpoints`.
    fn spread(&mut self, plan: &PortPlan<'_>, chain: &str, endpoints: &[&Endpoint]) {
        let to = |endpoint: &Endpoint| {
            let target = endpoint.socket_string();
            let sep = endpoint_chain(&plan.port_name, plan.port.protocol, &target);
            let why = comment(&format!("{} -> {target}", plan.port_name));
            (sep, why)
        };
        if let Some(seconds) = plan.affinity_seconds {
            for endpoint in endpoints {
                let (sep, why) = to(endpoint);
                self.rule(
                    chain,
                    &format!(
                        "-m comment --comment {why} -m recent --name {sep} --rcheck --seconds {seconds} --reap -j {sep}"
                    ),
                );
            }
        }
        let count = endpoints.len();
        for (i, endpoint) in endpoints.iter().enumerate() {
            let (sep, why) = to(endpoint);
            let statistic = if i + 1 < count {
                format!(
                    " -m statistic --mode random --probability {}",
                    probability(count - i)
                )
            } else {
                String::new()
            };
            self.rule(
                chain,
                &format!("-m comment --comment {why}{statistic} -j {sep}"),
            );
        }
    }

    /// A `KUBE-SEP-…` chain: masquerade hairpin traffic, remember sticky clients, DNAT.
    fn endpoint(&mut self, plan: &PortPlan<'_>, endpoint: &Endpoint) {
        let target = endpoint.socket_string();
        let sep = endpoint_chain(&plan.port_name, plan.port.protocol, &target);
        self.declare(&sep);
        let name = comment(&plan.port_name);
        let proto = plan.proto;
        self.rule(
            &sep,
            &format!(
                "-m comment --comment {name} -s {} -j {KUBE_MARK_MASQ}",
                endpoint.ip
            ),
        );
        let remember = if plan.affinity_seconds.is_some() {
            format!(" -m recent --name {sep} --set")
        } else {
            String::new()
        };
        self.rule(
            &sep,
            &format!(
                "-m comment --comment {name}{remember} -m {proto} -p {proto} -j DNAT --to-destination {target}"
            ),
        );
    }

    /// The `KUBE-EXT-…` chain every external destination (node port, external IP, load-balancer
    /// IP) jumps to.
    ///
    /// Under `externalTrafficPolicy: Local`, pod traffic (from the cluster CIDR, when one is
    /// configured) first goes to the cluster-wide chain unmasqueraded, as if it had gone out to a
    /// load balancer and come back; then the node's own traffic is masqueraded and goes there too;
    /// everything else reaches only the local endpoints with its client IP kept. Without a
    /// cluster CIDR the pod rule is left out, as upstream does without a local-traffic detector,
    /// and pod traffic follows the Local policy like any external client's.
    fn external(&mut self, plan: &PortPlan<'_>) {
        let chain = &plan.external_chain;
        self.declare(chain);
        let port_name = &plan.port_name;
        if plan.external_policy_local {
            if let Some(cidr) = &self.cluster_cidr {
                let rule = format!(
                    "-m comment --comment {} -s {cidr} -j {}",
                    comment(&format!(
                        "pod traffic for {port_name} external destinations"
                    )),
                    plan.cluster_chain,
                );
                self.rule(chain, &rule);
            }
            self.rule(
                chain,
                &format!(
                    "-m comment --comment {} -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}",
                    comment(&format!(
                        "masquerade LOCAL traffic for {port_name} external destinations"
                    )),
                ),
            );
            self.rule(
                chain,
                &format!(
                    "-m comment --comment {} -m addrtype --src-type LOCAL -j {}",
                    comment(&format!(
                        "route LOCAL traffic for {port_name} external destinations"
                    )),
                    plan.cluster_chain,
                ),
            );
        } else {
            self.rule(
                chain,
                &format!(
                    "-m comment --comment {} -j {KUBE_MARK_MASQ}",
                    comment(&format!(
                        "masquerade traffic for {port_name} external destinations"
                    )),
                ),
            );
        }
        if plan.has_external_endpoints {
            self.rule(chain, &format!("-j {}", plan.external_policy_chain()));
        }
    }

    /// The `KUBE-FW-…` chain: load-balancer traffic from an allowed source goes on to
    /// `KUBE-EXT-…`; the rest falls out untranslated and the filter table's
    /// `KUBE-PROXY-FIREWALL` drops it.
    ///
    /// When a source range holds one of the node's IPs, traffic from the load-balancer IPs
    /// themselves is accepted too, as upstream does: a node that holds its VIP as a local address
    /// connects to it from the VIP, not from its node IP.
    fn firewall(&mut self, plan: &PortPlan<'_>) {
        let chain = &plan.firewall_chain;
        self.declare(chain);
        let why = comment(&format!("{} loadbalancer IP", plan.port_name));
        let allowed_sources = plan.source_ranges.iter().map(ToString::to_string);
        let allow_from_node = plan
            .source_ranges
            .iter()
            .any(|range| self.node_ips.iter().any(|ip| range.contains(*ip)));
        let own_vips = plan
            .load_balancer_ips
            .iter()
            .filter(|_| allow_from_node)
            .map(ToString::to_string);
        for source in allowed_sources.chain(own_vips).collect::<Vec<_>>() {
            self.rule(
                chain,
                &format!(
                    "-m comment --comment {why} -s {source} -j {}",
                    plan.external_chain
                ),
            );
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
        let last_rule =
            comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain");
        match &self.node_port_addresses {
            None => lines.push(format!(
                "-A {KUBE_SERVICES} -m comment --comment {last_rule} -m addrtype --dst-type LOCAL -j {KUBE_NODEPORTS}",
            )),
            // One rule per selected address, as upstream with --nodeport-addresses.
            Some(addresses) => lines.extend(addresses.iter().map(|address| {
                format!(
                    "-A {KUBE_SERVICES} -m comment --comment {last_rule} -d {address} -j {KUBE_NODEPORTS}"
                )
            })),
        }
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
        let (payload, rule_count) = finish(lines, rule_count);
        NatRules {
            payload,
            rule_count,
        }
    }
}
