//! The stream loop driven by a plain stream in paused time: when the kernel is synced, with what,
//! and when each revision is answered.
//!
//! Test addresses: cluster IPs 10.96.0.0/16; pods 10.244.1.0/24 on this node.

use super::*;
use crate::sync_timer::SyncPeriods;
use splitproxy_dataplane::{ProxyState, SyncReport, testing::recording::RecordingDataplane};
use std::sync::{
    Arc, Mutex,
    atomic::{AtomicUsize, Ordering},
};
use tokio::{task::JoinHandle, time::Instant};
use tokio_stream::wrappers::ReceiverStream;

const EPOCH: &str = "epoch-1";
const SYNC_PERIOD: Duration = Duration::from_secs(30);
const MIN_SYNC_PERIOD: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

/// The kernel refusing the rules.
#[derive(Debug, thiserror::Error)]
#[error("kernel refused the rules")]
struct Refused;

/// A [`RecordingDataplane`] that also notes when each sync was attempted (in tokio's clock) and
/// can be told to refuse the next syncs. Clones share everything.
#[derive(Debug, Clone, Default)]
struct Kernel {
    synced: RecordingDataplane,
    attempts: Arc<Mutex<Vec<Instant>>>,
    refuse: Arc<AtomicUsize>,
}

impl Kernel {
    /// When syncs were attempted, failed or not, oldest first.
    fn attempts(&self) -> Vec<Instant> {
        self.attempts.lock().expect("not poisoned").clone()
    }

    /// The states synced successfully, oldest first.
    fn synced(&self) -> Vec<ProxyState> {
        self.synced.applied()
    }

    /// Makes the next `n` syncs fail.
    fn refuse_next(&self, n: usize) {
        self.refuse.store(n, Ordering::SeqCst);
    }
}

impl splitproxy_dataplane::SyncError for Refused {
    fn failed_step(&self) -> splitproxy_dataplane::FailedStep {
        splitproxy_dataplane::FailedStep::Restore { partial: false }
    }
}

impl Dataplane for Kernel {
    type Error = Refused;

    fn mode(&self) -> &'static str {
        "test"
    }

    async fn sync(&mut self, state: &ProxyState) -> Result<SyncReport, Refused> {
        self.attempts
            .lock()
            .expect("not poisoned")
            .push(Instant::now());
        let refused = self
            .refuse
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if refused {
            return Err(Refused);
        }
        match self.synced.sync(state).await {
            Ok(report) => Ok(report),
            Err(never) => match never {},
        }
    }
}

/// The stream loop running on a fake controller stream.
struct Agent {
    controller: mpsc::Sender<Result<pb::SyncResponse, tonic::Status>>,
    acks: mpsc::Receiver<pb::SyncRequest>,
    kernel: Kernel,
    status: Status,
    metrics: Metrics,
    task: JoinHandle<Result<(), StreamError>>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Agent {
    fn start() -> Self {
        let kernel = Kernel::default();
        let status = Status::default();
        let metrics = Metrics::new(&mut Default::default());
        let periods = SyncPeriods::new(SYNC_PERIOD, MIN_SYNC_PERIOD).expect("valid periods");
        let mut applier = Applier::new("node-1", kernel.clone(), status.clone(), metrics.clone())
            .with_sync_periods(periods);
        let (controller, inbound) = mpsc::channel(8);
        let (ack_tx, acks) = mpsc::channel(8);
        let loop_metrics = metrics.clone();
        let task = tokio::spawn(async move {
            let mut progressed = false;
            serve(
                "node-1",
                false,
                ReceiverStream::new(inbound),
                &ack_tx,
                &mut applier,
                &loop_metrics,
                &mut progressed,
            )
            .await
        });
        Self {
            controller,
            acks,
            kernel,
            status,
            metrics,
            task,
        }
    }

    async fn send(&self, message: pb::SyncResponse) {
        self.controller
            .send(Ok(message))
            .await
            .expect("the loop is running");
    }

    /// The next answer, with the instant it was sent.
    async fn ack(&mut self) -> (pb::Ack, Instant) {
        let request = tokio::time::timeout(Duration::from_secs(3600), self.acks.recv())
            .await
            .expect("an answer within the hour")
            .expect("the loop is running");
        match request.kind {
            Some(sync_request::Kind::Ack(ack)) => (ack, Instant::now()),
            other => panic!("expected an ack, got {other:?}"),
        }
    }

    /// Asserts that no answer has been sent.
    fn assert_no_ack(&mut self) {
        assert!(self.acks.try_recv().is_err(), "no answer is expected yet");
    }
}

/// A complete revision. `reset` replaces the state; otherwise it is a delta.
fn revision(number: u64, reset: bool, services: &[(&str, &str)]) -> pb::SyncResponse {
    pb::SyncResponse {
        controller_epoch: EPOCH.into(),
        revision: number,
        reset,
        complete: true,
        upserted_services: services
            .iter()
            .map(|(name, cluster_ip)| pb::Service {
                key: Some(pb::ObjectKey {
                    namespace: "demo".into(),
                    name: (*name).into(),
                }),
                cluster_ips: vec![(*cluster_ip).into()],
                ports: vec![pb::ServicePort {
                    name: "http".into(),
                    protocol: pb::Protocol::Tcp as i32,
                    port: 80,
                    node_port: 0,
                }],
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn applied(ack: &pb::Ack, number: u64) -> bool {
    ack.revision == number && ack.status == pb::AckStatus::Applied as i32
}

fn rejected(ack: &pb::Ack, number: u64) -> bool {
    ack.revision == number && ack.status == pb::AckStatus::Rejected as i32
}

/// Lets the loop run what is due now, without moving the clock.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_held_state_is_resynced_every_sync_period_without_new_revisions() {
    let mut agent = Agent::start();
    agent
        .send(revision(1, true, &[("web", "10.96.0.10")]))
        .await;
    let (ack, t0) = agent.ack().await;
    assert!(applied(&ack, 1), "{ack:?}");
    assert_eq!(agent.kernel.attempts(), [t0]);

    tokio::time::advance(SYNC_PERIOD - MS).await;
    settle().await;
    assert_eq!(agent.kernel.attempts(), [t0], "no resync before the period");

    tokio::time::advance(MS).await;
    settle().await;
    tokio::time::advance(SYNC_PERIOD).await;
    settle().await;
    assert_eq!(
        agent.kernel.attempts(),
        [t0, t0 + SYNC_PERIOD, t0 + 2 * SYNC_PERIOD]
    );
    let synced = agent.kernel.synced();
    assert_eq!(synced.len(), 3);
    assert!(
        synced.iter().all(|s| *s == synced[0]),
        "resyncs program the held state: {synced:#?}"
    );
    assert!(!synced[0].services.is_empty());
    agent.assert_no_ack();
    let last_sync = agent
        .status
        .snapshot()
        .last_sync
        .expect("a sync was recorded");
    assert_eq!(last_sync.error, None);
}

#[tokio::test(start_paused = true)]
async fn a_revision_arriving_100ms_after_a_sync_waits_for_min_sync_period() {
    let mut agent = Agent::start();
    agent
        .send(revision(1, true, &[("web", "10.96.0.10")]))
        .await;
    let (ack, t0) = agent.ack().await;
    assert!(applied(&ack, 1), "{ack:?}");

    tokio::time::advance(100 * MS).await;
    agent
        .send(revision(2, false, &[("api", "10.96.0.11")]))
        .await;
    tokio::time::advance(MIN_SYNC_PERIOD - 101 * MS).await;
    settle().await;
    // 999 ms after the first sync: neither in the kernel nor answered.
    assert_eq!(agent.kernel.attempts(), [t0]);
    agent.assert_no_ack();

    let (ack, answered) = agent.ack().await;
    assert!(applied(&ack, 2), "{ack:?}");
    let attempts = agent.kernel.attempts();
    assert_eq!(attempts.len(), 2);
    assert!(
        attempts[1] - attempts[0] >= MIN_SYNC_PERIOD,
        "second sync {:?} after the first",
        attempts[1] - attempts[0]
    );
    assert!(answered >= attempts[1], "answered only once in the kernel");
    let synced = agent.kernel.synced();
    assert_eq!(
        synced[1].services.len(),
        2,
        "the delta came on top: {synced:#?}"
    );
}

/// A complete delta of `number` building on `base` (protocol rule 12).
fn delta_on(base: u64, number: u64, services: &[(&str, &str)]) -> pb::SyncResponse {
    pb::SyncResponse {
        base_revision: base,
        ..revision(number, false, services)
    }
}

#[tokio::test(start_paused = true)]
async fn revisions_arriving_while_a_sync_waits_are_folded_into_it_and_only_the_newest_is_answered()
{
    let mut agent = Agent::start();
    agent
        .send(revision(1, true, &[("web", "10.96.0.10")]))
        .await;
    let (_, t0) = agent.ack().await;

    tokio::time::advance(100 * MS).await;
    agent.send(delta_on(1, 2, &[("api", "10.96.0.11")])).await;
    tokio::time::advance(400 * MS).await;
    agent.send(delta_on(2, 3, &[("db", "10.96.0.12")])).await;
    settle().await;
    agent.assert_no_ack();

    let (ack, _) = agent.ack().await;
    assert!(applied(&ack, 3), "one ack answers both: {ack:?}");
    assert_eq!(agent.kernel.attempts(), [t0, t0 + MIN_SYNC_PERIOD]);
    assert_eq!(agent.kernel.synced()[1].services.len(), 3);
    assert_eq!(agent.status.snapshot().state.revision, 3);
    agent.assert_no_ack();
}

#[tokio::test(start_paused = true)]
async fn after_a_rejection_deltas_on_the_dropped_state_go_unanswered_until_one_builds_on_the_applied()
 {
    let mut agent = Agent::start();
    agent
        .send(revision(1, true, &[("web", "10.96.0.10")]))
        .await;
    agent.ack().await;

    tokio::time::advance(5 * MIN_SYNC_PERIOD).await;
    agent.kernel.refuse_next(1);
    agent.send(delta_on(1, 2, &[("api", "10.96.0.11")])).await;
    let (ack, _) = agent.ack().await;
    assert!(rejected(&ack, 2), "{ack:?}");

    // Sent before the controller read the NACK: built on revision 2, which the agent dropped.
    agent.send(delta_on(2, 3, &[("db", "10.96.0.12")])).await;
    tokio::time::advance(5 * MIN_SYNC_PERIOD).await;
    settle().await;
    agent.assert_no_ack();

    agent.send(delta_on(1, 4, &[("db", "10.96.0.12")])).await;
    let (ack, _) = agent.ack().await;
    assert!(applied(&ack, 4), "{ack:?}");
    let held = agent.status.snapshot().state;
    let names: Vec<&str> = held.services.keys().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["db", "web"], "revision 2's api is gone with it");
}

#[tokio::test(start_paused = true)]
async fn nothing_touches_the_kernel_before_the_first_complete_revision() {
    let mut agent = Agent::start();
    tokio::time::advance(10 * SYNC_PERIOD).await;
    settle().await;
    assert!(agent.kernel.attempts().is_empty());

    // A delta with no state to build on is refused, and still nothing is synced.
    agent
        .send(revision(1, false, &[("web", "10.96.0.10")]))
        .await;
    let (ack, _) = agent.ack().await;
    assert!(rejected(&ack, 1), "{ack:?}");
    // The first part of a revision is not a state either.
    let mut first_part = revision(2, true, &[("web", "10.96.0.10")]);
    first_part.complete = false;
    agent.send(first_part).await;
    tokio::time::advance(10 * SYNC_PERIOD).await;
    settle().await;
    assert!(agent.kernel.attempts().is_empty());
    agent.assert_no_ack();

    // The last part completes it: synced at once (the first sync does not wait).
    let before = Instant::now();
    agent
        .send(revision(2, true, &[("api", "10.96.0.11")]))
        .await;
    let (ack, _) = agent.ack().await;
    assert!(applied(&ack, 2), "{ack:?}");
    assert_eq!(agent.kernel.attempts(), [before]);
    assert_eq!(agent.kernel.synced()[0].services.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_first_revision_the_kernel_refuses_is_tried_again_though_no_state_is_held() {
    let mut agent = Agent::start();
    agent.kernel.refuse_next(1);
    agent
        .send(revision(1, true, &[("web", "10.96.0.10")]))
        .await;
    let (ack, refused_at) = agent.ack().await;
    assert!(rejected(&ack, 1), "{ack:?}");
    assert!(ack.reason.contains("kernel refused the rules"), "{ack:?}");

    tokio::time::advance(MIN_SYNC_PERIOD).await;
    settle().await;
    assert_eq!(
        agent.kernel.attempts(),
        [refused_at, refused_at + MIN_SYNC_PERIOD]
    );
    let synced = agent.kernel.synced();
    assert_eq!(synced.len(), 1);
    assert_eq!(
        synced[0].services.len(),
        1,
        "the refused state, tried again"
    );
    assert_eq!(
        agent.status.snapshot().state.epoch,
        None,
        "still not applied"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_resync_is_counted_recorded_and_retried_after_min_sync_period() {
    let mut agent = Agent::start();
    agent
        .send(revision(1, true, &[("web", "10.96.0.10")]))
        .await;
    let (_, t0) = agent.ack().await;

    agent.kernel.refuse_next(1);
    tokio::time::advance(SYNC_PERIOD).await;
    settle().await;
    assert_eq!(agent.kernel.attempts(), [t0, t0 + SYNC_PERIOD]);
    let ipv4 = crate::metrics::FamilyLabel { ip_family: "IPv4" };
    assert_eq!(agent.metrics.restore_failures.get_or_create(&ipv4).get(), 1);
    let last_sync = agent.status.snapshot().last_sync.expect("recorded");
    assert_eq!(last_sync.error.as_deref(), Some("kernel refused the rules"));

    tokio::time::advance(MIN_SYNC_PERIOD).await;
    settle().await;
    let retried = t0 + SYNC_PERIOD + MIN_SYNC_PERIOD;
    assert_eq!(agent.kernel.attempts(), [t0, t0 + SYNC_PERIOD, retried]);
    let synced = agent.kernel.synced();
    assert_eq!(synced.len(), 2);
    assert_eq!(synced[0], synced[1]);
    assert_eq!(
        agent.status.snapshot().last_sync.and_then(|s| s.error),
        None
    );

    // Back to the regular period after the repair.
    tokio::time::advance(SYNC_PERIOD).await;
    settle().await;
    assert_eq!(
        agent.kernel.attempts().last(),
        Some(&(retried + SYNC_PERIOD))
    );
    agent.assert_no_ack();
}

#[tokio::test(start_paused = true)]
async fn a_revision_the_kernel_refuses_is_nacked_waits_in_no_queue_and_is_retried_with_back_off() {
    let mut agent = Agent::start();
    agent
        .send(revision(1, true, &[("web", "10.96.0.10")]))
        .await;
    let (_, t0) = agent.ack().await;

    tokio::time::advance(5 * MIN_SYNC_PERIOD).await;
    agent.kernel.refuse_next(3);
    agent
        .send(revision(2, false, &[("api", "10.96.0.11")]))
        .await;
    let (ack, refused_at) = agent.ack().await;
    assert!(rejected(&ack, 2), "{ack:?}");
    assert_eq!(refused_at, t0 + 5 * MIN_SYNC_PERIOD);
    let status = agent.status.snapshot();
    assert_eq!(status.state.revision, 1, "the last good state is held");
    assert_eq!(
        status.queued_since, None,
        "a refused revision waits no more"
    );
    assert!(status.proxy_healthy(Duration::ZERO));
    assert_eq!(agent.metrics.rejected_revisions.get(), 1);

    // Tried again one min-sync-period later, then twice as long after each failure; what the
    // kernel finally takes is the refused state, never the older one again.
    for _ in 0..10 {
        tokio::time::advance(MIN_SYNC_PERIOD).await;
        settle().await;
    }
    let second = MIN_SYNC_PERIOD;
    assert_eq!(
        agent.kernel.attempts(),
        [
            t0,
            refused_at,
            refused_at + second,
            refused_at + 3 * second,
            refused_at + 7 * second
        ]
    );
    tokio::time::advance(SYNC_PERIOD).await;
    settle().await;
    let synced = agent.kernel.synced();
    assert_eq!(synced.len(), 3);
    assert!(
        synced[1..].iter().all(|state| state.services.len() == 2),
        "{synced:?}"
    );
    assert_eq!(
        agent.status.snapshot().state.revision,
        1,
        "until a revision is applied"
    );
    agent.assert_no_ack();
}

#[tokio::test(start_paused = true)]
async fn a_revision_that_does_not_fit_is_refused_without_waiting() {
    let mut agent = Agent::start();
    agent
        .send(revision(1, true, &[("web", "10.96.0.10")]))
        .await;
    let (_, t0) = agent.ack().await;

    let mut other_epoch = revision(2, false, &[("api", "10.96.0.11")]);
    other_epoch.controller_epoch = "epoch-2".into();
    agent.send(other_epoch).await;
    let (ack, answered) = agent.ack().await;
    assert!(rejected(&ack, 2), "{ack:?}");
    assert_eq!(
        answered, t0,
        "nothing to wait for: the kernel is not touched"
    );
    assert_eq!(agent.kernel.attempts(), [t0]);
}

#[tokio::test(start_paused = true)]
async fn the_loop_ends_when_the_controller_closes_the_stream() {
    let mut agent = Agent::start();
    let (closed, _) = mpsc::channel(1);
    drop(std::mem::replace(&mut agent.controller, closed));
    let result = (&mut agent.task).await.expect("the loop does not panic");
    assert!(matches!(result, Err(StreamError::Closed)), "{result:?}");
}

/// A complete delta that changes only the node's status.
fn status_only(number: u64, eligible: bool) -> pb::SyncResponse {
    pb::SyncResponse {
        controller_epoch: EPOCH.into(),
        revision: number,
        complete: true,
        node_status: Some(pb::NodeStatus {
            eligible,
            reason: if eligible {
                String::new()
            } else {
                "the Node is being deleted".into()
            },
            pod_cidrs: Vec::new(),
            service_cidrs: Vec::new(),
            node_ips: Vec::new(),
            zone: String::new(),
        }),
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_status_only_revision_is_applied_at_once_without_touching_the_kernel() {
    let mut agent = Agent::start();
    agent
        .send(revision(1, true, &[("web", "10.96.0.10")]))
        .await;
    let (_, t0) = agent.ack().await;
    agent.send(status_only(2, false)).await;
    let (ack, answered) = agent.ack().await;
    assert!(applied(&ack, 2), "{ack:?}");
    assert_eq!(answered, t0, "no min-sync-period wait for a status change");
    assert_eq!(agent.kernel.attempts(), [t0], "no kernel write");
    let snapshot = agent.status.snapshot();
    assert_eq!(
        snapshot.state.eligibility,
        crate::node_state::Eligibility::Ineligible("the Node is being deleted".into())
    );
    assert_eq!(snapshot.queued_since, None, "nothing waits to be applied");
}

#[tokio::test(start_paused = true)]
async fn the_last_eligibility_outlives_the_controller_stream() {
    let mut agent = Agent::start();
    let mut reset = revision(1, true, &[("web", "10.96.0.10")]);
    reset.node_status = Some(pb::NodeStatus {
        eligible: true,
        ..pb::NodeStatus::default()
    });
    agent.send(reset).await;
    agent.ack().await;

    let (closed, _) = mpsc::channel(1);
    drop(std::mem::replace(&mut agent.controller, closed));
    let result = (&mut agent.task).await.expect("the loop does not panic");
    assert!(matches!(result, Err(StreamError::Closed)), "{result:?}");
    // Fail static: with no controller, the node keeps what it was last told, not the
    // not-eligible it starts with.
    assert!(agent.status.snapshot().state.eligibility.is_eligible());
}

#[test]
fn a_controller_not_ready_says_when_to_come_back_and_other_errors_do_not() {
    let refusal = |code, hint: Option<&str>| {
        let mut status = tonic::Status::new(code, "not read yet");
        if let Some(hint) = hint {
            let value = hint.parse().expect("ascii");
            status
                .metadata_mut()
                .insert(splitproxy_proto::RETRY_AFTER_MS, value);
        }
        StreamError::Status(status)
    };
    assert_eq!(
        refusal(tonic::Code::Unavailable, Some("2000")).retry_after(),
        Some(Duration::from_secs(2))
    );
    assert_eq!(refusal(tonic::Code::Unavailable, None).retry_after(), None);
    assert_eq!(
        refusal(tonic::Code::Unavailable, Some("soon")).retry_after(),
        None
    );
    assert_eq!(
        refusal(tonic::Code::Internal, Some("2000")).retry_after(),
        None
    );
    assert_eq!(StreamError::Closed.retry_after(), None);
}
