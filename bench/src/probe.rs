//! A hollow agent's dataplane: instead of programming a kernel it notes, for every state the
//! real agent code applies, when each churned change first shows in it, and when the agent first
//! held every Service.

use splitproxy_dataplane::{Dataplane, ProxyState, ServiceKey, SyncReport};
use std::{
    convert::Infallible,
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::{Duration, Instant},
};

/// One churn step: the endpoint `ip` of `service` stopped being ready at `written`.
#[derive(Debug, Clone)]
pub struct Change {
    /// The Service whose slice was rewritten.
    pub service: ServiceKey,
    /// The endpoint that became not ready.
    pub ip: IpAddr,
    /// When the file was written.
    pub written: Instant,
}

impl Change {
    /// Whether `state` holds this change: the Service is there and `ip` is not a ready endpoint
    /// of it (whether the controller sends not-ready endpoints or leaves them out).
    #[must_use]
    pub fn is_in(&self, state: &ProxyState) -> bool {
        state.services.get(&self.service).is_some_and(|service| {
            !service
                .ports
                .iter()
                .flat_map(|port| &port.endpoints)
                .any(|endpoint| endpoint.ip == self.ip && endpoint.ready)
        })
    }
}

/// The changes made so far, shared by the churner (the only writer) and every probe.
#[derive(Debug, Clone, Default)]
pub struct Changes(Arc<RwLock<Vec<Change>>>);

impl Changes {
    /// Adds the next change.
    pub fn push(&self, change: Change) {
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push(change);
    }
}

/// What one hollow agent saw.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// From the start of the run to the first applied state holding every Service.
    pub full_sync: Option<Duration>,
    /// Per change, in order: from writing it to the first applied state holding it.
    pub latencies: Vec<Option<Duration>>,
    /// How many states the agent applied.
    pub syncs: u64,
}

/// The dataplane of one hollow agent; clones share its record.
#[derive(Debug, Clone)]
pub struct Probe {
    changes: Changes,
    services: usize,
    started: Instant,
    record: Arc<Mutex<Record>>,
}

impl Probe {
    /// A probe watching for `changes`, and for `services` Services in total, timing from
    /// `started`.
    #[must_use]
    pub fn new(changes: Changes, services: usize, started: Instant) -> Self {
        Self {
            changes,
            services,
            started,
            record: Arc::default(),
        }
    }

    /// What the agent has seen so far.
    #[must_use]
    pub fn record(&self) -> Record {
        self.record
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn observe(&self, state: &ProxyState, now: Instant) {
        let mut record = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        record.syncs += 1;
        if record.full_sync.is_none() && state.services.len() >= self.services {
            record.full_sync = Some(now - self.started);
        }
        let changes = self
            .changes
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        record.latencies.resize(changes.len(), None);
        for (latency, change) in record.latencies.iter_mut().zip(changes.iter()) {
            if latency.is_none() && change.is_in(state) {
                *latency = Some(now.saturating_duration_since(change.written));
            }
        }
    }
}

impl Dataplane for Probe {
    type Error = Infallible;

    fn mode(&self) -> &'static str {
        "hollow"
    }

    async fn sync(&mut self, state: &ProxyState) -> Result<SyncReport, Self::Error> {
        self.observe(state, Instant::now());
        Ok(SyncReport::default())
    }
}
