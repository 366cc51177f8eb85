use super::*;
use crate::metrics::Metrics;
use std::time::Duration;

fn record(metrics: &Metrics, node: &str) -> Record {
    metrics.agents.by_node()[node].clone()
}

async fn wait(seconds: u64) {
    tokio::time::advance(Duration::from_secs(seconds)).await;
}

#[tokio::test(start_paused = true)]
async fn a_new_stream_is_behind_from_its_opening_until_its_first_ack() {
    let metrics = Metrics::default();
    let mut stream = Connection::open(&metrics, "node-1", "peer", 1, 0);
    wait(2).await;
    stream.view_computed(true);
    stream.sent(1, &[pb::SyncResponse::default()]);
    wait(3).await;

    let now = Instant::now();
    assert_eq!(record(&metrics, "node-1").lag(now), Duration::from_secs(5));
    assert_eq!(record(&metrics, "node-1").latest_revision, 1);

    stream.acked(1, true);
    let acked = record(&metrics, "node-1");
    assert_eq!((acked.acked_revision, acked.lag(now)), (1, Duration::ZERO));
    assert!(acked.last_ack_at.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_change_published_while_a_revision_is_in_flight_keeps_the_node_behind_after_the_ack() {
    let metrics = Metrics::default();
    let mut stream = Connection::open(&metrics, "node-1", "peer", 1, 0);
    stream.view_computed(true);
    stream.sent(1, &[pb::SyncResponse::default()]);
    wait(1).await;
    stream.observed_change();
    wait(4).await;
    stream.acked(1, true);

    // Behind since the change, not since the stream opened.
    assert_eq!(
        record(&metrics, "node-1").lag(Instant::now()),
        Duration::from_secs(4)
    );

    // The change turns out not to touch this node's view: up to date at once.
    stream.view_computed(false);
    assert_eq!(
        record(&metrics, "node-1").lag(Instant::now()),
        Duration::ZERO
    );
    assert_eq!(metrics.view_computations.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_rejected_revision_leaves_the_node_behind_with_the_reason() {
    let metrics = Metrics::default();
    let mut stream = Connection::open(&metrics, "node-1", "peer", 1, 0);
    stream.view_computed(true);
    stream.sent(1, &[pb::SyncResponse::default()]);
    wait(2).await;
    stream.rejected("dataplane sync failed");

    let rejected = record(&metrics, "node-1");
    assert_eq!(rejected.acked_revision, 0);
    assert_eq!(rejected.lag(Instant::now()), Duration::from_secs(2));
    assert_eq!(
        rejected.last_nack.map(|(_, reason)| reason).as_deref(),
        Some("dataplane sync failed")
    );
    assert_eq!(metrics.rejected_revisions.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_node_counts_once_while_its_old_stream_lingers_and_leaves_with_its_last_stream() {
    let metrics = Metrics::default();
    let old = Connection::open(&metrics, "node-1", "old", 1, 0);
    let new = Connection::open(&metrics, "node-1", "new", 1, 0);
    let other = Connection::open(&metrics, "node-2", "peer", 1, 0);

    assert_eq!(metrics.agents.streams().len(), 3);
    let by_node = metrics.agents.by_node();
    assert_eq!(by_node.len(), 2);
    assert_eq!(by_node["node-1"].peer, "new");

    drop((old, new));
    assert_eq!(
        metrics.agents.by_node().keys().collect::<Vec<_>>(),
        ["node-2"]
    );
    drop(other);
    assert!(metrics.agents.streams().is_empty());
}
