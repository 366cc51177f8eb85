use super::*;
use crate::metrics::Metrics;
use futures::FutureExt;
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
    let mut stream = Connection::open(&metrics.agents, &metrics.streams, "node-1", "peer", 1, 0);
    wait(2).await;
    stream.view_computed(true);
    stream.sent(1, &[crate::wire::SyncResponse::default()]);
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
    let mut stream = Connection::open(&metrics.agents, &metrics.streams, "node-1", "peer", 1, 0);
    stream.view_computed(true);
    stream.sent(1, &[crate::wire::SyncResponse::default()]);
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
    assert_eq!(metrics.streams.view_computations.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_rejected_revision_leaves_the_node_behind_with_the_reason() {
    let metrics = Metrics::default();
    let mut stream = Connection::open(&metrics.agents, &metrics.streams, "node-1", "peer", 1, 0);
    stream.view_computed(true);
    stream.sent(1, &[crate::wire::SyncResponse::default()]);
    wait(2).await;
    stream.rejected("dataplane sync failed");

    let rejected = record(&metrics, "node-1");
    assert_eq!(rejected.acked_revision, 0);
    assert_eq!(rejected.lag(Instant::now()), Duration::from_secs(2));
    assert_eq!(
        rejected.last_nack.map(|(_, reason)| reason).as_deref(),
        Some("dataplane sync failed")
    );
    assert_eq!(metrics.streams.rejected_revisions.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_node_counts_once_while_its_old_stream_lingers_and_leaves_with_its_last_stream() {
    let metrics = Metrics::default();
    let old = Connection::open(&metrics.agents, &metrics.streams, "node-1", "old", 1, 0);
    let new = Connection::open(&metrics.agents, &metrics.streams, "node-1", "new", 1, 0);
    let other = Connection::open(&metrics.agents, &metrics.streams, "node-2", "peer", 1, 0);

    assert_eq!(metrics.agents.streams().len(), 3);
    let by_node = metrics.agents.by_node();
    assert_eq!(by_node.len(), 2);
    assert_eq!(by_node["node-1"].peer, "new");
    // The old stream of node-1 is told to end; the others are not.
    assert_eq!(old.ending().now_or_never(), Some(Ending::Superseded));
    assert_eq!(new.ending().now_or_never(), None);
    assert_eq!(other.ending().now_or_never(), None);
    assert_eq!(metrics.streams.superseded_streams.get(), 1);
    assert_eq!(
        metrics.agents.kept(),
        2,
        "a node counts once against the share"
    );

    drop((old, new));
    assert_eq!(
        metrics.agents.by_node().keys().collect::<Vec<_>>(),
        ["node-2"]
    );
    drop(other);
    assert!(metrics.agents.streams().is_empty());
}

fn open(metrics: &Metrics, node: usize) -> Connection {
    let node = format!("node-{node}");
    Connection::open(&metrics.agents, &metrics.streams, &node, "peer", 1, 0)
}

#[test]
fn the_oldest_streams_beyond_the_limit_are_told_to_end_once_each() {
    let metrics = Metrics::default();
    let agents = &metrics.agents;
    let streams: Vec<Connection> = (0..4).map(|node| open(&metrics, node)).collect();
    assert!(!agents.shed_oldest(), "no limit, nothing shed");
    assert!(!agents.set_limit(None));
    assert!(agents.set_limit(Some(2)));
    assert!(agents.shed_oldest());
    assert!(agents.shed_oldest());
    assert!(!agents.shed_oldest(), "two kept, as the limit says");
    assert_eq!(agents.kept(), 2);
    let told: Vec<bool> = (streams.iter())
        .map(|stream| stream.ending().now_or_never().is_some())
        .collect();
    assert_eq!(told, [true, true, false, false]);

    // The shed streams end; a new one opens and is over the limit again: the oldest kept goes.
    let mut streams = streams.into_iter().skip(2).collect::<Vec<_>>();
    assert_eq!(agents.kept(), 2);
    streams.push(open(&metrics, 4));
    assert!(agents.shed_oldest());
    assert!(streams[0].ending().now_or_never() == Some(Ending::Shed));
    assert!(streams[1].ending().now_or_never().is_none());
    assert!(streams[2].ending().now_or_never().is_none());
    // A kept stream that ends makes room.
    assert_eq!(agents.kept(), 2);
    streams.pop();
    assert_eq!(agents.kept(), 1);
    assert!(!agents.shed_oldest());
}

#[test]
fn draining_tells_every_stream_to_end_once_and_says_so() {
    let metrics = Metrics::default();
    let agents = &metrics.agents;
    let streams: Vec<Connection> = (0..3).map(|node| open(&metrics, node)).collect();
    assert!(agents.set_limit(Some(2)));
    assert!(agents.shed_oldest());
    assert!(!agents.draining());

    assert_eq!(agents.drain(), 2, "the one already shed is not told twice");
    assert!(agents.draining());
    let endings: Vec<Option<Ending>> = (streams.iter())
        .map(|stream| stream.ending().now_or_never())
        .collect();
    assert_eq!(
        endings,
        [
            Some(Ending::Shed),
            Some(Ending::Draining),
            Some(Ending::Draining)
        ]
    );
    assert_eq!(agents.kept(), 0);
    drop(streams);
    assert_eq!(agents.open(), 0);
}
