//! Node eligibility: whether load balancers should keep sending a node new connections, which the
//! node's agent reports as `nodeEligible` on `/healthz`.
//!
//! kube-proxy's rule (KEP-3836): a node is eligible while its Node object is known, has no
//! `deletionTimestamp`, and carries no taint with the key `ToBeDeletedByClusterAutoscaler` (any
//! value, any effect). The cluster autoscaler sets that taint before it drains and removes a
//! node, so load balancers that probe `/healthz` stop choosing the node before its rules go.

use crate::cluster::NodeInfo;
use k8s_openapi::api::core::v1::Node;
use splitproxy_proto::v1alpha1 as pb;

/// The taint key the cluster autoscaler puts on a node it is about to remove.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Why a node is not eligible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Ineligible {
    /// The controller knows no Node object of the node's name: never created, or deleted.
    #[error("no Node object of this name is known")]
    UnknownNode,
    /// The Node has a `deletionTimestamp`: it is being deleted, held only by finalizers.
    #[error("the Node is being deleted")]
    Deleting,
    /// The Node carries the `ToBeDeletedByClusterAutoscaler` taint.
    #[error("the Node is tainted {TO_BE_DELETED_TAINT}")]
    ToBeDeleted,
}

impl Ineligible {
    /// Why `node` is not eligible; `None` when it is.
    #[must_use]
    pub fn of(node: &Node) -> Option<Self> {
        if node.metadata.deletion_timestamp.is_some() {
            return Some(Self::Deleting);
        }
        let tainted = node
            .spec
            .as_ref()
            .and_then(|spec| spec.taints.as_ref())
            .into_iter()
            .flatten()
            .any(|taint| taint.key == TO_BE_DELETED_TAINT);
        tainted.then_some(Self::ToBeDeleted)
    }
}

/// The status sent to the agent of a node the cluster knows as `known` (`None`: not at all): its
/// eligibility and, passed along, its pod CIDRs and IPs and the cluster's `service_cidrs`.
#[must_use]
pub fn status(known: Option<&NodeInfo>, service_cidrs: &[String]) -> pb::NodeStatus {
    let ineligible = match known {
        None => Some(Ineligible::UnknownNode),
        Some(node) => node.ineligible,
    };
    pb::NodeStatus {
        eligible: ineligible.is_none(),
        reason: ineligible.map(|i| i.to_string()).unwrap_or_default(),
        pod_cidrs: known.map(|node| node.pod_cidrs.clone()).unwrap_or_default(),
        service_cidrs: service_cidrs.to_vec(),
        node_ips: known.map(|node| node.node_ips.clone()).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests;
