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
    /// What the map holds, as of the last sync; read from the map when unknown (at the first
    /// sync, after a failed one).
    held: Option<Entries>,
}

impl EbpfBackend {
    /// A backend that attaches its programs at its first sync.
    #[must_use]
    pub fn new(config: Config) -> Self {
        Self {
            config,
            attached: None,
            held: None,
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
        let desired = entries::desired(state);
        let attached = self.attached.take();
        let held = self.held.take();
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
            let outcome = write(&mut attached, held, &desired).map(|written| (desired, written));
            (Some(attached), outcome)
        })
        .await
        .unwrap_or_else(|join| std::panic::resume_unwind(join.into_panic()));
        self.attached = attached;
        let (desired, (written, full)) = outcome?;
        let total = u32::try_from(desired.len()).unwrap_or(u32::MAX);
        self.held = Some(desired);
        Ok(SyncReport::for_family(
            IpFamily::V4,
            vec![(TABLE.to_owned(), written)],
            vec![(TABLE.to_owned(), total)],
            full,
        ))
    }
}

/// Takes the map from `held` (read from it when unknown) to `desired`; returns the entries
/// written and whether the map was read first (a full sync).
fn write(
    attached: &mut Attached,
    held: Option<Entries>,
    desired: &Entries,
) -> Result<(u32, bool), kernel::Error> {
    let full = held.is_none();
    let held = match held {
        Some(held) => held,
        None => {
            let (held, foreign) = attached.entries()?;
            attached.delete_foreign(&foreign)?;
            held
        }
    };
    let writes = entries::writes(&held, desired);
    attached.write(desired, &writes)?;
    Ok((u32::try_from(writes.len()).unwrap_or(u32::MAX), full))
}
