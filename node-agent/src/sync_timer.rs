//! When the agent may touch the kernel: kube-proxy's sync timing (`BoundedFrequencyRunner`) as a
//! pure timer that the applier consults.
//!
//! Two periods, named and defaulted as kube-proxy's:
//!
//! - **min-sync-period**: kernel syncs start at most once per period. The first sync may start
//!   at once; a revision that arrives sooner waits for the period to pass. kube-proxy's runner
//!   allows a burst of 2; this timer allows 1, which is simpler and loses nothing here: the
//!   revisions that arrive while a sync waits are folded into it (protocol rule 12), so a
//!   change waits at most one period, as under kube-proxy.
//! - **sync-period**: once a state is held, it is synced again (a full resync) at the latest one
//!   period after the last sync, with or without new revisions. This repairs rules someone else
//!   changed or flushed. Nothing is due before the first state is held (fail static).
//!
//! After a failed sync, a resync is due one min-sync-period after it (at least
//! [`MIN_RETRY_DELAY`], so a min-sync-period of 0 cannot spin), twice that after a second failure
//! in a row, and so on up to one sync-period. Upstream kube-proxy waits a whole sync-period
//! there (`syncRunner.RetryAfter(proxier.syncPeriod)`); the agent retries sooner on purpose, since
//! a node whose rules failed to apply should not wait 30 s to repair them, and backs off so that
//! a kernel that keeps refusing is not rewritten every second.

use std::time::Duration;
use tokio::time::Instant;

/// The shortest wait before retrying a failed sync, so that a min-sync-period of 0 (which
/// kube-proxy allows) cannot turn a failing kernel into a busy loop.
pub const MIN_RETRY_DELAY: Duration = Duration::from_secs(1);

/// Why a pair of periods is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPeriods {
    /// The sync period is zero.
    #[error("the sync period must be greater than 0")]
    ZeroSyncPeriod,
    /// The min-sync-period is longer than the sync period.
    #[error("the min-sync-period ({min:?}) must not be greater than the sync period ({sync:?})")]
    MinAboveSync {
        /// The sync period given.
        sync: Duration,
        /// The min-sync-period given.
        min: Duration,
    },
}

/// How often the agent syncs the kernel: a sync period above zero and a min-sync-period no
/// longer than it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncPeriods {
    sync_period: Duration,
    min_sync_period: Duration,
}

impl Default for SyncPeriods {
    fn default() -> Self {
        Self {
            // kube-proxy's default --iptables-sync-period.
            sync_period: Duration::from_secs(30),
            // kube-proxy's default --iptables-min-sync-period.
            min_sync_period: Duration::from_secs(1),
        }
    }
}

impl SyncPeriods {
    /// Periods of `sync_period` (the longest time between syncs while a state is held) and
    /// `min_sync_period` (the shortest time between the starts of two syncs).
    ///
    /// # Errors
    ///
    /// Returns [`InvalidPeriods`] when `sync_period` is zero or shorter than `min_sync_period`,
    /// as kube-proxy's validation does.
    pub fn new(sync_period: Duration, min_sync_period: Duration) -> Result<Self, InvalidPeriods> {
        if sync_period.is_zero() {
            return Err(InvalidPeriods::ZeroSyncPeriod);
        }
        if min_sync_period > sync_period {
            return Err(InvalidPeriods::MinAboveSync {
                sync: sync_period,
                min: min_sync_period,
            });
        }
        Ok(Self {
            sync_period,
            min_sync_period,
        })
    }

    /// The longest time between two syncs while a state is held (`--iptables-sync-period`).
    #[must_use]
    pub fn sync_period(&self) -> Duration {
        self.sync_period
    }

    /// The shortest time between the starts of two syncs (`--iptables-min-sync-period`).
    #[must_use]
    pub fn min_sync_period(&self) -> Duration {
        self.min_sync_period
    }

    /// How long a received revision may wait unapplied before `/healthz` fails: kube-proxy's
    /// 2 × sync-period.
    #[must_use]
    pub fn health_timeout(&self) -> Duration {
        self.sync_period.saturating_mul(2)
    }

    /// How long after a failed sync the held state is synced again: min-sync-period, but at
    /// least [`MIN_RETRY_DELAY`] and at most the sync period.
    #[must_use]
    pub fn retry_delay(&self) -> Duration {
        self.min_sync_period
            .max(MIN_RETRY_DELAY)
            .min(self.sync_period)
    }
}

/// Answers "when may the next sync start" and "when is the next resync due", from the syncs it is
/// told about. Holds no clock of its own: callers pass tokio instants, so paused-time tests
/// control it.
#[derive(Debug, Clone)]
pub struct SyncTimer {
    periods: SyncPeriods,
    /// When the last sync started; `None` before the first.
    last_start: Option<Instant>,
    /// When the next resync is due; `None` while no state is held.
    resync_at: Option<Instant>,
    /// Failed syncs since the last one that succeeded.
    failures: u32,
}

impl SyncTimer {
    /// A timer that has seen no sync: the first may start at once, and no resync is due.
    #[must_use]
    pub fn new(periods: SyncPeriods) -> Self {
        Self {
            periods,
            last_start: None,
            resync_at: None,
            failures: 0,
        }
    }

    /// The periods this timer keeps.
    #[must_use]
    pub fn periods(&self) -> SyncPeriods {
        self.periods
    }

    /// The earliest instant the next sync may start; `None` when it may start at once because no
    /// sync has happened yet.
    #[must_use]
    pub fn next_sync_allowed(&self) -> Option<Instant> {
        self.last_start
            .map(|start| start + self.periods.min_sync_period())
    }

    /// When the next resync is due; `None` while there is nothing to resync.
    #[must_use]
    pub fn resync_due(&self) -> Option<Instant> {
        self.resync_at
    }

    /// Records a sync that started at `started` and succeeded at `finished`: the next may start
    /// one min-sync-period after `started`, and a resync is due one sync-period after `finished`.
    pub fn succeeded(&mut self, started: Instant, finished: Instant) {
        self.last_start = Some(started);
        self.resync_at = Some(finished + self.periods.sync_period());
        self.failures = 0;
    }

    /// Records a sync that started at `started` and failed at `finished`: a resync is due
    /// [`SyncPeriods::retry_delay`] after `finished`, doubled for each earlier failure in a row,
    /// at most a sync-period.
    pub fn failed(&mut self, started: Instant, finished: Instant) {
        self.last_start = Some(started);
        let doublings = self.failures.min(16);
        self.failures = self.failures.saturating_add(1);
        let delay = (self.periods.retry_delay())
            .saturating_mul(1 << doublings)
            .min(self.periods.sync_period());
        self.resync_at = Some(finished + delay);
    }

    /// Drops the due resync, for when there turns out to be no state to resync.
    pub fn cancel_resync(&mut self) {
        self.resync_at = None;
    }
}

#[cfg(test)]
mod tests;
