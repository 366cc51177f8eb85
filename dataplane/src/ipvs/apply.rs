//! One IPVS sync: read the kernel's table, work out the [`Change`]s to the plan, make them.
//!
//! A change the kernel refuses does not stop the others: each virtual server stands alone, so one
//! Service the kernel will not take (an unknown scheduler, say) leaves every other Service
//! programmed, and the sync reports what failed.

use super::diff::{Change, ListedServer, changes};
use super::plan::Plan;
use super::{ListedRealServer, RealServer, ServiceId, VirtualServer};
use std::collections::{BTreeMap, BTreeSet};

/// The kernel's IPVS table, as the sync reads and changes it.
pub trait IpvsTable {
    /// Why an operation failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Every virtual server.
    fn services(&mut self) -> Result<Vec<VirtualServer>, Self::Error>;
    /// The real servers of `service`.
    fn real_servers(&mut self, service: ServiceId) -> Result<Vec<ListedRealServer>, Self::Error>;
    /// Adds a virtual server.
    fn add_service(&mut self, server: &VirtualServer) -> Result<(), Self::Error>;
    /// Changes the scheduler, flags and timeout of a virtual server.
    fn update_service(&mut self, server: &VirtualServer) -> Result<(), Self::Error>;
    /// Deletes a virtual server with its real servers.
    fn delete_service(&mut self, service: ServiceId) -> Result<(), Self::Error>;
    /// Adds a real server to `service`.
    fn add_real_server(&mut self, service: ServiceId, real: RealServer) -> Result<(), Self::Error>;
    /// Changes the weight of a real server of `service`.
    fn update_real_server(
        &mut self,
        service: ServiceId,
        real: RealServer,
    ) -> Result<(), Self::Error>;
    /// Deletes a real server of `service`.
    fn delete_real_server(
        &mut self,
        service: ServiceId,
        real: RealServer,
    ) -> Result<(), Self::Error>;
}

/// A change the kernel refused, and why.
#[derive(Debug, thiserror::Error)]
#[error("IPVS refused {change:?}")]
pub struct Refused<E: std::error::Error + 'static> {
    /// The change.
    pub change: Change,
    /// The kernel's answer.
    #[source]
    pub error: E,
}

/// What a sync did.
#[derive(Debug)]
pub struct Applied<E: std::error::Error + 'static> {
    /// The changes made.
    pub made: Vec<Change>,
    /// The changes the kernel refused.
    pub refused: Vec<Refused<E>>,
}

/// Reads `table`, and makes the changes that turn it into `plan`; virtual servers outside the
/// plan go only when `owned` says they are ours.
///
/// # Errors
///
/// When the table cannot be read: nothing was changed then.
pub fn apply<T: IpvsTable>(
    table: &mut T,
    plan: &Plan,
    owned: impl Fn(&ServiceId) -> bool,
) -> Result<Applied<T::Error>, T::Error> {
    let kernel = read(table)?;
    let mut applied = Applied {
        made: Vec::new(),
        refused: Vec::new(),
    };
    // Virtual servers the kernel would not add: their real servers would fail too.
    let mut not_added = BTreeSet::new();
    for change in changes(&kernel, plan, owned) {
        if let Change::AddRealServer(id, _) = &change
            && not_added.contains(id)
        {
            continue;
        }
        let result = match &change {
            Change::AddServer(server) => table.add_service(server),
            Change::UpdateServer(server) => table.update_service(server),
            Change::DeleteServer(id) => table.delete_service(*id),
            Change::AddRealServer(id, real) => table.add_real_server(*id, *real),
            Change::UpdateRealServer(id, real) => table.update_real_server(*id, *real),
            Change::DeleteRealServer(id, real) => table.delete_real_server(*id, *real),
        };
        match result {
            Ok(()) => applied.made.push(change),
            Err(error) => {
                if let Change::AddServer(server) = &change {
                    not_added.insert(server.id);
                }
                applied.refused.push(Refused { change, error });
            }
        }
    }
    Ok(applied)
}

/// Every virtual server of `table` with its real servers.
fn read<T: IpvsTable>(table: &mut T) -> Result<BTreeMap<ServiceId, ListedServer>, T::Error> {
    let mut kernel = BTreeMap::new();
    for server in table.services()? {
        let real_servers = table.real_servers(server.id)?;
        kernel.insert(
            server.id,
            ListedServer {
                server,
                real_servers,
            },
        );
    }
    Ok(kernel)
}

#[cfg(test)]
mod tests;
