//! Builders the unit tests of several modules share.

use k8s_openapi::{
    api::core::v1::{Node, NodeSpec, Taint},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use splitproxy_proto::v1alpha1 as pb;

/// A ready endpoint `address:8080` on `node` (empty: the slice names none), without hints, in
/// cluster form.
pub(crate) fn ready_backend(address: impl Into<String>, node: &str) -> pb::Endpoint {
    pb::Endpoint {
        address: address.into(),
        port: 8080,
        conditions: Some(pb::EndpointConditions {
            ready: true,
            serving: true,
            terminating: false,
        }),
        node_name: node.into(),
        ..pb::Endpoint::default()
    }
}

/// A Node `node-1` with `taints` (key, effect), being deleted when `deleting`.
pub(crate) fn node(taints: &[(&str, &str)], deleting: bool) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some("node-1".into()),
            deletion_timestamp: deleting.then_some(Time(Timestamp::UNIX_EPOCH)),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: Some(
                taints
                    .iter()
                    .map(|(key, effect)| Taint {
                        key: (*key).into(),
                        effect: (*effect).into(),
                        ..Taint::default()
                    })
                    .collect(),
            ),
            ..NodeSpec::default()
        }),
        status: None,
    }
}
