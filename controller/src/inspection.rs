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
                    .flat_map(|backends| &backends.ports)
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
