//! The gRPC inspection service: the node's applied state and last sync, for grpcurl.

use crate::status::Status;
use splitproxy_proto::v1alpha1::{
    self as pb, node_inspection_service_server::NodeInspectionService,
};
use tonic::{Request, Response};

/// Serves [`NodeInspectionService`] from the agent's status.
#[derive(Debug, Clone)]
pub struct Inspection {
    node_name: String,
    proxy_mode: pb::ProxyMode,
    status: Status,
}

impl Inspection {
    /// An inspection service for `node_name` reading `status`.
    #[must_use]
    pub fn new(node_name: String, proxy_mode: pb::ProxyMode, status: Status) -> Self {
        Self {
            node_name,
            proxy_mode,
            status,
        }
    }
}

#[tonic::async_trait]
impl NodeInspectionService for Inspection {
    async fn get_node_state(
        &self,
        _: Request<pb::GetNodeStateRequest>,
    ) -> Result<Response<pb::GetNodeStateResponse>, tonic::Status> {
        let s = self.status.snapshot();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Ok(Response::new(pb::GetNodeStateResponse {
            node_name: self.node_name.clone(),
            proxy_mode: self.proxy_mode as i32,
            connected: s.connected,
            controller: s.controller.clone(),
            applied: s.state.epoch.as_ref().map(|epoch| pb::ResumePoint {
                controller_epoch: epoch.clone(),
                revision: s.state.revision,
            }),
            applied_at: s.applied_at.map(Into::into),
            last_sync: s.last_sync.as_ref().map(|sync| pb::SyncResult {
                finished_at: Some(sync.finished_at.into()),
                duration: prost_types::Duration::try_from(sync.duration).ok(),
                error: sync.error.clone().unwrap_or_default(),
                rules_written: sync
                    .rules_written
                    .iter()
                    .map(|(table, rules)| pb::RuleCount {
                        table: table.clone(),
                        rules: *rules,
                    })
                    .collect(),
            }),
            service_count: count(s.state.services.len()),
            endpoint_count: count(s.state.endpoint_count()),
        }))
    }

    async fn list_services(
        &self,
        _: Request<pb::ListServicesRequest>,
    ) -> Result<Response<pb::ListServicesResponse>, tonic::Status> {
        let s = self.status.snapshot();
        let services = s
            .state
            .services
            .iter()
            .map(|(key, service)| pb::ServiceState {
                service: Some((**service).clone()),
                endpoints: s.state.endpoints.get(key).map(|e| (**e).clone()),
            })
            .collect();
        Ok(Response::new(pb::ListServicesResponse { services }))
    }
}
