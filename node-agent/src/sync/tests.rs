//! The applier's timing on its own: resyncs while the client waits for something else.
//!
//! Test addresses: cluster IPs 10.96.0.0/16.

use super::*;
use crate::node_state::Revision;
use prometheus_client::metrics::{counter::Counter, family::Family};
use splitproxy_dataplane::{IpFamily, testing::recording::RecordingDataplane};
use splitproxy_proto::v1alpha1 as pb;

const SYNC_PERIOD: Duration = Duration::from_secs(30);

fn applier(dataplane: &RecordingDataplane) -> Applier<RecordingDataplane> {
    let periods = SyncPeriods::new(SYNC_PERIOD, Duration::from_secs(1)).expect("valid periods");
    Applier::new(
        "node-1",
        dataplane.clone(),
        Status::default(),
        Metrics::new(&mut Default::default()),
    )
    .with_sync_periods(periods)
}

/// A ready endpoint `address:8080`.
fn ready_endpoint(address: &str) -> pb::Endpoint {
    pb::Endpoint {
        address: address.into(),
        port: 8080,
        conditions: Some(pb::EndpointConditions {
            ready: true,
            serving: true,
            terminating: false,
        }),
        ..pb::Endpoint::default()
    }
}

/// A complete reset revision holding `demo/web` on 10.96.0.10.
fn web_revision() -> Revision {
    Revision {
        epoch: "epoch-1".into(),
        number: 1,
        reset: true,
        on_presented_state: false,
        parts: vec![pb::SyncResponse {
            controller_epoch: "epoch-1".into(),
            revision: 1,
            reset: true,
            complete: true,
            upserted_services: vec![pb::Service {
                key: Some(pb::ObjectKey {
                    namespace: "demo".into(),
                    name: "web".into(),
                }),
                cluster_ips: vec!["10.96.0.10".into()],
                ports: vec![pb::ServicePort {
                    name: "http".into(),
                    protocol: pb::Protocol::Tcp as i32,
                    port: 80,
                    node_port: 0,
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

#[tokio::test(start_paused = true)]
async fn resyncs_run_while_the_client_waits_for_a_controller() {
    let dataplane = RecordingDataplane::default();
    let mut applier = applier(&dataplane);
    applier.apply(&web_revision()).await.expect("applied");
    let started = Instant::now();

    // A reconnect backoff (or a connection attempt) of 95 s spans three sync periods.
    let output = applier
        .resync_while(async {
            tokio::time::sleep(Duration::from_secs(95)).await;
            "waited"
        })
        .await;
    assert_eq!(output, "waited");
    assert_eq!(Instant::now() - started, Duration::from_secs(95));
    let applied = dataplane.applied();
    assert_eq!(applied.len(), 4, "the revision and three resyncs");
    assert!(applied.iter().all(|s| *s == applied[0]));
    assert_eq!(applier.resync_due(), Some(started + 4 * SYNC_PERIOD));
}

#[tokio::test(start_paused = true)]
async fn no_resync_runs_while_no_state_is_held() {
    let dataplane = RecordingDataplane::default();
    let mut applier = applier(&dataplane);
    assert_eq!(applier.resync_due(), None);
    applier
        .resync_while(tokio::time::sleep(10 * SYNC_PERIOD))
        .await;
    assert!(dataplane.applied().is_empty());
}

/// Reports what a dual-stack iptables sync of both families reports.
#[derive(Debug)]
struct DualStackReport;

impl Dataplane for DualStackReport {
    type Error = std::convert::Infallible;

    fn mode(&self) -> &'static str {
        "iptables"
    }

    fn ip_families(&self) -> Families {
        Families::new(IpFamily::ALL)
    }

    async fn sync(&mut self, _: &ProxyState) -> Result<SyncReport, Self::Error> {
        // A partial IPv4 sync next to a full IPv6 one.
        let mut report = SyncReport::for_family(
            IpFamily::V4,
            vec![("filter".into(), 4), ("nat".into(), 12)],
            vec![("filter".into(), 4), ("nat".into(), 30)],
            false,
        );
        report.merge(SyncReport::for_family(
            IpFamily::V6,
            vec![("filter".into(), 3), ("nat".into(), 9)],
            vec![("filter".into(), 3), ("nat".into(), 9)],
            true,
        ));
        // Each family then deleted its stale flows.
        report.conntrack = vec![
            splitproxy_dataplane::conntrack::Cleanup {
                family: IpFamily::V4,
                duration: Duration::from_millis(3),
                deleted: 2,
            },
            splitproxy_dataplane::conntrack::Cleanup {
                family: IpFamily::V6,
                duration: Duration::from_millis(1),
                deleted: 0,
            },
        ];
        Ok(report)
    }
}

#[tokio::test(start_paused = true)]
async fn rules_written_are_exported_per_table_and_ip_family() {
    let mut registry = prometheus_client::registry::Registry::default();
    let status = Status::default();
    let mut applier = Applier::new(
        "node-1",
        DualStackReport,
        status.clone(),
        Metrics::new(&mut registry),
    );
    applier.apply(&web_revision()).await.expect("applied");

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoded");
    for line in [
        r#"kubeproxy_sync_proxy_rules_iptables_last{table="nat",ip_family="IPv4"} 12"#,
        r#"kubeproxy_sync_proxy_rules_iptables_last{table="nat",ip_family="IPv6"} 9"#,
        r#"kubeproxy_sync_proxy_rules_iptables_last{table="filter",ip_family="IPv6"} 3"#,
        r#"kubeproxy_sync_proxy_rules_iptables_total{table="nat",ip_family="IPv4"} 30"#,
        r#"kubeproxy_sync_proxy_rules_iptables_total{table="nat",ip_family="IPv6"} 9"#,
        // One family was rewritten whole: the sync counts as full.
        r#"kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1"#,
        r#"kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv6"} 1"#,
        r#"kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 1"#,
        r#"kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"} 2"#,
        r#"kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv6"} 0"#,
        r#"kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family="IPv4"} 1"#,
        r#"kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{le="0.004",ip_family="IPv4"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
    assert!(
        !text.contains("kubeproxy_sync_partial_proxy_rules_duration_seconds_count"),
        "{text}"
    );
    // One sync programmed both families: each has its last sync time.
    for ip_family in ["IPv4", "IPv6"] {
        let series = format!(
            r#"kubeproxy_sync_proxy_rules_last_timestamp_seconds{{ip_family="{ip_family}"}} "#
        );
        assert!(text.contains(&series), "no {series} in\n{text}");
    }
    // The status sums the families per table.
    let synced = status.snapshot().last_sync.expect("synced");
    assert_eq!(
        synced.rules_written,
        [("filter".to_owned(), 7), ("nat".to_owned(), 21)]
    );
}

#[tokio::test(start_paused = true)]
async fn network_programming_is_observed_under_the_families_of_the_service() {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::new(&mut registry);
    let mut applier = Applier::new("node-1", DualStackReport, Status::default(), metrics);
    // `demo/web` (IPv4) and `demo/dual` (both families), each with an endpoint whose slices
    // changed a second ago.
    let mut revision = web_revision();
    let part = &mut revision.parts[0];
    let mut dual = part.upserted_services[0].clone();
    dual.key = Some(pb::ObjectKey {
        namespace: "demo".into(),
        name: "dual".into(),
    });
    dual.cluster_ips = vec!["10.96.0.11".into(), "fd00::11".into()];
    part.upserted_services.push(dual);
    let trigger = SystemTime::now() - Duration::from_secs(1);
    for (name, address) in [("web", "10.244.1.5"), ("dual", "fd00:244::5")] {
        part.upserted_endpoints.push(pb::ServiceEndpoints {
            key: Some(pb::ObjectKey {
                namespace: "demo".into(),
                name: name.into(),
            }),
            ports: vec![pb::PortEndpoints {
                port_name: "http".into(),
                protocol: pb::Protocol::Tcp as i32,
                endpoints: vec![ready_endpoint(address)],
            }],
            last_change_trigger_time: Some(trigger.into()),
            ..pb::ServiceEndpoints::default()
        });
    }

    applier.apply(&revision).await.expect("applied");

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoded");
    for line in [
        r#"kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} 2"#,
        r#"kubeproxy_network_programming_duration_seconds_count{ip_family="IPv6"} 1"#,
        // A second ago: above the 0.5 s bucket.
        r#"kubeproxy_network_programming_duration_seconds_bucket{le="0.5",ip_family="IPv6"} 0"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
}

/// `web_revision` as revision `number`, a delta adding `demo/local`: internalTrafficPolicy Local,
/// no endpoints.
fn local_service_delta(number: u64) -> Revision {
    let mut revision = web_revision();
    revision.number = number;
    revision.reset = false;
    let part = &mut revision.parts[0];
    part.revision = number;
    part.reset = false;
    let service = &mut part.upserted_services[0];
    service.key = Some(pb::ObjectKey {
        namespace: "demo".into(),
        name: "local".into(),
    });
    service.cluster_ips = vec!["10.96.0.11".into()];
    service.internal_traffic_policy_local = true;
    revision
}

#[tokio::test(start_paused = true)]
async fn changes_count_against_the_state_held_and_stop_pending_when_the_sync_starts() {
    let metrics = Metrics::new(&mut Default::default());
    let mut applier = Applier::new(
        "node-1",
        RecordingDataplane::default(),
        Status::default(),
        metrics.clone(),
    );
    applier.apply(&web_revision()).await.expect("applied");
    assert_eq!(metrics.service_changes.get(), 1);

    // The same state again (a reset after a reconnect) changes nothing.
    let mut again = web_revision();
    again.number = 2;
    applier.apply(&again).await.expect("applied");
    assert_eq!(metrics.service_changes.get(), 1);

    // A new Service waits for min-sync-period: pending until its sync starts.
    let delta = local_service_delta(3);
    let mut apply = std::pin::pin!(applier.apply(&delta));
    tokio::select! {
        biased;
        _ = &mut apply => panic!("the sync must wait for min-sync-period"),
        () = tokio::time::sleep(Duration::from_millis(100)) => {}
    }
    assert_eq!(metrics.service_changes_pending.get(), 1);
    assert_eq!(metrics.service_changes.get(), 2);
    apply.await.expect("applied");
    assert_eq!(metrics.service_changes_pending.get(), 0);
    assert_eq!(metrics.endpoint_changes.get(), 0);

    // Its internal Local policy has no local endpoint.
    let gauge = |traffic_policy| {
        metrics
            .no_local_endpoints
            .get_or_create(&TrafficPolicyLabel {
                traffic_policy,
                ip_family: "IPv4",
            })
            .get()
    };
    assert_eq!((gauge("internal"), gauge("external")), (1, 0));
}

/// The error of [`Refusing`]: the step, and the family when only one failed.
#[derive(Debug, thiserror::Error)]
#[error("refused")]
struct Refusal(FailedStep, Option<IpFamily>);

impl SyncError for Refusal {
    fn failed_step(&self) -> FailedStep {
        self.0
    }

    fn failed_family(&self) -> Option<IpFamily> {
        self.1
    }
}

/// Fails every sync at one step (in one family, or in all when `None`), in a proxy mode,
/// programming both families.
#[derive(Debug)]
struct Refusing(FailedStep, &'static str, Option<IpFamily>);

/// The value of `counters`' series for `ip_family`.
fn per_family(counters: &Family<FamilyLabel, Counter>, ip_family: &'static str) -> u64 {
    counters.get_or_create(&FamilyLabel { ip_family }).get()
}

impl Dataplane for Refusing {
    type Error = Refusal;

    fn mode(&self) -> &'static str {
        self.1
    }

    fn ip_families(&self) -> Families {
        Families::new(IpFamily::ALL)
    }

    async fn sync(&mut self, _: &ProxyState) -> Result<SyncReport, Refusal> {
        Err(Refusal(self.0, self.2))
    }
}

#[tokio::test(start_paused = true)]
async fn only_refused_rules_count_as_restore_failures_and_partial_ones_in_both_counters() {
    // (restore failures, partial ones) of IPv4, then of IPv6.
    let counts = |step, family| async move {
        let metrics = Metrics::new(&mut Default::default());
        let mut applier = Applier::new(
            "node-1",
            Refusing(step, "iptables", family),
            Status::default(),
            metrics.clone(),
        );
        applier.apply(&web_revision()).await.expect_err("refused");
        [
            (
                per_family(&metrics.restore_failures, "IPv4"),
                per_family(&metrics.partial_restore_failures, "IPv4"),
            ),
            (
                per_family(&metrics.restore_failures, "IPv6"),
                per_family(&metrics.partial_restore_failures, "IPv6"),
            ),
        ]
    };
    let partial = FailedStep::Restore { partial: true };
    let full = FailedStep::Restore { partial: false };
    assert_eq!(counts(partial, None).await, [(1, 1), (1, 1)]);
    assert_eq!(counts(full, None).await, [(1, 0), (1, 0)]);
    assert_eq!(counts(FailedStep::Other, None).await, [(0, 0), (0, 0)]);
    // Dual-stack iptables writes each family on its own: only the refused family counts.
    assert_eq!(counts(partial, Some(IpFamily::V6)).await, [(0, 0), (1, 1)]);
}

#[tokio::test(start_paused = true)]
async fn in_nftables_mode_a_refused_transaction_counts_per_family_and_not_as_iptables() {
    let metrics = Metrics::new(&mut Default::default());
    let step = FailedStep::Restore { partial: true };
    let mut applier = Applier::new(
        "node-1",
        Refusing(step, "nftables", None),
        Status::default(),
        metrics.clone(),
    );
    applier.apply(&web_revision()).await.expect_err("refused");
    let failures = |ip_family| per_family(&metrics.nftables_sync_failures, ip_family);
    assert_eq!((failures("IPv4"), failures("IPv6")), (1, 1));
    for ip_family in ["IPv4", "IPv6"] {
        assert_eq!(per_family(&metrics.restore_failures, ip_family), 0);
        assert_eq!(per_family(&metrics.partial_restore_failures, ip_family), 0);
    }
}

/// Records the syncs, the local CIDRs and the service CIDRs it is given.
#[derive(Debug, Clone, Default)]
#[allow(clippy::type_complexity)]
struct DetectorRecord(Arc<std::sync::Mutex<(usize, Vec<Vec<Cidr>>, Vec<Vec<Cidr>>)>>);

impl Dataplane for DetectorRecord {
    type Error = std::convert::Infallible;

    fn mode(&self) -> &'static str {
        "iptables"
    }

    async fn sync(&mut self, _: &ProxyState) -> Result<SyncReport, Self::Error> {
        if let Ok(mut record) = self.0.lock() {
            record.0 += 1;
        }
        Ok(SyncReport::default())
    }

    fn set_local_cidrs(&mut self, cidrs: Vec<Cidr>) {
        if let Ok(mut record) = self.0.lock() {
            record.1.push(cidrs);
        }
    }

    fn set_service_cidrs(&mut self, cidrs: Vec<Cidr>) {
        if let Ok(mut record) = self.0.lock() {
            record.2.push(cidrs);
        }
    }
}

fn cidrs(texts: &[&str]) -> Vec<Cidr> {
    texts
        .iter()
        .map(|text| text.parse().expect("a CIDR"))
        .collect()
}

/// A status-only delta, revision `number`, carrying `pod_cidrs`.
fn status_delta(number: u64, pod_cidrs: &[&str]) -> Revision {
    status_delta_with(number, pod_cidrs, &[])
}

/// A status-only delta, revision `number`, carrying `pod_cidrs` and `service_cidrs`.
fn status_delta_with(number: u64, pod_cidrs: &[&str], service_cidrs: &[&str]) -> Revision {
    Revision {
        epoch: "epoch-1".into(),
        number,
        reset: false,
        on_presented_state: false,
        parts: vec![pb::SyncResponse {
            controller_epoch: "epoch-1".into(),
            revision: number,
            complete: true,
            node_status: Some(pb::NodeStatus {
                eligible: true,
                reason: String::new(),
                pod_cidrs: pod_cidrs.iter().map(|cidr| (*cidr).to_owned()).collect(),
                service_cidrs: service_cidrs
                    .iter()
                    .map(|cidr| (*cidr).to_owned())
                    .collect(),
                ..pb::NodeStatus::default()
            }),
            ..Default::default()
        }],
    }
}

#[tokio::test(start_paused = true)]
async fn the_node_cidr_detector_follows_the_nodes_pod_cidrs_and_rewrites_the_rules() {
    let record = DetectorRecord::default();
    let periods = SyncPeriods::new(SYNC_PERIOD, Duration::ZERO).expect("valid periods");
    let new_applier = |record: &DetectorRecord| {
        Applier::new(
            "node-1",
            record.clone(),
            Status::default(),
            Metrics::new(&mut Default::default()),
        )
        .with_sync_periods(periods)
    };
    let mut applier = new_applier(&record).with_node_cidr_detector();
    let mut reset = web_revision();
    reset.parts[0].node_status = status_delta(1, &["10.244.1.0/24", "fd00:1::/64"]).parts[0]
        .node_status
        .take();
    applier.apply(&reset).await.expect("applied");
    // The same CIDRs again: nothing to write. New ones: the rules are written again, although
    // no Service changed. One that does not parse is left out.
    applier
        .apply(&status_delta(2, &["10.244.1.0/24", "fd00:1::/64"]))
        .await
        .expect("applied");
    applier
        .apply(&status_delta(3, &["10.244.9.0/24", "not a cidr"]))
        .await
        .expect("applied");
    let (syncs, given, _) = record.0.lock().map(|r| r.clone()).unwrap_or_default();
    assert_eq!(syncs, 2);
    assert_eq!(
        given,
        [
            cidrs(&["10.244.1.0/24", "fd00:1::/64"]),
            cidrs(&["10.244.9.0/24"])
        ]
    );

    // Without the detector the Node's CIDRs change nothing.
    let other = DetectorRecord::default();
    let mut applier = new_applier(&other);
    applier.apply(&web_revision()).await.expect("applied");
    applier
        .apply(&status_delta(2, &["10.244.9.0/24"]))
        .await
        .expect("applied");
    assert_eq!(
        other.0.lock().map(|r| r.clone()).unwrap_or_default(),
        (1, Vec::new(), Vec::new())
    );
}

#[tokio::test(start_paused = true)]
async fn new_service_cidrs_reach_the_dataplane_and_are_written_at_once() {
    let record = DetectorRecord::default();
    let periods = SyncPeriods::new(SYNC_PERIOD, Duration::ZERO).expect("valid periods");
    let mut applier = Applier::new(
        "node-1",
        record.clone(),
        Status::default(),
        Metrics::new(&mut Default::default()),
    )
    .with_sync_periods(periods);
    applier.apply(&web_revision()).await.expect("applied");
    for (number, cidrs) in [
        (2, &["10.96.0.0/16"][..]),
        (3, &["10.96.0.0/16"][..]),
        (4, &["10.96.0.0/16", "fd00:10:96::/112"][..]),
    ] {
        applier
            .apply(&status_delta_with(number, &[], cidrs))
            .await
            .expect("applied");
    }
    let (syncs, _, given) = record.0.lock().map(|r| r.clone()).unwrap_or_default();
    // The reset, then each change of the CIDRs; the repeat writes nothing.
    assert_eq!(syncs, 3);
    assert_eq!(
        given,
        [
            cidrs(&["10.96.0.0/16"]),
            cidrs(&["10.96.0.0/16", "fd00:10:96::/112"])
        ]
    );
}

#[test]
fn the_nodes_ips_replace_those_known_at_start_and_bind_address_keeps_its_family() {
    let ip = |text: &str| -> IpAddr { text.parse().expect("an IP") };
    let from_node =
        |texts: &[&str]| -> Vec<String> { texts.iter().map(|text| (*text).to_owned()).collect() };
    let mut ips = NodeIps {
        bind_address: None,
        in_use: vec![ip("198.18.0.12")],
    };
    assert_eq!(
        ips.follow(&[]),
        None,
        "a Node without IPs keeps the start ones"
    );
    let dual = from_node(&["198.18.0.11", "fd00:198:18::11"]);
    assert_eq!(
        ips.follow(&dual),
        Some(vec![ip("198.18.0.11"), ip("fd00:198:18::11")])
    );
    assert_eq!(ips.follow(&dual), None, "the same again changes nothing");

    let mut bound = NodeIps {
        bind_address: Some(ip("198.18.0.99")),
        in_use: vec![ip("198.18.0.99")],
    };
    assert_eq!(
        bound.follow(&dual),
        Some(vec![ip("198.18.0.99"), ip("fd00:198:18::11")])
    );
    let mut bound_v6 = NodeIps {
        bind_address: Some(ip("fd00::99")),
        in_use: Vec::new(),
    };
    assert_eq!(
        bound_v6.follow(&from_node(&["198.18.0.11"])),
        Some(vec![ip("fd00::99"), ip("198.18.0.11")])
    );
}

/// A status-only delta, revision `number`, moving the node to `zone`.
fn zone_delta(number: u64, zone: &str) -> Revision {
    let mut revision = status_delta(number, &[]);
    if let Some(status) = revision.parts[0].node_status.as_mut() {
        status.zone = zone.into();
    }
    revision
}

#[tokio::test(start_paused = true)]
async fn a_new_zone_localizes_the_sets_in_cluster_form_again_and_rewrites_the_rules() {
    let dataplane = RecordingDataplane::default();
    let mut applier = applier(&dataplane);
    let mut reset = web_revision();
    let endpoint = |address: &str, node: &str, zone: &str| pb::Endpoint {
        node_name: node.into(),
        for_zones: vec![zone.into()],
        ..ready_endpoint(address)
    };
    reset.parts[0].upserted_endpoints = vec![pb::ServiceEndpoints {
        key: Some(pb::ObjectKey {
            namespace: "demo".into(),
            name: "web".into(),
        }),
        ports: vec![pb::PortEndpoints {
            port_name: "http".into(),
            protocol: pb::Protocol::Tcp as i32,
            endpoints: vec![
                endpoint("10.244.1.2", "node-1", "a"),
                endpoint("10.244.2.2", "node-2", "b"),
            ],
        }],
        cluster_form: true,
        ..pb::ServiceEndpoints::default()
    }];
    reset.parts[0].node_status = zone_delta(1, "a").parts[0].node_status.clone();
    applier.apply(&reset).await.expect("applied");
    applier.apply(&zone_delta(2, "b")).await.expect("applied");

    let seen: Vec<Vec<(bool, bool)>> = (dataplane.applied().iter())
        .map(|state| {
            (state.services.values())
                .flat_map(|s| &s.ports[0].endpoints)
                .map(|e| (e.is_local, e.topology_excluded))
                .collect()
        })
        .collect();
    // In zone a, node-1's endpoint is local and zone b's is left out; in zone b, the other way.
    assert_eq!(
        seen,
        [
            vec![(true, false), (false, true)],
            vec![(true, true), (false, false)]
        ]
    );
}
