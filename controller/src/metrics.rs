//! The controller's Prometheus metrics (`splitproxy_controller_*`) and the HTTP server that
//! exposes them on `/metrics`.
//!
//! **Cardinality.** Counters are cluster-wide, without a `node` label: at 5,000 nodes a per-node
//! counter would be 5,000 series that outlive the streams. Per-node detail (bytes and messages
//! sent per stream) is in `ControllerInspectionService.ListNodes`. Only the per-node gauges a user
//! needs to find a lagging node carry `node` (acknowledged and latest revision, lag): they are
//! computed at scrape time from the open streams, so a node's series vanish when its agent
//! disconnects; at 5,000 nodes that is 15,000 series, which a `metric_relabel_configs` drop rule
//! can cut to the cluster-wide `max`/`sum` if it is too many.

use crate::agents::{Agents, StreamCounters};
use axum::{Router, extract::State, response::Response, routing::get};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use std::{net::SocketAddr, sync::Arc, sync::atomic::AtomicU64};

/// Every metric the controller exports.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// `splitproxy_controller_invalid_services`: Services left out of the last cluster state
    /// because they cannot be programmed (each is logged with its key).
    pub invalid_services: Gauge,
    /// What the streams count: views computed, messages and bytes sent, revisions rejected.
    pub streams: StreamCounters,
    /// `splitproxy_controller_refused_streams_total{reason}`: agent streams refused because
    /// their credential was missing, invalid, for another node, or could not be reviewed, or
    /// because the controller had not read the cluster yet (`not_ready`).
    pub refused_streams: Family<ReasonLabel, Counter>,
    /// `splitproxy_controller_subscriptions_total{resume}`: agent streams opened, by what the
    /// agent resumed from: a state this controller acknowledged (`acknowledged`), its sums per
    /// bucket (`summary`) or every digest (`digests`) of a state held from another replica, or
    /// nothing (`none`: it is sent a reset). After a replica fails, the agents that move to
    /// another arrive as `summary`.
    pub subscriptions: Family<ResumeLabel, Counter>,
    /// `splitproxy_controller_node_share`: the most agent streams this replica keeps, its share
    /// of the nodes plus a margin; 0 while it keeps any number (a lone replica, or no
    /// `--controller-service`).
    pub node_share: Gauge,
    /// `splitproxy_controller_shed_streams_total`: agent streams ended because this replica held
    /// more than its share of the nodes; their agents moved to another replica.
    pub shed_streams: Counter,
    /// The open streams, for `splitproxy_controller_connected_agents` and the per-node gauges.
    pub agents: Agents,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    #[must_use]
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "splitproxy_controller_invalid_services",
            "Services left out of the cluster state because they cannot be programmed",
            metrics.invalid_services.clone(),
        );
        registry.register(
            "splitproxy_controller_view_computations",
            "Node views computed from the published cluster state",
            metrics.streams.view_computations.clone(),
        );
        registry.register(
            "splitproxy_controller_update_messages_sent",
            "Node view messages (SyncResponse) sent to agents",
            metrics.streams.messages_sent.clone(),
        );
        registry.register(
            "splitproxy_controller_update_bytes_sent",
            "Encoded protobuf bytes of the node view messages sent to agents",
            metrics.streams.bytes_sent.clone(),
        );
        registry.register(
            "splitproxy_controller_rejected_revisions",
            "Revisions agents rejected (NACKed), keeping their last good state",
            metrics.streams.rejected_revisions.clone(),
        );
        registry.register(
            "splitproxy_controller_refused_streams",
            "Agent streams refused: credential missing, invalid, for another node, or unreviewable; or the cluster not read yet",
            metrics.refused_streams.clone(),
        );
        registry.register(
            "splitproxy_controller_subscriptions",
            "Agent streams opened, by what the agent resumed from: acknowledged, summary, digests or none",
            metrics.subscriptions.clone(),
        );
        registry.register(
            "splitproxy_controller_node_share",
            "The most agent streams this replica keeps (its share of the nodes plus a margin); 0 without a limit",
            metrics.node_share.clone(),
        );
        registry.register(
            "splitproxy_controller_shed_streams",
            "Agent streams ended because this replica held more than its share of the nodes",
            metrics.shed_streams.clone(),
        );
        registry.register(
            "splitproxy_controller_superseded_streams",
            "Agent streams ended because a newer stream of the same node opened",
            metrics.streams.superseded_streams.clone(),
        );
        registry.register(
            "splitproxy_controller_fallen_behind_streams",
            "Agent streams ended because their agent left a revision unanswered past the fall-behind limit",
            metrics.streams.fallen_behind_streams.clone(),
        );
        registry.register_collector(Box::new(AgentGauges(metrics.agents.clone())));
        metrics
    }
}

impl Metrics {
    /// Counts one opened agent stream, by what the agent resumed from.
    pub fn count_subscription(&self, resume: &'static str) {
        self.subscriptions
            .get_or_create(&ResumeLabel { resume })
            .inc();
    }

    /// Counts one refused agent stream.
    pub fn count_refusal(&self, reason: &'static str) {
        self.refused_streams
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }
}

/// A `resume` label, from a fixed set.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResumeLabel {
    /// What the agent resumed from.
    pub resume: &'static str,
}

/// A `reason` label, from a fixed set.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    reason: &'static str,
}

/// A `node` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabel {
    node: String,
}

/// The gauges read from the open streams at each scrape.
#[derive(Debug)]
struct AgentGauges(Agents);

impl Collector for AgentGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let by_node = self.0.by_node();
        let now = tokio::time::Instant::now();
        let connected: Gauge = Gauge::default();
        connected.set(i64::try_from(by_node.len()).unwrap_or(i64::MAX));
        let open: Gauge = Gauge::default();
        open.set(i64::try_from(self.0.open()).unwrap_or(i64::MAX));
        let acked: Family<NodeLabel, Gauge> = Family::default();
        let latest: Family<NodeLabel, Gauge> = Family::default();
        let lag: Family<NodeLabel, Gauge<f64, AtomicU64>> = Family::default();
        for (node, record) in &by_node {
            let label = NodeLabel { node: node.clone() };
            let as_gauge = |revision: u64| i64::try_from(revision).unwrap_or(i64::MAX);
            acked
                .get_or_create(&label)
                .set(as_gauge(record.acked_revision));
            latest
                .get_or_create(&label)
                .set(as_gauge(record.latest_revision));
            lag.get_or_create(&label).set(record.lag(now).as_secs_f64());
        }
        connected.encode(encoder.encode_descriptor(
            "splitproxy_controller_connected_agents",
            "Nodes with an open node view stream",
            None,
            connected.metric_type(),
        )?)?;
        open.encode(encoder.encode_descriptor(
            "splitproxy_controller_open_streams",
            "Open node view streams, those told to end and not ended yet included",
            None,
            open.metric_type(),
        )?)?;
        acked.encode(encoder.encode_descriptor(
            "splitproxy_controller_node_acked_revision",
            "The last revision each connected node applied (ACKed)",
            None,
            acked.metric_type(),
        )?)?;
        latest.encode(encoder.encode_descriptor(
            "splitproxy_controller_node_latest_revision",
            "The newest revision sent to each connected node, in flight or acknowledged",
            None,
            latest.metric_type(),
        )?)?;
        lag.encode(encoder.encode_descriptor(
            "splitproxy_controller_node_lag_seconds",
            "Seconds since each connected node first lacked a published change; 0 when up to date",
            None,
            lag.metric_type(),
        )?)?;
        Ok(())
    }
}

/// Serves `/metrics` from `registry` on `listen` until the server fails.
///
/// # Errors
///
/// If `listen` cannot be bound or the server fails.
pub async fn serve(listen: SocketAddr, registry: Arc<Registry>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(address = %listen, "serving metrics");
    let router = Router::new()
        .route("/metrics", get(encode))
        .with_state(registry);
    axum::serve(listener, router).await
}

async fn encode(State(registry): State<Arc<Registry>>) -> Response {
    splitproxy_telemetry::metrics_response(&registry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::Connection;

    fn scrape(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).expect("encodes");
        text
    }

    fn assert_scraped(registry: &Registry, samples: &[&str]) {
        let text = scrape(registry);
        for sample in samples {
            assert!(text.lines().any(|l| l == *sample), "no {sample} in\n{text}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn per_node_gauges_follow_the_open_streams() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let mut stream = Connection::open(
            &metrics.agents,
            &metrics.streams,
            "node-1",
            "198.18.0.11:4000",
            1,
            0,
        );
        stream.view_computed(true);
        stream.sent(1, &[crate::wire::SyncResponse::default()]);
        tokio::time::advance(std::time::Duration::from_secs(3)).await;

        assert_scraped(
            &registry,
            &[
                "splitproxy_controller_connected_agents 1",
                r#"splitproxy_controller_node_latest_revision{node="node-1"} 1"#,
                r#"splitproxy_controller_node_acked_revision{node="node-1"} 0"#,
                r#"splitproxy_controller_node_lag_seconds{node="node-1"} 3.0"#,
                "splitproxy_controller_update_messages_sent_total 1",
            ],
        );

        stream.acked(1, true);
        assert_scraped(
            &registry,
            &[
                r#"splitproxy_controller_node_acked_revision{node="node-1"} 1"#,
                r#"splitproxy_controller_node_lag_seconds{node="node-1"} 0.0"#,
            ],
        );

        drop(stream);
        let text = scrape(&registry);
        assert!(
            text.contains("splitproxy_controller_connected_agents 0\n"),
            "{text}"
        );
        assert!(!text.contains("node=\"node-1\""), "{text}");
    }
}
