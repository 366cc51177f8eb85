//! The changes that bring the kernel's IPVS table to a [`Plan`], with kube-proxy's graceful
//! termination (`pkg/proxy/ipvs/graceful_termination.go`): a TCP real server that leaves the
//! plan while it still holds connections is set to weight 0, so it takes no new connection but
//! keeps its open ones, and is deleted by a later sync once they are gone; UDP and SCTP real
//! servers are deleted at once (their flows are cleaned up through conntrack). A draining real
//! server that comes back to the plan gets its weight back.
//!
//! Only virtual servers the caller owns are deleted: IPVS is shared, and another program's
//! virtual servers must survive.

use super::plan::Plan;
use super::{ListedRealServer, RealServer, ServiceId, VirtualServer};
use crate::Protocol;
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

/// A virtual server as the kernel lists it, with its real servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedServer {
    /// The virtual server.
    pub server: VirtualServer,
    /// Its real servers.
    pub real_servers: Vec<ListedRealServer>,
}

/// One change to the kernel's IPVS table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Add the virtual server.
    AddServer(VirtualServer),
    /// Change the scheduler, flags or timeout of the virtual server of the same identity.
    UpdateServer(VirtualServer),
    /// Delete the virtual server and its real servers.
    DeleteServer(ServiceId),
    /// Add a real server to a virtual server.
    AddRealServer(ServiceId, RealServer),
    /// Change a real server's weight.
    UpdateRealServer(ServiceId, RealServer),
    /// Delete a real server.
    DeleteRealServer(ServiceId, RealServer),
}

impl std::fmt::Display for Change {
    /// `add tcp 10.96.0.10:80 rr`, `weight tcp 10.96.0.10:80 10.244.1.20:8080 0`, …
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let real = |real: &RealServer| std::net::SocketAddr::new(real.address, real.port);
        match self {
            Self::AddServer(server) => write!(f, "add {} {}", server.id, server.scheduler),
            Self::UpdateServer(server) => write!(f, "update {} {}", server.id, server.scheduler),
            Self::DeleteServer(id) => write!(f, "delete {id}"),
            Self::AddRealServer(id, r) => write!(f, "add real {id} {} {}", real(r), r.weight),
            Self::UpdateRealServer(id, r) => write!(f, "weight {id} {} {}", real(r), r.weight),
            Self::DeleteRealServer(id, r) => write!(f, "delete real {id} {}", real(r)),
        }
    }
}

/// The changes that turn `kernel` (every virtual server the kernel lists) into `plan`, in an
/// order the kernel accepts: deletions of whole virtual servers first, then per virtual server
/// in identity order its own change and its real servers'. Virtual servers not in the plan are
/// deleted only when `owned` says so.
#[must_use]
pub fn changes(
    kernel: &BTreeMap<ServiceId, ListedServer>,
    plan: &Plan,
    owned: impl Fn(&ServiceId) -> bool,
) -> Vec<Change> {
    let mut changes: Vec<Change> = kernel
        .keys()
        .filter(|id| !plan.servers.contains_key(id) && owned(id))
        .map(|id| Change::DeleteServer(*id))
        .collect();
    for (id, planned) in &plan.servers {
        let Some(listed) = kernel.get(id) else {
            changes.push(Change::AddServer(planned.server.clone()));
            changes.extend(
                planned
                    .real_servers
                    .iter()
                    .map(|real| Change::AddRealServer(*id, *real)),
            );
            continue;
        };
        if listed.server != planned.server {
            changes.push(Change::UpdateServer(planned.server.clone()));
        }
        let held: BTreeMap<(IpAddr, u16), &ListedRealServer> = listed
            .real_servers
            .iter()
            .map(|real| ((real.server.address, real.server.port), real))
            .collect();
        for real in &planned.real_servers {
            match held.get(&(real.address, real.port)) {
                None => changes.push(Change::AddRealServer(*id, *real)),
                Some(listed) if listed.server.weight != real.weight => {
                    changes.push(Change::UpdateRealServer(*id, *real));
                }
                Some(_) => {}
            }
        }
        let planned_endpoints: BTreeSet<(IpAddr, u16)> = planned
            .real_servers
            .iter()
            .map(|real| (real.address, real.port))
            .collect();
        let gone = |real: &&ListedRealServer| {
            !planned_endpoints.contains(&(real.server.address, real.server.port))
        };
        for listed in listed.real_servers.iter().filter(gone) {
            changes.extend(retire(id, listed));
        }
    }
    changes
}

/// What to do with a real server that left the plan: drain a TCP one that still holds
/// connections, delete the others.
fn retire(id: &ServiceId, listed: &ListedRealServer) -> Option<Change> {
    let connections = listed
        .active_connections
        .saturating_add(listed.inactive_connections);
    if id.protocol == Protocol::Tcp && connections > 0 {
        (listed.server.weight != 0).then_some(Change::UpdateRealServer(
            *id,
            RealServer {
                weight: 0,
                ..listed.server
            },
        ))
    } else {
        Some(Change::DeleteRealServer(*id, listed.server))
    }
}

#[cfg(test)]
mod tests;
