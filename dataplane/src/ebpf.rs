//! The eBPF mode (`--proxy-mode ebpf`): Services balanced in the socket layer. Programs attached
//! to the node's cgroup v2 root send a socket aimed at a cluster IP to one endpoint when it
//! connects (or, for unconnected UDP, per datagram), so no packet is translated and no rule is
//! walked; replies and `getpeername()` read as the Service.
//!
//! * [`layout`]: the maps' keys and values as `bpf/sock.c` reads them;
//! * [`entries`]: what a [`ProxyState`] asks the maps to hold, and the order of writes that gets
//!   there without a half-written Service port (pure);
//! * [`kernel`]: the programs and maps, pinned so they outlive the agent, and the map's
//!   reads and writes.
//!
//! This first part serves cluster IPs over IPv4 to clients on the node (pods and host
//! processes), with both traffic policies' endpoint choice; `docs/features.md` lists what the
//! mode does not do yet.

pub mod entries;
pub mod kernel;
pub mod layout;

use crate::full_sync::FullSyncClock;
use crate::{Dataplane, FailedStep, IpFamily, ProxyState, SyncError, SyncReport};
use entries::Entries;
use kernel::Attached;
use std::path::PathBuf;

/// How the eBPF mode is configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// A BPF filesystem (mounted there if it is not): the maps and links are pinned under it.
    pub bpf_root: PathBuf,
    /// The cgroup v2 folder the programs attach to: the hierarchy's root serves every process
    /// on the node.
    pub cgroup: PathBuf,
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

/// The state the map holds the entries of, and how many there are.
#[derive(Debug)]
struct Programmed {
    state: ProxyState,
    entries: usize,
}

/// What one sync changes in the map.
enum Change {
    /// Everything: the map is read and made to hold these entries.
    Full(Entries),
    /// Only changed Services: their entries before and after, and the map's size after.
    /// Cluster IPs are each one Service's (the API server allocates them), so no two Services'
    /// entries share a key.
    Services {
        before: Entries,
        after: Entries,
        total: usize,
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

    /// The change from what the map holds to `state`'s entries.
    fn change_to(&self, state: &ProxyState) -> Change {
        let Some(programmed) = self.programmed.as_ref().filter(|_| !self.full_syncs.due()) else {
            return Change::Full(entries::desired(state));
        };
        let (mut before, mut after) = (Entries::new(), Entries::new());
        for key in state.changed_services(&programmed.state) {
            if let Some(service) = programmed.state.services.get(key) {
                before.extend(entries::of_service(service));
            }
            if let Some(service) = state.services.get(key) {
                after.extend(entries::of_service(service));
            }
        }
        let total = programmed.entries.saturating_sub(before.len()) + after.len();
        Change::Services {
            before,
            after,
            total,
        }
    }
}

/// The table name the sync report counts the map's entries under.
const TABLE: &str = "services";

impl Dataplane for EbpfBackend {
    type Error = kernel::Error;

    fn mode(&self) -> &'static str {
        "ebpf"
    }

    async fn sync(&mut self, state: &ProxyState) -> Result<SyncReport, kernel::Error> {
        let change = self.change_to(state);
        let attached = self.attached.take();
        self.programmed = None;
        let config = self.config.clone();
        // Map writes are system calls of a few microseconds each, tens of thousands on a big
        // cluster's first sync: off the runtime's threads.
        let (attached, outcome) = tokio::task::spawn_blocking(move || {
            let mut attached = match attached {
                Some(attached) => attached,
                None => match Attached::new(&config.bpf_root, &config.cgroup) {
                    Ok(attached) => attached,
                    Err(err) => return (None, Err(err)),
                },
            };
            let outcome = apply(&mut attached, &change).map(|written| (written, change));
            (Some(attached), outcome)
        })
        .await
        .unwrap_or_else(|join| std::panic::resume_unwind(join.into_panic()));
        self.attached = attached;
        let (written, change) = outcome?;
        let (full, total) = match change {
            Change::Full(desired) => {
                self.full_syncs.record();
                (true, desired.len())
            }
            Change::Services { total, .. } => (false, total),
        };
        self.programmed = Some(Programmed {
            state: state.clone(),
            entries: total,
        });
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Ok(SyncReport::for_family(
            IpFamily::V4,
            vec![(TABLE.to_owned(), count(written))],
            vec![(TABLE.to_owned(), count(total))],
            full,
        ))
    }
}

/// Makes the map's change; returns the entries written. A full change reads the map first,
/// removing what no agent of this layout writes.
fn apply(attached: &mut Attached, change: &Change) -> Result<usize, kernel::Error> {
    let (writes, total) = match change {
        Change::Full(desired) => {
            let (held, foreign) = attached.entries()?;
            attached.delete_foreign(&foreign)?;
            (entries::writes(&held, desired), desired.len())
        }
        Change::Services {
            before,
            after,
            total,
        } => (entries::writes(before, after), *total),
    };
    attached.write(total, &writes)?;
    Ok(writes.len())
}
