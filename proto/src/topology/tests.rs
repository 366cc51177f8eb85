//! Nodes `node-a1`, `node-a2` in zone `a`, `node-b1` in zone `b`; endpoints `10.244.<n>.x`.

use super::*;
use crate::v1alpha1::{EndpointConditions, ObjectKey};

/// A ready endpoint on `node`, in cluster form, with the hints the EndpointSlice controller
/// writes for `PreferSameNode` (`node_hint`) and `PreferSameZone` (`zone_hint`).
fn backend(
    address: &str,
    node: &str,
    node_hint: Option<&str>,
    zone_hint: Option<&str>,
) -> Endpoint {
    Endpoint {
        address: address.into(),
        port: 8080,
        conditions: Some(EndpointConditions {
            ready: true,
            serving: true,
            terminating: false,
        }),
        node_name: node.into(),
        for_zones: zone_hint.into_iter().map(String::from).collect(),
        for_nodes: node_hint.into_iter().map(String::from).collect(),
        ..Endpoint::default()
    }
}

fn zone_hinted(address: &str, node: &str, zone: &str) -> Endpoint {
    backend(address, node, None, Some(zone))
}

fn node_hinted(address: &str, node: &str, zone: &str) -> Endpoint {
    backend(address, node, Some(node), Some(zone))
}

fn not_ready(endpoint: Endpoint) -> Endpoint {
    Endpoint {
        conditions: Some(EndpointConditions {
            ready: false,
            serving: true,
            terminating: true,
        }),
        ..endpoint
    }
}

fn zone(name: &str) -> &str {
    name
}

/// One Service port's `endpoints` in cluster form, as a set.
fn set_of(endpoints: &[Endpoint]) -> ServiceEndpoints {
    ServiceEndpoints {
        key: Some(ObjectKey {
            namespace: "default".into(),
            name: "web".into(),
        }),
        ports: vec![PortEndpoints {
            port_name: "http".into(),
            protocol: 1,
            endpoints: endpoints.to_vec(),
        }],
        cluster_form: true,
        ..ServiceEndpoints::default()
    }
}

/// The addresses `node` (in `zone`) sends cluster-wide traffic to, and the mode.
fn used(endpoints: &[Endpoint], node: &str, zone: &str) -> (Option<Mode>, Vec<String>) {
    let place = Place { node, zone };
    let mode = place.mode(endpoints);
    let mut set = set_of(endpoints);
    place.localize(&mut set);
    let used = (set.ports[0].endpoints.iter())
        .filter(|e| e.conditions.is_some_and(|c| c.ready) && !e.topology_excluded)
        .map(|e| e.address.clone())
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
        used(&endpoints, "node-a2", zone("a")),
        (Some(Mode::PreferSameZone), vec!["10.244.1.1".into()])
    );
    assert_eq!(
        used(&endpoints, "node-b1", zone("b")),
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
    assert_eq!(used(&endpoints, "node-a1", zone("a")), (None, everyone));
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
        used(&endpoints, "node-b1", zone("b")),
        (None, vec!["10.244.1.1".into(), "10.244.2.1".into()])
    );
    assert_eq!(
        used(&endpoints, "node-a1", zone("a")).0,
        Some(Mode::PreferSameZone)
    );
}

#[test]
fn a_node_without_a_zone_label_ignores_zone_hints() {
    let endpoints = [
        zone_hinted("10.244.1.1", "node-a1", "a"),
        zone_hinted("10.244.3.1", "node-b1", "b"),
    ];
    assert_eq!(used(&endpoints, "node-x", zone("")).0, None);
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
    let place = Place {
        node: "node-b1",
        zone: "b",
    };
    assert_eq!(place.mode(&endpoints), Some(Mode::PreferSameZone));
    let mut set = set_of(&endpoints);
    place.localize(&mut set);
    let excluded: Vec<bool> = (set.ports[0].endpoints.iter())
        .map(|e| e.topology_excluded)
        .collect();
    assert_eq!(excluded, [true, false, false]);
}

#[test]
fn no_ready_endpoint_selects_no_mode() {
    let endpoints = [not_ready(zone_hinted("10.244.1.1", "node-a1", "a"))];
    assert_eq!(used(&endpoints, "node-a1", zone("a")).0, None);
}

#[test]
fn same_node_hints_beat_zone_hints_where_the_node_has_an_endpoint() {
    let endpoints = [
        node_hinted("10.244.1.1", "node-a1", "a"),
        node_hinted("10.244.2.1", "node-a2", "a"),
        node_hinted("10.244.3.1", "node-b1", "b"),
    ];
    assert_eq!(
        used(&endpoints, "node-a1", zone("a")),
        (Some(Mode::PreferSameNode), vec!["10.244.1.1".into()])
    );
    // A node without an endpoint of its own falls back to its zone's.
    assert_eq!(
        used(&endpoints, "node-a3", zone("a")),
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
        used(&endpoints, "node-a1", zone("a")),
        (
            Some(Mode::PreferSameZone),
            vec!["10.244.1.1".into(), "10.244.2.1".into()]
        )
    );
}

#[test]
fn an_endpoint_is_local_to_the_node_it_runs_on_only() {
    let endpoints = [
        backend("10.244.1.1", "node-a1", None, None),
        backend("10.244.9.1", "", None, None),
    ];
    let mut set = set_of(&endpoints);
    Place {
        node: "node-a1",
        zone: "a",
    }
    .localize(&mut set);
    let local: Vec<bool> = set.ports[0].endpoints.iter().map(|e| e.is_local).collect();
    assert_eq!(local, [true, false]);
    // A place standing for a whole zone runs nothing, not even endpoints naming no node.
    let mut set = set_of(&endpoints);
    Place::anywhere_in("a").localize(&mut set);
    assert!(set.ports[0].endpoints.iter().all(|e| !e.is_local));
}

#[test]
fn the_filtered_form_carries_locality_and_no_nodes_or_hints() {
    let endpoints = [
        zone_hinted("10.244.1.1", "node-a1", "a"),
        zone_hinted("10.244.3.1", "node-b1", "b"),
    ];
    let filtered = Place {
        node: "node-a1",
        zone: "a",
    }
    .filtered(&set_of(&endpoints));
    assert!(!filtered.cluster_form);
    let seen: Vec<(bool, bool)> = (filtered.ports[0].endpoints.iter())
        .map(|e| (e.is_local, e.topology_excluded))
        .collect();
    assert_eq!(seen, [(true, false), (false, true)]);
    assert!(
        filtered.ports[0].endpoints.iter().all(|e| {
            e.node_name.is_empty() && e.for_zones.is_empty() && e.for_nodes.is_empty()
        })
    );
}

#[test]
fn a_node_is_singled_out_by_an_endpoint_on_it_or_a_node_hint_naming_it() {
    let set = set_of(&[
        backend("10.244.1.1", "node-a1", None, None),
        backend("10.244.2.1", "node-a2", Some("node-b1"), None),
    ]);
    let singled_out = |node| Place { node, zone: "a" }.is_singled_out(&set.ports);
    assert!(singled_out("node-a1"));
    assert!(singled_out("node-b1"));
    assert!(!singled_out("node-c1"));
    assert!(!Place::anywhere_in("a").is_singled_out(&set.ports));
}
