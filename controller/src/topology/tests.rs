//! Nodes `node-a1`, `node-a2` in zone `a`, `node-b1` in zone `b`; endpoints `10.244.<n>.x`.

use super::*;
use crate::{backends::Hints, testing::ready_backend};
use splitproxy_proto::v1alpha1 as pb;

/// A ready endpoint on `node` with the hints the EndpointSlice controller writes for
/// `PreferSameNode` (`node_hint`) and `PreferSameZone` (`zone_hint`).
fn backend(address: &str, node: &str, node_hint: Option<&str>, zone_hint: Option<&str>) -> Backend {
    Backend {
        hints: Hints {
            for_zones: zone_hint.into_iter().map(String::from).collect(),
            for_nodes: node_hint.into_iter().map(String::from).collect(),
        },
        ..ready_backend(address, node)
    }
}

fn zone_hinted(address: &str, node: &str, zone: &str) -> Backend {
    backend(address, node, None, Some(zone))
}

fn node_hinted(address: &str, node: &str, zone: &str) -> Backend {
    backend(address, node, Some(node), Some(zone))
}

fn not_ready(backend: Backend) -> Backend {
    Backend {
        endpoint: pb::Endpoint {
            conditions: Some(pb::EndpointConditions {
                ready: false,
                serving: true,
                terminating: true,
            }),
            ..backend.endpoint
        },
        ..backend
    }
}

fn zone(name: &str) -> NodeTopology {
    NodeTopology { zone: name.into() }
}

/// The addresses `node` (in `zone`) sends cluster-wide traffic to, and the mode.
fn used(endpoints: &[Backend], node: &str, zone: &NodeTopology) -> (Option<Mode>, Vec<String>) {
    let place = Place::new(node, Some(zone));
    let mode = place.mode(endpoints);
    let used = endpoints
        .iter()
        .filter(|b| b.endpoint.conditions.is_some_and(|c| c.ready))
        .filter(|b| !place.excludes(mode, b))
        .map(|b| b.endpoint.address.clone())
        .collect();
    (mode, used)
}

#[test]
fn zone_hints_keep_cluster_traffic_in_the_node_zone() {
    let endpoints = [
        zone_hinted("10.244.1.1", "node-a1", "a"),
        zone_hinted("10.244.3.1", "node-b1", "b"),
    ];
    assert_eq!(
        used(&endpoints, "node-a2", &zone("a")),
        (Some(Mode::PreferSameZone), vec!["10.244.1.1".into()])
    );
    assert_eq!(
        used(&endpoints, "node-b1", &zone("b")),
        (Some(Mode::PreferSameZone), vec!["10.244.3.1".into()])
    );
}

#[test]
fn one_ready_endpoint_without_a_hint_makes_every_node_ignore_the_hints() {
    let endpoints = [
        zone_hinted("10.244.1.1", "node-a1", "a"),
        backend("10.244.2.1", "node-a2", None, None),
        zone_hinted("10.244.3.1", "node-b1", "b"),
    ];
    let everyone = vec![
        "10.244.1.1".to_owned(),
        "10.244.2.1".into(),
        "10.244.3.1".into(),
    ];
    assert_eq!(used(&endpoints, "node-a1", &zone("a")), (None, everyone));
}

#[test]
fn hints_naming_no_endpoint_for_the_node_zone_are_ignored() {
    // Zone b's only endpoint stopped being ready: zone b has no hint left, so it spreads over
    // zone a instead of having nothing.
    let endpoints = [
        zone_hinted("10.244.1.1", "node-a1", "a"),
        zone_hinted("10.244.2.1", "node-a2", "a"),
        not_ready(zone_hinted("10.244.3.1", "node-b1", "b")),
    ];
    assert_eq!(
        used(&endpoints, "node-b1", &zone("b")),
        (None, vec!["10.244.1.1".into(), "10.244.2.1".into()])
    );
    assert_eq!(
        used(&endpoints, "node-a1", &zone("a")).0,
        Some(Mode::PreferSameZone)
    );
}

#[test]
fn a_node_without_a_zone_label_ignores_zone_hints() {
    let endpoints = [
        zone_hinted("10.244.1.1", "node-a1", "a"),
        zone_hinted("10.244.3.1", "node-b1", "b"),
    ];
    assert_eq!(used(&endpoints, "node-x", &zone("")).0, None);
    assert_eq!(Place::new("node-x", None).mode(&endpoints), None);
}

#[test]
fn endpoints_that_are_not_ready_neither_vote_nor_get_excluded() {
    // The EndpointSlice controller gives no hint to endpoints that are not ready.
    let draining = not_ready(backend("10.244.2.1", "node-a2", None, None));
    let endpoints = [
        zone_hinted("10.244.1.1", "node-a1", "a"),
        draining.clone(),
        zone_hinted("10.244.3.1", "node-b1", "b"),
    ];
    let zone_b = zone("b");
    let place = Place::new("node-b1", Some(&zone_b));
    let mode = place.mode(&endpoints);
    assert_eq!(mode, Some(Mode::PreferSameZone));
    assert!(!place.excludes(mode, &draining));
    assert!(place.excludes(mode, &endpoints[0]));
    assert!(!place.excludes(mode, &endpoints[2]));
}

#[test]
fn no_ready_endpoint_selects_no_mode() {
    let endpoints = [not_ready(zone_hinted("10.244.1.1", "node-a1", "a"))];
    assert_eq!(used(&endpoints, "node-a1", &zone("a")).0, None);
}

#[test]
fn same_node_hints_beat_zone_hints_where_the_node_has_an_endpoint() {
    let endpoints = [
        node_hinted("10.244.1.1", "node-a1", "a"),
        node_hinted("10.244.2.1", "node-a2", "a"),
        node_hinted("10.244.3.1", "node-b1", "b"),
    ];
    assert_eq!(
        used(&endpoints, "node-a1", &zone("a")),
        (Some(Mode::PreferSameNode), vec!["10.244.1.1".into()])
    );
    // A node without an endpoint of its own falls back to its zone's.
    assert_eq!(
        used(&endpoints, "node-a3", &zone("a")),
        (
            Some(Mode::PreferSameZone),
            vec!["10.244.1.1".into(), "10.244.2.1".into()]
        )
    );
}

#[test]
fn one_endpoint_without_a_node_hint_falls_back_to_zone_hints() {
    let endpoints = [
        node_hinted("10.244.1.1", "node-a1", "a"),
        zone_hinted("10.244.2.1", "node-a2", "a"),
        node_hinted("10.244.3.1", "node-b1", "b"),
    ];
    assert_eq!(
        used(&endpoints, "node-a1", &zone("a")),
        (
            Some(Mode::PreferSameZone),
            vec!["10.244.1.1".into(), "10.244.2.1".into()]
        )
    );
}
