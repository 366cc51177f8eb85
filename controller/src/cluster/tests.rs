use super::*;
use crate::{eligibility::Ineligible, manifests::parse_documents, topology::NodeTopology};

const WEB: &str = include_str!("../../tests/fixtures/web.yaml");

fn objects(text: &str) -> Objects {
    Objects::from_manifests(&parse_documents(text).expect("fixture parses"))
}

fn web_key() -> Key {
    ("demo".into(), "web".into())
}

#[test]
fn slices_of_a_service_are_merged_deduplicated_and_not_ready_endpoints_dropped() {
    let state = ClusterState::build(&objects(WEB), &ServiceSelector::default());
    let backends = &state.endpoints[&web_key()];
    assert_eq!(backends.ports().len(), 1);
    let port = &backends.ports()[0];
    assert_eq!(
        (port.port_name.as_str(), port.protocol),
        ("http", pb::Protocol::Tcp as i32)
    );
    let addresses: Vec<_> = port
        .endpoints
        .iter()
        .map(|b| (b.address.as_str(), b.port, b.node_name.as_str()))
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
    let state = ClusterState::build(&objects(WEB), &ServiceSelector::default());
    let service = &state.services[&web_key()];
    assert_eq!(service.ports[0].port, 80);
    assert_eq!(service.ports[0].node_port, 30080);
    assert!(
        state.endpoints[&web_key()].ports()[0]
            .endpoints
            .iter()
            .all(|b| b.port == 8080)
    );
}

#[test]
fn newest_trigger_time_of_the_slices_is_kept() {
    let state = ClusterState::build(&objects(WEB), &ServiceSelector::default());
    let trigger = state.endpoints[&web_key()]
        .cluster
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
    let state = ClusterState::build(&objects(text), &ServiceSelector::default());
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
    let state = ClusterState::build(&objects(text), &ServiceSelector::default());
    let names: Vec<_> = state.services.keys().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["good"]);
    let invalid: Vec<_> = state
        .invalid_services
        .iter()
        .map(|(_, n)| n.as_str())
        .collect();
    assert_eq!(invalid, ["bad-ip", "bad-port", "bad-proto"]);
}

#[test]
fn names_the_api_server_would_refuse_and_ports_sharing_a_name_skip_the_service() {
    let text = r#"
apiVersion: v1
kind: Service
metadata: {name: "evil\"\n-A INPUT -j ACCEPT", namespace: a}
spec: {clusterIP: 10.96.0.5, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: Upper, namespace: a}
spec: {clusterIP: 10.96.0.6, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: spaced-port, namespace: a}
spec: {clusterIP: 10.96.0.7, ports: [{port: 80, name: "my port"}]}
---
apiVersion: v1
kind: Service
metadata: {name: twice, namespace: a}
spec: {clusterIP: 10.96.0.8, ports: [{port: 80, name: http}, {port: 81, name: http}]}
---
apiVersion: v1
kind: Service
metadata: {name: good, namespace: a}
spec: {clusterIP: 10.96.0.9, ports: [{port: 80, name: http}, {port: 81, name: metrics}]}
"#;
    let objects = objects(text);
    let reasons: Vec<_> = objects
        .services
        .values()
        .filter_map(|svc| convert_service(svc).err())
        .collect();
    assert_eq!(
        reasons,
        [
            Invalid::Name("Upper".into()),
            Invalid::Name("evil\"\n-A INPUT -j ACCEPT".into()),
            Invalid::Name("my port".into()),
            Invalid::DuplicatePort("http".into()),
        ]
    );
    let state = ClusterState::build(&objects, &ServiceSelector::default());
    let names: Vec<_> = state.services.keys().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["good"]);
    assert_eq!(state.invalid_services.len(), 4);
}

#[test]
fn endpoints_of_the_other_family_than_their_slice_are_dropped() {
    let text = r"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: a}
spec: {clusterIP: 10.96.0.5, ports: [{port: 80, name: http}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v4, namespace: a, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: ['fd00::1']
- addresses: ['10.244.1.2']
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, namespace: a, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints:
- addresses: ['10.244.1.3']
- addresses: ['fd00::2']
";
    let state = ClusterState::build(&objects(text), &ServiceSelector::default());
    let addresses: Vec<_> = state.endpoints[&("a".to_owned(), "web".to_owned())].ports()[0]
        .endpoints
        .iter()
        .map(|b| b.address.as_str())
        .collect();
    assert_eq!(addresses, ["10.244.1.2", "fd00::2"]);
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
    let state = ClusterState::build(&objects(text), &ServiceSelector::default());
    assert!(state.services.contains_key(&("a".into(), "s".into())));
    assert!(state.endpoints.is_empty());
}

#[test]
fn external_and_load_balancer_fields_are_carried_over() {
    let text = r"
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: a}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.6
  ports: [{port: 80, nodePort: 30080}]
  externalIPs: [192.0.2.10, not-an-ip]
  loadBalancerSourceRanges: [203.0.113.0/24]
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
status:
  loadBalancer:
    ingress:
    - {ip: 198.51.100.1}
    - {ip: 198.51.100.2, ipMode: VIP}
    - {ip: 198.51.100.3, ipMode: Proxy}
";
    let state = ClusterState::build(&objects(text), &ServiceSelector::default());
    let service = &state.services[&("a".into(), "lb".into())];
    assert_eq!(
        service.external_ips,
        ["192.0.2.10"],
        "the invalid IP is dropped, the Service kept"
    );
    assert_eq!(
        service.load_balancer_ips,
        ["198.51.100.1", "198.51.100.2"],
        "ipMode Proxy is not programmed"
    );
    assert_eq!(service.load_balancer_source_ranges, ["203.0.113.0/24"]);
    assert!(service.external_traffic_policy_local && !service.internal_traffic_policy_local);
    assert_eq!(service.health_check_node_port, 32000);
    assert_eq!(
        service.session_affinity,
        Some(pb::SessionAffinity {
            timeout_seconds: 60
        })
    );
}

#[test]
fn client_ip_affinity_without_a_timeout_gets_kubernetes_default() {
    let text = r"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: a}
spec: {clusterIP: 10.96.0.6, ports: [{port: 80}], sessionAffinity: ClientIP, internalTrafficPolicy: Local}
";
    let state = ClusterState::build(&objects(text), &ServiceSelector::default());
    let service = &state.services[&("a".into(), "s".into())];
    assert_eq!(
        service.session_affinity,
        Some(pb::SessionAffinity {
            timeout_seconds: 10_800
        })
    );
    assert!(service.internal_traffic_policy_local);
}

#[test]
fn a_bad_source_range_skips_the_service_instead_of_opening_it() {
    let text = r"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: a}
spec: {type: LoadBalancer, clusterIP: 10.96.0.6, ports: [{port: 80}], loadBalancerSourceRanges: [203.0.113.0/33]}
";
    assert!(
        ClusterState::build(&objects(text), &ServiceSelector::default())
            .services
            .is_empty()
    );
}

#[test]
fn a_named_proxy_claims_only_services_labelled_with_its_name() {
    let text = r"
apiVersion: v1
kind: Service
metadata: {name: mine, namespace: a, labels: {service.kubernetes.io/service-proxy-name: splitproxy}}
spec: {clusterIP: 10.96.0.5, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: other, namespace: a, labels: {service.kubernetes.io/service-proxy-name: foo}}
spec: {clusterIP: 10.96.0.6, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: unlabelled, namespace: a}
spec: {clusterIP: 10.96.0.7, ports: [{port: 80}]}
";
    let selector = ServiceSelector {
        service_proxy_name: Some("splitproxy".into()),
    };
    let state = ClusterState::build(&objects(text), &selector);
    let names: Vec<_> = state.services.keys().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["mine"]);
    assert_eq!(
        selector.label_selector(),
        "service.kubernetes.io/service-proxy-name=splitproxy"
    );
    assert_eq!(
        ServiceSelector::default().label_selector(),
        "!service.kubernetes.io/service-proxy-name"
    );
}

#[test]
fn dual_stack_and_ipv6_only_services_keep_every_cluster_ip_and_both_families_slices() {
    let text = r"
apiVersion: v1
kind: Service
metadata: {name: both, namespace: a}
spec:
  clusterIP: 10.96.0.7
  clusterIPs: [10.96.0.7, 'fd00:10:96::7']
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: both-v4, namespace: a, labels: {kubernetes.io/service-name: both}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.1.9], nodeName: node-1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: both-v6, namespace: a, labels: {kubernetes.io/service-name: both}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ['fd00:10:244:1::9'], nodeName: node-1}]
---
apiVersion: v1
kind: Service
metadata: {name: six, namespace: a}
spec: {clusterIP: 'fd00:10:96::8', ipFamilies: [IPv6], ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: six-1, namespace: a, labels: {kubernetes.io/service-name: six}}
addressType: IPv6
ports: [{port: 80}]
endpoints: [{addresses: ['fd00:10:244:2::9']}]
";
    let state = ClusterState::build(&objects(text), &ServiceSelector::default());
    let both: Key = ("a".into(), "both".into());
    let six: Key = ("a".into(), "six".into());
    assert_eq!(
        state.services[&both].cluster_ips,
        ["10.96.0.7", "fd00:10:96::7"]
    );
    assert_eq!(state.services[&six].cluster_ips, ["fd00:10:96::8"]);
    let addresses = |key: &Key| -> Vec<(String, u32)> {
        let ports = state.endpoints[key].ports();
        assert_eq!(ports.len(), 1, "{ports:?}");
        ports[0]
            .endpoints
            .iter()
            .map(|b| (b.address.clone(), b.port))
            .collect()
    };
    assert_eq!(
        addresses(&both),
        [
            ("10.244.1.9".to_owned(), 8080),
            ("fd00:10:244:1::9".to_owned(), 8080)
        ]
    );
    assert_eq!(addresses(&six), [("fd00:10:244:2::9".to_owned(), 80)]);
}

const ZONED: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  clusterIP: 10.96.0.10
  trafficDistribution: PreferSameNode
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: demo
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.1.2]
  nodeName: node-1
  zone: zone-a
  hints:
    forZones: [{name: zone-a}]
    forNodes: [{name: node-1}]
- addresses: [10.244.2.2]
  nodeName: node-2
---
apiVersion: v1
kind: Node
metadata:
  name: node-1
  labels: {topology.kubernetes.io/zone: zone-a}
---
apiVersion: v1
kind: Node
metadata: {name: node-2}
"#;

#[test]
fn endpoint_hints_and_node_zones_are_carried_into_the_state() {
    let state = ClusterState::build(&objects(ZONED), &ServiceSelector::default());
    let hints: Vec<_> = state.endpoints[&web_key()].ports()[0]
        .endpoints
        .iter()
        .map(|e| (e.address.as_str(), e.for_zones.clone(), e.for_nodes.clone()))
        .collect();
    assert_eq!(
        hints,
        [
            (
                "10.244.1.2",
                vec!["zone-a".to_owned()],
                vec!["node-1".to_owned()]
            ),
            ("10.244.2.2", Vec::new(), Vec::new()),
        ]
    );
    assert_eq!(
        *state.nodes,
        [
            (
                "node-1".to_owned(),
                NodeInfo {
                    topology: NodeTopology {
                        zone: "zone-a".into()
                    },
                    ineligible: None,
                    pod_cidrs: Vec::new(),
                    node_ips: Vec::new(),
                }
            ),
            ("node-2".to_owned(), NodeInfo::default()),
        ]
        .into_iter()
        .collect()
    );
}

const DRAINING: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: node-1}
spec:
  taints:
  - {key: ToBeDeletedByClusterAutoscaler, value: "1700000000", effect: NoSchedule}
---
apiVersion: v1
kind: Node
metadata:
  name: node-2
  deletionTimestamp: "2026-11-22T10:00:00Z"
  finalizers: [example.com/hold]
---
apiVersion: v1
kind: Node
metadata: {name: node-3}
spec:
  taints:
  - {key: node.kubernetes.io/unschedulable, effect: NoSchedule}
  - {key: DeletionCandidateOfClusterAutoscaler, value: "1700000000", effect: PreferNoSchedule}
"#;

#[test]
fn nodes_being_deleted_or_tainted_for_removal_are_carried_as_ineligible() {
    let state = ClusterState::build(&objects(DRAINING), &ServiceSelector::default());
    let ineligible: Vec<(&str, Option<Ineligible>)> = state
        .nodes
        .iter()
        .map(|(name, node)| (name.as_str(), node.ineligible))
        .collect();
    assert_eq!(
        ineligible,
        [
            ("node-1", Some(Ineligible::ToBeDeleted)),
            ("node-2", Some(Ineligible::Deleting)),
            // Cordoned, and only a candidate for removal: still eligible, as upstream.
            ("node-3", None),
        ]
    );
}

#[test]
fn the_service_cidrs_are_the_union_of_every_service_cidr_object() {
    let text = "
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec: {cidrs: [10.96.0.0/16, fd00:10:96::/112]}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: extra}
spec: {cidrs: [10.100.0.0/24, 10.96.0.0/16]}
";
    let state = Builder::default().build(&objects(text), &ServiceSelector::default());
    assert_eq!(
        *state.service_cidrs,
        ["10.100.0.0/24", "10.96.0.0/16", "fd00:10:96::/112"]
    );
    let before = Builder::default().build(&objects(""), &ServiceSelector::default());
    let changes = state.changes_since(&before);
    assert!(changes.service_cidrs && !changes.is_empty());
}

#[test]
fn node_ips_are_the_first_internal_ip_then_one_of_the_other_family() {
    let node = |addresses: &str| -> Vec<String> {
        let text = format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: node-1}}\nstatus: {{addresses: [{addresses}]}}\n"
        );
        let state = Builder::default().build(&objects(&text), &ServiceSelector::default());
        state.nodes["node-1"].node_ips.clone()
    };
    assert_eq!(
        node(
            "{type: Hostname, address: node-1}, {type: ExternalIP, address: 203.0.113.1}, \
             {type: InternalIP, address: 198.18.0.11}, {type: InternalIP, address: 198.18.0.99}, \
             {type: InternalIP, address: 'fd00:198:18::11'}"
        ),
        ["198.18.0.11", "fd00:198:18::11"]
    );
    // ExternalIPs after every InternalIP; IPv6 first when it is the first.
    assert_eq!(
        node("{type: ExternalIP, address: 203.0.113.1}, {type: InternalIP, address: 'fd00::1'}"),
        ["fd00::1", "203.0.113.1"]
    );
    assert_eq!(
        node("{type: InternalIP, address: not-an-ip}"),
        Vec::<String>::new()
    );
}

#[test]
fn builds_whose_nodes_did_not_change_share_the_nodes_and_a_changed_node_is_seen() {
    let node = |name: &str, zone: &str| {
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}, labels: {{topology.kubernetes.io/zone: {zone}}}}}\n"
        )
    };
    let mut snapshot = objects(&format!(
        "{}---\n{}",
        node("node-1", "a"),
        node("node-2", "a")
    ));
    let mut builder = Builder::default();
    let first = builder.build(&snapshot, &ServiceSelector::default());
    // A source hands over the same objects again when something else changed.
    let second = builder.build(&snapshot, &ServiceSelector::default());
    assert!(Arc::ptr_eq(&first.nodes, &second.nodes));
    assert!(second.changes_since(&first).is_empty());

    let moved = objects(&node("node-2", "b"));
    snapshot.nodes.extend(moved.nodes);
    let third = builder.build(&snapshot, &ServiceSelector::default());
    assert_eq!(third.nodes["node-2"].topology.zone, "b");
    let changes = third.changes_since(&second);
    assert_eq!(changes.nodes, BTreeSet::from(["node-2".to_owned()]));
}

/// A random object for the builder's property test: one of 12 Services (some invalid, some
/// another proxy's), 16 slices that may belong to any of them, 4 Nodes in 2 zones, 2 CIDRs.
fn random_manifest(rng: &mut impl rand::Rng) -> String {
    let service = rng.random_range(0..12);
    match rng.random_range(0..4) {
        0 => {
            let port = [80, 81, 0][rng.random_range(0..3)];
            let labels = if rng.random_ratio(1, 6) {
                "{service.kubernetes.io/service-proxy-name: other}"
            } else {
                "{}"
            };
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{service}, namespace: demo, labels: {labels}}}\nspec: {{clusterIP: 10.96.0.{service}, ports: [{{name: http, port: {port}}}]}}\n"
            )
        }
        1 => {
            let (slice, node, ready) = (
                rng.random_range(0..16),
                rng.random_range(0..4),
                rng.random_bool(0.8),
            );
            format!(
                "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: slice-{slice}, namespace: demo, labels: {{kubernetes.io/service-name: svc-{service}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{{addresses: [10.0.{slice}.{node}], conditions: {{ready: {ready}}}, nodeName: node-{node}}}]\n"
            )
        }
        2 => {
            let (node, zone) = (rng.random_range(0..4), rng.random_range(0..2));
            format!(
                "apiVersion: v1\nkind: Node\nmetadata: {{name: node-{node}, labels: {{topology.kubernetes.io/zone: zone-{zone}}}}}\n"
            )
        }
        _ => {
            let (name, block) = (rng.random_range(0..2), rng.random_range(96..99));
            format!(
                "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {{name: cidr-{name}}}\nspec: {{cidrs: [10.{block}.0.0/16]}}\n"
            )
        }
    }
}

/// Removes from `map` the keys `keys` has.
fn without<K: Ord + Clone, V: Clone>(map: &mut OrdMap<K, V>, keys: &OrdMap<K, V>) {
    for key in keys.keys() {
        map.remove(key);
    }
}

#[test]
fn a_state_built_from_the_changes_equals_one_built_from_scratch() {
    use rand::{Rng, SeedableRng};
    let selector = ServiceSelector::default();
    for seed in 1..=30 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut snapshot = Objects::default();
        let mut builder = Builder::default();
        let (mut before, mut before_fresh) = (ClusterState::default(), ClusterState::default());
        for step in 0..60 {
            // Add or replace an object, or remove one of the same kind and key.
            let object = objects(&random_manifest(&mut rng));
            let mut changed = snapshot.clone();
            if rng.random_ratio(1, 4) {
                without(&mut changed.services, &object.services);
                without(&mut changed.slices, &object.slices);
                without(&mut changed.nodes, &object.nodes);
                without(&mut changed.service_cidrs, &object.service_cidrs);
            } else {
                changed.services.extend(object.services);
                changed.slices.extend(object.slices);
                changed.nodes.extend(object.nodes);
                changed.service_cidrs.extend(object.service_cidrs);
            }
            snapshot = changed;
            let context = format!("seed {seed}, step {step}");
            let built = builder.build(&snapshot, &selector);
            let fresh = ClusterState::build(&snapshot, &selector);
            assert_eq!(built.services, fresh.services, "{context}");
            assert_eq!(built.endpoints, fresh.endpoints, "{context}");
            assert_eq!(built.nodes, fresh.nodes, "{context}");
            assert_eq!(built.service_cidrs, fresh.service_cidrs, "{context}");
            assert_eq!(built.invalid_services, fresh.invalid_services, "{context}");
            assert_eq!(
                built.changes_since(&before),
                fresh.changes_since(&before_fresh),
                "{context}"
            );
            (before, before_fresh) = (built, fresh);
        }
    }
}

#[test]
fn a_change_to_one_service_leaves_the_other_maps_and_entries_shared() {
    let mut snapshot = objects(WEB);
    let other = "apiVersion: v1\nkind: Service\nmetadata: {name: other, namespace: demo}\nspec: {clusterIP: 10.96.0.11, ports: [{port: 80}]}\n";
    snapshot.services.extend(objects(other).services);
    let mut builder = Builder::default();
    let first = builder.build(&snapshot, &ServiceSelector::default());
    let changed = other.replace("port: 80", "port: 81");
    snapshot.services.extend(objects(&changed).services);
    let second = builder.build(&snapshot, &ServiceSelector::default());
    assert!(Arc::ptr_eq(&first.endpoints, &second.endpoints));
    assert!(Arc::ptr_eq(&first.nodes, &second.nodes));
    assert!(Arc::ptr_eq(&first.service_cidrs, &second.service_cidrs));
    assert!(Arc::ptr_eq(
        &first.services[&web_key()],
        &second.services[&web_key()]
    ));
    let other_key = ("demo".to_owned(), "other".to_owned());
    assert_eq!(second.services[&other_key].ports[0].port, 81);
    let changes = second.changes_since(&first);
    assert_eq!(changes.services, BTreeSet::from([other_key]));
    assert!(changes.endpoints.is_empty() && changes.nodes.is_empty());
}

#[test]
fn a_node_update_the_views_do_not_use_changes_nothing() {
    let node = |heartbeat: &str| {
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: node-1, labels: {{topology.kubernetes.io/zone: a}}}}\nstatus: {{conditions: [{{type: Ready, status: 'True', lastHeartbeatTime: '{heartbeat}'}}], addresses: [{{type: InternalIP, address: 10.0.0.1}}]}}\n"
        )
    };
    let mut snapshot = objects(&node("2026-11-27T00:00:00Z"));
    let mut builder = Builder::default();
    let first = builder.build(&snapshot, &ServiceSelector::default());
    snapshot
        .nodes
        .extend(objects(&node("2026-11-27T00:00:10Z")).nodes);
    let second = builder.build(&snapshot, &ServiceSelector::default());
    assert!(Arc::ptr_eq(&first.nodes, &second.nodes));
    assert!(second.changes_since(&first).is_empty());

    let moved = node("2026-11-27T00:00:20Z").replace("10.0.0.1", "10.0.0.2");
    snapshot.nodes.extend(objects(&moved).nodes);
    let third = builder.build(&snapshot, &ServiceSelector::default());
    assert_eq!(third.nodes["node-1"].node_ips, ["10.0.0.2"]);
}
