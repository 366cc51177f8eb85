//! Node eligibility: whether load balancers should keep sending a node new connections, which the
//! node's agent reports as `nodeEligible` on `/healthz`.
//!
//! kube-proxy's rule (KEP-3836): a node is eligible while its Node object is known, has no
//! `deletionTimestamp`, and carries no taint with the key `ToBeDeletedByClusterAutoscaler` (any
//! value, any effect). The cluster autoscaler sets that taint before it drains and removes a
//! node, so load balancers that probe `/healthz` stop choosing the node before its rules go.

use k8s_openapi::api::core::v1::Node;

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

#[cfg(test)]
mod tests;
