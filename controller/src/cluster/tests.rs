use super::*;
use crate::manifests::{Object, parse_documents};

const WEB: &str = include_str!("../../tests/fixtures/web.yaml");

fn objects(text: &str) -> Objects {
    let mut objects = Objects::default();
    for object in parse_documents(text).expect("fixture parses") {
        match object {
            Object::Service(s) => {
                let key = (
                    s.metadata.namespace.clone().unwrap_or_default(),
                    s.metadata.name.clone().unwrap_or_default(),
                );
                objects.services.insert(key, *s);
            }
            Object::EndpointSlice(s) => {
                let key = (
                    s.metadata.namespace.clone().unwrap_or_default(),
                    s.metadata.name.clone().unwrap_or_default(),
                );
                objects.slices.insert(key, *s);
            }
            Object::Node(n) => {
                objects
                    .nodes
                    .insert(n.metadata.name.clone().unwrap_or_default(), *n);
            }
        }
    }
    objects
}

fn web_key() -> Key {
    ("demo".into(), "web".into())
}

#[test]
fn slices_of_a_service_are_merged_deduplicated_and_not_ready_endpoints_dropped() {
    let state = ClusterState::build(&objects(WEB));
    let backends = &state.endpoints[&web_key()];
    assert_eq!(backends.ports.len(), 1);
    let port = &backends.ports[0];
    assert_eq!(
        (port.port_name.as_str(), port.protocol),
        ("http", pb::Protocol::Tcp)
    );
    let addresses: Vec<_> = port
        .endpoints
        .iter()
        .map(|b| {
            (
                b.endpoint.address.as_str(),
                b.endpoint.port,
                b.node_name.as_str(),
            )
        })
        .collect();
    assert_eq!(
        addresses,
        [
            ("10.244.1.2", 8080, "node-1"),
            ("10.244.2.3", 8080, "node-2")
        ]
    );
}

#[test]
fn named_target_port_resolves_to_the_slice_port_number() {
    let state = ClusterState::build(&objects(WEB));
    let service = &state.services[&web_key()];
    assert_eq!(service.ports[0].port, 80);
    assert_eq!(service.ports[0].node_port, 30080);
    assert!(
        state.endpoints[&web_key()].ports[0]
            .endpoints
            .iter()
            .all(|b| b.endpoint.port == 8080)
    );
}

#[test]
fn newest_trigger_time_of_the_slices_is_kept() {
    let state = ClusterState::build(&objects(WEB));
    let trigger = state.endpoints[&web_key()]
        .last_change_trigger_time
        .expect("annotated");
    assert_eq!(trigger, "2026-11-22T06:00:05Z".parse().expect("literal"));
}

#[test]
fn headless_external_name_and_other_proxies_services_are_skipped() {
    let text = r"
apiVersion: v1
kind: Service
metadata: {name: headless, namespace: a}
spec: {clusterIP: None, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: a}
spec: {type: ExternalName, externalName: example.invalid}
---
apiVersion: v1
kind: Service
metadata: {name: other, namespace: a, labels: {service.kubernetes.io/service-proxy-name: foo}}
spec: {clusterIP: 10.96.0.5, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: mine, namespace: a}
spec: {clusterIP: 10.96.0.6, ports: [{port: 80}]}
";
    let state = ClusterState::build(&objects(text));
    let names: Vec<_> = state.services.keys().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["mine"]);
}

#[test]
fn an_invalid_service_is_skipped_without_affecting_the_others() {
    let text = r"
apiVersion: v1
kind: Service
metadata: {name: bad-port, namespace: a}
spec: {clusterIP: 10.96.0.5, ports: [{port: 70000}]}
---
apiVersion: v1
kind: Service
metadata: {name: bad-proto, namespace: a}
spec: {clusterIP: 10.96.0.7, ports: [{port: 80, protocol: QUIC}]}
---
apiVersion: v1
kind: Service
metadata: {name: bad-ip, namespace: a}
spec: {clusterIP: 10.96.0.300, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: good, namespace: a}
spec: {clusterIP: 10.96.0.6, ports: [{port: 80}]}
";
    let state = ClusterState::build(&objects(text));
    let names: Vec<_> = state.services.keys().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["good"]);
}

#[test]
fn headless_and_fqdn_slices_are_ignored() {
    let text = r"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: a}
spec: {clusterIP: 10.96.0.6, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: a, labels: {kubernetes.io/service-name: s, service.kubernetes.io/headless: ''}}
addressType: IPv4
ports: [{port: 80}]
endpoints: [{addresses: [10.244.1.9]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-2, namespace: a, labels: {kubernetes.io/service-name: s}}
addressType: FQDN
ports: [{port: 80}]
endpoints: [{addresses: [pod.example.invalid]}]
";
    let state = ClusterState::build(&objects(text));
    assert!(state.services.contains_key(&("a".into(), "s".into())));
    assert!(state.endpoints.is_empty());
}
