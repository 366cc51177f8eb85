//! Test addresses: cluster IPs 10.96.0.0/16, pods 10.244.0.0/16 (10.244.1.0/24 on this node,
//! node-1; 10.244.2.0/24 on node-2).

use super::*;
use std::net::Ipv4Addr;

const TCP: pb::Protocol = pb::Protocol::Tcp;
const UDP: pb::Protocol = pb::Protocol::Udp;

fn object_key(name: &str) -> pb::ObjectKey {
    pb::ObjectKey {
        namespace: "demo".into(),
        name: name.into(),
    }
}

fn key(name: &str) -> Key {
    ("demo".to_owned(), name.to_owned())
}

fn port(name: &str, protocol: pb::Protocol, port: u32, node_port: u32) -> pb::ServicePort {
    pb::ServicePort {
        name: name.into(),
        protocol: protocol as i32,
        port,
        node_port,
    }
}

/// A Service `demo/<name>` on `cluster_ip` with the given ports.
fn service(name: &str, cluster_ip: &str, ports: Vec<pb::ServicePort>) -> pb::Service {
    pb::Service {
        key: Some(object_key(name)),
        cluster_ips: vec![cluster_ip.into()],
        ports,
        ..Default::default()
    }
}

/// A ready endpoint `address:port`.
fn endpoint(address: &str, port: u32, is_local: bool) -> pb::Endpoint {
    pb::Endpoint {
        address: address.into(),
        port,
        conditions: Some(pb::EndpointConditions {
            ready: true,
            serving: true,
            terminating: false,
        }),
        is_local,
        ..pb::Endpoint::default()
    }
}

fn port_endpoints(
    port_name: &str,
    protocol: pb::Protocol,
    endpoints: Vec<pb::Endpoint>,
) -> pb::PortEndpoints {
    pb::PortEndpoints {
        port_name: port_name.into(),
        protocol: protocol as i32,
        endpoints,
    }
}

fn endpoints(name: &str, ports: Vec<pb::PortEndpoints>) -> pb::ServiceEndpoints {
    pb::ServiceEndpoints {
        key: Some(object_key(name)),
        ports,
        ..pb::ServiceEndpoints::default()
    }
}

/// A Service `demo/<name>` with one unnamed TCP port 80, and its endpoint set with one endpoint
/// `10.244.1.<host>:8080`.
fn web(name: &str, host: u8) -> (pb::Service, pb::ServiceEndpoints) {
    (
        service(name, "10.96.0.10", vec![port("", TCP, 80, 0)]),
        endpoints(
            name,
            vec![port_endpoints(
                "",
                TCP,
                vec![endpoint(&format!("10.244.1.{host}"), 8080, true)],
            )],
        ),
    )
}

/// One complete part carrying the given changes.
#[derive(Default)]
struct Part {
    upserted_services: Vec<pb::Service>,
    removed_services: Vec<&'static str>,
    upserted_endpoints: Vec<pb::ServiceEndpoints>,
    removed_endpoints: Vec<&'static str>,
    appended_endpoints: Vec<pb::ServiceEndpoints>,
    node_status: Option<pb::NodeStatus>,
    replaced_buckets: Option<pb::ReplacedBuckets>,
}

fn revision(epoch: &str, number: u64, reset: bool, parts: Vec<Part>) -> Revision {
    let count = parts.len();
    Revision {
        epoch: epoch.into(),
        number,
        reset,
        on_presented_state: false,
        parts: parts
            .into_iter()
            .enumerate()
            .map(|(i, part)| pb::SyncResponse {
                controller_epoch: epoch.into(),
                revision: number,
                reset,
                complete: i + 1 == count,
                upserted_services: part.upserted_services,
                removed_services: part.removed_services.into_iter().map(object_key).collect(),
                upserted_endpoints: part.upserted_endpoints,
                removed_endpoints: part.removed_endpoints.into_iter().map(object_key).collect(),
                trace_context: None,
                node_status: part.node_status,
                replaced_buckets: part.replaced_buckets,
                base_revision: 0,
                appended_endpoints: part.appended_endpoints,
            })
            .collect(),
    }
}

/// The state after a reset of epoch `e1`, revision 1, holding `a` and `b` with their endpoints.
fn state_with_a_and_b() -> NodeState {
    let (a, a_eps) = web("a", 2);
    let (b, b_eps) = web("b", 3);
    NodeState::default()
        .apply(&revision(
            "e1",
            1,
            true,
            vec![Part {
                upserted_services: vec![a, b],
                upserted_endpoints: vec![a_eps, b_eps],
                ..Part::default()
            }],
        ))
        .expect("a reset applies on an empty state")
}

fn service_names(state: &NodeState) -> Vec<&str> {
    state
        .services
        .keys()
        .map(|(_, name)| name.as_str())
        .collect()
}

fn endpoint_names(state: &NodeState) -> Vec<&str> {
    state
        .endpoints
        .keys()
        .map(|(_, name)| name.as_str())
        .collect()
}

#[test]
fn first_reset_is_taken_with_its_epoch_and_revision() {
    let state = state_with_a_and_b();
    assert_eq!(state.epoch.as_deref(), Some("e1"));
    assert_eq!(state.revision, 1);
    assert_eq!(service_names(&state), ["a", "b"]);
    assert_eq!(endpoint_names(&state), ["a", "b"]);
    assert_eq!(state.endpoint_count(), 2);
}

/// `demo/big`: 300 endpoints behind ports `a` and `b`.
fn big_set() -> pb::ServiceEndpoints {
    let port = |name: &str| {
        let each =
            (0..300).map(|i| endpoint(&format!("10.244.{}.{}", i / 200, i % 200 + 1), 8080, false));
        port_endpoints(name, TCP, each.collect())
    };
    endpoints("big", vec![port("a"), port("b")])
}

#[test]
fn a_set_sent_in_pieces_is_held_whole_with_the_digest_of_the_whole() {
    let (big, _) = web("big", 2);
    let whole = big_set();
    let pieces = splitproxy_proto::pieces::split(&whole, 2_000);
    assert!(pieces.len() > 5, "{} pieces", pieces.len());
    let (first, rest) = pieces.split_first().expect("pieces");
    let mut parts = vec![Part {
        upserted_services: vec![big],
        upserted_endpoints: vec![first.clone()],
        ..Part::default()
    }];
    parts.extend(rest.iter().map(|piece| Part {
        appended_endpoints: vec![piece.clone()],
        ..Part::default()
    }));
    let state = state_with_a_and_b()
        .apply(&revision("e1", 2, false, parts))
        .expect("pieces of a set upserted in the revision are taken");

    assert_eq!(state.endpoints.get(&key("big")).map(|e| &**e), Some(&whole));
    assert_eq!(state.endpoint_count(), 2 + 600);
    let digest = state
        .digests()
        .into_iter()
        .find(|d| d.kind == pb::ResourceKind::Endpoints as i32 && d.key == Some(object_key("big")));
    assert_eq!(
        digest.map(|d| d.sha256_prefix),
        Some(splitproxy_proto::digest(&whole))
    );
}

#[test]
fn a_piece_continuing_no_set_of_its_revision_is_rejected() {
    let held = state_with_a_and_b();
    let piece = endpoints(
        "a",
        vec![port_endpoints(
            "",
            TCP,
            vec![endpoint("10.244.1.9", 8080, true)],
        )],
    );
    // `a`'s endpoints are held, but not upserted by this revision; nor by the part before the
    // piece once it removes them.
    for parts in [
        vec![Part {
            appended_endpoints: vec![piece.clone()],
            ..Part::default()
        }],
        vec![
            Part {
                upserted_endpoints: vec![web("a", 2).1],
                ..Part::default()
            },
            Part {
                removed_endpoints: vec!["a"],
                ..Part::default()
            },
            Part {
                appended_endpoints: vec![piece.clone()],
                ..Part::default()
            },
        ],
    ] {
        assert_eq!(
            held.apply(&revision("e1", 2, false, parts)),
            Err(Rejected::PieceWithoutSet("demo/a".into()))
        );
    }
}

#[test]
fn reset_replaces_everything_the_agent_held() {
    let held = state_with_a_and_b();
    let (c, c_eps) = web("c", 4);
    let (b, _) = web("b", 3);
    let next = held
        .apply(&revision(
            "e2",
            1,
            true,
            vec![Part {
                upserted_services: vec![b, c],
                upserted_endpoints: vec![c_eps.clone()],
                ..Part::default()
            }],
        ))
        .expect("a reset applies whatever the state held");
    assert_eq!(next.epoch.as_deref(), Some("e2"));
    assert_eq!(next.revision, 1);
    assert_eq!(service_names(&next), ["b", "c"]);
    // b's endpoints were not named by the reset, so they are gone even though b stays.
    assert_eq!(endpoint_names(&next), ["c"]);
    assert_eq!(*next.endpoints[&key("c")], c_eps);
}

#[test]
fn empty_reset_leaves_no_services() {
    let next = state_with_a_and_b()
        .apply(&revision("e1", 2, true, vec![Part::default()]))
        .expect("an empty reset applies");
    assert!(next.services.is_empty() && next.endpoints.is_empty());
}

#[test]
fn delta_upserts_and_removes_services_and_endpoints() {
    let held = state_with_a_and_b();
    let changed_a = service("a", "10.96.0.20", vec![port("", TCP, 8080, 0)]);
    let (c, c_eps) = web("c", 4);
    let (_, new_a_eps) = web("a", 9);
    let next = held
        .apply(&revision(
            "e1",
            2,
            false,
            vec![Part {
                upserted_services: vec![changed_a.clone(), c.clone()],
                upserted_endpoints: vec![new_a_eps.clone(), c_eps.clone()],
                removed_endpoints: vec!["b"],
                ..Part::default()
            }],
        ))
        .expect("a delta of the held epoch applies");
    assert_eq!(next.revision, 2);
    assert_eq!(service_names(&next), ["a", "b", "c"]);
    assert_eq!(*next.services[&key("a")], changed_a);
    assert_eq!(*next.services[&key("c")], c);
    // b keeps its Service but loses its endpoints.
    assert_eq!(endpoint_names(&next), ["a", "c"]);
    assert_eq!(*next.endpoints[&key("a")], new_a_eps);
    assert_eq!(*next.endpoints[&key("c")], c_eps);
}

#[test]
fn delta_leaves_resources_it_does_not_name_alone() {
    let held = state_with_a_and_b();
    let (c, _) = web("c", 4);
    let next = held
        .apply(&revision(
            "e1",
            2,
            false,
            vec![Part {
                upserted_services: vec![c],
                ..Part::default()
            }],
        ))
        .expect("a delta of the held epoch applies");
    assert_eq!(next.services[&key("a")], held.services[&key("a")]);
    assert_eq!(next.services[&key("b")], held.services[&key("b")]);
    assert_eq!(next.endpoints, held.endpoints);
}

#[test]
fn removing_a_service_removes_its_endpoints() {
    let next = state_with_a_and_b()
        .apply(&revision(
            "e1",
            2,
            false,
            vec![Part {
                removed_services: vec!["a"],
                ..Part::default()
            }],
        ))
        .expect("a delta of the held epoch applies");
    assert_eq!(service_names(&next), ["b"]);
    assert_eq!(endpoint_names(&next), ["b"]);
    let Conversion {
        model: proxy,
        invalid,
    } = Conversion::of(&next, "node-1");
    assert!(invalid.is_empty());
    let names: Vec<&str> = proxy.services.keys().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["b"]);
}

#[test]
fn delta_from_another_epoch_is_rejected_and_the_state_is_untouched() {
    let held = state_with_a_and_b();
    let before = held.clone();
    let err = held
        .apply(&revision(
            "e2",
            2,
            false,
            vec![Part {
                removed_services: vec!["a", "b"],
                ..Part::default()
            }],
        ))
        .expect_err("a delta of another epoch must not apply");
    assert_eq!(
        err,
        Rejected::NotOnAppliedState {
            got: "e2".into(),
            held: Some("e1".into()),
        }
    );
    assert_eq!(held, before);
}

#[test]
fn delta_from_another_epoch_builds_on_a_state_whose_digests_were_presented() {
    let held = state_with_a_and_b();
    let mut delta = revision(
        "e2",
        1,
        false,
        vec![Part {
            removed_services: vec!["a"],
            ..Part::default()
        }],
    );
    delta.on_presented_state = true;
    let next = held.apply(&delta).expect("builds on the presented state");
    assert_eq!(next.epoch.as_deref(), Some("e2"));
    let names: Vec<&str> = next.services.keys().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["b"]);
    // The digests it presented name each resource once, by kind and key.
    let digests = held.digests();
    assert_eq!(digests.len(), held.services.len() + held.endpoints.len());
    assert!(
        digests
            .iter()
            .all(|d| d.kind != pb::ResourceKind::Unspecified as i32)
    );
}

/// The buckets, out of 4096, of the Services named `names` (protocol rule 11).
fn replacing(names: &[&str]) -> Option<pb::ReplacedBuckets> {
    let bucket = |name| splitproxy_proto::bucket_of(&object_key(name).namespace, name, 4096);
    Some(pb::ReplacedBuckets {
        bucket_count: 4096,
        buckets: names
            .iter()
            .map(|name| u32::try_from(bucket(name)).expect("small"))
            .collect(),
    })
}

#[test]
fn a_delta_from_a_summary_replaces_what_the_agent_holds_in_its_buckets() {
    let held = state_with_a_and_b();
    let on_summary = |part: Part| {
        let mut delta = revision("e2", 1, false, vec![part]);
        delta.on_presented_state = true;
        delta
    };
    assert_ne!(
        replacing(&["a"]),
        replacing(&["b"]),
        "a and b in one bucket"
    );

    // a's bucket replaced by nothing: a and its endpoints are gone, b stays.
    let next = held
        .apply(&on_summary(Part {
            replaced_buckets: replacing(&["a"]),
            ..Part::default()
        }))
        .expect("applies");
    let names: Vec<&str> = next.services.keys().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["b"]);
    assert_eq!(next.endpoints.len(), 1);

    // Replaced by a new a: the new one, endpoints and all.
    let (a, a_eps) = web("a", 9);
    let next = held
        .apply(&on_summary(Part {
            upserted_services: vec![a.clone()],
            upserted_endpoints: vec![a_eps.clone()],
            replaced_buckets: replacing(&["a"]),
            ..Part::default()
        }))
        .expect("applies");
    assert_eq!(next.services.len(), 2);
    assert_eq!(next.endpoints.values().filter(|e| ***e == a_eps).count(), 1);

    // Nowhere else: on a delta that does not answer a summary, or with a bad bucket count.
    let mut plain = on_summary(Part {
        replaced_buckets: replacing(&["a"]),
        ..Part::default()
    });
    plain.epoch = "e1".into();
    plain.number = 2;
    plain.on_presented_state = false;
    assert!(matches!(
        held.apply(&plain),
        Err(Rejected::ReplacedBuckets(_))
    ));
    let odd = on_summary(Part {
        replaced_buckets: Some(pb::ReplacedBuckets {
            bucket_count: 3,
            buckets: vec![1],
        }),
        ..Part::default()
    });
    assert!(matches!(
        held.apply(&odd),
        Err(Rejected::ReplacedBuckets(_))
    ));
}

#[test]
fn the_summary_sums_every_digest_held_in_its_bucket() {
    let held = state_with_a_and_b();
    let summary = held.summary();
    assert_eq!(summary.bucket_sums.len(), splitproxy_proto::SUMMARY_BUCKETS);
    let total = |digests: &mut dyn Iterator<Item = u64>| digests.fold(0u64, u64::wrapping_add);
    assert_eq!(
        total(&mut summary.bucket_sums.iter().copied()),
        total(&mut held.digests().iter().map(|d| d.sha256_prefix))
    );
    let a_digest = total(
        &mut (held.digests().into_iter())
            .filter(|d| d.key.as_ref().is_some_and(|k| k.name == "a"))
            .map(|d| d.sha256_prefix),
    );
    let a_bucket = replacing(&["a"]).expect("some").buckets[0] as usize;
    assert_eq!(
        summary.bucket_sums[a_bucket], a_digest,
        "a's Service and endpoints"
    );
}

#[test]
fn delta_before_any_state_is_rejected() {
    let (a, a_eps) = web("a", 2);
    let err = NodeState::default()
        .apply(&revision(
            "e1",
            1,
            false,
            vec![Part {
                upserted_services: vec![a],
                upserted_endpoints: vec![a_eps],
                ..Part::default()
            }],
        ))
        .expect_err("a delta needs a state to build on");
    assert_eq!(
        err,
        Rejected::NotOnAppliedState {
            got: "e1".into(),
            held: None,
        }
    );
}

#[test]
fn service_without_key_is_rejected() {
    let held = state_with_a_and_b();
    let mut keyless = web("c", 4).0;
    keyless.key = None;
    let err = held
        .apply(&revision(
            "e1",
            2,
            false,
            vec![Part {
                upserted_services: vec![keyless],
                removed_services: vec!["a"],
                ..Part::default()
            }],
        ))
        .expect_err("a Service without key cannot be stored");
    assert_eq!(err, Rejected::MissingKey);
    assert_eq!(service_names(&held), ["a", "b"]);
}

#[test]
fn endpoints_without_key_are_rejected_even_in_a_reset() {
    let mut keyless = web("a", 2).1;
    keyless.key = None;
    let err = NodeState::default()
        .apply(&revision(
            "e1",
            1,
            true,
            vec![Part {
                upserted_services: vec![web("a", 2).0],
                upserted_endpoints: vec![keyless],
                ..Part::default()
            }],
        ))
        .expect_err("an endpoint set without key cannot be stored");
    assert_eq!(err, Rejected::MissingKey);
}

#[test]
fn revision_split_in_parts_is_applied_in_order() {
    let held = state_with_a_and_b();
    let a_on_81 = service("a", "10.96.0.10", vec![port("", TCP, 81, 0)]);
    let a_on_82 = service("a", "10.96.0.10", vec![port("", TCP, 82, 0)]);
    let (c, c_eps) = web("c", 4);
    let next = held
        .apply(&revision(
            "e1",
            2,
            false,
            vec![
                Part {
                    upserted_services: vec![a_on_81, c],
                    upserted_endpoints: vec![c_eps],
                    ..Part::default()
                },
                Part {
                    // Removals of a part come before its upserts; across parts, order counts.
                    removed_services: vec!["c", "b"],
                    upserted_services: vec![a_on_82.clone()],
                    ..Part::default()
                },
                Part {
                    upserted_services: vec![web("b", 5).0],
                    ..Part::default()
                },
            ],
        ))
        .expect("every part builds on the held epoch");
    assert_eq!(next.revision, 2);
    assert_eq!(service_names(&next), ["a", "b"]);
    assert_eq!(*next.services[&key("a")], a_on_82);
    // b came back in the last part, without the endpoints it lost with its removal.
    assert_eq!(endpoint_names(&next), ["a"]);
}

#[test]
fn the_conversion_joins_endpoints_to_ports_by_port_name_and_protocol() {
    let svc = pb::Service {
        key: Some(object_key("dns")),
        cluster_ips: vec!["10.96.0.53".into(), "fd00:10:96::53".into()],
        ports: vec![
            port("dns", UDP, 53, 0),
            port("dns-tcp", TCP, 53, 30053),
            port("metrics", TCP, 9153, 0),
        ],
        ..Default::default()
    };
    let eps = endpoints(
        "dns",
        vec![
            // Same name as a Service port, other protocol: belongs to no port.
            port_endpoints("dns", TCP, vec![endpoint("10.244.2.9", 5353, false)]),
            port_endpoints(
                "dns",
                UDP,
                vec![
                    endpoint("10.244.1.2", 5353, true),
                    endpoint("10.244.2.3", 5353, false),
                ],
            ),
            port_endpoints("dns-tcp", TCP, vec![endpoint("10.244.1.2", 5354, true)]),
        ],
    );
    let state = NodeState::default()
        .apply(&revision(
            "e1",
            1,
            true,
            vec![Part {
                upserted_services: vec![svc],
                upserted_endpoints: vec![eps],
                ..Part::default()
            }],
        ))
        .expect("a reset applies");
    let Conversion {
        model: proxy,
        invalid,
    } = Conversion::of(&state, "node-1");
    assert!(invalid.is_empty(), "{invalid:?}");
    let dp_endpoint = |ip: [u8; 4], port, is_local| dp::Endpoint {
        ip: IpAddr::V4(Ipv4Addr::from(ip)),
        port,
        ready: true,
        serving: true,
        terminating: false,
        is_local,
        topology_excluded: false,
    };
    let expected = dp::Service {
        key: dp::ServiceKey {
            namespace: "demo".into(),
            name: "dns".into(),
        },
        cluster_ips: vec![
            "10.96.0.53".parse().expect("valid"),
            "fd00:10:96::53".parse().expect("valid"),
        ],
        ports: vec![
            dp::ServicePort {
                name: "dns".into(),
                protocol: dp::Protocol::Udp,
                port: 53,
                node_port: None,
                endpoints: vec![
                    dp_endpoint([10, 244, 1, 2], 5353, true),
                    dp_endpoint([10, 244, 2, 3], 5353, false),
                ],
            },
            dp::ServicePort {
                name: "dns-tcp".into(),
                protocol: dp::Protocol::Tcp,
                port: 53,
                node_port: Some(30053),
                endpoints: vec![dp_endpoint([10, 244, 1, 2], 5354, true)],
            },
            dp::ServicePort {
                name: "metrics".into(),
                protocol: dp::Protocol::Tcp,
                port: 9153,
                node_port: None,
                endpoints: Vec::new(),
            },
        ],
        ..Default::default()
    };
    assert_eq!(proxy.services.len(), 1);
    assert_eq!(*proxy.services[&expected.key], expected);
}

#[test]
fn the_conversion_carries_endpoint_conditions_and_topology() {
    let (svc, mut eps) = web("a", 2);
    eps.ports[0].endpoints[0].conditions = Some(pb::EndpointConditions {
        ready: false,
        serving: true,
        terminating: true,
    });
    eps.ports[0].endpoints.push(pb::Endpoint {
        topology_excluded: true,
        ..endpoint("10.244.2.2", 8080, false)
    });
    let state = NodeState {
        epoch: Some("e1".into()),
        revision: 1,
        services: OrdMap::unit(key("a"), Arc::new(svc)),
        endpoints: OrdMap::unit(key("a"), Arc::new(eps)),
        eligibility: Eligibility::Eligible,
        pod_cidrs: Vec::new(),
        service_cidrs: Vec::new(),
        node_ips: Vec::new(),
        zone: String::new(),
    };
    let Conversion {
        model: proxy,
        invalid: _,
    } = Conversion::of(&state, "node-1");
    let ep = &proxy
        .services
        .values()
        .next()
        .expect("a is converted")
        .ports[0]
        .endpoints[0];
    assert!(!ep.ready && ep.serving && ep.terminating && ep.is_local);
    assert!(!ep.topology_excluded);
    let excluded: Vec<bool> = proxy
        .services
        .values()
        .flat_map(|s| &s.ports[0].endpoints)
        .map(|e| e.topology_excluded)
        .collect();
    assert_eq!(excluded, [false, true]);
}

/// The endpoint set of `web("a", ..)` in cluster form: `10.244.1.2` on node-1 in zone `a`,
/// `10.244.2.2` on node-2 in zone `b`, each zone-hinted.
fn in_cluster_form() -> (pb::Service, pb::ServiceEndpoints) {
    let (svc, mut eps) = web("a", 2);
    eps.cluster_form = true;
    eps.ports[0].endpoints = vec![
        pb::Endpoint {
            node_name: "node-1".into(),
            for_zones: vec!["a".into()],
            ..endpoint("10.244.1.2", 8080, false)
        },
        pb::Endpoint {
            node_name: "node-2".into(),
            for_zones: vec!["b".into()],
            ..endpoint("10.244.2.2", 8080, false)
        },
    ];
    (svc, eps)
}

/// Each endpoint of the one converted Service: address, local, excluded by topology.
fn locality(conversion: &Conversion) -> Vec<(String, bool, bool)> {
    (conversion.model.services.values())
        .flat_map(|s| &s.ports[0].endpoints)
        .map(|e| (e.ip.to_string(), e.is_local, e.topology_excluded))
        .collect()
}

#[test]
fn a_set_in_cluster_form_is_localized_for_the_agents_node_and_zone() {
    let (svc, eps) = in_cluster_form();
    let state = |zone: &str| NodeState {
        epoch: Some("e1".into()),
        revision: 1,
        services: OrdMap::unit(key("a"), Arc::new(svc.clone())),
        endpoints: OrdMap::unit(key("a"), Arc::new(eps.clone())),
        zone: zone.into(),
        ..NodeState::default()
    };
    let local = |address: &str, local, excluded| (address.to_owned(), local, excluded);
    assert_eq!(
        locality(&Conversion::of(&state("a"), "node-1")),
        [
            local("10.244.1.2", true, false),
            local("10.244.2.2", false, true)
        ]
    );
    assert_eq!(
        locality(&Conversion::of(&state("b"), "node-2")),
        [
            local("10.244.1.2", false, true),
            local("10.244.2.2", true, false)
        ]
    );
    // A node of zone b that runs neither: zone b's endpoint, none local.
    assert_eq!(
        locality(&Conversion::of(&state("b"), "node-9")),
        [
            local("10.244.1.2", false, true),
            local("10.244.2.2", false, false)
        ]
    );
    // Without a zone, the hints are ignored.
    assert_eq!(
        locality(&Conversion::of(&state(""), "node-1")),
        [
            local("10.244.1.2", true, false),
            local("10.244.2.2", false, false)
        ]
    );
}

/// A Service and, if it has any, its endpoint set.
type WithEndpoints = (pb::Service, Option<pb::ServiceEndpoints>);

#[test]
fn the_conversion_skips_only_the_services_that_cannot_be_programmed() {
    let bad_endpoint = |address: &str, port| {
        let (svc, mut eps) = web("x", 0);
        eps.ports[0].endpoints = vec![endpoint(address, port, false)];
        (svc, Some(eps))
    };
    let cases: Vec<(&str, WithEndpoints, InvalidService)> = vec![
        (
            "cluster IP",
            (
                service("x", "10.96.0.300", vec![port("", TCP, 80, 0)]),
                None,
            ),
            InvalidService::ClusterIp("10.96.0.300".into()),
        ),
        (
            "port zero",
            (service("x", "10.96.0.11", vec![port("", TCP, 0, 0)]), None),
            InvalidService::Port(0),
        ),
        (
            "port above 65535",
            (
                service("x", "10.96.0.11", vec![port("", TCP, 65536, 0)]),
                None,
            ),
            InvalidService::Port(65536),
        ),
        (
            "node port above 65535",
            (
                service("x", "10.96.0.11", vec![port("", TCP, 80, 70000)]),
                None,
            ),
            InvalidService::Port(70000),
        ),
        (
            "unspecified protocol",
            (
                service(
                    "x",
                    "10.96.0.11",
                    vec![port("", pb::Protocol::Unspecified, 80, 0)],
                ),
                None,
            ),
            InvalidService::Protocol(0),
        ),
        (
            "unknown protocol",
            (
                service(
                    "x",
                    "10.96.0.11",
                    vec![pb::ServicePort {
                        name: String::new(),
                        protocol: 99,
                        port: 80,
                        node_port: 0,
                    }],
                ),
                None,
            ),
            InvalidService::Protocol(99),
        ),
        (
            "endpoint address",
            bad_endpoint("10.244.1", 8080),
            InvalidService::EndpointAddress("10.244.1".into()),
        ),
        (
            "endpoint port",
            bad_endpoint("10.244.1.7", 0),
            InvalidService::Port(0),
        ),
        (
            "port name with a quote and a space",
            (
                service("x", "10.96.0.11", vec![port("a \"b", TCP, 80, 0)]),
                None,
            ),
            InvalidService::Name("a \"b".into()),
        ),
        (
            "port name used twice",
            (
                service(
                    "x",
                    "10.96.0.11",
                    vec![port("http", TCP, 80, 0), port("http", UDP, 81, 0)],
                ),
                None,
            ),
            InvalidService::DuplicatePort("http".into()),
        ),
        (
            "endpoint listed twice",
            {
                let (svc, mut eps) = web("x", 0);
                let twice = endpoint("10.244.1.7", 8080, false);
                eps.ports[0].endpoints = vec![twice.clone(), twice];
                (svc, Some(eps))
            },
            InvalidService::DuplicateEndpoint("10.244.1.7:8080".into()),
        ),
    ];
    for (case, (bad, bad_eps), reason) in cases {
        let (a, a_eps) = web("a", 2);
        let (z, z_eps) = web("z", 3);
        let state = NodeState::default()
            .apply(&revision(
                "e1",
                1,
                true,
                vec![Part {
                    upserted_services: vec![a, bad, z],
                    upserted_endpoints: [a_eps, z_eps].into_iter().chain(bad_eps).collect(),
                    ..Part::default()
                }],
            ))
            .expect("an invalid Service is stored; only its conversion fails");
        let Conversion {
            model: proxy,
            invalid,
        } = Conversion::of(&state, "node-1");
        assert_eq!(invalid, BTreeMap::from([(key("x"), reason)]), "case {case}");
        let names: Vec<&str> = proxy.services.keys().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["a", "z"], "case {case}");
        assert!(
            proxy
                .services
                .values()
                .all(|s| s.ports[0].endpoints.len() == 1),
            "case {case}: the valid Services keep their endpoints"
        );
    }
}

#[test]
fn endpoint_changes_lists_changed_added_and_removed_sets_only() {
    let (a, a_eps) = web("a", 2);
    let (b, b_eps) = web("b", 3);
    let (c, c_eps) = web("c", 4);
    let (d, d_eps) = web("d", 5);
    let before = NodeState::default()
        .apply(&revision(
            "e1",
            1,
            true,
            vec![Part {
                upserted_services: vec![a.clone(), b.clone(), c.clone(), d],
                upserted_endpoints: vec![a_eps, b_eps.clone(), c_eps, d_eps],
                ..Part::default()
            }],
        ))
        .expect("a reset applies");
    let (e, e_eps) = web("e", 6);
    let after = before
        .apply(&revision(
            "e1",
            2,
            false,
            vec![Part {
                // a: endpoints changed; b: Service changed, endpoints re-sent unchanged;
                // c: endpoints removed; d: Service removed; e: added.
                upserted_services: vec![service("b", "10.96.0.99", vec![port("", TCP, 80, 0)]), e],
                upserted_endpoints: vec![web("a", 7).1, b_eps, e_eps],
                removed_endpoints: vec!["c"],
                removed_services: vec!["d"],
                ..Part::default()
            }],
        ))
        .expect("a delta of the held epoch applies");
    let mut changed: Vec<&str> = before
        .endpoint_changes(&after)
        .map(|(_, name)| name.as_str())
        .collect();
    changed.sort_unstable();
    assert_eq!(changed, ["a", "c", "d", "e"]);
    assert_eq!(after.endpoint_changes(&after).count(), 0);
}

#[test]
fn external_addresses_affinity_and_policies_reach_the_dataplane_model() {
    let service = pb::Service {
        key: Some(pb::ObjectKey {
            namespace: "a".into(),
            name: "lb".into(),
        }),
        cluster_ips: vec!["10.96.0.6".into()],
        ports: vec![pb::ServicePort {
            name: String::new(),
            protocol: pb::Protocol::Tcp as i32,
            port: 80,
            node_port: 30080,
        }],
        external_ips: vec!["192.0.2.10".into()],
        load_balancer_ips: vec!["198.51.100.1".into()],
        load_balancer_source_ranges: vec!["203.0.113.0/24".into()],
        session_affinity: Some(pb::SessionAffinity {
            timeout_seconds: 60,
        }),
        external_traffic_policy_local: true,
        internal_traffic_policy_local: false,
        health_check_node_port: 32000,
    };
    let state = NodeState {
        services: OrdMap::unit(("a".to_owned(), "lb".to_owned()), Arc::new(service)),
        ..NodeState::default()
    };
    let Conversion {
        model: proxy,
        invalid,
    } = Conversion::of(&state, "node-1");
    assert!(invalid.is_empty());
    let converted = proxy.services.values().next().expect("converted");
    assert_eq!(
        converted.external_ips,
        ["192.0.2.10".parse::<IpAddr>().expect("literal")]
    );
    assert_eq!(
        converted.load_balancer_ips,
        ["198.51.100.1".parse::<IpAddr>().expect("literal")]
    );
    assert_eq!(
        converted.load_balancer_source_ranges,
        ["203.0.113.0/24".parse::<dp::Cidr>().expect("literal")]
    );
    assert_eq!(converted.session_affinity, Some(Duration::from_secs(60)));
    assert_eq!(converted.external_traffic_policy, dp::TrafficPolicy::Local);
    assert_eq!(
        converted.internal_traffic_policy,
        dp::TrafficPolicy::Cluster
    );
    assert_eq!(converted.health_check_node_port, Some(32000));
}

fn node_status(eligible: bool, reason: &str) -> Option<pb::NodeStatus> {
    Some(pb::NodeStatus {
        eligible,
        reason: reason.into(),
        pod_cidrs: Vec::new(),
        ..pb::NodeStatus::default()
    })
}

#[test]
fn the_node_is_not_eligible_before_any_revision() {
    assert!(!NodeState::default().eligibility.is_eligible());
}

#[test]
fn eligibility_follows_the_node_status_and_a_delta_without_one_keeps_it() {
    let eligible = state_with_a_and_b()
        .apply(&revision(
            "e1",
            2,
            false,
            vec![Part {
                node_status: node_status(true, ""),
                ..Part::default()
            }],
        ))
        .expect("applies");
    assert_eq!(eligible.eligibility, Eligibility::Eligible);
    assert!(
        eligible.same_rules(&state_with_a_and_b()),
        "the status is not a rule"
    );

    let tainted = eligible
        .apply(&revision(
            "e1",
            3,
            false,
            vec![Part {
                node_status: node_status(
                    false,
                    "the Node is tainted ToBeDeletedByClusterAutoscaler",
                ),
                ..Part::default()
            }],
        ))
        .expect("applies");
    assert_eq!(
        tainted.eligibility,
        Eligibility::Ineligible("the Node is tainted ToBeDeletedByClusterAutoscaler".into())
    );

    let (c, c_eps) = web("c", 4);
    let later = tainted
        .apply(&revision(
            "e1",
            4,
            false,
            vec![Part {
                upserted_services: vec![c],
                upserted_endpoints: vec![c_eps],
                ..Part::default()
            }],
        ))
        .expect("applies");
    assert_eq!(later.eligibility, tainted.eligibility);
}

#[test]
fn a_reset_without_a_node_status_leaves_the_node_not_eligible() {
    let eligible = NodeState::default()
        .apply(&revision(
            "e1",
            1,
            true,
            vec![Part {
                node_status: node_status(true, ""),
                ..Part::default()
            }],
        ))
        .expect("applies");
    assert!(eligible.eligibility.is_eligible());
    let reset = eligible
        .apply(&revision("e2", 1, true, vec![Part::default()]))
        .expect("applies");
    assert!(!reset.eligibility.is_eligible());
}

#[test]
fn services_whose_names_cannot_go_into_a_rule_are_skipped_and_the_rest_renders() {
    // A quote or a newline in a name went into an iptables comment as it was, so
    // iptables-restore refused the whole transaction: one bad name blocked every Service.
    let too_long = "x".repeat(64);
    for bad in [
        "evil\"",
        "evil\n-A INPUT -j DROP",
        "Upper",
        "",
        too_long.as_str(),
    ] {
        for (namespace, name) in [("demo", bad), (bad, "x")] {
            let mut svc = service("x", "10.96.0.11", vec![port("", TCP, 80, 0)]);
            svc.key = Some(pb::ObjectKey {
                namespace: namespace.into(),
                name: name.into(),
            });
            let (a, a_eps) = web("a", 2);
            let state = NodeState::default()
                .apply(&revision(
                    "e1",
                    1,
                    true,
                    vec![Part {
                        upserted_services: vec![a, svc],
                        upserted_endpoints: vec![a_eps],
                        ..Part::default()
                    }],
                ))
                .expect("the revision is well formed");
            let Conversion {
                model: proxy,
                invalid,
            } = Conversion::of(&state, "node-1");
            assert_eq!(
                invalid,
                BTreeMap::from([(
                    (namespace.to_owned(), name.to_owned()),
                    InvalidService::Name(bad.into())
                )])
            );
            let names: Vec<&str> = proxy.services.keys().map(|k| k.name.as_str()).collect();
            assert_eq!(names, ["a"], "{bad:?}");
            let nat = splitproxy_dataplane::iptables::render_nat(
                &proxy,
                &splitproxy_dataplane::NodeOptions::default(),
                &std::collections::BTreeSet::new(),
            );
            splitproxy_dataplane::testing::tracer::Ruleset::parse(&nat.payload)
                .expect("the remaining Services render to valid restore input");
        }
    }
}

#[test]
fn revision_zero_is_rejected() {
    let (a, a_eps) = web("a", 2);
    let zero = revision(
        "e1",
        0,
        true,
        vec![Part {
            upserted_services: vec![a],
            upserted_endpoints: vec![a_eps],
            ..Part::default()
        }],
    );
    assert_eq!(
        NodeState::default().apply(&zero),
        Err(Rejected::RevisionZero)
    );
}

#[test]
fn a_key_named_twice_in_one_list_of_a_part_is_rejected() {
    let (a, a_eps) = web("a", 2);
    let (a_again, _) = web("a", 3);
    let twice = revision(
        "e1",
        1,
        true,
        vec![Part {
            upserted_services: vec![a, a_again],
            upserted_endpoints: vec![a_eps],
            ..Part::default()
        }],
    );
    assert_eq!(
        NodeState::default().apply(&twice),
        Err(Rejected::DuplicateKey {
            list: "upserted_services",
            key: "demo/a".into()
        })
    );
    let removed_twice = revision(
        "e1",
        2,
        false,
        vec![Part {
            removed_services: vec!["b", "b"],
            ..Part::default()
        }],
    );
    assert_eq!(
        state_with_a_and_b().apply(&removed_twice),
        Err(Rejected::DuplicateKey {
            list: "removed_services",
            key: "demo/b".into()
        })
    );
}

#[test]
fn a_conversion_updated_by_the_changed_services_equals_a_whole_conversion() {
    let held = state_with_a_and_b();
    let (_, new_a_eps) = web("a", 9);
    let (c, c_eps) = web("c", 4);
    let bad = service("d", "not-an-ip", vec![port("", TCP, 80, 0)]);
    let next = held
        .apply(&revision(
            "e1",
            2,
            false,
            vec![Part {
                upserted_services: vec![c, bad],
                upserted_endpoints: vec![new_a_eps, c_eps],
                removed_services: vec!["b"],
                ..Part::default()
            }],
        ))
        .expect("a delta of the held epoch applies");
    let changed: Vec<&Key> = held
        .service_changes(&next)
        .chain(held.endpoint_changes(&next))
        .collect();
    let names: BTreeSet<&str> = changed.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, BTreeSet::from(["a", "b", "c", "d"]));
    let updated = Conversion::of(&held, "node-1").updated(&next, "node-1", changed);
    assert_eq!(updated, Conversion::of(&next, "node-1"));
    assert_eq!(updated.invalid.keys().collect::<Vec<_>>(), [&key("d")]);
    let kept = Conversion::of(&held, "node-1").updated(&next, "node-1", []);
    assert_ne!(
        kept,
        Conversion::of(&next, "node-1"),
        "without the changes it stays the old one"
    );
}
