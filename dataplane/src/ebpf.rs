//! The eBPF mode (`--proxy-mode ebpf`): Services balanced in the socket layer. Programs attached
//! to the node's cgroup v2 root send a socket aimed at a Service to one endpoint when it
//! connects (or, for unconnected UDP, per datagram), so no packet is translated and no rule is
//! walked; replies and `getpeername()` read as the Service.
//!
//! * [`layout`]: the maps' keys and values as `bpf/sock.c` reads them;
//! * [`entries`]: what a [`ProxyState`] asks the maps to hold, and the order of writes that gets
//!   there without a half-written Service port (pure);
//! * [`kernel`]: the programs and maps, pinned so they outlive the agent, and the map's
//!   reads and writes;
//! * [`packets`]: the tc programs on the node's devices, for traffic from outside the node;
//! * [`nft_table`]: the nftables table that masquerades the connections they mark and refuses
//!   Service addresses without endpoints they let through.
//!
//! It serves Services of both families to clients on the node (pods and host processes):
//! cluster IPs with both traffic policies' endpoint choice and session affinity, and node ports,
//! external IPs and load-balancer IPs as upstream serves the node's own traffic to them; and
//! node ports, external IPs and load-balancer IPs to clients outside the node, as the external
//! traffic policy says; `docs/features.md` lists what the mode does not do yet.

mod capabilities;
pub mod entries;
mod error;
pub mod kernel;
pub mod layout;
mod links;
pub mod nft_table;
pub mod packets;

use crate::full_sync::FullSyncClock;
use crate::{Dataplane, FailedStep, IpFamily, ProxyState, SyncError, SyncReport};
use entries::{Claims, Entries, Frontend, Write};
use kernel::Attached;
use layout::SlotKey;
use std::net::IpAddr;
use std::path::PathBuf;

/// How the eBPF mode is configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// A BPF filesystem (mounted there if it is not): the maps and links are pinned under it.
    pub bpf_root: PathBuf,
    /// The cgroup v2 folder the programs attach to: the hierarchy's root serves every process
    /// on the node.
    pub cgroup: PathBuf,
    /// The addresses taking node ports
    /// ([`NodeOptions::node_port_addresses`](crate::node_options::NodeOptions::node_port_addresses));
    /// `None` for every address of the node's interfaces, listed at each sync.
    pub node_port_addresses: Option<Vec<IpAddr>>,
    /// The devices whose traffic from outside is balanced; `None` for those holding the
    /// node-port addresses, listed at each sync.
    pub devices: Option<Vec<String>>,
    /// The mark the packet programs set on connections to masquerade
    /// ([`NodeOptions::masquerade_bit`](crate::node_options::NodeOptions::masquerade_bit)'s).
    pub masquerade_mark: u32,
}

impl SyncError for kernel::Error {
    fn failed_step(&self) -> FailedStep {
        FailedStep::Other
    }
}

/// The eBPF mode as a [`Dataplane`].
#[derive(Debug)]
pub struct EbpfBackend {
    config: Config,
    /// The programs, attached at the first sync.
    attached: Option<Attached>,
    /// What the map holds, as of the last sync; unknown at the first sync and after a failed
    /// one, when the map is read instead.
    programmed: Option<Programmed>,
    /// When the map was last read and reconciled whole: once an hour, as every mode's full sync,
    /// so that entries changed behind the agent's back come back.
    full_syncs: FullSyncClock,
}

/// The state the map holds the entries of, how many there are, who claims each header, and the
/// addresses node ports were written on.
#[derive(Debug)]
struct Programmed {
    state: ProxyState,
    entries: PerFamily,
    claims: Claims,
    node_ports: Vec<IpAddr>,
}

/// Entries or writes per IP family, IPv4's first (as [`IpFamily::ALL`]).
type PerFamily = [usize; 2];

/// `keys` counted per family.
fn per_family<'a>(keys: impl Iterator<Item = &'a SlotKey>) -> PerFamily {
    let mut counts = [0, 0];
    for key in keys {
        counts[usize::from(key.address.is_ipv6())] += 1;
    }
    counts
}

/// What one sync changes in the map.
enum Change {
    /// Everything: the map is read and made to hold these entries.
    Full(Entries),
    /// Only changed Services, none sharing a key with another Service: their entries before and
    /// after, and the map's size after.
    Services {
        before: Entries,
        after: Entries,
        total: PerFamily,
    },
}

impl EbpfBackend {
    /// A backend that attaches its programs at its first sync.
    #[must_use]
    pub fn new(config: Config) -> Self {
        Self {
            config,
            attached: None,
            programmed: None,
            full_syncs: FullSyncClock::default(),
        }
    }

    /// The change from what the map holds to `state`'s entries with node ports on
    /// `node_ports`, and who claims each header after it. A change of node addresses, a clash
    /// between Services' keys and the hourly full sync change everything.
    fn change_to(&mut self, state: &ProxyState, node_ports: &[IpAddr]) -> (Change, Claims) {
        let full = |state: &ProxyState| {
            let desired = entries::desired(state, node_ports);
            (Change::Full(desired.entries), desired.claims)
        };
        let Some(mut programmed) = self
            .programmed
            .take()
            .filter(|programmed| !self.full_syncs.due() && programmed.node_ports == node_ports)
        else {
            return full(state);
        };
        let (mut before, mut after) = (Vec::new(), Vec::new());
        for key in state.changed_services(&programmed.state) {
            if let Some(service) = programmed.state.services.get(key) {
                before.extend(entries::frontends(service, node_ports));
            }
            if let Some(service) = state.services.get(key) {
                after.extend(entries::frontends(service, node_ports));
            }
        }
        if !entries::reclaim(&mut programmed.claims, &before, &after) {
            return full(state);
        }
        let collect = |frontends: &[Frontend]| -> Entries {
            frontends.iter().flat_map(Frontend::entries).collect()
        };
        let (before, after) = (collect(&before), collect(&after));
        let (gone, added) = (per_family(before.keys()), per_family(after.keys()));
        let total = [0, 1].map(|f| programmed.entries[f].saturating_sub(gone[f]) + added[f]);
        let change = Change::Services {
            before,
            after,
            total,
        };
        (change, programmed.claims)
    }
}

/// The table name the sync report counts the map's entries under.
const TABLE: &str = "services";

impl Dataplane for EbpfBackend {
    type Error = kernel::Error;

    fn mode(&self) -> &'static str {
        "ebpf"
    }

    fn set_node_port_addresses(&mut self, addresses: Option<Vec<IpAddr>>) {
        self.config.node_port_addresses = addresses;
    }

    async fn sync(&mut self, state: &ProxyState) -> Result<SyncReport, kernel::Error> {
        let node_ports = kernel::node_port_addresses(self.config.node_port_addresses.as_deref())?;
        let devices = match &self.config.devices {
            Some(devices) => devices.clone(),
            None => packets::devices_holding(&node_ports)?,
        };
        let (change, claims) = self.change_to(state, &node_ports);
        let attached = self.attached.take();
        let config = self.config.clone();
        // Map writes are system calls of a few microseconds each, tens of thousands on a big
        // cluster's first sync: off the runtime's threads.
        let (attached, outcome) = tokio::task::spawn_blocking(move || {
            let mut attached = match attached {
                Some(attached) => attached,
                None => {
                    match Attached::new(&config.bpf_root, &config.cgroup, config.masquerade_mark) {
                        Ok(attached) => attached,
                        Err(err) => return (None, Err(err)),
                    }
                }
            };
            let outcome = apply(&mut attached, &change)
                .and_then(|written| attached.attach_devices(&devices).map(|()| written))
                .map(|written| (written, change));
            (Some(attached), outcome)
        })
        .await
        .unwrap_or_else(|join| std::panic::resume_unwind(join.into_panic()));
        self.attached = attached;
        let (written, change) = outcome?;
        let (full, total) = match change {
            Change::Full(desired) => {
                self.full_syncs.record();
                (true, per_family(desired.keys()))
            }
            Change::Services { total, .. } => (false, total),
        };
        self.programmed = Some(Programmed {
            state: state.clone(),
            entries: total,
            claims,
            node_ports,
        });
        let count = |n: usize| vec![(TABLE.to_owned(), u32::try_from(n).unwrap_or(u32::MAX))];
        let mut report =
            SyncReport::for_family(IpFamily::V4, count(written[0]), count(total[0]), full);
        report.merge(SyncReport::for_family(
            IpFamily::V6,
            count(written[1]),
            count(total[1]),
            full,
        ));
        Ok(report)
    }
}

/// Makes the map's change; returns the entries written per family. A full change reads the
/// map first, removing what no agent of this layout writes. UDP connections from outside to
/// endpoints gone choose again, and what is refused from outside follows the change.
fn apply(attached: &mut Attached, change: &Change) -> Result<PerFamily, kernel::Error> {
    let (writes, total, gone, refused) = match change {
        Change::Full(desired) => {
            let (held, foreign) = attached.entries()?;
            attached.delete_foreign(&foreign)?;
            let gone = entries::gone_udp_endpoints(&held, desired);
            let refused = entries::refused_from_outside(desired).collect();
            (
                entries::writes(&held, desired),
                desired.len(),
                gone,
                refused,
            )
        }
        Change::Services {
            before,
            after,
            total,
        } => {
            let mut refused = attached.refused();
            for gone in entries::refused_from_outside(before) {
                refused.remove(&gone);
            }
            refused.extend(entries::refused_from_outside(after));
            (
                entries::writes(before, after),
                total.iter().sum(),
                entries::gone_udp_endpoints(before, after),
                refused,
            )
        }
    };
    attached.write(total, &writes)?;
    // Once the endpoints are gone from the map, so no new flow chooses them.
    attached.forget_udp_flows(&gone)?;
    attached.refuse(refused)?;
    Ok(per_family(writes.iter().map(|write| match write {
        Write::Put(key, _) | Write::Delete(key) => key,
    })))
}
