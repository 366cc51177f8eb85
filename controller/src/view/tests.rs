use super::*;
use crate::cluster::{Backend, PortBackends, ServiceBackends};

fn cluster(endpoints: &[(&str, &str)]) -> ClusterState {
    let key: Key = ("demo".into(), "web".into());
    let mut state = ClusterState::default();
    state.services.insert(
        key.clone(),
        pb::Service {
            key: Some(object_key(&key)),
            cluster_ips: vec!["10.96.0.10".into()],
            ports: vec![pb::ServicePort {
                name: "http".into(),
                protocol: pb::Protocol::Tcp as i32,
                port: 80,
                node_port: 0,
            }],
            ..Default::default()
        },
    );
    if !endpoints.is_empty() {
        let backends = endpoints
            .iter()
            .map(|(address, node)| Backend {
                endpoint: pb::Endpoint {
                    address: (*address).into(),
                    port: 8080,
                    conditions: Some(pb::EndpointConditions {
                        ready: true,
                        serving: true,
                        terminating: false,
                    }),
                    is_local: false,
                },
                node_name: (*node).into(),
            })
            .collect();
        state.endpoints.insert(
            key,
            ServiceBackends {
                ports: vec![PortBackends {
                    port_name: "http".into(),
                    protocol: pb::Protocol::Tcp,
                    endpoints: backends,
                }],
                last_change_trigger_time: None,
            },
        );
    }
    state
}

fn local_flags(view: &NodeView) -> Vec<(String, bool)> {
    view.endpoints
        .values()
        .flat_map(|e| &e.ports)
        .flat_map(|p| &p.endpoints)
        .map(|e| (e.address.clone(), e.is_local))
        .collect()
}

#[test]
fn endpoints_on_the_viewing_node_are_marked_local() {
    let state = cluster(&[
        ("10.244.1.2", "node-1"),
        ("10.244.2.2", "node-2"),
        ("10.244.3.2", ""),
    ]);
    let view = NodeView::for_node(&state, "node-1");
    assert_eq!(
        local_flags(&view),
        [
            ("10.244.1.2".into(), true),
            ("10.244.2.2".into(), false),
            ("10.244.3.2".into(), false)
        ]
    );
}

#[test]
fn identical_views_give_an_empty_delta() {
    let view = NodeView::for_node(&cluster(&[("10.244.1.2", "node-1")]), "node-1");
    assert!(Delta::between(&view, &view).is_empty());
}

#[test]
fn changed_endpoints_are_upserted_without_resending_the_service() {
    let before = NodeView::for_node(&cluster(&[("10.244.1.2", "node-1")]), "node-1");
    let after = NodeView::for_node(&cluster(&[("10.244.2.2", "node-2")]), "node-1");
    let delta = Delta::between(&before, &after);
    assert!(delta.upserted_services.is_empty());
    assert_eq!(delta.upserted_endpoints.len(), 1);
    assert!(delta.removed_endpoints.is_empty() && delta.removed_services.is_empty());
}

#[test]
fn losing_every_endpoint_removes_the_endpoint_set_but_keeps_the_service() {
    let before = NodeView::for_node(&cluster(&[("10.244.1.2", "node-1")]), "node-1");
    let after = NodeView::for_node(&cluster(&[]), "node-1");
    let delta = Delta::between(&before, &after);
    assert_eq!(
        delta.removed_endpoints,
        [pb::ObjectKey {
            namespace: "demo".into(),
            name: "web".into()
        }]
    );
    assert!(delta.removed_services.is_empty());
}

#[test]
fn a_removed_service_does_not_list_its_endpoints_again() {
    let before = NodeView::for_node(&cluster(&[("10.244.1.2", "node-1")]), "node-1");
    let delta = Delta::between(&before, &NodeView::default());
    assert_eq!(delta.removed_services.len(), 1);
    assert!(delta.removed_endpoints.is_empty());
}
