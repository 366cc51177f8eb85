//! What kube-proxy's IPVS mode holds in the kernel for a state, decided per IP family: the
//! virtual servers with their real servers, and the addresses bound to `kube-ipvs0`.
//!
//! As upstream (`pkg/proxy/ipvs/proxier.go`, `syncProxyRules`), every Service port gets one
//! virtual server per cluster IP, external IP and load-balancer IP of the family, and one per
//! node address taking node ports; real servers are the endpoints [`crate::endpoints`] selects,
//! at weight 1:
//!
//! * cluster IPs use the cluster-wide endpoints, or the local ones under
//!   `internalTrafficPolicy: Local`;
//! * external IPs, load-balancer IPs and node ports use the local endpoints under
//!   `externalTrafficPolicy: Local`, else the cluster-wide ones.
//!
//! A port without usable endpoints keeps its virtual servers with no real server, as upstream.
//! Session affinity is persistence with the affinity's timeout.

use super::{RealServer, ServiceId, VirtualServer, service_flags};
use crate::IpFamily;
use crate::endpoints::categorize;
use crate::{Endpoint, ProxyState, Service, ServicePort, TrafficPolicy};
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

/// How a node's IPVS mode is configured, beyond its Services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanOptions {
    /// The family planned: only its addresses and endpoints count.
    pub family: IpFamily,
    /// The scheduler of every virtual server (`--ipvs-scheduler`, default `rr`).
    pub scheduler: String,
    /// The node's addresses that take node ports (its addresses, or those `--nodeport-addresses`
    /// selects); those of other families are skipped.
    pub node_port_addresses: Vec<IpAddr>,
    /// Every address the node holds, but on `kube-ipvs0`. An external or load-balancer IP among
    /// them is local already and is not bound, as upstream: bound, it would join
    /// `KUBE-IPVS-IPS`, and `KUBE-IPVS-FILTER` would close the node's other ports on it.
    pub local_addresses: BTreeSet<IpAddr>,
}

/// A virtual server and the real servers it should have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedServer {
    /// The virtual server.
    pub server: VirtualServer,
    /// Its real servers, each at weight 1.
    pub real_servers: BTreeSet<RealServer>,
}

/// Everything the IPVS mode holds in the kernel for one family.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The virtual servers, by identity.
    pub servers: BTreeMap<ServiceId, PlannedServer>,
    /// The addresses bound to `kube-ipvs0`: every cluster, external and load-balancer IP of a
    /// Service port that the node does not hold already, so the kernel takes their traffic as
    /// local.
    pub bound_addresses: BTreeSet<IpAddr>,
}

/// The plan for `state` under `options`.
#[must_use]
pub fn plan(state: &ProxyState, options: &PlanOptions) -> Plan {
    let mut plan = Plan::default();
    for service in state.services.values() {
        for port in &service.ports {
            plan_port(&mut plan, service, port, options);
        }
    }
    plan
}

fn plan_port(plan: &mut Plan, service: &Service, port: &ServicePort, options: &PlanOptions) {
    let family = options.family;
    let cluster_ips = family.select(&service.cluster_ips);
    // As the iptables mode, the family's proxier programs only Services of its family.
    if cluster_ips.is_empty() {
        return;
    }
    let external_ips = family.select(&service.external_ips);
    let load_balancer_ips = family.select(&service.load_balancer_ips);

    let sets = categorize(port.endpoints.iter().filter(|e| family.contains(&e.ip)));
    let internal = match service.internal_traffic_policy {
        TrafficPolicy::Cluster => &sets.cluster,
        TrafficPolicy::Local => &sets.local,
    };
    let external = match service.external_traffic_policy {
        TrafficPolicy::Cluster => &sets.cluster,
        TrafficPolicy::Local => &sets.local,
    };

    let server = |address: IpAddr, port_number: u16| {
        virtual_server(service, port, address, port_number, options)
    };
    for &ip in &cluster_ips {
        plan.add(server(ip, port.port), internal);
    }
    for &ip in external_ips.iter().chain(&load_balancer_ips) {
        plan.add(server(ip, port.port), external);
    }
    plan.bound_addresses.extend(&cluster_ips);
    plan.bound_addresses.extend(
        external_ips
            .iter()
            .chain(&load_balancer_ips)
            .filter(|ip| !options.local_addresses.contains(ip)),
    );
    if let Some(node_port) = port.node_port {
        for ip in family.select(&options.node_port_addresses) {
            plan.add(server(ip, node_port), external);
        }
    }
}

impl Plan {
    fn add(&mut self, server: VirtualServer, endpoints: &[&Endpoint]) {
        let real_servers = endpoints
            .iter()
            .map(|endpoint| RealServer {
                address: endpoint.ip,
                port: endpoint.port,
                weight: 1,
            })
            .collect();
        self.servers.insert(
            server.id,
            PlannedServer {
                server,
                real_servers,
            },
        );
    }
}

/// The virtual server of `port` at `address:port_number`, with the node's scheduler and the
/// Service's session affinity.
fn virtual_server(
    service: &Service,
    port: &ServicePort,
    address: IpAddr,
    port_number: u16,
    options: &PlanOptions,
) -> VirtualServer {
    let mut flags = 0;
    // Upstream's `mh` scheduler hashes the source port too, and falls back when the hashed real
    // server is unavailable.
    if options.scheduler == "mh" {
        flags |= service_flags::SCHED_FALLBACK | service_flags::SCHED_PORT;
    }
    let timeout = match service.session_affinity {
        Some(timeout) => {
            flags |= service_flags::PERSISTENT;
            u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX)
        }
        None => 0,
    };
    VirtualServer {
        id: ServiceId {
            protocol: port.protocol,
            address,
            port: port_number,
        },
        scheduler: options.scheduler.clone(),
        flags,
        timeout,
    }
}

#[cfg(test)]
mod tests;
