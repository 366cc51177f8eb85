//! The applier's timing on its own: resyncs while the client waits for something else.
//!
//! Test addresses: cluster IPs 10.96.0.0/16.

use super::*;
use splitproxy_dataplane::{IpFamily, recording::RecordingDataplane};
use splitproxy_proto::v1alpha1 as pb;

const SYNC_PERIOD: Duration = Duration::from_secs(30);

fn applier(dataplane: &RecordingDataplane) -> Applier<RecordingDataplane> {
    let periods = SyncPeriods::new(SYNC_PERIOD, Duration::from_secs(1)).expect("valid periods");
    Applier::new(
        dataplane.clone(),
        Status::default(),
        Metrics::new(&mut Default::default()),
    )
    .with_sync_periods(periods)
}

/// A complete reset revision holding `demo/web` on 10.96.0.10.
fn web_revision() -> Revision {
    Revision {
        epoch: "epoch-1".into(),
        number: 1,
        reset: true,
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
        Ok(report)
    }
}

#[tokio::test(start_paused = true)]
async fn rules_written_are_exported_per_table_and_ip_family() {
    let mut registry = prometheus_client::registry::Registry::default();
    let status = Status::default();
    let mut applier = Applier::new(DualStackReport, status.clone(), Metrics::new(&mut registry));
    applier.apply(&web_revision()).await.expect("applied");

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoded");
    for line in [
        r#"kubeproxy_sync_proxy_rules_iptables_last{table="nat",ip_family="IPv4"} 12"#,
        r#"kubeproxy_sync_proxy_rules_iptables_last{table="nat",ip_family="IPv6"} 9"#,
        r#"kubeproxy_sync_proxy_rules_iptables_last{table="filter",ip_family="IPv6"} 3"#,
        r#"kubeproxy_sync_proxy_rules_iptables_total{table="nat",ip_family="IPv4"} 30"#,
        r#"kubeproxy_sync_proxy_rules_iptables_total{table="nat",ip_family="IPv6"} 9"#,
        "kubeproxy_sync_partial_proxy_rules_duration_seconds_count 1",
        "kubeproxy_sync_full_proxy_rules_duration_seconds_count 0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
    // The status sums the families per table.
    let synced = status.snapshot().last_sync.expect("synced");
    assert_eq!(
        synced.rules_written,
        [("filter".to_owned(), 7), ("nat".to_owned(), 21)]
    );
}
