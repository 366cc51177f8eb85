//! What the maps should hold for a [`ProxyState`], and the order of writes that takes them from
//! what they hold there without a connection ever seeing a half-written Service port.

use super::layout::{Scope, SlotKey, SlotValue};
use super::nft_table::Refused;
use crate::port_plan::PortPlan;
use crate::{IpFamily, Protocol, ProxyState, Service};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

/// Map entries by key.
pub type Entries = BTreeMap<SlotKey, SlotValue>;

/// How many Services claim each header key ([`Frontend::header`]).
pub type Claims = HashMap<SlotKey, u32>;

/// One write to the services map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Creates or replaces an entry.
    Put(SlotKey, SlotValue),
    /// Removes an entry.
    Delete(SlotKey),
}

/// One Service port at one address connections are aimed at: its header, then one slot per
/// endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frontend {
    /// The header's key (slot 0).
    pub header: SlotKey,
    /// Whether the address is a cluster IP: those win a key two Services claim.
    pub cluster_ip: bool,
    /// The endpoints, in slot order.
    endpoints: Vec<SocketAddr>,
    /// With no endpoints: drop rather than refuse.
    drop: bool,
    /// Outside clients are masqueraded.
    masquerade: bool,
    /// `sessionAffinity: ClientIP`'s timeout in seconds; 0 without.
    affinity_seconds: u32,
}

impl Frontend {
    /// The header and slot entries.
    pub fn entries(&self) -> impl Iterator<Item = (SlotKey, SlotValue)> + '_ {
        let count = u32::try_from(self.endpoints.len()).unwrap_or(u32::MAX);
        let header = SlotValue::Header {
            count,
            drop: self.drop && count == 0,
            masquerade: self.masquerade,
            affinity_seconds: self.affinity_seconds,
        };
        std::iter::once((self.header, header)).chain(
            (1..=count).zip(&self.endpoints).map(|(slot, endpoint)| {
                (self.header.with_slot(slot), SlotValue::Endpoint(*endpoint))
            }),
        )
    }
}

/// What the map should hold for a state, and who claims each header.
#[derive(Debug, Default)]
pub struct Desired {
    /// The entries.
    pub entries: Entries,
    /// The Services claiming each header, clashes included.
    pub claims: Claims,
}

/// The entries of every Service in `state` ([`frontends`]), with node ports on `node_ports`.
/// Where two Services claim one key (an external or load-balancer IP naming another's cluster
/// IP or external IP), the cluster IP's Service takes it, else the first in name order:
/// upstream's rules for both sit in one chain in map order, so which one serves is chance there,
/// and a cluster IP taken over by another tenant's external IP is CVE-2020-8554.
#[must_use]
pub fn desired(state: &ProxyState, node_ports: &[IpAddr]) -> Desired {
    let mut frontends: Vec<Frontend> = state
        .services
        .values()
        .flat_map(|service| frontends(service, node_ports))
        .collect();
    frontends.sort_by_key(|frontend| !frontend.cluster_ip);
    let mut desired = Desired::default();
    for frontend in &frontends {
        let claims = desired.claims.entry(frontend.header).or_default();
        *claims += 1;
        if *claims == 1 {
            desired.entries.extend(frontend.entries());
        }
    }
    desired
}

/// Moves `claims` from the frontends of Services as they were (`before`) to the same Services'
/// now (`after`). Returns whether every key either side names had at most one claim both before
/// and after: only then are `before`'s entries exactly what the map holds for them, and
/// writing `after`'s over them exact.
pub fn reclaim(claims: &mut Claims, before: &[Frontend], after: &[Frontend]) -> bool {
    let sole = |claims: &Claims, frontends: &[Frontend]| {
        frontends
            .iter()
            .all(|frontend| claims.get(&frontend.header).is_none_or(|n| *n <= 1))
    };
    let sole_before = sole(claims, before);
    for frontend in before {
        if let Some(n) = claims.get_mut(&frontend.header) {
            *n -= 1;
            if *n == 0 {
                claims.remove(&frontend.header);
            }
        }
    }
    for frontend in after {
        *claims.entry(frontend.header).or_default() += 1;
    }
    sole_before && sole(claims, after)
}

/// The frontends of `service`'s addresses of both families, per port, for the node's own
/// traffic: each cluster IP with the endpoints its internal traffic policy sends traffic to;
/// the node port on each of `node_ports`, each external IP and each load-balancer IP without
/// source ranges with every endpoint, as upstream sends the node's own traffic to those (its
/// short-circuit under `externalTrafficPolicy: Local`). Then the same node ports, external and
/// load-balancer IPs for traffic from outside, with the endpoints the external traffic policy
/// sends it to, masqueraded under `Cluster`. A load-balancer IP with source ranges is left to
/// the network in both: the socket layer does not know yet which source a connection will
/// have, and the packet programs do not check sources yet. A key the Service names twice (an
/// external IP that is also its load-balancer IP) is its first frontend's.
#[must_use]
pub fn frontends(service: &Service, node_ports: &[IpAddr]) -> Vec<Frontend> {
    let mut frontends: Vec<Frontend> = Vec::new();
    let mut headers = HashSet::new();
    for port in &service.ports {
        for family in IpFamily::ALL {
            let plan = PortPlan::new(service, port, family);
            // A family the Service has no cluster IP of is not the Service's (upstream's
            // proxier of that family never sees it): no node port, external or load-balancer
            // IP of it either.
            if plan.cluster_ips.is_empty() {
                continue;
            }
            let addresses = |endpoints: &[&crate::Endpoint]| -> Vec<SocketAddr> {
                endpoints
                    .iter()
                    .map(|endpoint| SocketAddr::new(endpoint.ip, endpoint.port))
                    .collect()
            };
            let internal = addresses(if plan.internal_policy_local {
                &plan.local_endpoints
            } else {
                &plan.cluster_endpoints
            });
            let every = addresses(&plan.cluster_endpoints);
            let outside = addresses(if plan.external_policy_local {
                &plan.local_endpoints
            } else {
                &plan.cluster_endpoints
            });
            let affinity_seconds = plan
                .affinity_seconds
                .map_or(0, |seconds| u32::try_from(seconds).unwrap_or(u32::MAX));
            let at = |address: IpAddr, port_number: u16| SlotKey {
                address,
                port: port_number,
                protocol: port.protocol,
                scope: Scope::Node,
                slot: 0,
            };
            let cluster_ips = plan.cluster_ips.iter().map(|ip| at(*ip, port.port));
            let node_ports = port.node_port.into_iter().flat_map(|node_port| {
                node_ports
                    .iter()
                    .filter(|ip| family.contains(ip))
                    .map(move |ip| at(*ip, node_port))
            });
            let balancers = if plan.source_ranges.is_empty() {
                plan.load_balancer_ips.as_slice()
            } else {
                &[]
            };
            let external: Vec<SlotKey> = node_ports
                .chain(
                    plan.external_ips
                        .iter()
                        .chain(balancers)
                        .map(|ip| at(*ip, port.port)),
                )
                .collect();
            let from_outside = external.iter().map(|header| SlotKey {
                scope: Scope::Outside,
                ..*header
            });
            let node = |endpoints| (false, endpoints);
            let keyed = cluster_ips
                .map(|header| (header, true, node(&internal)))
                .chain(external.iter().map(|header| (*header, false, node(&every))))
                .chain(
                    from_outside
                        .map(|header| (header, false, (!plan.external_policy_local, &outside))),
                );
            for (header, cluster_ip, (masquerade, endpoints)) in keyed {
                if !headers.insert(header) {
                    continue;
                }
                frontends.push(Frontend {
                    header,
                    cluster_ip,
                    endpoints: endpoints.clone(),
                    drop: plan.has_endpoints,
                    masquerade,
                    affinity_seconds,
                });
            }
        }
    }
    frontends
}

/// The Service ports reached from outside over UDP, each with an endpoint, that `before` holds
/// and `after` does not: connections from outside that went there must choose again.
#[must_use]
pub fn gone_udp_endpoints(before: &Entries, after: &Entries) -> HashSet<(SocketAddr, SocketAddr)> {
    let pairs = |entries: &Entries| -> HashSet<(SocketAddr, SocketAddr)> {
        entries
            .iter()
            .filter(|(key, _)| key.scope == Scope::Outside && key.protocol == Protocol::Udp)
            .filter_map(|(key, value)| match value {
                SlotValue::Endpoint(endpoint) => {
                    Some((SocketAddr::new(key.address, key.port), *endpoint))
                }
                SlotValue::Header { .. } => None,
            })
            .collect()
    };
    let after = pairs(after);
    pairs(before)
        .into_iter()
        .filter(|pair| !after.contains(pair))
        .collect()
}

/// The Service addresses and ports of `entries` that refuse connections from outside: the
/// outside headers without endpoints that do not drop. The packet programs let those through
/// untranslated, for the nftables table to reject.
pub fn refused_from_outside(entries: &Entries) -> impl Iterator<Item = Refused> + '_ {
    entries.iter().filter_map(|(key, value)| match value {
        SlotValue::Header {
            count: 0,
            drop: false,
            ..
        } if key.scope == Scope::Outside => Some((key.address, key.protocol, key.port)),
        _ => None,
    })
}

/// The writes that take the map from `current` to `desired`, ordered so that a program reading
/// between any two of them finds, for every port, a header whose slots all exist: endpoint
/// slots are written before headers (a count goes up only once its slots are there), headers
/// before removals (a count goes down, or a port goes, before its slots do).
#[must_use]
pub fn writes(current: &Entries, desired: &Entries) -> Vec<Write> {
    let puts = desired
        .iter()
        .filter(|(key, value)| current.get(key) != Some(value))
        .map(|(key, value)| (*key, *value));
    let (header_puts, slot_puts): (Vec<_>, Vec<_>) = puts.partition(|(key, _)| key.slot == 0);
    let deletes = current
        .keys()
        .filter(|key| !desired.contains_key(key))
        .copied();
    let (header_deletes, slot_deletes): (Vec<SlotKey>, Vec<SlotKey>) =
        deletes.partition(|key| key.slot == 0);
    let put = |(key, value)| Write::Put(key, value);
    slot_puts
        .into_iter()
        .map(put)
        .chain(header_puts.into_iter().map(put))
        .chain(header_deletes.into_iter().map(Write::Delete))
        .chain(slot_deletes.into_iter().map(Write::Delete))
        .collect()
}

#[cfg(test)]
mod tests;
