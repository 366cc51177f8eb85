//! What the agent has done so far, shared by the sync loop (writer) and the HTTP and inspection
//! servers (readers).

use crate::node_state::NodeState;
use std::{
    sync::{Arc, RwLock},
    time::{Duration, SystemTime},
};
use tokio::time::Instant;

/// The outcome of one dataplane sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncOutcome {
    /// When the sync finished.
    pub finished_at: SystemTime,
    /// How long it took.
    pub duration: Duration,
    /// The error, when the sync failed.
    pub error: Option<String>,
    /// Rules written per table.
    pub rules_written: Vec<(String, u32)>,
}

/// A consistent copy of the agent's status.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Whether a controller stream is open.
    pub connected: bool,
    /// The controller of the current or last stream.
    pub controller: String,
    /// The applied state.
    pub state: Arc<NodeState>,
    /// When the applied state was applied.
    pub applied_at: Option<SystemTime>,
    /// The last sync.
    pub last_sync: Option<SyncOutcome>,
    /// Since when a received revision has waited to be applied; `None` when none waits.
    pub queued_since: Option<Instant>,
}

impl Snapshot {
    /// kube-proxy's proxier health (`Health().Healthy`), without node eligibility: no received
    /// revision has waited longer than `timeout` to be applied.
    #[must_use]
    pub fn proxy_healthy(&self, timeout: Duration) -> bool {
        self.queued_since
            .is_none_or(|since| since.elapsed() < timeout)
    }
}

/// The shared status; clones share it.
#[derive(Debug, Clone, Default)]
pub struct Status {
    inner: Arc<RwLock<Snapshot>>,
}

impl Status {
    /// A copy of the current status.
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        // A poisoned lock still holds the last written status, which is what readers want.
        match self.inner.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Completes once a state is applied: the node's rules are in the kernel. Looks twice a
    /// second; meant for what waits on that once.
    pub async fn applied(&self) {
        while self.snapshot().applied_at.is_none() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Changes the status under the lock.
    pub fn update(&self, change: impl FnOnce(&mut Snapshot)) {
        let mut guard = match self.inner.write() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        change(&mut guard);
    }
}
