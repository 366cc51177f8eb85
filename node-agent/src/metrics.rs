//! The agent's Prometheus metrics, with kube-proxy's names and meaning where kube-proxy has the
//! metric, and `splitproxy_agent_*` for what only the split has.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use splitproxy_dataplane::IpFamily;
use std::sync::atomic::AtomicU64;

/// A `table` and `ip_family` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabel {
    /// The table's name (`nat`, `filter`).
    pub table: String,
    /// The IP family the table belongs to (`IPv4`, `IPv6`), as kube-proxy labels it.
    pub ip_family: String,
}

/// An `ip_family` label (`IPv4`, `IPv6`), as kube-proxy labels it.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabel {
    /// The IP family.
    pub ip_family: &'static str,
}

/// A `code` label (HTTP status code).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    /// The status code.
    pub code: String,
}

/// A `traffic_policy` and `ip_family` label, as kube-proxy labels its no-local-endpoints gauge.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrafficPolicyLabel {
    /// `internal` (internalTrafficPolicy) or `external` (externalTrafficPolicy).
    pub traffic_policy: &'static str,
    /// The IP family whose Service ports are counted.
    pub ip_family: &'static str,
}

/// A family of gauges holding seconds (timestamps), one per label set.
type SecondsGauges = Family<FamilyLabel, Gauge<f64, AtomicU64>>;

/// Every metric the agent exports. Those kube-proxy labels with `ip_family` carry it here too:
/// one sync programs every family the node has, so it is recorded under each of them.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// `kubeproxy_sync_proxy_rules_duration_seconds`.
    pub sync_duration: Family<FamilyLabel, Histogram>,
    /// `kubeproxy_sync_full_proxy_rules_duration_seconds`.
    pub full_sync_duration: Family<FamilyLabel, Histogram>,
    /// `kubeproxy_sync_partial_proxy_rules_duration_seconds`.
    pub partial_sync_duration: Family<FamilyLabel, Histogram>,
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds`.
    pub last_sync_timestamp: SecondsGauges,
    /// `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds`.
    pub last_queued_timestamp: SecondsGauges,
    /// `kubeproxy_network_programming_duration_seconds`, under the IP families of the Service
    /// whose endpoints changed.
    pub network_programming: Family<FamilyLabel, Histogram>,
    /// `kubeproxy_sync_proxy_rules_endpoint_changes_total`: Services whose endpoints a received
    /// revision changes, compared with the state held (a revision that changes nothing counts 0).
    pub endpoint_changes: Counter,
    /// `kubeproxy_sync_proxy_rules_endpoint_changes_pending`: those of the revision waiting for
    /// its kernel sync to start; 0 once it starts.
    pub endpoint_changes_pending: Gauge,
    /// `kubeproxy_sync_proxy_rules_service_changes_total`: Services a received revision adds,
    /// changes or removes, compared with the state held.
    pub service_changes: Counter,
    /// `kubeproxy_sync_proxy_rules_service_changes_pending`: those of the revision waiting for
    /// its kernel sync to start; 0 once it starts.
    pub service_changes_pending: Gauge,
    /// `kubeproxy_sync_proxy_rules_no_local_endpoints_total` (a gauge despite the name, as
    /// upstream): Service ports with a Local traffic policy and no local endpoint to use, after
    /// the last successful sync, per IP family of their Service.
    pub no_local_endpoints: Family<TrafficPolicyLabel, Gauge>,
    /// `kubeproxy_sync_proxy_rules_iptables_last`, per table and IP family.
    pub rules_last: Family<TableLabel, Gauge>,
    /// `kubeproxy_sync_proxy_rules_iptables_total`.
    pub rules_total: Family<TableLabel, Gauge>,
    /// `kubeproxy_sync_proxy_rules_iptables_restore_failures_total`: syncs whose rules the
    /// kernel refused (not failures to read the tables or run the tools).
    pub restore_failures: Family<FamilyLabel, Counter>,
    /// `kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total`: those of them that
    /// were partial syncs (the next sync is full).
    pub partial_restore_failures: Family<FamilyLabel, Counter>,
    /// `kubeproxy_sync_proxy_rules_nftables_sync_failures_total`: in nftables mode, syncs whose
    /// transaction the kernel refused, per IP family whose table it held (one transaction holds
    /// every family's, so each counts). The iptables counters stay 0 in that mode, as upstream.
    pub nftables_sync_failures: Family<FamilyLabel, Counter>,
    /// `kubeproxy_conntrack_reconciler_sync_duration_seconds`: per IP family, how long the
    /// deletion of stale conntrack flows after each sync took (upstream's reconciler runs at the
    /// same point).
    pub conntrack_cleanup_duration: Family<FamilyLabel, Histogram>,
    /// `kubeproxy_conntrack_reconciler_deleted_entries_total`: per IP family, the stale flows
    /// deleted.
    pub conntrack_deleted_entries: Family<FamilyLabel, Counter>,
    /// `kubeproxy_proxy_healthz_total`.
    pub healthz: Family<CodeLabel, Counter>,
    /// `kubeproxy_proxy_livez_total`.
    pub livez: Family<CodeLabel, Counter>,
    /// `splitproxy_agent_reconnects_total`.
    pub reconnects: Counter,
    /// `splitproxy_agent_rejected_revisions_total`.
    pub rejected_revisions: Counter,
    /// `splitproxy_agent_reset_revisions_received_total`: complete revisions that replaced the
    /// whole state; after the first, each one means a controller could not send a delta.
    pub reset_revisions_received: Counter,
    /// `splitproxy_agent_invalid_services`: Services skipped in the last sync.
    pub invalid_services: Gauge,
    /// `splitproxy_agent_update_messages_received_total`: `SyncResponse` messages received.
    pub update_messages_received: Counter,
    /// `splitproxy_agent_update_bytes_received_total`: their encoded protobuf size, without
    /// gRPC framing or HTTP/2 overhead.
    pub update_bytes_received: Counter,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    #[must_use]
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self {
            sync_duration: Family::new_with_constructor(sync_histogram),
            full_sync_duration: Family::new_with_constructor(sync_histogram),
            partial_sync_duration: Family::new_with_constructor(sync_histogram),
            last_sync_timestamp: Family::default(),
            last_queued_timestamp: Family::default(),
            network_programming: Family::new_with_constructor(|| {
                Histogram::new(network_programming_buckets())
            }),
            endpoint_changes: Counter::default(),
            endpoint_changes_pending: Gauge::default(),
            service_changes: Counter::default(),
            service_changes_pending: Gauge::default(),
            no_local_endpoints: Family::default(),
            rules_last: Family::default(),
            rules_total: Family::default(),
            restore_failures: Family::default(),
            partial_restore_failures: Family::default(),
            nftables_sync_failures: Family::default(),
            conntrack_cleanup_duration: Family::new_with_constructor(sync_histogram),
            conntrack_deleted_entries: Family::default(),
            healthz: Family::default(),
            livez: Family::default(),
            reconnects: Counter::default(),
            rejected_revisions: Counter::default(),
            reset_revisions_received: Counter::default(),
            invalid_services: Gauge::default(),
            update_messages_received: Counter::default(),
            update_bytes_received: Counter::default(),
        };
        // kube-proxy's names and HELP texts, so dashboards and alerts written for it work.
        registry.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            metrics.sync_duration.clone(),
        );
        registry.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            metrics.full_sync_duration.clone(),
        );
        registry.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            metrics.partial_sync_duration.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            metrics.last_sync_timestamp.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            metrics.last_queued_timestamp.clone(),
        );
        registry.register(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            metrics.network_programming.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            metrics.endpoint_changes.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            metrics.endpoint_changes_pending.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            metrics.service_changes.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            metrics.service_changes_pending.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            metrics.no_local_endpoints.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_iptables_last",
            "Number of iptables rules written by kube-proxy in last sync",
            metrics.rules_last.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_iptables_total",
            "Total number of iptables rules owned by kube-proxy",
            metrics.rules_total.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_iptables_restore_failures",
            "Cumulative proxy iptables restore failures",
            metrics.restore_failures.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures",
            "Cumulative proxy iptables partial restore failures",
            metrics.partial_restore_failures.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_nftables_sync_failures",
            "Cumulative proxy nftables sync failures",
            metrics.nftables_sync_failures.clone(),
        );
        registry.register(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds",
            "ReconcileConntrackFlowsLatency latency in seconds",
            metrics.conntrack_cleanup_duration.clone(),
        );
        registry.register(
            "kubeproxy_conntrack_reconciler_deleted_entries",
            "Cumulative conntrack flows deleted by conntrack reconciler",
            metrics.conntrack_deleted_entries.clone(),
        );
        registry.register(
            "kubeproxy_proxy_healthz",
            "Cumulative proxy healthz HTTP status",
            metrics.healthz.clone(),
        );
        registry.register(
            "kubeproxy_proxy_livez",
            "Cumulative proxy livez HTTP status",
            metrics.livez.clone(),
        );
        registry.register(
            "splitproxy_agent_reconnects",
            "Times a controller stream ended or could not be opened, followed by a new attempt",
            metrics.reconnects.clone(),
        );
        registry.register(
            "splitproxy_agent_rejected_revisions",
            "Revisions the agent rejected (NACKed), keeping its last good state",
            metrics.rejected_revisions.clone(),
        );
        registry.register(
            "splitproxy_agent_reset_revisions_received",
            "Complete revisions that replaced the agent's whole state instead of a delta",
            metrics.reset_revisions_received.clone(),
        );
        registry.register(
            "splitproxy_agent_invalid_services",
            "Services skipped in the last sync because they cannot be programmed",
            metrics.invalid_services.clone(),
        );
        registry.register(
            "splitproxy_agent_update_messages_received",
            "Node view messages (SyncResponse) received from controllers",
            metrics.update_messages_received.clone(),
        );
        registry.register(
            "splitproxy_agent_update_bytes_received",
            "Encoded protobuf bytes of the node view messages received from controllers",
            metrics.update_bytes_received.clone(),
        );
        metrics
    }

    /// Creates, at 0, the series a dashboard should find before anything happened: the
    /// no-local-endpoints gauges and the restore failure counters of each of `families`.
    pub fn start_families(&self, families: &[IpFamily]) {
        for family in families {
            let ip_family = family.name();
            for traffic_policy in ["internal", "external"] {
                self.no_local_endpoints
                    .get_or_create_owned(&TrafficPolicyLabel {
                        traffic_policy,
                        ip_family,
                    });
            }
            let label = FamilyLabel { ip_family };
            self.restore_failures.get_or_create_owned(&label);
            self.partial_restore_failures.get_or_create_owned(&label);
        }
    }
}

/// A histogram with kube-proxy's sync duration buckets: `ExponentialBuckets(0.001, 2, 15)`.
fn sync_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 2.0, 15,
    ))
}

/// kube-proxy's network programming buckets: 0.25, 0.5, 1..59 by 1, 60..115 by 5, 120..300 by 30.
fn network_programming_buckets() -> Vec<f64> {
    let mut buckets = vec![0.25, 0.5];
    buckets.extend((1..60).map(f64::from));
    buckets.extend((60..120).step_by(5).map(f64::from));
    buckets.extend((120..=300).step_by(30).map(f64::from));
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_proxy_metrics_are_exported_under_kube_proxys_names() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        metrics.start_families(&[IpFamily::V4, IpFamily::V6]);
        metrics
            .restore_failures
            .get_or_create(&FamilyLabel { ip_family: "IPv6" })
            .inc();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        // Counters get `_total` on their samples; the gauge keeps upstream's `_total` name.
        for sample in [
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 0",
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending 0",
            "kubeproxy_sync_proxy_rules_service_changes_total 0",
            "kubeproxy_sync_proxy_rules_service_changes_pending 0",
            "splitproxy_agent_update_messages_received_total 0",
            "splitproxy_agent_update_bytes_received_total 0",
        ] {
            assert!(
                text.lines().any(|l| l == sample),
                "no {sample:?} in\n{text}"
            );
        }
        for sample in [
            r#"kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy="internal",ip_family="IPv4"} 0"#,
            r#"kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy="external",ip_family="IPv6"} 0"#,
            r#"kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} 0"#,
            r#"kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv6"} 1"#,
            r#"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family="IPv6"} 0"#,
        ] {
            assert!(
                text.lines().any(|l| l == sample),
                "no {sample:?} in\n{text}"
            );
        }
    }

    #[test]
    fn network_programming_buckets_match_kube_proxy() {
        let buckets = network_programming_buckets();
        assert_eq!(&buckets[..3], &[0.25, 0.5, 1.0]);
        assert!(buckets.contains(&59.0) && buckets.contains(&115.0) && buckets.contains(&300.0));
        assert!(!buckets.contains(&61.0) && !buckets.contains(&125.0));
        assert!(buckets.windows(2).all(|w| w[0] < w[1]));
    }
}
