//! What kube-proxy decides for one Service port before any mode writes a rule: which addresses,
//! which endpoints, and whether traffic finds one.
//!
//! Every mode renders from the same [`PortPlan`], so iptables and nftables never disagree about
//! which endpoints a port uses or whether it has any, and the iptables nat rules and filter
//! REJECT or DROP rules never disagree with each other. The names follow upstream's
//! `syncProxyRules` (`hasEndpoints`, `hasInternalEndpoints`, `usesExternalTrafficChain`, …); the
//! `uses_*_chain` decisions name upstream's chains but hold in every mode.

use crate::IpFamily;
use crate::endpoints::categorize;
use crate::{Cidr, Endpoint, Service, ServicePort, TrafficPolicy};
use std::net::IpAddr;

/// One Service port, decided for one IP family.
pub(crate) struct PortPlan<'a> {
    /// The port.
    pub port: &'a ServicePort,
    /// `ns/name:port`.
    pub port_name: String,
    /// The family the plan is for.
    pub family: IpFamily,
    /// `tcp`, `udp` or `sctp`.
    pub proto: &'static str,
    /// The cluster IPs of the family.
    pub cluster_ips: Vec<IpAddr>,
    /// The external IPs of the family.
    pub external_ips: Vec<IpAddr>,
    /// The load-balancer ingress IPs of the family.
    pub load_balancer_ips: Vec<IpAddr>,
    /// The load-balancer source ranges of the family.
    pub source_ranges: Vec<Cidr>,
    /// The session-affinity timeout in seconds, with `sessionAffinity: ClientIP`.
    pub affinity_seconds: Option<u64>,
    /// The endpoints `KUBE-SVC-…` spreads over.
    pub cluster_endpoints: Vec<&'a Endpoint>,
    /// The endpoints `KUBE-SVL-…` spreads over.
    pub local_endpoints: Vec<&'a Endpoint>,
    /// Every endpoint a `KUBE-SEP-…` chain is written for.
    pub reachable: Vec<&'a Endpoint>,
    /// `externalTrafficPolicy: Local` on a Service with external destinations.
    pub external_policy_local: bool,
    /// Some endpoint anywhere takes new connections; without one, everything is rejected.
    pub has_endpoints: bool,
    /// Cluster-IP traffic has endpoints (false under `internalTrafficPolicy: Local` without a
    /// local endpoint).
    pub has_internal_endpoints: bool,
    /// External traffic has endpoints (false under `externalTrafficPolicy: Local` without a local
    /// endpoint).
    pub has_external_endpoints: bool,
    /// `KUBE-SVC-…` is written.
    pub uses_cluster_chain: bool,
    /// `KUBE-SVL-…` is written.
    pub uses_local_chain: bool,
    /// `KUBE-EXT-…` is written.
    pub uses_external_chain: bool,
    /// `KUBE-FW-…` is written.
    pub uses_firewall_chain: bool,
    /// The health-check node port the filter table accepts: the Service's, under
    /// `externalTrafficPolicy: Local`.
    pub health_check_node_port: Option<u16>,
    /// `internalTrafficPolicy: Local`.
    pub internal_policy_local: bool,
}

impl<'a> PortPlan<'a> {
    /// Decides `port` of `service` for the `family` proxier: only the family's addresses, source
    /// ranges and endpoints count, as upstream's per-family proxiers see them.
    pub fn new(service: &'a Service, port: &'a ServicePort, family: IpFamily) -> Self {
        let port_name = port.port_name(&service.key);
        let of_family = |ips: &[IpAddr]| -> Vec<IpAddr> {
            ips.iter()
                .filter(|ip| family.contains(ip))
                .copied()
                .collect()
        };
        let external_ips = of_family(&service.external_ips);
        let load_balancer_ips = of_family(&service.load_balancer_ips);
        let source_ranges: Vec<Cidr> = service
            .load_balancer_source_ranges
            .iter()
            .filter(|range| family.contains(&range.address))
            .copied()
            .collect();

        // Upstream's ExternallyAccessible, UsesClusterEndpoints and UsesLocalEndpoints.
        let externally_accessible =
            port.node_port.is_some() || !external_ips.is_empty() || !load_balancer_ips.is_empty();
        let external_policy_local =
            externally_accessible && service.external_traffic_policy == TrafficPolicy::Local;
        let internal_policy_local = service.internal_traffic_policy == TrafficPolicy::Local;
        // External traffic needs the cluster set even under eTP Local: the node's own traffic
        // short-circuits to it.
        let uses_cluster_endpoints = !internal_policy_local || externally_accessible;
        let uses_local_endpoints = internal_policy_local || external_policy_local;

        let sets = categorize(port.endpoints.iter().filter(|e| family.contains(&e.ip)));
        let has_endpoints = sets.has_any();
        let reachable = sets.reachable(uses_cluster_endpoints, uses_local_endpoints);
        let no_local = sets.local.is_empty();
        let uses_cluster_chain = uses_cluster_endpoints && !sets.cluster.is_empty();
        let uses_local_chain = uses_local_endpoints && !no_local;

        Self {
            family,
            proto: port.protocol.as_str(),
            cluster_ips: of_family(&service.cluster_ips),
            affinity_seconds: service.session_affinity.map(|timeout| timeout.as_secs()),
            has_endpoints,
            has_internal_endpoints: has_endpoints && !(internal_policy_local && no_local),
            has_external_endpoints: has_endpoints && !(external_policy_local && no_local),
            uses_cluster_chain,
            uses_local_chain,
            uses_external_chain: has_endpoints && externally_accessible,
            uses_firewall_chain: has_endpoints
                && !load_balancer_ips.is_empty()
                && !source_ranges.is_empty(),
            cluster_endpoints: if uses_cluster_chain {
                sets.cluster
            } else {
                Vec::new()
            },
            local_endpoints: if uses_local_chain {
                sets.local
            } else {
                Vec::new()
            },
            reachable,
            health_check_node_port: service
                .health_check_node_port
                .filter(|_| service.external_traffic_policy == TrafficPolicy::Local),
            external_policy_local,
            internal_policy_local,
            external_ips,
            load_balancer_ips,
            source_ranges,
            port,
            port_name,
        }
    }
}
