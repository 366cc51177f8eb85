//! What the maps should hold for a [`ProxyState`], and the order of writes that takes them from
//! what they hold there without a connection ever seeing a half-written Service port.

use super::layout::{SlotKey, SlotValue};
use crate::port_plan::PortPlan;
use crate::{IpFamily, ProxyState, Service};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddrV4};

/// Map entries by key.
pub type Entries = BTreeMap<SlotKey, SlotValue>;

/// One write to the services map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Creates or replaces an entry.
    Put(SlotKey, SlotValue),
    /// Removes an entry.
    Delete(SlotKey),
}

/// The entries of every IPv4 cluster IP's ports in `state` ([`of_service`]).
#[must_use]
pub fn desired(state: &ProxyState) -> Entries {
    state
        .services
        .values()
        .flat_map(|service| of_service(service))
        .collect()
}

/// The entries of `service`'s IPv4 cluster IPs: per port, a header with the endpoint count,
/// then one slot per endpoint the port's traffic policy sends cluster-IP traffic to.
#[must_use]
pub fn of_service(service: &Service) -> Entries {
    let mut entries = Entries::new();
    for port in &service.ports {
        let plan = PortPlan::new(service, port, IpFamily::V4);
        let endpoints: Vec<SocketAddrV4> = if plan.internal_policy_local {
            &plan.local_endpoints
        } else {
            &plan.cluster_endpoints
        }
        .iter()
        .filter_map(|endpoint| match endpoint.ip {
            IpAddr::V4(ip) => Some(SocketAddrV4::new(ip, endpoint.port)),
            IpAddr::V6(_) => None,
        })
        .collect();
        for address in &plan.cluster_ips {
            let IpAddr::V4(address) = *address else {
                continue;
            };
            let header = SlotKey {
                address,
                port: port.port,
                protocol: port.protocol,
                slot: 0,
            };
            let count = u32::try_from(endpoints.len()).unwrap_or(u32::MAX);
            let drop = count == 0 && plan.has_endpoints;
            entries.insert(header, SlotValue::Header { count, drop });
            for (slot, endpoint) in (1..=count).zip(&endpoints) {
                entries.insert(header.with_slot(slot), SlotValue::Endpoint(*endpoint));
            }
        }
    }
    entries
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
