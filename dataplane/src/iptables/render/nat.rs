//! The nat table: dispatch from `KUBE-SERVICES` and `KUBE-NODEPORTS` to the per-service chains,
//! endpoint selection, DNAT, and masquerading.

use super::super::chain_names::{endpoint_chain, is_owned};
use super::chains::PortChains;
use super::{
    KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_SERVICES, TableText, comment,
    probability, render_service,
};
use crate::IpFamily;
use crate::NodeOptions;
use crate::node_options::FamilyOptions;
use crate::{Endpoint, ProxyState};
use std::collections::BTreeSet;

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
    options: &NodeOptions,
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
/// `externalTrafficPolicy: Local` (see [`NodeOptions`]).
#[must_use]
pub fn render_nat_for(
    family: IpFamily,
    state: &ProxyState,
    options: &NodeOptions,
    existing_chains: &BTreeSet<String>,
) -> NatRules {
    let options = FamilyOptions::new(family, options);
    let services: Vec<ServiceNat> = state
        .services
        .values()
        .map(|service| render_service(service, &options).nat)
        .collect();
    let table = assemble_full(services.iter(), existing_chains, &options);
    NatRules {
        payload: table.payload,
        rule_count: table.written,
    }
}

/// One chain of a Service's own (`KUBE-SVC-…`, `KUBE-SEP-…`, …) and its rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Chain {
    /// The chain's name.
    pub name: String,
    /// Its rules, as `-A <name> …` lines.
    pub rules: Vec<String>,
}

/// What one Service adds to the nat table: its dispatch rules in the shared chains, and its own
/// chains in the order they are written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServiceNat {
    /// Its rules of `KUBE-SERVICES`, before the final jump to `KUBE-NODEPORTS`.
    pub dispatch: Vec<String>,
    /// Its rules of `KUBE-NODEPORTS`.
    pub node_ports: Vec<String>,
    /// Its own chains.
    pub chains: Vec<Chain>,
}

impl ServiceNat {
    /// Declares `chain` (once, however often it is asked for).
    fn declare(&mut self, chain: &str) {
        if !self.chains.iter().any(|c| c.name == chain) {
            self.chains.push(Chain {
                name: chain.to_owned(),
                rules: Vec::new(),
            });
        }
    }

    /// Appends a rule to `chain`, declared before.
    fn rule(&mut self, chain: &str, rest: &str) {
        if let Some(chain) = self.chains.iter_mut().rev().find(|c| c.name == chain) {
            chain.rules.push(format!("-A {} {rest}", chain.name));
        }
    }

    /// Adds the rules of one Service port.
    pub(super) fn add(&mut self, plan: &PortChains<'_>, options: &FamilyOptions) {
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
                self.dispatch.push(format!(
                    "-A {KUBE_SERVICES} -m comment --comment {} -m {proto} -p {proto} -d {ip} --dport {port} -j {to}",
                    comment(&format!("{port_name} cluster IP")),
                ));
            }
        }
        for ip in &plan.external_ips {
            self.dispatch.push(format!(
                "-A {KUBE_SERVICES} -m comment --comment {} -m {proto} -p {proto} -d {ip} --dport {port} -j {}",
                comment(&format!("{port_name} external IP")),
                plan.external_chain,
            ));
        }
        for ip in &plan.load_balancer_ips {
            self.dispatch.push(format!(
                "-A {KUBE_SERVICES} -m comment --comment {} -m {proto} -p {proto} -d {ip} --dport {port} -j {}",
                comment(&format!("{port_name} loadbalancer IP")),
                plan.load_balancer_chain(),
            ));
        }
        if let Some(node_port) = plan.port.node_port {
            self.node_ports.push(format!(
                "-A {KUBE_NODEPORTS} -m comment --comment {} -m {proto} -p {proto} --dport {node_port} -j {}",
                comment(port_name),
                plan.external_chain,
            ));
        }

        if plan.uses_cluster_chain {
            self.declare(&plan.cluster_chain);
            self.masquerade_cluster_ip(plan, &plan.cluster_chain, options);
            self.spread(plan, &plan.cluster_chain, &plan.cluster_endpoints);
        }
        if plan.uses_local_chain {
            self.declare(&plan.local_chain);
            self.masquerade_cluster_ip(plan, &plan.local_chain, options);
            self.spread(plan, &plan.local_chain, &plan.local_endpoints);
        }
        for endpoint in &plan.reachable {
            self.endpoint(plan, endpoint);
        }
        if plan.uses_external_chain {
            self.external(plan, options);
        }
        if plan.uses_firewall_chain {
            self.firewall(plan, options);
        }
    }

    /// The first rule of the chain cluster-IP traffic goes to (`KUBE-SVL-…` under
    /// `internalTrafficPolicy: Local`, else `KUBE-SVC-…`), as upstream writes it: with
    /// `masquerade_all` every packet to the cluster IP is marked for masquerading; with a cluster
    /// CIDR only those from outside it (`! -s <cidr>`: the node itself, or an off-cluster client
    /// routing the Service range through this node), so replies come back through this node
    /// whichever node the endpoint is on. Without either, nothing is marked here.
    fn masquerade_cluster_ip(
        &mut self,
        plan: &PortChains<'_>,
        chain: &str,
        options: &FamilyOptions,
    ) {
        if !plan.has_internal_endpoints || chain != plan.internal_chain() {
            return;
        }
        let from = match (&options.local, options.masquerade_all) {
            (_, true) => String::new(),
            (Some(local), false) => format!(" {}", local.iptables_not()),
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
    fn spread(&mut self, plan: &PortChains<'_>, chain: &str, endpoints: &[&Endpoint]) {
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
    fn endpoint(&mut self, plan: &PortChains<'_>, endpoint: &Endpoint) {
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
    fn external(&mut self, plan: &PortChains<'_>, options: &FamilyOptions) {
        let chain = &plan.external_chain;
        self.declare(chain);
        let port_name = &plan.port_name;
        if plan.external_policy_local {
            if let Some(local) = &options.local {
                let rule = format!(
                    "-m comment --comment {} {} -j {}",
                    comment(&format!(
                        "pod traffic for {port_name} external destinations"
                    )),
                    local.iptables(),
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
    /// `KUBE-PROXY-FIREWALL` drops it, as the chain's last rule (a comment alone) says.
    ///
    /// When a source range holds one of the node's IPs, traffic from the load-balancer IPs
    /// themselves is accepted too, as upstream does: a node that holds its VIP as a local address
    /// connects to it from the VIP, not from its node IP.
    fn firewall(&mut self, plan: &PortChains<'_>, options: &FamilyOptions) {
        let chain = &plan.firewall_chain;
        self.declare(chain);
        let why = comment(&format!("{} loadbalancer IP", plan.port_name));
        let allowed_sources = plan.source_ranges.iter().map(ToString::to_string);
        let allow_from_node = plan
            .source_ranges
            .iter()
            .any(|range| options.node_ips.iter().any(|ip| range.contains(*ip)));
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
        // No target: it only tells the reader where the rest goes, as upstream writes it.
        let rest = comment(&format!(
            "other traffic to {} will be dropped by KUBE-PROXY-FIREWALL",
            plan.port_name
        ));
        self.rule(chain, &format!("-m comment --comment {rest}"));
    }
}

/// An assembled nat table: the payload, and its rules.
pub(crate) struct AssembledNat {
    /// The `iptables-restore` input, from `*nat` to `COMMIT`.
    pub payload: String,
    /// Rules in the payload.
    pub written: u32,
    /// Rules the table holds once the payload is restored: those written and the Services' own
    /// chains left out of it.
    pub total: u32,
}

/// The whole nat table for `services`: every chain written; owned chains in `existing` that no
/// Service writes are deleted.
pub(crate) fn assemble_full<'a>(
    services: impl Iterator<Item = &'a ServiceNat> + Clone,
    existing: &BTreeSet<String>,
    options: &FamilyOptions,
) -> AssembledNat {
    let written: Vec<&Chain> = services.clone().flat_map(|s| &s.chains).collect();
    let names: BTreeSet<&str> = written.iter().map(|c| c.name.as_str()).collect();
    let stale: Vec<&str> = existing
        .iter()
        .map(String::as_str)
        .filter(|chain| is_owned(chain) && !names.contains(chain))
        .collect();
    assemble(services, &written, &stale, options)
}

/// The nat table for `services`, as `iptables-restore --noflush` input that writes the shared
/// chains whole, the Services' chains in `written` (declared, which flushes them, then filled),
/// and deletes the chains in `stale`; every other chain of a Service is left as it is.
pub(crate) fn assemble<'a>(
    services: impl Iterator<Item = &'a ServiceNat> + Clone,
    written: &[&Chain],
    stale: &[&str],
    options: &FamilyOptions,
) -> AssembledNat {
    let mut table = TableText::new("nat");
    for chain in [
        KUBE_SERVICES,
        KUBE_NODEPORTS,
        KUBE_MARK_MASQ,
        KUBE_POSTROUTING,
    ]
    .into_iter()
    .chain(written.iter().map(|chain| chain.name.as_str()))
    .chain(stale.iter().copied())
    {
        table.declare(chain);
    }

    table.rules(services.clone().flat_map(|s| &s.dispatch));
    let last_rule =
        comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain");
    match &options.node_port_addresses {
        None => {
            // Loopback node ports only where route_localnet lets them work: IPv4, when asked.
            let loopback = match options.family {
                IpFamily::V4 if options.localhost_node_ports => "",
                IpFamily::V4 => " ! -d 127.0.0.0/8",
                IpFamily::V6 => " ! -d ::1/128",
            };
            table.rule(&format!(
                "-A {KUBE_SERVICES} -m comment --comment {last_rule} -m addrtype --dst-type LOCAL{loopback} -j {KUBE_NODEPORTS}",
            ));
        }
        // One rule per selected address, as upstream with --nodeport-addresses.
        Some(addresses) => {
            for address in addresses {
                table.rule(&format!(
                    "-A {KUBE_SERVICES} -m comment --comment {last_rule} -d {address} -j {KUBE_NODEPORTS}"
                ));
            }
        }
    }
    table.rules(services.clone().flat_map(|s| &s.node_ports));
    let mark = &options.masquerade_mark;
    table.rule(&format!("-A {KUBE_MARK_MASQ} -j MARK --or-mark {mark}"));
    table.rule(&format!(
        "-A {KUBE_POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN"
    ));
    table.rule(&format!("-A {KUBE_POSTROUTING} -j MARK --xor-mark {mark}"));
    table.rule(&format!(
        "-A {KUBE_POSTROUTING} -m comment --comment {} -j MASQUERADE --random-fully",
        comment("kubernetes service traffic requiring SNAT"),
    ));
    let shared_rules = table.rules;
    table.rules(written.iter().flat_map(|chain| &chain.rules));
    let own_rules: usize = services
        .flat_map(|s| &s.chains)
        .map(|chain| chain.rules.len())
        .sum();
    for chain in stale {
        table.delete(chain);
    }
    let (payload, written) = table.finish();
    AssembledNat {
        payload,
        written,
        total: u32::try_from(shared_rules + own_rules).unwrap_or(u32::MAX),
    }
}
