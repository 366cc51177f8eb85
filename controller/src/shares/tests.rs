use super::*;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};
use kube::api::ObjectMeta;

#[test]
fn a_lone_replica_or_an_empty_cluster_has_no_limit() {
    assert_eq!(limit(5_000, 1), None);
    assert_eq!(limit(5_000, 0), None);
    assert_eq!(limit(0, 3), None);
}

#[test]
fn each_replica_keeps_its_share_plus_a_fifth_and_together_they_keep_every_node() {
    assert_eq!(limit(5_000, 2), Some(3_000));
    assert_eq!(limit(5_000, 3), Some(2_000));
    assert_eq!(limit(4, 2), Some(2));
    for nodes in 1..300 {
        for replicas in 2..12 {
            let Some(each) = limit(nodes, replicas) else {
                panic!("{nodes} nodes, {replicas} replicas: no limit");
            };
            assert!(
                each * replicas >= nodes,
                "{nodes} nodes, {replicas} replicas"
            );
        }
    }
}

fn slice(
    namespace: &str,
    name: &str,
    service: &str,
    family: &str,
    ready: &[Option<bool>],
) -> (Key, Arc<EndpointSlice>) {
    let endpoints = ready
        .iter()
        .enumerate()
        .map(|(i, ready)| Endpoint {
            addresses: vec![format!("10.0.0.{i}")],
            conditions: Some(EndpointConditions {
                ready: *ready,
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    let slice = EndpointSlice {
        metadata: ObjectMeta {
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
            labels: Some([(SERVICE_NAME_LABEL.to_owned(), service.to_owned())].into()),
            ..Default::default()
        },
        address_type: family.to_owned(),
        endpoints: Some(endpoints),
        ports: None,
    };
    ((namespace.to_owned(), name.to_owned()), Arc::new(slice))
}

#[test]
fn replicas_are_the_ready_endpoints_of_the_controllers_service() {
    let service = (
        "splitproxy-system".to_owned(),
        "splitproxy-controller".to_owned(),
    );
    let slices: OrdMap<Key, Arc<EndpointSlice>> = [
        // Unset readiness is ready, as for any Service.
        slice(
            "splitproxy-system",
            "splitproxy-controller-a",
            "splitproxy-controller",
            "IPv4",
            &[Some(true), None, Some(false)],
        ),
        slice(
            "splitproxy-system",
            "splitproxy-controller-b",
            "splitproxy-controller",
            "IPv4",
            &[Some(true)],
        ),
        // Another Service in the namespace, and one of the same name elsewhere.
        slice(
            "splitproxy-system",
            "other-a",
            "other",
            "IPv4",
            &[Some(true)],
        ),
        slice(
            "demo",
            "splitproxy-controller-a",
            "splitproxy-controller",
            "IPv4",
            &[Some(true)],
        ),
        slice(
            "zzz",
            "splitproxy-controller-a",
            "splitproxy-controller",
            "IPv4",
            &[Some(true)],
        ),
    ]
    .into_iter()
    .collect();
    assert_eq!(ready_replicas(&slices, &service), 3);

    // Dual-stack replicas are counted once.
    let mut dual = slices.clone();
    let (key, v6) = slice(
        "splitproxy-system",
        "splitproxy-controller-c",
        "splitproxy-controller",
        "IPv6",
        &[Some(true), Some(true)],
    );
    dual.insert(key, v6);
    assert_eq!(ready_replicas(&dual, &service), 3);

    let absent = ("splitproxy-system".to_owned(), "missing".to_owned());
    assert_eq!(ready_replicas(&slices, &absent), 0);
}
