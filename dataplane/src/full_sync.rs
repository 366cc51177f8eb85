//! kube-proxy's full sync, in every mode: a sync writes every rule, not only the changed
//! Services', the first time, after a failed sync, once an hour, and when the kernel shows that
//! someone removed what was written (the iptables canary chains, the nftables table). How a mode
//! looks at the kernel is its own; when to stop trusting what it wrote last is decided here.

use std::time::{Duration, Instant};

/// How often a sync is full even when nothing forces it (kube-proxy's `FullSyncPeriod`).
pub const FULL_SYNC_PERIOD: Duration = Duration::from_secs(60 * 60);

/// When the last full sync of one table (or family) was written.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FullSyncClock {
    last: Option<Instant>,
}

impl FullSyncClock {
    /// Why the next sync must be full, before the kernel is looked at: `in_kernel` says whether
    /// the kernel holds what was written last (false the first time and after a failure).
    pub(crate) fn reason(&self, in_kernel: bool) -> Option<&'static str> {
        if !in_kernel {
            Some("first sync or previous failure")
        } else if self.due() {
            Some("periodic full sync")
        } else {
            None
        }
    }

    /// Whether a full sync is due by the clock alone: none yet, or the last one a period ago.
    pub(crate) fn due(&self) -> bool {
        self.last.is_none_or(|at| at.elapsed() >= FULL_SYNC_PERIOD)
    }

    /// Records a full sync that succeeded just now.
    pub(crate) fn record(&mut self) {
        self.last = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_is_full_until_one_was_written_and_again_after_a_failure() {
        let mut clock = FullSyncClock::default();
        assert_eq!(clock.reason(false), Some("first sync or previous failure"));
        assert_eq!(clock.reason(true), Some("periodic full sync"));
        clock.record();
        assert_eq!(clock.reason(true), None);
        assert!(!clock.due());
        assert_eq!(clock.reason(false), Some("first sync or previous failure"));
    }

    #[test]
    fn a_full_sync_is_due_again_a_period_after_the_last() {
        let clock = FullSyncClock {
            last: Instant::now().checked_sub(FULL_SYNC_PERIOD),
        };
        assert!(clock.last.is_some());
        assert!(clock.due());
        assert_eq!(clock.reason(true), Some("periodic full sync"));
    }
}
