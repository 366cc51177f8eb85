//! The controller's gRPC inspection service: the connected agents and how far behind each node
//! is, and a summary of the published cluster state, for grpcurl.

use crate::{
    agents::{Agents, Record},
    fanout::Published,
};
use splitproxy_proto::v1alpha1::{
    self as pb, controller_inspection_service_server::ControllerInspectionService,
};
use tokio::sync::watch;
use tonic::{Request, Response};

/// Serves [`ControllerInspectionService`] from the open streams and the published state.
#[derive(Debug, Clone)]
pub struct Inspection {
    epoch: String,
    agents: Agents,
    cluster: watch::Receiver<Published>,
}

impl Inspection {
    /// An inspection service for the controller of `epoch`, reading `agents` and `cluster`.
    #[must_use]
    pub fn new(epoch: String, agents: Agents, cluster: watch::Receiver<Published>) -> Self {
        Self {
            epoch,
            agents,
            cluster,
        }
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The wire form of one stream's record, with its lag at `now`.
fn connected_node(record: Record, now: tokio::time::Instant) -> pb::ConnectedNode {
    pb::ConnectedNode {
        lag: prost_types::Duration::try_from(record.lag(now)).ok(),
        node_name: record.node,
        peer: record.peer,
        connected_at: Some(record.connected_at.into()),
        proxy_mode: record.proxy_mode,
        acked_revision: record.acked_revision,
        latest_revision: record.latest_revision,
        revisions_behind: record.latest_revision.saturating_sub(record.acked_revision),
        behind_since: record.behind_since.map(|since| since.wall.into()),
        last_ack_at: record.last_ack_at.map(Into::into),
        last_nack_at: record.last_nack.as_ref().map(|(at, _)| (*at).into()),
        last_nack_reason: record
            .last_nack
            .map(|(_, reason)| reason)
            .unwrap_or_default(),
        messages_sent: record.messages_sent,
        bytes_sent: record.bytes_sent,
    }
}

#[tonic::async_trait]
impl ControllerInspectionService for Inspection {
    async fn list_nodes(
        &self,
        _: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, tonic::Status> {
        let now = tokio::time::Instant::now();
        let nodes = self
            .agents
            .streams()
            .into_iter()
            .map(|record| connected_node(record, now))
            .collect();
        Ok(Response::new(pb::ListNodesResponse { nodes }))
    }

    async fn get_cluster_state(
        &self,
        _: Request<pb::GetClusterStateRequest>,
    ) -> Result<Response<pb::GetClusterStateResponse>, tonic::Status> {
        let published = self.cluster.borrow().clone();
        let mut response = pb::GetClusterStateResponse {
            connected_agents: count(self.agents.by_node().len()),
            controller_epoch: self.epoch.clone(),
            ..Default::default()
        };
        if let Some(state) = published {
            response.synced = true;
            response.service_count = count(state.services.len());
            response.endpoint_count = count(
                state
                    .endpoints
                    .values()
                    .flat_map(|backends| backends.ports())
                    .map(|port| port.endpoints.len())
                    .sum(),
            );
            response.node_count = count(state.nodes.len());
            response.invalid_services = state
                .invalid_services
                .iter()
                .map(|(namespace, name)| pb::ObjectKey {
                    namespace: namespace.clone(),
                    name: name.clone(),
                })
                .collect();
        }
        Ok(Response::new(response))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{agents::Connection, cluster::ClusterState, metrics::Metrics};
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn cluster_state_is_reported_once_read_with_its_invalid_services() {
        let metrics = Metrics::default();
        let (tx, rx) = watch::channel(None);
        let inspection = Inspection::new("e1".into(), metrics.agents.clone(), rx);
        let ask = || async {
            inspection
                .get_cluster_state(Request::new(pb::GetClusterStateRequest {}))
                .await
                .expect("answers")
                .into_inner()
        };
        assert!(!ask().await.synced);

        let mut state = ClusterState::default();
        state
            .invalid_services
            .insert(("demo".into(), "broken".into()));
        Arc::make_mut(&mut state.nodes).insert("node-1".into(), Default::default());
        tx.send_replace(Some(Arc::new(state)));
        let _stream = Connection::open(&metrics.agents, &metrics.streams, "node-1", "peer", 1, 0);

        let answer = ask().await;
        assert!(answer.synced);
        assert_eq!((answer.node_count, answer.connected_agents), (1, 1));
        assert_eq!(answer.controller_epoch, "e1");
        assert_eq!(answer.invalid_services[0].name, "broken");
    }

    #[tokio::test(start_paused = true)]
    async fn listed_nodes_show_revisions_lag_and_the_last_rejection() {
        let metrics = Metrics::default();
        let (_tx, rx) = watch::channel(None);
        let inspection = Inspection::new("e1".into(), metrics.agents.clone(), rx);
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
        stream.rejected("dataplane sync failed");
        tokio::time::advance(std::time::Duration::from_secs(7)).await;

        let nodes = inspection
            .list_nodes(Request::new(pb::ListNodesRequest {}))
            .await
            .expect("answers")
            .into_inner()
            .nodes;

        assert_eq!(nodes.len(), 1);
        let node = &nodes[0];
        assert_eq!(
            (
                node.acked_revision,
                node.latest_revision,
                node.revisions_behind
            ),
            (0, 1, 1)
        );
        assert_eq!(node.lag.map(|lag| lag.seconds), Some(7));
        assert!(node.behind_since.is_some() && node.last_nack_at.is_some());
        assert_eq!(node.last_nack_reason, "dataplane sync failed");
        assert_eq!(node.messages_sent, 1);
    }
}
