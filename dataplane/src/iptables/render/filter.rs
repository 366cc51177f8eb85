//! The filter table: REJECT or DROP for Service traffic no endpoint can take, the load-balancer
//! source-range firewall, the health-check node port ACCEPTs, and kube-proxy's forwarding rules.

use super::chains::PortChains;
use super::{
    FILTER_KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_PROXY_FIREWALL,
    TableText, comment, render_service,
};
use crate::IpFamily;
use crate::NodeOptions;
use crate::ProxyState;
use crate::node_options::FamilyOptions;

/// The filter chain accepting health-check node ports (jumped to from INPUT). It shares its name
/// with the nat [`KUBE_NODEPORTS`](super::KUBE_NODEPORTS) chain, as in kube-proxy.
const FILTER_KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";

/// The rendered filter table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterRules {
    /// The `iptables-restore` input, from `*filter` to `COMMIT`, ending with a newline.
    pub payload: String,
    /// The number of rules (`-A` lines) in [`payload`](Self::payload).
    pub rule_count: u32,
}

/// Renders the IPv4 filter table for `state`: [`render_filter_for`] IPv4.
#[must_use]
pub fn render_filter(state: &ProxyState) -> FilterRules {
    render_filter_for(IpFamily::V4, state)
}

/// Renders the `family` filter table for `state`, as kube-proxy's proxier for that family does
/// (its addresses only; IPv6 rejects with `icmp6-port-unreachable`):
///
/// * `KUBE-SERVICES`: a REJECT for each cluster IP whose port has no usable endpoint, so clients
///   are refused at once instead of timing out; a DROP ("has no local endpoints") when only
///   `internalTrafficPolicy: Local` finds none.
/// * `KUBE-EXTERNAL-SERVICES`: the same for external IPs, load-balancer IPs and node ports, the
///   DROP being for `externalTrafficPolicy: Local` (traffic the `KUBE-EXT-…` chain did not
///   short-circuit to the cluster-wide endpoints).
/// * `KUBE-PROXY-FIREWALL`: a DROP for load-balancer IP traffic its `KUBE-FW-…` chain did not
///   accept (`loadBalancerSourceRanges`).
/// * `KUBE-NODEPORTS`: accept the `healthCheckNodePort` of each `externalTrafficPolicy: Local`
///   Service, once per Service port as upstream writes it, whether or not it has endpoints, so
///   load balancers can reach the agent's health-check server through a host firewall.
/// * `KUBE-FORWARD`: accept forwarded Service traffic.
///
/// Every chain here is kube-proxy's fixed set and is rewritten whole on each sync.
#[must_use]
pub fn render_filter_for(family: IpFamily, state: &ProxyState) -> FilterRules {
    let options = FamilyOptions::new(family, &NodeOptions::default());
    let services: Vec<ServiceFilter> = state
        .services
        .values()
        .map(|service| render_service(service, &options).filter)
        .collect();
    assemble(services.iter(), &options)
}

/// What one Service adds to the filter table, per chain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServiceFilter {
    /// Its rules of `KUBE-SERVICES`.
    services: Vec<String>,
    /// Its rules of `KUBE-EXTERNAL-SERVICES`.
    external: Vec<String>,
    /// Its rules of `KUBE-NODEPORTS`.
    node_ports: Vec<String>,
    /// Its rules of `KUBE-PROXY-FIREWALL`.
    firewall: Vec<String>,
}

impl ServiceFilter {
    /// Adds the rules of one Service port.
    pub(super) fn add(&mut self, plan: &PortChains<'_>) {
        let proto = plan.proto;
        if let Some(health_check_node_port) = plan.health_check_node_port {
            self.node_ports.push(format!(
            "-A {FILTER_KUBE_NODEPORTS} -m comment --comment {} -m tcp -p tcp --dport {health_check_node_port} -j ACCEPT",
            comment(&format!("{} health check node port", plan.port_name)),
        ));
        }
        let (verdict, why) = plan.no_endpoint_verdict();
        if !plan.has_internal_endpoints {
            for ip in &plan.cluster_ips {
                self.services.push(format!(
                "-A {FILTER_KUBE_SERVICES} -m comment --comment {why} -m {proto} -p {proto} -d {ip} --dport {} -j {verdict}",
                plan.port.port
            ));
            }
        }
        for ip in &plan.external_ips {
            if !plan.has_external_endpoints {
                self.external.push(format!(
                "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {why} -m {proto} -p {proto} -d {ip} --dport {} -j {verdict}",
                plan.port.port
            ));
            }
        }
        if plan.uses_firewall_chain {
            let why = comment(&format!(
                "{} traffic not accepted by {}",
                plan.port_name, plan.firewall_chain
            ));
            for ip in &plan.load_balancer_ips {
                self.firewall.push(format!(
                "-A {KUBE_PROXY_FIREWALL} -m comment --comment {why} -m {proto} -p {proto} -d {ip} --dport {} -j DROP",
                plan.port.port
            ));
            }
        }
        if !plan.has_external_endpoints {
            for ip in &plan.load_balancer_ips {
                self.external.push(format!(
                "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {why} -m {proto} -p {proto} -d {ip} --dport {} -j {verdict}",
                plan.port.port
            ));
            }
            if let Some(node_port) = plan.port.node_port {
                self.external.push(format!(
                "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {why} -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {node_port} -j {verdict}"
            ));
            }
        }
    }
}

/// The filter table for `services`: kube-proxy's fixed chains, written whole.
pub(crate) fn assemble<'a>(
    services: impl Iterator<Item = &'a ServiceFilter> + Clone,
    options: &FamilyOptions,
) -> FilterRules {
    let mut table = TableText::new("filter");
    for chain in [
        FILTER_KUBE_SERVICES,
        KUBE_EXTERNAL_SERVICES,
        KUBE_FORWARD,
        FILTER_KUBE_NODEPORTS,
        KUBE_PROXY_FIREWALL,
    ] {
        table.declare(chain);
    }
    if options.localhost_node_ports {
        table.declare(KUBE_FIREWALL);
    }
    table.rules(services.clone().flat_map(|s| &s.services));
    table.rules(services.clone().flat_map(|s| &s.external));
    table.rules(services.clone().flat_map(|s| &s.node_ports));
    // A liberal conntrack marks only out-of-window RSTs INVALID; upstream then drops none.
    if !options.tcp_be_liberal {
        table.rule(&format!(
            "-A {KUBE_FORWARD} -m conntrack --ctstate INVALID -j DROP"
        ));
    }
    table.rule(&format!(
        "-A {KUBE_FORWARD} -m comment --comment {} -m mark --mark {mark}/{mark} -j ACCEPT",
        comment("kubernetes forwarding rules"),
        mark = options.masquerade_mark,
    ));
    table.rule(&format!(
        "-A {KUBE_FORWARD} -m comment --comment {} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        comment("kubernetes forwarding conntrack rule"),
    ));
    table.rules(services.flat_map(|s| &s.firewall));
    if options.localhost_node_ports {
        table.rule(&format!(
            "-A {KUBE_FIREWALL} -m comment --comment {} -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
            comment("block incoming localnet connections"),
        ));
    }
    let (payload, rule_count) = table.finish();
    FilterRules {
        payload,
        rule_count,
    }
}
