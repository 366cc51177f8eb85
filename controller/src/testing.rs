//! Builders the unit tests of several modules share.

use crate::cluster::{Backend, Hints};
use splitproxy_proto::v1alpha1 as pb;

/// A ready endpoint `address:8080` on `node` (empty: the slice names none), without hints.
pub(crate) fn ready_backend(address: impl Into<String>, node: &str) -> Backend {
    Backend {
        endpoint: pb::Endpoint {
            address: address.into(),
            port: 8080,
            conditions: Some(pb::EndpointConditions {
                ready: true,
                serving: true,
                terminating: false,
            }),
            is_local: false,
            topology_excluded: false,
        },
        node_name: node.into(),
        hints: Hints::default(),
    }
}
