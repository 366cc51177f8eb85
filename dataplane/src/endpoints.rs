//! Which endpoints receive new connections: kube-proxy's `CategorizeEndpoints`.
//!
//! Upstream (`pkg/proxy/topology.go`) splits a Service port's endpoints into the set used by the
//! `Cluster` traffic policy and the set used by the `Local` one:
//!
//! * **cluster**: the ready endpoints topology hints leave to this node; when none is ready,
//!   those that are serving and terminating (KEP-1669), so a rolling update that has only
//!   draining pods left still answers.
//! * **local**: the ready endpoints on this node (topology hints do not narrow it), else the local
//!   serving-and-terminating ones.
//!
//! Endpoints that are neither ready nor serving-and-terminating are never used. The controller
//! applies the hints (with upstream's all-or-nothing rule) and marks what they take out of this
//! node's cluster set with [`Endpoint::topology_excluded`]; should every ready endpoint carry the
//! mark, which the controller never sends, the marks are ignored rather than the Service refused.
//!
//! The selection is pure and backend-independent; backends filter by address family before
//! calling [`categorize`], as upstream runs one proxier per family (an IPv4 proxier never sees the
//! IPv6 endpoints, so they cannot mask its fallback).

use crate::{Endpoint, IpFamily, ProxyState, TrafficPolicy};
use std::collections::BTreeSet;

/// Service ports whose `Local` traffic policy finds no endpoint to use on this node, per policy:
/// what kube-proxy's `sync_proxy_rules_no_local_endpoints_total` gauge reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoLocalEndpoints {
    /// Ports with `internalTrafficPolicy: Local` and no local endpoint: in-cluster clients on
    /// this node are dropped.
    pub internal: usize,
    /// Externally reachable ports (node port, external or load-balancer IP) with
    /// `externalTrafficPolicy: Local` and no local endpoint: external traffic to this node is
    /// dropped.
    pub external: usize,
}

impl NoLocalEndpoints {
    /// Counts the ports of `state` as `family`'s proxier upstream does: those of Services with a
    /// cluster IP of that family, over that family's endpoints and external addresses.
    #[must_use]
    pub fn of(state: &ProxyState, family: IpFamily) -> Self {
        let mut counts = Self::default();
        let services = state.services.values();
        for service in services.filter(|s| s.cluster_ips.iter().any(|ip| family.contains(ip))) {
            for port in &service.ports {
                let sets = categorize(port.endpoints.iter().filter(|e| family.contains(&e.ip)));
                if !sets.local.is_empty() {
                    continue;
                }
                if service.internal_traffic_policy == TrafficPolicy::Local {
                    counts.internal += 1;
                }
                let of_family = |ips: &[std::net::IpAddr]| ips.iter().any(|ip| family.contains(ip));
                let externally_accessible = port.node_port.is_some()
                    || of_family(&service.external_ips)
                    || of_family(&service.load_balancer_ips);
                if externally_accessible && service.external_traffic_policy == TrafficPolicy::Local
                {
                    counts.external += 1;
                }
            }
        }
        counts
    }
}

/// A Service port's endpoints, split by traffic policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointSets<'a> {
    /// The endpoints `Cluster` traffic policy spreads over, in input order.
    pub cluster: Vec<&'a Endpoint>,
    /// Whether [`cluster`](Self::cluster) holds terminating endpoints because none is ready.
    pub cluster_is_terminating_fallback: bool,
    /// The endpoints on this node that `Local` traffic policy spreads over, in input order.
    pub local: Vec<&'a Endpoint>,
    /// Whether [`local`](Self::local) holds terminating endpoints because no local one is ready.
    pub local_is_terminating_fallback: bool,
    /// Ready endpoints left out of [`cluster`](Self::cluster) only because topology hints send
    /// this node's traffic elsewhere; they still serve other nodes, so their connections are live.
    pub topology_excluded: Vec<&'a Endpoint>,
}

impl<'a> EndpointSets<'a> {
    /// Upstream's `hasAnyEndpoints`: some endpoint anywhere can take new connections. When this
    /// is false the Service port is rejected; when it is true but a `Local` policy finds no local
    /// endpoint, that traffic is dropped instead.
    #[must_use]
    pub fn has_any(&self) -> bool {
        // `cluster` is never empty while some endpoint is usable: without topology marks every
        // usable local endpoint is in it too, and the marks never leave it without a ready one.
        !self.cluster.is_empty()
    }

    /// The endpoints some rule may send traffic to (upstream's `allReachableEndpoints`): the
    /// cluster set if `cluster_policy_used`, plus the local set if `local_policy_used`, each
    /// once, in the order of `cluster` then the local ones it lacks.
    #[must_use]
    pub fn reachable(
        &self,
        cluster_policy_used: bool,
        local_policy_used: bool,
    ) -> Vec<&'a Endpoint> {
        let mut seen = BTreeSet::new();
        let cluster = self.cluster.iter().filter(|_| cluster_policy_used);
        let local = self.local.iter().filter(|_| local_policy_used);
        cluster
            .chain(local)
            .filter(|endpoint| seen.insert((endpoint.ip, endpoint.port)))
            .copied()
            .collect()
    }
}

/// Splits `endpoints` into the cluster-policy and local-policy sets; an address:port listed twice
/// counts once (its first listing), as upstream merges EndpointSlices.
#[must_use]
pub fn categorize<'a>(endpoints: impl IntoIterator<Item = &'a Endpoint>) -> EndpointSets<'a> {
    let mut seen = BTreeSet::new();
    let endpoints: Vec<&Endpoint> = endpoints
        .into_iter()
        .filter(|endpoint| seen.insert((endpoint.ip, endpoint.port)))
        .collect();
    let kept_by_topology = |endpoint: &Endpoint| !(endpoint.ready && endpoint.topology_excluded);
    let topology_applies = endpoints
        .iter()
        .any(|endpoint| endpoint.ready && kept_by_topology(endpoint));
    let (cluster, cluster_is_terminating_fallback) = if topology_applies {
        usable(&endpoints, kept_by_topology)
    } else {
        usable(&endpoints, |_| true)
    };
    let (local, local_is_terminating_fallback) = usable(&endpoints, |endpoint| endpoint.is_local);
    let topology_excluded = if topology_applies {
        endpoints
            .iter()
            .copied()
            .filter(|endpoint| !kept_by_topology(endpoint))
            .collect()
    } else {
        Vec::new()
    };
    EndpointSets {
        cluster,
        cluster_is_terminating_fallback,
        local,
        local_is_terminating_fallback,
        topology_excluded,
    }
}

/// The ready endpoints among those `eligible`, else the serving-and-terminating ones; and whether
/// it fell back.
fn usable<'a>(
    endpoints: &[&'a Endpoint],
    eligible: impl Fn(&Endpoint) -> bool,
) -> (Vec<&'a Endpoint>, bool) {
    let pick = |wanted: &dyn Fn(&Endpoint) -> bool| -> Vec<&'a Endpoint> {
        endpoints
            .iter()
            .copied()
            .filter(|endpoint| eligible(endpoint) && wanted(endpoint))
            .collect()
    };
    let ready = pick(&|endpoint| endpoint.ready);
    if !ready.is_empty() {
        return (ready, false);
    }
    let draining = pick(&|endpoint| endpoint.serving && endpoint.terminating);
    let fell_back = !draining.is_empty();
    (draining, fell_back)
}

#[cfg(test)]
mod tests {
    //! Endpoints are pods `10.244.x.y` (`10.244.0.x` on this node), all on port 8080 unless said.
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn endpoint(ip: &str, ready: bool, serving: bool, terminating: bool, local: bool) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port: 8080,
            ready,
            serving,
            terminating,
            is_local: local,
            topology_excluded: false,
        }
    }

    fn ready(ip: &str, local: bool) -> Endpoint {
        endpoint(ip, true, true, false, local)
    }

    fn draining(ip: &str, local: bool) -> Endpoint {
        endpoint(ip, false, true, true, local)
    }

    fn addresses(endpoints: &[&Endpoint]) -> Vec<String> {
        endpoints.iter().map(|e| e.socket_string()).collect()
    }

    #[test]
    fn local_policies_without_local_endpoints_are_counted_per_port_and_policy() {
        use crate::{Protocol, Service, ServiceKey, ServicePort};
        let port = |name: &str, node_port: Option<u16>, endpoints: Vec<Endpoint>| {
            ServicePort::new(name, Protocol::Tcp, 80, node_port, endpoints)
        };
        let service = |name: &str, itp: TrafficPolicy, etp: TrafficPolicy, ports| Service {
            internal_traffic_policy: itp,
            external_traffic_policy: etp,
            ..Service::new(
                ServiceKey::new("demo", name),
                vec!["10.96.0.1".parse().unwrap()],
                ports,
            )
        };
        let (local, cluster) = (TrafficPolicy::Local, TrafficPolicy::Cluster);
        let mut state = ProxyState::default();
        for service in [
            // iTP Local: one port with only a remote endpoint, one with none at all.
            service(
                "itp",
                local,
                cluster,
                vec![
                    port("a", None, vec![ready("10.244.1.1", false)]),
                    port("b", None, vec![]),
                ],
            ),
            // eTP Local with a node port and only remote endpoints: external traffic is dropped.
            service(
                "etp",
                cluster,
                local,
                vec![port("a", Some(30080), vec![ready("10.244.1.1", false)])],
            ),
            // eTP Local without any external address does not count; a local endpoint never does.
            service(
                "internal-only",
                cluster,
                local,
                vec![port("a", None, vec![])],
            ),
            service(
                "served",
                local,
                local,
                vec![port("a", Some(30081), vec![draining("10.244.0.1", true)])],
            ),
        ] {
            state.insert(service);
        }

        assert_eq!(
            NoLocalEndpoints::of(&state, IpFamily::V4),
            NoLocalEndpoints {
                internal: 2,
                external: 1
            }
        );
        // An IPv4-only state has nothing for the IPv6 proxier to count.
        assert_eq!(
            NoLocalEndpoints::of(&state, IpFamily::V6),
            NoLocalEndpoints::default()
        );
    }

    #[test]
    fn no_local_endpoints_are_counted_per_family_of_endpoints_and_addresses() {
        use crate::{Protocol, Service, ServiceKey, ServicePort};
        // Dual-stack, both policies Local, no node port: its only local endpoint is IPv4, and
        // only its IPv6 side has an external IP.
        let service = Service {
            internal_traffic_policy: TrafficPolicy::Local,
            external_traffic_policy: TrafficPolicy::Local,
            external_ips: vec!["2001:db8::10".parse().unwrap()],
            ..Service::new(
                ServiceKey::new("demo", "dual"),
                vec!["10.96.0.1".parse().unwrap(), "fd00::1".parse().unwrap()],
                vec![ServicePort::new(
                    "a",
                    Protocol::Tcp,
                    80,
                    None,
                    vec![ready("10.244.0.1", true), ready("fd00:244::1", false)],
                )],
            )
        };
        let mut state = ProxyState::default();
        state.insert(service);

        assert_eq!(
            NoLocalEndpoints::of(&state, IpFamily::V4),
            NoLocalEndpoints::default()
        );
        assert_eq!(
            NoLocalEndpoints::of(&state, IpFamily::V6),
            NoLocalEndpoints {
                internal: 1,
                external: 1
            }
        );
    }

    #[test]
    fn ready_endpoints_are_preferred_over_terminating_ones() {
        let all = [
            ready("10.244.1.1", false),
            draining("10.244.2.1", false),
            ready("10.244.0.1", true),
            draining("10.244.0.2", true),
        ];

        let sets = categorize(&all);

        assert_eq!(
            addresses(&sets.cluster),
            ["10.244.1.1:8080", "10.244.0.1:8080"]
        );
        assert!(!sets.cluster_is_terminating_fallback);
        assert_eq!(addresses(&sets.local), ["10.244.0.1:8080"]);
        assert!(!sets.local_is_terminating_fallback);
        assert!(sets.has_any());
    }

    #[test]
    fn serving_terminating_endpoints_are_used_when_none_is_ready() {
        let all = [
            draining("10.244.1.1", false),
            endpoint("10.244.2.1", false, false, true, false),
            endpoint("10.244.3.1", false, false, false, false),
        ];

        let sets = categorize(&all);

        assert_eq!(addresses(&sets.cluster), ["10.244.1.1:8080"]);
        assert!(sets.cluster_is_terminating_fallback);
        assert!(sets.local.is_empty());
        assert!(!sets.local_is_terminating_fallback);
        assert!(sets.has_any());
    }

    #[test]
    fn local_set_falls_back_on_its_own() {
        // Ready endpoints elsewhere do not stop the local set from using a draining local one.
        let all = [ready("10.244.1.1", false), draining("10.244.0.1", true)];

        let sets = categorize(&all);

        assert_eq!(addresses(&sets.cluster), ["10.244.1.1:8080"]);
        assert!(!sets.cluster_is_terminating_fallback);
        assert_eq!(addresses(&sets.local), ["10.244.0.1:8080"]);
        assert!(sets.local_is_terminating_fallback);
        assert_eq!(
            addresses(&sets.reachable(true, true)),
            ["10.244.1.1:8080", "10.244.0.1:8080"]
        );
        assert_eq!(addresses(&sets.reachable(true, false)), ["10.244.1.1:8080"]);
        assert_eq!(addresses(&sets.reachable(false, true)), ["10.244.0.1:8080"]);
    }

    #[test]
    fn endpoints_neither_ready_nor_serving_are_never_used() {
        let all = [
            endpoint("10.244.1.1", false, false, true, true),
            endpoint("10.244.2.1", false, false, false, false),
        ];

        let sets = categorize(&all);

        assert_eq!(sets, EndpointSets::default());
        assert!(!sets.has_any());
        assert!(sets.reachable(true, true).is_empty());
    }

    fn elsewhere(endpoint: Endpoint) -> Endpoint {
        Endpoint {
            topology_excluded: true,
            ..endpoint
        }
    }

    #[test]
    fn topology_excluded_endpoints_leave_the_cluster_set_but_not_the_local_one() {
        let all = [
            ready("10.244.1.1", false),
            elsewhere(ready("10.244.2.1", false)),
            elsewhere(ready("10.244.0.1", true)),
        ];

        let sets = categorize(&all);

        assert_eq!(addresses(&sets.cluster), ["10.244.1.1:8080"]);
        assert_eq!(addresses(&sets.local), ["10.244.0.1:8080"]);
        assert_eq!(
            addresses(&sets.topology_excluded),
            ["10.244.2.1:8080", "10.244.0.1:8080"]
        );
        assert_eq!(
            addresses(&sets.reachable(true, true)),
            ["10.244.1.1:8080", "10.244.0.1:8080"]
        );
        assert_eq!(addresses(&sets.reachable(true, false)), ["10.244.1.1:8080"]);
    }

    #[test]
    fn topology_marks_on_every_ready_endpoint_are_ignored_rather_than_refusing_the_service() {
        let all = [
            elsewhere(ready("10.244.1.1", false)),
            elsewhere(ready("10.244.2.1", false)),
            draining("10.244.3.1", false),
        ];

        let sets = categorize(&all);

        assert_eq!(
            addresses(&sets.cluster),
            ["10.244.1.1:8080", "10.244.2.1:8080"]
        );
        assert!(!sets.cluster_is_terminating_fallback);
        assert!(sets.topology_excluded.is_empty());
    }

    #[test]
    fn duplicate_addresses_count_once() {
        let all = [
            ready("10.244.0.1", true),
            ready("10.244.0.1", true),
            ready("10.244.1.1", false),
        ];

        let sets = categorize(&all);

        assert_eq!(
            addresses(&sets.cluster),
            ["10.244.0.1:8080", "10.244.1.1:8080"]
        );
        assert_eq!(
            addresses(&sets.reachable(true, true)),
            ["10.244.0.1:8080", "10.244.1.1:8080"]
        );
    }
}
