//! Applies complete revisions: state first, then the dataplane, then the status and metrics. A
//! revision that cannot be applied leaves the last good state, in memory and in the kernel. Every
//! kernel sync, of a revision or a periodic resync, goes through the [`SyncTimer`].

use crate::{
    health_check::HealthChecks,
    metrics::{FamilyLabel, Metrics, TableLabel, TrafficPolicyLabel},
    node_port_addresses::{NodePortAddress, interface_addresses, select},
    node_state::{Conversion, Eligibility, NodeState},
    status::{Snapshot, Status, SyncOutcome},
    sync_timer::{SyncPeriods, SyncTimer},
};
use splitproxy_dataplane::{
    Cidr, Dataplane, FailedStep, Families, ProxyState, ServiceKey, SyncError, SyncReport,
    endpoints::NoLocalEndpoints,
};
use splitproxy_proto::Key;
use splitproxy_telemetry::error_chain;
use std::{
    collections::BTreeSet,
    future::Future,
    net::IpAddr,
    sync::Arc,
    time::{Duration, SystemTime},
};
use tokio::time::Instant;
use tracing::Instrument;

/// The CIDRs of `texts` (`what` they are) that parse, the others named in a warning: the API
/// server checks them, so one that does not parse is not worth refusing the node's view over.
fn parse_cidrs(what: &str, texts: &[String]) -> Vec<Cidr> {
    texts
        .iter()
        .filter_map(|text| match text.parse() {
            Ok(cidr) => Some(cidr),
            Err(err) => {
                tracing::warn!(cidr = ?text, %err, "ignoring one of the {what} that does not parse");
                None
            }
        })
        .collect()
}

/// The Node's pod CIDRs that parse, for the `NodeCIDR` detector.
fn local_cidrs(pod_cidrs: &[String]) -> Vec<Cidr> {
    let cidrs = parse_cidrs("Node's pod CIDRs", pod_cidrs);
    tracing::info!(
        pod_cidrs = ?cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "pod traffic is told by the Node's pod CIDRs (NodeCIDR)"
    );
    cidrs
}

/// Why a revision was not applied; sent to the controller as the NACK reason.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The revision does not fit the state held.
    #[error("rejected revision")]
    Rejected(#[from] crate::node_state::Rejected),
    /// The kernel refused the rules.
    #[error("dataplane sync failed")]
    Dataplane(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Owns the dataplane, the applied state and the sync timing: the only writer of the kernel.
#[derive(Debug)]
pub struct Applier<D> {
    /// The node the agent programs, which endpoint sets in cluster form are localized for.
    node: String,
    dataplane: D,
    status: Status,
    metrics: Metrics,
    timer: SyncTimer,
    health_checks: Option<HealthChecks>,
    /// The dataplane model of the state held in `status`, and that state: updated by each
    /// revision with the Services it changed.
    converted: (Arc<NodeState>, Conversion),
    /// The model of the last revision the kernel refused, which every resync writes in place of
    /// the held state's until a revision is applied: as kube-proxy retries its last change, so
    /// the families that took it keep it (no flapping back) and the others take it once their
    /// kernel does.
    refused: Option<Conversion>,
    /// Whether pod traffic is told by the Node's pod CIDRs (kube-proxy's `NodeCIDR` detector).
    node_cidr_detector: bool,
    /// The `nodePortAddresses` selection and the addresses it matched last: matched again
    /// before each sync, as kube-proxy does.
    node_ports: Option<(Vec<NodePortAddress>, Option<Vec<IpAddr>>)>,
    /// The node's IPs in use, and the `bindAddress` that names the one of its family.
    node_ips: NodeIps,
}

/// The node's IPs (kube-proxy's node IPs): those of its Node object, which the controller sends,
/// with `bindAddress` in place of the one of its family; until the Node's arrive, those known at
/// start.
#[derive(Debug, Default)]
struct NodeIps {
    bind_address: Option<IpAddr>,
    in_use: Vec<IpAddr>,
}

impl NodeIps {
    /// The node IPs after the Node's `from_node` arrive; `None` when they change nothing (or
    /// the Node has none: the ones in use stay).
    fn follow(&mut self, from_node: &[String]) -> Option<Vec<IpAddr>> {
        let mut ips: Vec<IpAddr> = from_node.iter().filter_map(|ip| ip.parse().ok()).collect();
        if ips.is_empty() {
            return None;
        }
        if let Some(bind) = self.bind_address {
            match ips.iter_mut().find(|ip| ip.is_ipv4() == bind.is_ipv4()) {
                Some(same_family) => *same_family = bind,
                None => ips.insert(0, bind),
            }
        }
        if ips == self.in_use {
            return None;
        }
        self.in_use.clone_from(&ips);
        Some(ips)
    }
}

impl<D: Dataplane> Applier<D> {
    /// An applier that programs `dataplane` for `node` and reports to `status` and `metrics`,
    /// with kube-proxy's default sync periods.
    pub fn new(node: &str, dataplane: D, status: Status, metrics: Metrics) -> Self {
        metrics.start_families(&dataplane.ip_families());
        Self {
            node: node.to_owned(),
            dataplane,
            status,
            metrics,
            timer: SyncTimer::new(SyncPeriods::default()),
            health_checks: None,
            converted: Default::default(),
            refused: None,
            node_cidr_detector: false,
            node_ports: None,
            node_ips: NodeIps::default(),
        }
    }

    /// The same applier, with the node's IPs known at start (`start`) replaced by its Node's
    /// when the controller sends them, `bind_address` keeping its family's.
    #[must_use]
    pub fn with_node_ips(mut self, bind_address: Option<IpAddr>, start: Vec<IpAddr>) -> Self {
        self.node_ips = NodeIps {
            bind_address,
            in_use: start,
        };
        self
    }

    /// The same applier, matching `selection` against the node's addresses and IPs before each
    /// sync (it matched `current` at start), and moving node ports and health-check node ports
    /// when the match changes.
    #[must_use]
    pub fn with_node_port_selection(
        mut self,
        selection: Vec<NodePortAddress>,
        current: Option<Vec<IpAddr>>,
    ) -> Self {
        if !selection.is_empty() {
            self.node_ports = Some((selection, current));
        }
        self
    }

    /// Matches the `nodePortAddresses` selection again; when the node's addresses moved, the
    /// dataplane and the health-check servers move with them.
    fn follow_node_port_addresses(&mut self) {
        let Some((selection, current)) = &mut self.node_ports else {
            return;
        };
        let addresses = match interface_addresses() {
            Ok(interfaces) => select(selection, &interfaces, &self.node_ips.in_use),
            Err(err) => {
                tracing::warn!(%err, "cannot list the node's addresses; node ports stay where they are");
                return;
            }
        };
        if addresses == *current {
            return;
        }
        tracing::info!(?addresses, before = ?current, "node ports move to the node's addresses now selected");
        current.clone_from(&addresses);
        self.dataplane.set_node_port_addresses(addresses.clone());
        if let Some(health_checks) = &mut self.health_checks {
            health_checks.rebind(crate::health_check::bind_addresses(addresses));
        }
    }

    /// The same applier, telling pod traffic by the pod CIDRs of the Node, which the controller
    /// sends with the node's status: the dataplane's detector follows them when they change.
    #[must_use]
    pub fn with_node_cidr_detector(mut self) -> Self {
        self.node_cidr_detector = true;
        self
    }

    /// The same applier, reconciling `health_checks` with the applied state after every
    /// successful sync.
    #[must_use]
    pub fn with_health_checks(mut self, health_checks: HealthChecks) -> Self {
        self.health_checks = Some(health_checks);
        self
    }

    /// The same applier with `periods` instead; meant right after [`Applier::new`], before any
    /// sync.
    #[must_use]
    pub fn with_sync_periods(mut self, periods: SyncPeriods) -> Self {
        self.timer = SyncTimer::new(periods);
        self
    }

    /// The IP families the dataplane programs, as the agent tells the controller.
    #[must_use]
    pub fn ip_families(&self) -> Families {
        self.dataplane.ip_families()
    }

    /// The `ip_family` label of each family the dataplane programs: a sync programs them all.
    fn family_labels(&self) -> impl Iterator<Item = FamilyLabel> + use<D> {
        let families = self.dataplane.ip_families().into_iter();
        families.map(|family| FamilyLabel {
            ip_family: family.name(),
        })
    }

    /// When the next periodic resync is due; `None` while no state is held.
    #[must_use]
    pub fn resync_due(&self) -> Option<Instant> {
        self.timer.resync_due()
    }

    /// Awaits `work` (a stream message, a connection, a backoff), running the periodic resyncs
    /// that fall due meanwhile. `work` is polled first, so it wins a tie with a resync; it is not
    /// polled while a resync runs.
    pub async fn resync_while<F: Future>(&mut self, work: F) -> F::Output {
        let mut work = std::pin::pin!(work);
        loop {
            let due = self.timer.resync_due();
            tokio::select! {
                biased;
                output = &mut work => return output,
                () = sleep_until(due) => self.resync().await,
            }
        }
    }

    /// Notes that a revision has arrived and waits to be applied (for `/healthz`).
    pub fn queued(&self) {
        let now = unix_seconds(SystemTime::now());
        for label in self.family_labels() {
            self.metrics
                .last_queued_timestamp
                .get_or_create(&label)
                .set(now);
        }
        self.status.update(|s| {
            s.queued_since.get_or_insert_with(tokio::time::Instant::now);
        });
    }

    /// Notes that no received revision waits any more: those that did were rejected (NACKed) or
    /// dropped as built on a rejected one. The node keeps serving its last good rules, the
    /// refusal is in the metrics and with the controller, and a change the agent refused does
    /// not fail `/healthz` and `/livez`, where kube-proxy, which keeps a refused change queued,
    /// fails them on every node the change reaches (docs/kube-proxy-compatibility.md).
    pub fn unqueued(&self) {
        self.status.update(|s| s.queued_since = None);
    }

    /// The state held: the last one applied.
    #[must_use]
    pub fn held(&self) -> Arc<NodeState> {
        self.status.snapshot().state
    }

    /// When min-sync-period next allows a kernel sync; `None` when one may start at once.
    #[must_use]
    pub fn next_sync_allowed(&self) -> Option<Instant> {
        self.timer.next_sync_allowed()
    }

    /// Applies one complete revision on top of the state held, as [`Applier::apply_state`].
    #[cfg(test)]
    pub(crate) async fn apply(
        &mut self,
        revision: &crate::node_state::Revision,
    ) -> Result<(), ApplyError> {
        let next = self.status.snapshot().state.apply(revision)?;
        self.apply_state(next, revision.reset).await
    }

    /// Brings the node to `next`, the state after one or more complete revisions (`reset` when
    /// one replaced the whole state): waits until min-sync-period allows a sync, then syncs the
    /// kernel. A state that differs from the one held only in the node's status is taken at
    /// once, without a sync. Records the number of Services changed on the current span's
    /// `services_changed`.
    ///
    /// # Errors
    ///
    /// Returns why the state was not applied; the last good state then stays in place.
    pub async fn apply_state(&mut self, next: NodeState, reset: bool) -> Result<(), ApplyError> {
        let current = self.status.snapshot().state;
        if next.eligibility != current.eligibility {
            match &next.eligibility {
                Eligibility::Eligible => tracing::info!("node is eligible for new connections"),
                Eligibility::Ineligible(reason) => {
                    tracing::info!(%reason, "node is not eligible for new connections");
                }
            }
        }
        let detector_moved = self.node_cidr_detector && next.pod_cidrs != current.pod_cidrs;
        if detector_moved {
            self.dataplane.set_local_cidrs(local_cidrs(&next.pod_cidrs));
        }
        let node_ips_moved = match self.node_ips.follow(&next.node_ips) {
            Some(ips) => {
                tracing::info!(node_ips = ?ips, "the node's IPs, from its Node object");
                self.dataplane.set_node_ips(ips);
                true
            }
            None => false,
        };
        let service_cidrs_moved = next.service_cidrs != current.service_cidrs;
        if service_cidrs_moved {
            tracing::info!(service_cidrs = ?next.service_cidrs, "the cluster's service CIDRs");
            self.dataplane
                .set_service_cidrs(parse_cidrs("service CIDRs", &next.service_cidrs));
        }
        // Each is a walk of both states: taken once, for the conversion, the counts and the
        // programming latency.
        let service_changes: Vec<Key> = current.service_changes(&next).cloned().collect();
        let endpoint_changes: Vec<Key> = current.endpoint_changes(&next).cloned().collect();
        let changed: BTreeSet<&Key> = service_changes.iter().chain(&endpoint_changes).collect();
        // Endpoint sets in cluster form are localized with the zone: all of them again.
        let zone_moved = next.zone != current.zone;
        let rules_moved = detector_moved || service_cidrs_moved || node_ips_moved || zone_moved;
        tracing::Span::current().record("services_changed", changed.len());
        if !reset && changed.is_empty() && !rules_moved {
            // Only the node's status changed: nothing to write, and no reason to wait for
            // min-sync-period or to fail with the kernel (protocol rule 9).
            let next = Arc::new(next);
            self.converted.0 = Arc::clone(&next);
            self.status.update(|s| {
                s.state = next;
                s.applied_at = Some(SystemTime::now());
                s.queued_since = None;
            });
            return Ok(());
        }
        self.count_changes(service_changes.len(), endpoint_changes.len());
        let conversion = if zone_moved {
            Conversion::of(&next, &self.node)
        } else {
            let node = self.node.clone();
            self.conversion_of(&current)
                .updated(&next, &node, changed.iter().copied())
        };
        for (namespace, name) in changed {
            if let Some(err) = conversion.invalid.get(&(namespace.clone(), name.clone())) {
                // Quoted (`?`): a hostile name must not break the log line.
                tracing::warn!(service = ?format!("{namespace}/{name}"), %err, "skipping service that cannot be programmed");
            }
        }
        self.metrics
            .invalid_services
            .set(i64::try_from(conversion.invalid.len()).unwrap_or(i64::MAX));
        let proxy_state = conversion.model.clone();

        let (report, duration, finished_at) = match self.sync_kernel(&proxy_state).await {
            Ok(synced) => synced,
            Err(err) => {
                self.refused = Some(conversion);
                return Err(err);
            }
        };
        self.refused = None;
        let next = Arc::new(next);
        self.converted = (Arc::clone(&next), conversion);
        self.record_success(&endpoint_changes, next, report, duration, finished_at);
        for family in self.dataplane.ip_families() {
            let no_local = NoLocalEndpoints::of(&proxy_state, family);
            for (traffic_policy, ports) in [
                ("internal", no_local.internal),
                ("external", no_local.external),
            ] {
                let label = TrafficPolicyLabel {
                    traffic_policy,
                    ip_family: family.name(),
                };
                self.metrics
                    .no_local_endpoints
                    .get_or_create(&label)
                    .set(i64::try_from(ports).unwrap_or(i64::MAX));
            }
        }
        self.reconcile_health_checks(&proxy_state);
        Ok(())
    }

    /// The conversion of `state`, the state held: the one kept, unless it is of another state.
    fn conversion_of(&mut self, state: &Arc<NodeState>) -> &Conversion {
        if !Arc::ptr_eq(&self.converted.0, state) {
            self.converted = (Arc::clone(state), Conversion::of(state, &self.node));
        }
        &self.converted.1
    }

    /// Counts the Services whose definition (`services`) or endpoints (`endpoints`) a revision
    /// changes, as kube-proxy's change trackers count the changes that wait for the next sync.
    fn count_changes(&self, services: usize, endpoints: usize) {
        let as_gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.metrics.service_changes.inc_by(services as u64);
        self.metrics.endpoint_changes.inc_by(endpoints as u64);
        self.metrics.service_changes_pending.set(as_gauge(services));
        self.metrics
            .endpoint_changes_pending
            .set(as_gauge(endpoints));
    }

    /// Syncs the held state again (a full resync), repairing rules changed behind the agent's
    /// back; or the state of a revision the kernel refused, trying it again. Does nothing, and
    /// drops the due resync, while there is neither.
    async fn resync(&mut self) {
        let held = self.status.snapshot().state;
        let proxy_state = match &self.refused {
            Some(refused) => refused.model.clone(),
            None if held.epoch.is_none() => {
                self.timer.cancel_resync();
                return;
            }
            None => self.conversion_of(&held).model.clone(),
        };
        // A resync is nobody's change: its kernel sync is a trace of its own.
        let span = tracing::info_span!("resync", revision = held.revision);
        splitproxy_telemetry::trace::continue_trace(&span, None);
        match self.sync_kernel(&proxy_state).instrument(span).await {
            Ok((report, duration, finished_at)) => {
                tracing::debug!(
                    revision = held.revision,
                    refused_change = self.refused.is_some(),
                    "resynced"
                );
                self.record_sync(report, duration, finished_at, |_| {});
                // Retries the health-check ports that could not be bound before.
                self.reconcile_health_checks(&proxy_state);
            }
            Err(err) => {
                tracing::warn!(
                    revision = held.revision,
                    retry_in_ms = self.timer.periods().retry_delay().as_millis() as u64,
                    error = %error_chain(&err),
                    "resync failed"
                );
            }
        }
    }

    fn reconcile_health_checks(&mut self, state: &ProxyState) {
        if let Some(health_checks) = &mut self.health_checks {
            health_checks.reconcile(state);
        }
    }

    /// Waits for the timer to allow a sync, syncs `state`, and records the outcome in the timer
    /// and the metrics; a failure also in the status.
    async fn sync_kernel(
        &mut self,
        state: &ProxyState,
    ) -> Result<(SyncReport, Duration, SystemTime), ApplyError> {
        if let Some(allowed) = self.timer.next_sync_allowed() {
            tokio::time::sleep_until(allowed).await;
        }
        self.follow_node_port_addresses();
        // The sync takes the pending changes in, as kube-proxy's checks them out when it starts.
        self.metrics.service_changes_pending.set(0);
        self.metrics.endpoint_changes_pending.set(0);
        let started = Instant::now();
        let result = self.dataplane.sync(state).await;
        let finished = Instant::now();
        let duration = finished - started;
        for label in self.family_labels() {
            let seconds = duration.as_secs_f64();
            self.metrics
                .sync_duration
                .get_or_create(&label)
                .observe(seconds);
        }
        let finished_at = SystemTime::now();
        match result {
            Ok(report) => {
                let kind = if report.full {
                    &self.metrics.full_sync_duration
                } else {
                    &self.metrics.partial_sync_duration
                };
                for label in self.family_labels() {
                    kind.get_or_create(&label).observe(duration.as_secs_f64());
                }
                self.timer.succeeded(started, finished);
                Ok((report, duration, finished_at))
            }
            Err(err) => {
                self.timer.failed(started, finished);
                if let FailedStep::Restore { partial } = err.failed_step() {
                    let families = match err.failed_family() {
                        Some(family) => Families::new([family]),
                        None => self.dataplane.ip_families(),
                    };
                    for family in families {
                        let label = FamilyLabel {
                            ip_family: family.name(),
                        };
                        if self.dataplane.mode() == "nftables" {
                            self.metrics
                                .nftables_sync_failures
                                .get_or_create(&label)
                                .inc();
                        } else {
                            self.metrics.restore_failures.get_or_create(&label).inc();
                            if partial {
                                self.metrics
                                    .partial_restore_failures
                                    .get_or_create(&label)
                                    .inc();
                            }
                        }
                    }
                }
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
        endpoint_changes: &[Key],
        next: Arc<NodeState>,
        report: SyncReport,
        duration: Duration,
        finished_at: SystemTime,
    ) {
        let now = unix_seconds(finished_at);
        let programmed = &self.converted.1.model;
        let families = self.dataplane.ip_families();
        for key @ (namespace, name) in endpoint_changes {
            let trigger = next
                .endpoints
                .get(key)
                .and_then(|e| e.last_change_trigger_time);
            let service = programmed
                .services
                .get(&ServiceKey::new(namespace.as_str(), name.as_str()));
            let (Some(trigger), Some(service)) = (trigger, service) else {
                continue;
            };
            let since = now - (trigger.seconds as f64 + f64::from(trigger.nanos) / 1e9);
            // Upstream's proxier of each family observes the Services it programs: those with
            // a cluster IP of its family.
            for family in &families {
                if service.cluster_ips.iter().any(|ip| family.contains(ip)) {
                    let label = FamilyLabel {
                        ip_family: family.name(),
                    };
                    let histogram = self.metrics.network_programming.get_or_create(&label);
                    histogram.observe(since.max(0.0));
                }
            }
        }
        self.record_sync(report, duration, finished_at, |s| {
            s.state = next;
            s.applied_at = Some(finished_at);
            s.queued_since = None;
        });
    }

    /// Records a successful sync, of a revision or a resync, in the metrics and the status;
    /// `change` updates the status in the same step.
    fn record_sync(
        &self,
        report: SyncReport,
        duration: Duration,
        finished_at: SystemTime,
        change: impl FnOnce(&mut Snapshot),
    ) {
        for (gauge, counts) in [
            (&self.metrics.rules_last, &report.family_rules),
            (&self.metrics.rules_total, &report.family_totals),
        ] {
            for (family, table, rules) in counts {
                gauge
                    .get_or_create(&TableLabel {
                        table: table.clone(),
                        ip_family: family.name().to_owned(),
                    })
                    .set(i64::from(*rules));
            }
        }
        for cleanup in &report.conntrack {
            let family = FamilyLabel {
                ip_family: cleanup.family.name(),
            };
            self.metrics
                .conntrack_cleanup_duration
                .get_or_create(&family)
                .observe(cleanup.duration.as_secs_f64());
            self.metrics
                .conntrack_deleted_entries
                .get_or_create(&family)
                .inc_by(u64::from(cleanup.deleted));
        }
        for label in self.family_labels() {
            let gauge = self.metrics.last_sync_timestamp.get_or_create(&label);
            gauge.set(unix_seconds(finished_at));
        }
        self.status.update(|s| {
            change(s);
            s.last_sync = Some(SyncOutcome {
                finished_at,
                duration,
                error: None,
                rules_written: report.rules_written(),
            });
        });
    }
}

/// Sleeps until `at`; forever when it is `None`.
pub async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn unix_seconds(time: SystemTime) -> f64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests;
