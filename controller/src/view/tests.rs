use super::{resume::SortedDigests, *};
use crate::{
    digests::{Digests, SharedDigests},
    eligibility::Ineligible,
    nodes::NodeInfo,
    testing::ready_backend,
    topology::NodeTopology,
};

fn cluster(endpoints: &[(&str, &str)]) -> ClusterState {
    let backends = endpoints
        .iter()
        .map(|(address, node)| ready_backend(*address, node))
        .collect();
    cluster_of(backends, BTreeMap::new())
}

/// The Service demo/web with `backends` on its one port, and `nodes`.
fn cluster_of(backends: Vec<pb::Endpoint>, nodes: BTreeMap<String, NodeInfo>) -> ClusterState {
    let key: Key = ("demo".into(), "web".into());
    let service = pb::Service {
        key: Some(object_key(&key)),
        cluster_ips: vec!["10.96.0.10".into()],
        ports: vec![pb::ServicePort {
            name: "http".into(),
            protocol: pb::Protocol::Tcp as i32,
            port: 80,
            node_port: 0,
        }],
        ..Default::default()
    };
    let mut endpoints = BTreeMap::new();
    insert_http_backends(&mut endpoints, &key, backends);
    ClusterState::of(BTreeMap::from([(key, service)]), endpoints, nodes)
}

/// `backends` as the endpoints of `key`'s one port, `http`, unless there are none.
fn insert_http_backends(
    endpoints: &mut BTreeMap<Key, ServiceBackends>,
    key: &Key,
    backends: Vec<pb::Endpoint>,
) {
    if !backends.is_empty() {
        let ports = vec![pb::PortEndpoints {
            port_name: "http".into(),
            protocol: pb::Protocol::Tcp as i32,
            endpoints: backends,
        }];
        endpoints.insert(key.clone(), ServiceBackends::new(key, ports, None));
    }
}

/// Each endpoint's address and one of its flags.
fn flags(view: &NodeView, flag: impl Fn(&pb::Endpoint) -> bool) -> Vec<(String, bool)> {
    view.endpoints()
        .flat_map(|(_, e)| &e.ports)
        .flat_map(|p| &p.endpoints)
        .map(|e| (e.address.clone(), flag(e)))
        .collect()
}

fn local_flags(view: &NodeView) -> Vec<(String, bool)> {
    flags(view, |e| e.is_local)
}

#[test]
fn endpoints_on_the_viewing_node_are_marked_local() {
    let state = cluster(&[
        ("10.244.1.2", "node-1"),
        ("10.244.2.2", "node-2"),
        ("10.244.3.2", ""),
    ]);
    let view = NodeView::for_node(&state, "node-1", EndpointForm::Filtered);
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
    let view = NodeView::for_node(
        &cluster(&[("10.244.1.2", "node-1")]),
        "node-1",
        EndpointForm::Filtered,
    );
    assert!(Delta::between(&view, &view).is_empty());
}

#[test]
fn changed_endpoints_are_upserted_without_resending_the_service() {
    let before = NodeView::for_node(
        &cluster(&[("10.244.1.2", "node-1")]),
        "node-1",
        EndpointForm::Filtered,
    );
    let after = NodeView::for_node(
        &cluster(&[("10.244.2.2", "node-2")]),
        "node-1",
        EndpointForm::Filtered,
    );
    let delta = Delta::between(&before, &after);
    assert!(delta.upserted_services.is_empty());
    assert_eq!(delta.upserted_endpoints.len(), 1);
    assert!(delta.removed_endpoints.is_empty() && delta.removed_services.is_empty());
}

#[test]
fn losing_every_endpoint_removes_the_endpoint_set_but_keeps_the_service() {
    let before = NodeView::for_node(
        &cluster(&[("10.244.1.2", "node-1")]),
        "node-1",
        EndpointForm::Filtered,
    );
    let after = NodeView::for_node(&cluster(&[]), "node-1", EndpointForm::Filtered);
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
    let before = NodeView::for_node(
        &cluster(&[("10.244.1.2", "node-1")]),
        "node-1",
        EndpointForm::Filtered,
    );
    let delta = Delta::between(&before, &NodeView::default());
    assert_eq!(delta.removed_services.len(), 1);
    assert!(delta.removed_endpoints.is_empty());
}

/// `cluster` with each endpoint zone-hinted as the EndpointSlice controller does for
/// `PreferSameZone` (the zone of its node), and the nodes' zone labels.
fn zoned(endpoints: &[(&str, &str, &str)], nodes: &[(&str, &str)]) -> ClusterState {
    let backends = endpoints
        .iter()
        .map(|(address, node, zone)| {
            let mut backend = ready_backend(*address, node);
            backend.for_zones.push((*zone).into());
            backend
        })
        .collect();
    let nodes = nodes
        .iter()
        .map(|(node, zone)| {
            (
                (*node).into(),
                NodeInfo {
                    topology: NodeTopology {
                        zone: (*zone).into(),
                    },
                    ineligible: None,
                    pod_cidrs: Vec::new(),
                    node_ips: Vec::new(),
                },
            )
        })
        .collect();
    cluster_of(backends, nodes)
}

fn excluded_flags(view: &NodeView) -> Vec<(String, bool)> {
    flags(view, |e| e.topology_excluded)
}

#[test]
fn zone_hints_exclude_other_zones_endpoints_from_the_node_view_only() {
    let state = zoned(
        &[("10.244.1.2", "node-1", "a"), ("10.244.2.2", "node-2", "b")],
        &[("node-1", "a"), ("node-2", "b"), ("node-3", "a")],
    );
    let on_node_3 = NodeView::for_node(&state, "node-3", EndpointForm::Filtered);
    assert_eq!(
        excluded_flags(&on_node_3),
        [("10.244.1.2".into(), false), ("10.244.2.2".into(), true)]
    );
    let on_node_2 = NodeView::for_node(&state, "node-2", EndpointForm::Filtered);
    assert_eq!(
        excluded_flags(&on_node_2),
        [("10.244.1.2".into(), true), ("10.244.2.2".into(), false)]
    );
    // Locality is independent: node-2's own endpoint stays local, the excluded one is not.
    assert_eq!(
        local_flags(&on_node_2),
        [("10.244.1.2".into(), false), ("10.244.2.2".into(), true)]
    );
}

#[test]
fn nodes_of_one_zone_that_no_endpoint_singles_out_share_one_copy_of_the_narrowed_endpoints() {
    let state = zoned(
        &[("10.244.1.2", "node-1", "a"), ("10.244.2.2", "node-2", "b")],
        &[
            ("node-1", "a"),
            ("node-2", "b"),
            ("node-3", "a"),
            ("node-4", "a"),
            ("node-5", "b"),
        ],
    );
    let key: Key = ("demo".into(), "web".into());
    let view = |node: &str| NodeView::for_node(&state, node, EndpointForm::Filtered);
    let (on_3, on_4, on_5) = (view("node-3"), view("node-4"), view("node-5"));
    let seen = |view: &NodeView| Arc::clone(view.endpoints_of(&key).expect("endpoints"));
    assert!(on_3.own.is_empty() && on_4.own.is_empty() && on_5.own.is_empty());
    assert!(Arc::ptr_eq(&seen(&on_3), &seen(&on_4)));
    assert!(!Arc::ptr_eq(&seen(&on_3), &seen(&on_5)));
    assert_eq!(excluded_flags(&on_5), excluded_flags(&view("node-2")));
    // node-1 runs an endpoint, so it has a copy of its own, with that endpoint local.
    assert_eq!(view("node-1").own.len(), 1);
}

#[test]
fn every_node_sees_each_service_as_if_its_view_were_computed_for_it_alone() {
    for seed in 1..=20 {
        let state = scattered(seed);
        for node in (0..10).map(|n| format!("node-{n}")) {
            let view = NodeView::for_node(&state, &node, EndpointForm::Filtered);
            let place = place_of(&state, &node);
            for (key, backends) in state.endpoints.iter() {
                let alone = backends.seen_from(&place);
                let seen = view.endpoints_of(key).map(|e| &**e);
                assert_eq!(seen, Some(&alone), "seed {seed}, {node}, {key:?}");
            }
        }
    }
}

#[test]
fn a_node_zone_label_change_changes_its_view() {
    let endpoints = [("10.244.1.2", "node-1", "a"), ("10.244.2.2", "node-2", "b")];
    let before = NodeView::for_node(
        &zoned(
            &endpoints,
            &[("node-1", "a"), ("node-2", "b"), ("node-3", "a")],
        ),
        "node-3",
        EndpointForm::Filtered,
    );
    let after = NodeView::for_node(
        &zoned(
            &endpoints,
            &[("node-1", "a"), ("node-2", "b"), ("node-3", "b")],
        ),
        "node-3",
        EndpointForm::Filtered,
    );
    let delta = Delta::between(&before, &after);
    assert_eq!(delta.upserted_endpoints.len(), 1);
    assert_eq!(
        excluded_flags(&after),
        [("10.244.1.2".into(), true), ("10.244.2.2".into(), false)]
    );
    // Losing the label entirely: hints are ignored, nothing is excluded.
    let unlabelled = NodeView::for_node(
        &zoned(&endpoints, &[("node-1", "a"), ("node-2", "b")]),
        "node-3",
        EndpointForm::Filtered,
    );
    assert!(
        excluded_flags(&unlabelled)
            .iter()
            .all(|(_, excluded)| !excluded)
    );
}

/// `cluster(&[])` with `node-1` known, eligible or not as `ineligible` says.
fn with_node_1(ineligible: Option<Ineligible>) -> ClusterState {
    let mut state = cluster(&[]);
    Arc::make_mut(&mut state.nodes).insert(
        "node-1".into(),
        NodeInfo {
            topology: NodeTopology::default(),
            ineligible,
            pod_cidrs: vec!["10.244.1.0/24".into()],
            node_ips: Vec::new(),
        },
    );
    state
}

#[test]
fn a_reset_carries_the_node_status_and_a_delta_leaves_an_unchanged_one_out() {
    let known = with_node_1(None);
    let view = NodeView::for_node(&known, "node-1", EndpointForm::Filtered);
    let reset = Delta::between(&NodeView::default(), &view);
    assert_eq!(
        reset.node_status,
        Some(pb::NodeStatus {
            eligible: true,
            reason: String::new(),
            pod_cidrs: vec!["10.244.1.0/24".into()],
            service_cidrs: Vec::new(),
            node_ips: Vec::new(),
            zone: String::new(),
        })
    );
    let mut moved = known;
    moved.endpoints = cluster(&[("10.244.2.2", "node-2")]).endpoints;
    let delta = Delta::between(
        &view,
        &NodeView::for_node(&moved, "node-1", EndpointForm::Filtered),
    );
    assert_eq!(delta.upserted_endpoints.len(), 1);
    assert_eq!(delta.node_status, None, "the status did not change");
}

#[test]
fn new_pod_cidrs_alone_make_a_delta_that_carries_the_new_status() {
    let before = NodeView::for_node(&with_node_1(None), "node-1", EndpointForm::Filtered);
    let mut readdressed = with_node_1(None);
    if let Some(node) = Arc::make_mut(&mut readdressed.nodes).get_mut("node-1") {
        node.pod_cidrs = vec!["10.244.7.0/24".into()];
    }
    let delta = Delta::between(
        &before,
        &NodeView::for_node(&readdressed, "node-1", EndpointForm::Filtered),
    );
    assert_eq!(
        delta.node_status.map(|status| status.pod_cidrs),
        Some(vec!["10.244.7.0/24".to_owned()])
    );
}

#[test]
fn a_node_the_cluster_does_not_know_is_not_eligible() {
    let view = NodeView::for_node(&with_node_1(None), "node-9", EndpointForm::Filtered);
    assert_eq!(
        view.status(),
        Some(&pb::NodeStatus {
            eligible: false,
            reason: "no Node object of this name is known".into(),
            pod_cidrs: Vec::new(),
            service_cidrs: Vec::new(),
            node_ips: Vec::new(),
            zone: String::new(),
        })
    );
}

#[test]
fn a_taint_alone_makes_a_delta_that_carries_only_the_new_status() {
    let before = NodeView::for_node(&with_node_1(None), "node-1", EndpointForm::Filtered);
    let after = NodeView::for_node(
        &with_node_1(Some(Ineligible::ToBeDeleted)),
        "node-1",
        EndpointForm::Filtered,
    );
    let delta = Delta::between(&before, &after);
    assert!(!delta.is_empty());
    assert_eq!(
        delta,
        Delta {
            node_status: Some(pb::NodeStatus {
                eligible: false,
                reason: "the Node is tainted ToBeDeletedByClusterAutoscaler".into(),
                pod_cidrs: vec!["10.244.1.0/24".into()],
                service_cidrs: Vec::new(),
                node_ips: Vec::new(),
                zone: String::new(),
            }),
            ..Delta::default()
        }
    );
    let other_node = NodeView::for_node(
        &with_node_1(Some(Ineligible::ToBeDeleted)),
        "node-2",
        EndpointForm::Filtered,
    );
    assert_eq!(
        Delta::between(
            &NodeView::for_node(&with_node_1(None), "node-2", EndpointForm::Filtered),
            &other_node
        ),
        Delta::default(),
        "another node's taint changes nothing for node-2"
    );
}

/// What a view holds, entry by entry, for comparing views computed in different ways.
fn contents(view: &NodeView) -> (Vec<pb::Service>, Vec<pb::ServiceEndpoints>) {
    (
        view.services().values().map(|s| (**s).clone()).collect(),
        view.endpoints().map(|(_, e)| (**e).clone()).collect(),
    )
}

#[test]
fn advancing_by_the_changes_matches_comparing_whole_views() {
    let zones = [("node-1", "a"), ("node-2", "b"), ("node-3", "a")];
    // Each state follows the one before: endpoints move onto and off the node, gain and lose
    // zone hints, disappear, come back.
    let states = [
        cluster(&[("10.244.1.2", "node-1")]),
        cluster(&[("10.244.2.2", "node-2")]),
        zoned(
            &[("10.244.1.2", "node-1", "a"), ("10.244.2.2", "node-2", "b")],
            &zones,
        ),
        cluster(&[]),
        cluster(&[("10.244.1.2", "node-1"), ("10.244.1.3", "node-1")]),
        with_node_1(Some(Ineligible::ToBeDeleted)),
        cluster(&[("10.244.2.2", "node-2")]),
    ];
    for (node, form) in ["node-1", "node-2", "node-3"].into_iter().flat_map(|node| {
        [
            (node, EndpointForm::Filtered),
            (node, EndpointForm::Cluster),
        ]
    }) {
        let first = states[0].clone().followed_by(None);
        let mut view = NodeView::for_node(&first, node, form);
        let mut previous = Some(first);
        for state in &states[1..] {
            let state = state.clone().followed_by(previous.as_ref());
            let (next, delta) = view.advance(&state, node);
            let whole = NodeView::for_node(&state, node, form);
            assert_eq!(
                contents(&next),
                contents(&whole),
                "{node}, {form:?}: the view"
            );
            assert_eq!(
                delta,
                Delta::between(&view, &whole),
                "{node}, {form:?}: the delta from generation {:?}",
                view.generation
            );
            view = next;
            previous = Some(state);
        }
    }
}

/// A DaemonSet-backed Service: one endpoint on each of `nodes` nodes.
fn daemon_set(nodes: usize) -> ClusterState {
    let endpoints: Vec<(String, String)> = (1..=nodes)
        .map(|n| (format!("10.244.{n}.2"), format!("node-{n}")))
        .collect();
    let endpoints: Vec<(&str, &str)> = (endpoints.iter())
        .map(|(address, node)| (address.as_str(), node.as_str()))
        .collect();
    cluster(&endpoints)
}

#[test]
fn in_cluster_form_every_node_shares_one_set_of_a_daemon_set_services_endpoints() {
    let state = daemon_set(50);
    let key: Key = ("demo".into(), "web".into());
    let views: Vec<NodeView> = (1..=50)
        .map(|n| NodeView::for_node(&state, &format!("node-{n}"), EndpointForm::Cluster))
        .collect();
    let shared = views[0].endpoints_of(&key).expect("endpoints");
    assert!(shared.cluster_form);
    for view in &views {
        assert!(view.own.is_empty());
        let set = view.endpoints_of(&key).expect("endpoints");
        assert!(Arc::ptr_eq(set, shared));
    }
    // Each endpoint names its node, for the agent to tell its own; none is marked local here.
    let first = &shared.ports[0].endpoints[0];
    assert_eq!(
        (first.node_name.as_str(), first.is_local),
        ("node-1", false)
    );

    // Filtered, every node runs an endpoint, so every node holds a copy of its own: what grew
    // as nodes × endpoints.
    for n in 1..=50 {
        let filtered = NodeView::for_node(&state, &format!("node-{n}"), EndpointForm::Filtered);
        assert_eq!(filtered.own.len(), 1);
        assert!(!filtered.endpoints_of(&key).expect("endpoints").cluster_form);
    }
}

#[test]
fn a_change_to_a_daemon_set_service_costs_a_cluster_form_view_no_set_of_its_own() {
    let before = daemon_set(20);
    let after = daemon_set(21).followed_by(Some(&before));
    let view = NodeView::for_node(&before, "node-3", EndpointForm::Cluster);
    let (next, delta) = view.advance(&after, "node-3");
    assert!(next.own.is_empty());
    let key: Key = ("demo".into(), "web".into());
    assert_eq!(delta.upserted_endpoints.len(), 1);
    assert!(Arc::ptr_eq(
        &delta.upserted_endpoints[0],
        next.endpoints_of(&key).expect("endpoints")
    ));
}

#[test]
fn a_view_further_behind_than_the_history_gets_a_delta_from_whole_views() {
    let mut state = cluster(&[("10.244.1.2", "node-1")]);
    let old = NodeView::for_node(&state, "node-2", EndpointForm::Filtered);
    for i in 0..crate::history::HISTORY_LENGTH + 1 {
        let address = format!("10.244.{}.{}", 2 + i / 250, i % 250 + 1);
        state = cluster(&[(address.as_str(), "node-2")]).followed_by(Some(&state));
    }
    let (next, delta) = old.advance(&state, "node-2");
    assert_eq!(
        contents(&next),
        contents(&NodeView::for_node(
            &state,
            "node-2",
            EndpointForm::Filtered
        ))
    );
    assert_eq!(delta.upserted_endpoints.len(), 1);
    assert!(
        delta.upserted_services.is_empty(),
        "the Service did not change"
    );
}

#[test]
fn new_service_cidrs_alone_make_a_delta_that_carries_them_to_every_node() {
    let before = with_node_1(None);
    let mut extended = with_node_1(None);
    extended.service_cidrs = Arc::new(vec!["10.96.0.0/16".into(), "10.100.0.0/24".into()]);
    for node in ["node-1", "node-9"] {
        let delta = Delta::between(
            &NodeView::for_node(&before, node, EndpointForm::Filtered),
            &NodeView::for_node(&extended, node, EndpointForm::Filtered),
        );
        assert_eq!(
            delta.node_status.map(|status| status.service_cidrs),
            Some(vec!["10.96.0.0/16".to_owned(), "10.100.0.0/24".to_owned()]),
            "{node}"
        );
    }
}

/// What an agent holding `view` presents when it subscribes: the digest of each resource.
fn held(view: &NodeView) -> HeldDigests {
    HeldDigests {
        services: SortedDigests::of(
            view.services()
                .iter()
                .map(|(key, service)| (key.clone(), splitproxy_proto::digest(&**service)))
                .collect(),
        ),
        endpoints: SortedDigests::of(
            view.endpoints()
                .map(|(key, endpoints)| (key.clone(), splitproxy_proto::digest(&**endpoints)))
                .collect(),
        ),
    }
}

/// What an agent holding `view` presents by summary (protocol rule 11): its sums per bucket,
/// computed from the digests as an agent does.
fn summarized(view: &NodeView) -> Vec<u64> {
    let mut summary = pb::HeldSummary::with_buckets(splitproxy_proto::SUMMARY_BUCKETS);
    let all = held(view);
    for ((namespace, name), digest) in all.services.0.iter().chain(&all.endpoints.0) {
        summary.add(namespace, name, *digest);
    }
    summary.bucket_sums
}

#[test]
fn a_delta_from_a_summary_replaces_the_buckets_that_changed_and_nothing_else() {
    let before = cluster(&[("10.244.1.2", "node-1"), ("10.244.2.2", "node-2")]);
    let after = cluster(&[("10.244.1.2", "node-1"), ("10.244.2.3", "node-2")]);
    let (old, new) = (
        NodeView::for_node(&before, "node-3", EndpointForm::Filtered),
        NodeView::for_node(&after, "node-3", EndpointForm::Filtered),
    );

    // An agent holding the view itself: every sum matches, and it is sent only the status.
    let status_only = Delta::from_summary(&summarized(&new), &new, &after.digests);
    assert_eq!(
        status_only,
        Delta {
            node_status: new.status().cloned(),
            ..Delta::default()
        }
    );
    assert!(status_only.node_status.is_some());

    // An agent holding the old view: the changed Service's bucket is replaced, with everything
    // the view holds in it (the Service shares its endpoints' key, so it comes along).
    let delta = Delta::from_summary(&summarized(&old), &new, &after.digests);
    let ((namespace, name), web) = new.endpoints().next().expect("web");
    let bucket = splitproxy_proto::bucket_of(namespace, name, splitproxy_proto::SUMMARY_BUCKETS);
    assert_eq!(
        delta.replaced_buckets,
        Some(pb::ReplacedBuckets {
            bucket_count: u32::try_from(splitproxy_proto::SUMMARY_BUCKETS).expect("small"),
            buckets: vec![u32::try_from(bucket).expect("small")],
        })
    );
    assert_eq!(delta.upserted_endpoints, [Arc::clone(web)]);
    assert_eq!(delta.upserted_services.len(), 1);
    assert!(delta.removed_services.is_empty() && delta.removed_endpoints.is_empty());
    assert!(delta.node_status.is_some());
}

#[test]
fn a_summary_without_a_power_of_two_of_buckets_up_to_65536_is_ignored() {
    let subscribe = |buckets: usize, held: Vec<pb::ResourceDigest>| pb::Subscribe {
        summary: Some(pb::HeldSummary {
            bucket_sums: vec![0; buckets],
        }),
        held,
        ..Default::default()
    };
    for buckets in [0, 3, (1 << 16) + 1, 1 << 17] {
        assert_eq!(
            Held::from_subscribe(&mut subscribe(buckets, Vec::new())),
            None,
            "{buckets} buckets and no digests: the agent gets a reset"
        );
    }
    let digest = pb::ResourceDigest {
        kind: pb::ResourceKind::Service as i32,
        key: Some(pb::ObjectKey {
            namespace: "demo".into(),
            name: "web".into(),
        }),
        sha256_prefix: 7,
    };
    assert!(matches!(
        Held::from_subscribe(&mut subscribe(3, vec![digest.clone()])),
        Some(Held::Digests(_))
    ));
    assert_eq!(
        Held::from_subscribe(&mut subscribe(1 << 16, vec![digest])),
        Some(Held::Summary(vec![0; 1 << 16])),
        "a summary wins over digests"
    );
}

#[test]
fn deltas_from_digests_use_the_digests_shared_by_every_node_of_a_state() {
    let before = cluster(&[("10.244.1.2", "node-1"), ("10.244.2.2", "node-2")]);
    let after = cluster(&[("10.244.1.2", "node-1"), ("10.244.2.3", "node-2")]);
    let forms = [EndpointForm::Filtered, EndpointForm::Cluster];
    for (node, form) in ["node-1", "node-3"]
        .into_iter()
        .flat_map(|node| forms.map(|form| (node, form)))
    {
        let old = NodeView::for_node(&before, node, form);
        let new = NodeView::for_node(&after, node, form);

        // The digests of `after`'s entries; filtered, node-1 sees its own endpoints (not
        // shared).
        let delta = Delta::from_digests(&held(&old), &new, &after.digests);
        assert!(delta.upserted_services.is_empty(), "{node}: {delta:?}");
        assert_eq!(
            delta.upserted_endpoints,
            [Arc::clone(new.endpoints().next().expect("web").1)],
            "{node}"
        );
        // Nothing changed for an agent that holds the new view.
        let none = Delta::from_digests(&held(&new), &new, &after.digests);
        assert!(none.upserted_services.is_empty() && none.upserted_endpoints.is_empty());
        assert!(none.removed_services.is_empty() && none.removed_endpoints.is_empty());

        // Digests computed for another state's entries are not taken for these.
        let stale = SharedDigests::default();
        let _ = Delta::from_digests(&held(&old), &old, &stale);
        assert_eq!(
            Delta::from_digests(&held(&old), &new, &stale),
            delta,
            "{node}"
        );
    }
    // Computed once for the state: the Service and its endpoints in cluster form, and, as
    // filtered nodes resumed, the plain set.
    let shared = after.digests.computed.get().expect("computed");
    assert_eq!(shared.by_address.len(), 2);
    assert_eq!(
        shared.filtered.get().map(std::collections::HashMap::len),
        Some(1)
    );
}

#[test]
fn a_state_only_agents_deriving_locality_resume_from_hashes_no_filtered_set() {
    let state = cluster(&[("10.244.1.2", "node-1"), ("10.244.2.2", "node-2")]);
    let view = NodeView::for_node(&state, "node-1", EndpointForm::Cluster);
    let delta = Delta::from_summary(&[0; 4], &view, &state.digests);
    assert_eq!(delta.upserted_endpoints.len(), 1);
    let _ = Delta::from_digests(&held(&view), &view, &state.digests);
    let shared = state.digests.computed.get().expect("computed");
    assert!(shared.filtered.get().is_none());
}

/// A cluster of 300 Services with endpoints spread pseudo-randomly (from `seed`) over node-0 to
/// node-7 and nowhere, some not ready, some with zone or node hints, and nodes in two zones.
fn scattered(seed: u64) -> ClusterState {
    let mut next = seed;
    let mut roll = |n: u64| {
        next = next
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (next >> 33) % n
    };
    let mut services = BTreeMap::new();
    let mut endpoints = BTreeMap::new();
    for i in 0..300u32 {
        let key: Key = ("demo".into(), format!("s{i}"));
        services.insert(
            key.clone(),
            pb::Service {
                key: Some(object_key(&key)),
                ..Default::default()
            },
        );
        let hinting = roll(4);
        let backends: Vec<pb::Endpoint> = (0..roll(5))
            .map(|j| {
                let node = match roll(9) {
                    8 => String::new(),
                    n => format!("node-{n}"),
                };
                let mut backend = ready_backend(format!("10.244.{i}.{j}"), &node);
                if roll(5) == 0
                    && let Some(c) = backend.conditions.as_mut()
                {
                    c.ready = false;
                }
                match hinting {
                    1 => {
                        backend.for_zones.push(format!("zone-{}", roll(2)));
                    }
                    2 => {
                        backend.for_nodes.push(format!("node-{}", roll(8)));
                    }
                    _ => {}
                }
                backend
            })
            .collect();
        insert_http_backends(&mut endpoints, &key, backends);
    }
    let nodes = (0..8)
        .map(|n| {
            let info = NodeInfo {
                topology: NodeTopology {
                    zone: format!("zone-{}", n % 2),
                },
                ..NodeInfo::default()
            };
            (format!("node-{n}"), info)
        })
        .collect();
    ClusterState::of(services, endpoints, nodes)
}

#[test]
fn first_views_from_the_placement_index_equal_those_from_every_endpoint() {
    for seed in 1..=20 {
        let state = scattered(seed);
        // The same state with an index of other endpoints: its views look at every endpoint.
        let mut unindexed = state.clone();
        unindexed.placement = Arc::default();
        assert!(
            unindexed
                .placement
                .candidates(&Arc::default(), "node-0")
                .is_some()
        );
        let mut own_seen = 0;
        for node in (0..9).map(|n| format!("node-{n}")) {
            let indexed = NodeView::for_node(&state, &node, EndpointForm::Filtered);
            let scanned = NodeView::for_node(&unindexed, &node, EndpointForm::Filtered);
            assert_eq!(indexed.own, scanned.own, "seed {seed}, {node}");
            own_seen += indexed.own.len();
        }
        assert!(
            own_seen > 0,
            "seed {seed}: no node had endpoints of its own"
        );
    }
}

#[test]
fn a_placement_index_built_from_the_state_befores_equals_one_built_afresh() {
    for seed in 1..=10 {
        let nodes: Vec<String> = (0..9).map(|n| format!("node-{n}")).collect();
        let before = scattered(seed);
        for node in &nodes {
            assert!(
                before
                    .placement
                    .candidates(&before.endpoints, node)
                    .is_some()
            );
        }
        let mut after = scattered(seed + 100);
        // Some Services lose their endpoints, and one that had none gains some.
        let endpoints = Arc::make_mut(&mut after.endpoints);
        for i in (0..300).step_by(7) {
            endpoints.remove(&("demo".to_owned(), format!("s{i}")));
        }
        let (key, backends) = endpoints.get_min().cloned().expect("endpoints left");
        endpoints.insert(("demo".to_owned(), "new".to_owned()), backends);
        endpoints.remove(&key);
        let after = after.followed_by(Some(&before));
        assert!(!after.placement.built_alone(), "seeded, not built yet");

        let fresh = crate::placement::Placement::default();
        let mut singled_out = 0;
        for node in &nodes {
            let carried: Vec<&Key> = (after.placement.candidates(&after.endpoints, node))
                .expect("indexed")
                .collect();
            let built: Vec<&Key> = (fresh.candidates(&after.endpoints, node))
                .expect("indexed")
                .collect();
            assert_eq!(carried, built, "seed {seed}, {node}");
            singled_out += built.len();
        }
        assert!(singled_out > 0, "seed {seed}: no node singled out");
        assert!(
            after.placement.built_alone(),
            "seed {seed}: the state before's index is dropped once this one is built"
        );
    }
}

#[test]
fn held_digests_are_sorted_once_each_and_entries_without_key_or_kind_skipped() {
    let entry = |kind: pb::ResourceKind, name: Option<&str>, digest| pb::ResourceDigest {
        kind: kind as i32,
        key: name.map(|name| pb::ObjectKey {
            namespace: "demo".into(),
            name: name.into(),
        }),
        sha256_prefix: digest,
    };
    let held = HeldDigests::from_subscribe(vec![
        entry(pb::ResourceKind::Service, Some("b"), 2),
        entry(pb::ResourceKind::Endpoints, Some("b"), 20),
        entry(pb::ResourceKind::Service, Some("a"), 1),
        entry(pb::ResourceKind::Service, Some("b"), 3),
        entry(pb::ResourceKind::Service, None, 4),
        entry(pb::ResourceKind::Unspecified, Some("c"), 5),
    ])
    .expect("digests listed");
    let key = |name: &str| ("demo".to_owned(), name.to_owned());
    assert_eq!(held.services.0, [(key("a"), 1), (key("b"), 2)]);
    assert_eq!(held.endpoints.0, [(key("b"), 20)]);
    assert_eq!(held.services.get(&key("b")), Some(&2));
    assert_eq!(held.services.get(&key("c")), None);
    assert_eq!(HeldDigests::from_subscribe(Vec::new()), None);
}

/// What an agent holding `view` holds: the encoding of each Service (`false`) and endpoint set
/// (`true`), by key.
type Holdings = BTreeMap<(bool, Key), Vec<u8>>;

fn holdings(view: &NodeView) -> Holdings {
    use prost::Message;
    let services =
        (view.services().iter()).map(|(key, s)| ((false, key.clone()), s.encode_to_vec()));
    let endpoints = (view.endpoints()).map(|(key, e)| ((true, key.clone()), e.encode_to_vec()));
    services.chain(endpoints).collect()
}

/// An agent's summary of `held` in `buckets` buckets, from the bytes it holds.
fn summary_of(held: &Holdings, buckets: usize) -> Vec<u64> {
    let mut summary = pb::HeldSummary::with_buckets(buckets);
    for ((_, (namespace, name)), bytes) in held {
        summary.add(namespace, name, splitproxy_proto::digest_of_encoding(bytes));
    }
    summary.bucket_sums
}

/// `delta` applied as an agent does: the replaced buckets emptied first, then the upserts.
fn apply(held: &mut Holdings, delta: &Delta) {
    use prost::Message;
    if let Some(replaced) = &delta.replaced_buckets {
        let set = replaced.to_set().expect("a valid bucket count");
        held.retain(|(_, (namespace, name)), _| !set.contains(namespace, name));
    }
    let key = |key: &Option<pb::ObjectKey>| {
        let key = key.as_ref().expect("keyed");
        (key.namespace.clone(), key.name.clone())
    };
    for service in &delta.upserted_services {
        held.insert((false, key(&service.key)), service.encode_to_vec());
    }
    for endpoints in &delta.upserted_endpoints {
        held.insert((true, key(&endpoints.key)), endpoints.encode_to_vec());
    }
    assert!(delta.removed_services.is_empty() && delta.removed_endpoints.is_empty());
}

#[test]
fn a_delta_from_a_summary_brings_any_held_view_to_the_node_view() {
    for seed in 1..=6 {
        // Two unrelated states of the same 300 Services, seen by nodes with endpoints of their
        // own, hinted ones, and none (node-8 runs nothing).
        let (before, after) = (scattered(seed), scattered(seed + 100));
        let forms = [EndpointForm::Filtered, EndpointForm::Cluster];
        for (node, form) in (0..9)
            .map(|n| format!("node-{n}"))
            .flat_map(|node| forms.map(|form| (node.clone(), form)))
        {
            let (old, new) = (
                NodeView::for_node(&before, &node, form),
                NodeView::for_node(&after, &node, form),
            );
            for buckets in [16, splitproxy_proto::SUMMARY_BUCKETS] {
                let context = format!("seed {seed}, {node}, {form:?}, {buckets} buckets");
                let up_to_date = summary_of(&holdings(&new), buckets);
                let none = Delta::from_summary(&up_to_date, &new, &after.digests);
                assert_eq!(none.replaced_buckets, None, "{context}");
                assert!(none.upserted_services.is_empty(), "{context}");
                assert!(none.upserted_endpoints.is_empty(), "{context}");

                let mut held = holdings(&old);
                let summary = summary_of(&held, buckets);
                let delta = Delta::from_summary(&summary, &new, &after.digests);
                // The same from digests computed for this view alone.
                let alone = Delta::from_summary(&summary, &new, &SharedDigests::default());
                assert_eq!(alone, delta, "{context}");
                apply(&mut held, &delta);
                assert_eq!(held, holdings(&new), "{context}");
            }
        }
        // The plain sums are computed once per state and bucket count.
        let shared = after.digests.computed.get().expect("computed");
        let counted = shared.summaries.iter().filter(|s| s.get().is_some());
        assert_eq!(counted.count(), 2, "seed {seed}");
    }
}

#[test]
fn a_state_takes_the_digests_and_bucket_keys_of_the_last_state_whose_digests_were_computed() {
    let before = scattered(3);
    let (node, buckets) = ("node-1", splitproxy_proto::SUMMARY_BUCKETS);
    let old = NodeView::for_node(&before, node, EndpointForm::Filtered);
    let mut held = holdings(&old);
    let summary = summary_of(&held, buckets);
    let _ = Delta::from_summary(&summary, &old, &before.digests);

    // One Service loses an endpoint; every other entry is shared with `before`.
    let (key, backends) = (before.endpoints.iter())
        .find(|(_, b)| b.ports().iter().any(|p| p.endpoints.len() > 1))
        .expect("a Service with two endpoints");
    let mut ports = backends.ports().to_vec();
    for port in &mut ports {
        port.endpoints.truncate(1);
    }
    let mut after = before.clone();
    Arc::make_mut(&mut after.endpoints).insert(
        key.clone(),
        Arc::new(ServiceBackends::new(key, ports, None)),
    );
    // A state nobody resumed from in between: the one after takes `before`'s digests.
    let between = before.clone().followed_by(Some(&before));
    let after = after.followed_by(Some(&between));
    assert!(between.digests.computed.get().is_none());

    let new = NodeView::for_node(&after, node, EndpointForm::Filtered);
    let delta = Delta::from_summary(&summary, &new, &after.digests);
    let alone = Delta::from_summary(&summary, &new, &SharedDigests::default());
    assert_eq!(delta, alone);
    assert!(!delta.upserted_endpoints.is_empty());
    apply(&mut held, &delta);
    assert_eq!(held, holdings(&new));

    let (was, now) = (
        before.digests.computed.get().expect("computed"),
        after.digests.computed.get().expect("computed"),
    );
    let fresh = Digests::compute(&after.services, &after.endpoints, None);
    assert_eq!(now.by_address, fresh.by_address);
    let keys = |digests: &Digests| {
        let at = buckets.trailing_zeros() as usize;
        Arc::clone(&digests.summaries[at].get().expect("summed").keys)
    };
    assert!(Arc::ptr_eq(&keys(was), &keys(now)));
    // The state before is let go once these are computed.
    assert!(after.digests.seed.lock().expect("not poisoned").is_none());
}
