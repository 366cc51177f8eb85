//! Applies complete revisions: state first, then the dataplane, then the status and metrics. A
//! revision that cannot be applied leaves the last good state, in memory and in the kernel.

use crate::{
    metrics::{Metrics, TableLabel},
    state::{NodeState, Revision},
    status::{Status, SyncOutcome},
};
use splitproxy_dataplane::Dataplane;
use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

/// Why a revision was not applied; sent to the controller as the NACK reason.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The revision does not fit the state held.
    #[error("rejected revision")]
    Rejected(#[from] crate::state::Rejected),
    /// The kernel refused the rules.
    #[error("dataplane sync failed")]
    Dataplane(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Owns the dataplane and the applied state.
#[derive(Debug)]
pub struct Applier<D> {
    dataplane: D,
    status: Status,
    metrics: Metrics,
}

impl<D: Dataplane> Applier<D> {
    /// An applier that programs `dataplane` and reports to `status` and `metrics`.
    pub fn new(dataplane: D, status: Status, metrics: Metrics) -> Self {
        Self {
            dataplane,
            status,
            metrics,
        }
    }

    /// Notes that a revision has arrived and waits to be applied (for `/healthz`).
    pub fn queued(&self) {
        self.metrics
            .last_queued_timestamp
            .set(unix_seconds(SystemTime::now()));
        self.status.update(|s| {
            s.queued_since.get_or_insert_with(tokio::time::Instant::now);
        });
    }

    /// Applies a complete revision.
    ///
    /// # Errors
    ///
    /// Returns why the revision was rejected; the last good state then stays in place.
    pub async fn apply(&mut self, revision: &Revision) -> Result<(), ApplyError> {
        let current = self.status.snapshot().state;
        let next = current.apply(revision)?;
        let (proxy_state, invalid) = next.to_proxy_state();
        for ((namespace, name), err) in &invalid {
            tracing::warn!(service = %format!("{namespace}/{name}"), %err, "skipping service that cannot be programmed");
        }
        self.metrics
            .invalid_services
            .set(i64::try_from(invalid.len()).unwrap_or(i64::MAX));

        let started = tokio::time::Instant::now();
        let result = self.dataplane.sync(&proxy_state).await;
        let duration = started.elapsed();
        self.metrics.sync_duration.observe(duration.as_secs_f64());
        let finished_at = SystemTime::now();
        match result {
            Ok(report) => {
                self.record_success(&current, next, report.rules_written, duration, finished_at);
                Ok(())
            }
            Err(err) => {
                self.metrics.restore_failures.inc();
                let message = format!("{err}");
                self.status.update(|s| {
                    s.last_sync = Some(SyncOutcome {
                        finished_at,
                        duration,
                        error: Some(message),
                        rules_written: Vec::new(),
                    });
                });
                Err(ApplyError::Dataplane(Box::new(err)))
            }
        }
    }

    fn record_success(
        &self,
        previous: &NodeState,
        next: NodeState,
        rules_written: Vec<(String, u32)>,
        duration: Duration,
        finished_at: SystemTime,
    ) {
        let now = unix_seconds(finished_at);
        for key in previous.endpoint_changes(&next) {
            self.metrics.endpoint_changes.inc();
            let trigger = next
                .endpoints
                .get(key)
                .and_then(|e| e.last_change_trigger_time);
            if let Some(trigger) = trigger {
                let since = now - (trigger.seconds as f64 + f64::from(trigger.nanos) / 1e9);
                self.metrics.network_programming.observe(since.max(0.0));
            }
        }
        for (table, rules) in &rules_written {
            self.metrics
                .rules_last
                .get_or_create(&TableLabel {
                    table: table.clone(),
                })
                .set(i64::from(*rules));
        }
        self.metrics.last_sync_timestamp.set(now);
        self.status.update(|s| {
            s.state = Arc::new(next);
            s.applied_at = Some(finished_at);
            s.queued_since = None;
            s.last_sync = Some(SyncOutcome {
                finished_at,
                duration,
                error: None,
                rules_written,
            });
        });
    }
}

fn unix_seconds(time: SystemTime) -> f64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
