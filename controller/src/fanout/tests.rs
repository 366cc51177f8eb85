use super::*;
use crate::{resources::ServiceBackends, testing::ready_backend};
use splitproxy_proto::v1alpha1::node_view_service_client::NodeViewServiceClient;
use std::collections::BTreeMap;

fn key(name: &str) -> pb::ObjectKey {
    pb::ObjectKey {
        namespace: "demo".into(),
        name: name.into(),
    }
}

/// A cluster of `services` Services named s0, s1, …, each with one endpoint `10.244.1.<n>`.
fn cluster(services: usize, endpoint_host: u8) -> ClusterState {
    let mut converted = BTreeMap::new();
    let mut endpoints = BTreeMap::new();
    for i in 0..services {
        let name = format!("s{i}");
        let k = ("demo".to_owned(), name.clone());
        converted.insert(
            k.clone(),
            pb::Service {
                key: Some(key(&name)),
                cluster_ips: vec![format!("10.96.{}.{}", i / 250, i % 250 + 1)],
                ports: vec![pb::ServicePort {
                    name: String::new(),
                    protocol: pb::Protocol::Tcp as i32,
                    port: 80,
                    node_port: 0,
                }],
                ..Default::default()
            },
        );
        let ports = vec![pb::PortEndpoints {
            port_name: String::new(),
            protocol: pb::Protocol::Tcp as i32,
            endpoints: vec![ready_backend(format!("10.244.1.{endpoint_host}"), "node-1")],
        }];
        endpoints.insert(k.clone(), ServiceBackends::new(&k, ports, None));
    }
    ClusterState::of(converted, endpoints, BTreeMap::new())
}

/// `parts` as an agent decodes them.
fn decoded(parts: Vec<wire::SyncResponse>) -> Vec<pb::SyncResponse> {
    (parts.iter())
        .map(|part| pb::SyncResponse::decode(&*part.encode_to_vec()).expect("decodes"))
        .collect()
}

/// The resources of `parts`, in order: (kind, name).
fn resources(parts: &[pb::SyncResponse]) -> Vec<(&'static str, String)> {
    let name = |key: &Option<pb::ObjectKey>| key.as_ref().map_or(String::new(), |k| k.name.clone());
    parts
        .iter()
        .flat_map(|p| {
            let services = p
                .upserted_services
                .iter()
                .map(|s| ("service", name(&s.key)));
            let endpoints = p
                .upserted_endpoints
                .iter()
                .map(|e| ("endpoints", name(&e.key)));
            services.chain(endpoints).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn large_revisions_are_split_by_size_and_only_the_last_part_is_complete() {
    let view = NodeView::for_node(&cluster(10_000, 2), "node-1", EndpointForm::Filtered);
    let delta = Delta::between(&NodeView::default(), &view);
    let everything = resources(&decoded(split(
        delta.clone(),
        "e",
        7,
        true,
        &Encodings::default(),
        EndpointSets::InPieces,
    )));
    let parts = decoded(split(
        delta,
        "e",
        7,
        true,
        &Encodings::default(),
        EndpointSets::InPieces,
    ));

    assert!(parts.len() >= 3, "{} parts", parts.len());
    for part in &parts {
        // The budget, and a header of a few bytes.
        assert!(
            part.encoded_len() <= MAX_MESSAGE_BYTES + 64,
            "{}",
            part.encoded_len()
        );
    }
    // Filled up: each part but the last holds more than the budget less one resource.
    for part in &parts[..parts.len() - 1] {
        assert!(
            part.encoded_len() > MAX_MESSAGE_BYTES - 200,
            "{}",
            part.encoded_len()
        );
    }
    assert_eq!(everything.len(), 20_000);
    assert_eq!(
        resources(&parts),
        everything,
        "every resource once, in order"
    );
    assert!(
        parts
            .iter()
            .all(|p| p.revision == 7 && p.reset && p.controller_epoch == "e")
    );
    let complete: Vec<bool> = parts.iter().map(|p| p.complete).collect();
    assert_eq!(complete.iter().filter(|c| **c).count(), 1);
    assert_eq!(complete.last(), Some(&true));
}

/// Endpoints `a` (one), `huge` (30,000 behind two ports) and `z` (one), as a delta upserts them.
fn delta_with_a_huge_set() -> (Delta, pb::ServiceEndpoints) {
    let endpoints = |name: &str, count: usize| pb::ServiceEndpoints {
        key: Some(key(name)),
        ports: ["http", "https"]
            .map(|port_name| pb::PortEndpoints {
                port_name: port_name.into(),
                protocol: pb::Protocol::Tcp as i32,
                endpoints: (0..count)
                    .map(|i| pb::Endpoint {
                        address: format!("10.{}.{}.{}", i / 65_536, i / 256 % 256, i % 256),
                        port: 8080,
                        ..Default::default()
                    })
                    .collect(),
            })
            .into(),
        last_change_trigger_time: None,
        cluster_form: true,
    };
    let huge = endpoints("huge", 30_000);
    assert!(huge.encoded_len() > 20 * MAX_MESSAGE_BYTES);
    let delta = Delta {
        upserted_endpoints: vec![
            Arc::new(endpoints("a", 1)),
            Arc::new(huge.clone()),
            Arc::new(endpoints("z", 1)),
        ],
        ..Delta::default()
    };
    (delta, huge)
}

/// `delta` as the parts of a delta revision, as an agent decodes them.
fn delta_parts(delta: Delta, sets: EndpointSets) -> Vec<pb::SyncResponse> {
    decoded(split(delta, "e", 1, false, &Encodings::default(), sets))
}

#[test]
fn a_set_bigger_than_a_message_goes_in_pieces_each_in_a_message_of_its_own() {
    let (delta, huge) = delta_with_a_huge_set();
    let parts = delta_parts(delta, EndpointSets::InPieces);

    assert!(parts.len() > 20, "{} parts", parts.len());
    let mut assembled: Option<pb::ServiceEndpoints> = None;
    for (i, part) in parts.iter().enumerate() {
        assert!(
            part.encoded_len() <= MAX_MESSAGE_BYTES + 64,
            "part {i}: {}",
            part.encoded_len()
        );
        assert!(part.appended_endpoints.len() <= 1, "part {i} appends twice");
        for upserted in &part.upserted_endpoints {
            if upserted.key == huge.key {
                assert!(assembled.is_none(), "huge upserted twice");
                assembled = Some(upserted.clone());
            }
        }
        for piece in &part.appended_endpoints {
            assert_eq!(piece.key, huge.key);
            let whole = assembled.as_mut().expect("a piece after the upsert");
            splitproxy_proto::pieces::append(whole, piece);
        }
    }
    assert_eq!(assembled.as_ref(), Some(&huge), "the pieces make the set");
    let first = resources(&parts[..1]);
    assert_eq!(
        first,
        [
            ("endpoints", "a".to_owned()),
            ("endpoints", "huge".to_owned())
        ]
    );
    let last = parts.last().expect("parts");
    assert!(
        last.upserted_endpoints
            .iter()
            .any(|e| e.key == Some(key("z")))
    );
}

#[test]
fn to_an_agent_without_pieces_a_set_bigger_than_a_message_goes_whole_and_alone() {
    let (delta, _) = delta_with_a_huge_set();
    let parts = delta_parts(delta, EndpointSets::Whole);

    let names: Vec<Vec<String>> = parts
        .iter()
        .map(|p| {
            resources(std::slice::from_ref(p))
                .into_iter()
                .map(|(_, n)| n)
                .collect()
        })
        .collect();
    assert_eq!(names, [vec!["a"], vec!["huge"], vec!["z"]]);
    assert!(parts.iter().all(|p| p.appended_endpoints.is_empty()));
}

#[test]
fn an_empty_reset_is_one_complete_message() {
    let parts = decoded(split(
        Delta::default(),
        "e",
        1,
        true,
        &Encodings::default(),
        EndpointSets::InPieces,
    ));
    assert_eq!(parts.len(), 1);
    assert!(parts[0].complete && parts[0].reset);
}

/// A controller serving whatever the test publishes, on a loopback port.
struct Harness {
    tx: watch::Sender<Published>,
    url: String,
}

impl Harness {
    /// Publishes `state` as the successor of the current one, as the source does.
    fn publish(&self, state: ClusterState) {
        self.tx.send_modify(|current| {
            *current = Some(Arc::new(state.followed_by(current.as_deref())));
        });
    }
}

async fn harness(initial: Option<ClusterState>) -> Harness {
    harness_recording(initial, Metrics::default()).await
}

async fn harness_recording(initial: Option<ClusterState>, metrics: Metrics) -> Harness {
    harness_of(initial, |fanout| fanout.with_metrics(metrics)).await
}

/// A server of `initial` (and what is published after), as `configure` makes it.
async fn harness_of(
    initial: Option<ClusterState>,
    configure: impl FnOnce(FanOut) -> FanOut,
) -> Harness {
    let (tx, rx) = watch::channel(initial.map(Arc::new));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(configure(FanOut::new(rx)).into_service())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    Harness { tx, url }
}

/// A request stream that opens with `subscribe`, and its sender for the acks.
async fn subscription(
    subscribe: pb::Subscribe,
) -> (
    mpsc::Sender<pb::SyncRequest>,
    tokio_stream::wrappers::ReceiverStream<pb::SyncRequest>,
) {
    let (tx, rx) = mpsc::channel(4);
    tx.send(pb::SyncRequest {
        kind: Some(sync_request::Kind::Subscribe(subscribe)),
    })
    .await
    .expect("queue subscribe");
    (tx, tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// One raw agent stream.
struct Agent {
    tx: mpsc::Sender<pb::SyncRequest>,
    rx: Streaming<pb::SyncResponse>,
    /// Whether the controller said it reads summaries (protocol rule 11).
    reads_summary: bool,
}

impl Agent {
    async fn subscribe(url: &str, resume: Option<pb::ResumePoint>) -> Self {
        Self::subscribe_holding(url, resume, Vec::new()).await
    }

    async fn subscribe_holding(
        url: &str,
        resume: Option<pb::ResumePoint>,
        held: Vec<pb::ResourceDigest>,
    ) -> Self {
        Self::subscribe_with(
            url,
            pb::Subscribe {
                node_name: "node-1".into(),
                resume,
                held,
                ..Default::default()
            },
        )
        .await
    }

    async fn subscribe_with(url: &str, subscribe: pb::Subscribe) -> Self {
        let (tx, rx) = subscription(subscribe).await;
        let mut client = NodeViewServiceClient::connect(url.to_owned())
            .await
            .expect("connect");
        let response = client.sync(rx).await.expect("stream");
        let reads_summary = response
            .metadata()
            .contains_key(splitproxy_proto::READS_SUMMARY);
        Self {
            tx,
            rx: response.into_inner(),
            reads_summary,
        }
    }

    async fn next(&mut self) -> pb::SyncResponse {
        tokio::time::timeout(Duration::from_secs(30), self.rx.message())
            .await
            .expect("a message within 30 s")
            .expect("stream open")
            .expect("a message")
    }

    /// The messages of one revision; its last.
    async fn whole(&mut self) -> pb::SyncResponse {
        loop {
            let message = self.next().await;
            if message.complete {
                return message;
            }
        }
    }

    async fn answer(&self, revision: u64, status: pb::AckStatus) {
        let ack = pb::Ack {
            revision,
            status: status as i32,
            reason: String::new(),
        };
        self.tx
            .send(pb::SyncRequest {
                kind: Some(sync_request::Kind::Ack(ack)),
            })
            .await
            .expect("send ack");
    }
}

#[tokio::test]
async fn first_revision_is_a_reset_and_later_ones_are_deltas_from_the_acknowledged_view() {
    let h = harness(Some(cluster(2, 2))).await;
    let mut agent = Agent::subscribe(&h.url, None).await;
    let first = agent.next().await;
    assert!(first.reset && first.complete);
    assert_eq!(first.upserted_services.len(), 2);
    agent.answer(first.revision, pb::AckStatus::Applied).await;

    h.publish(cluster(1, 3));
    let second = agent.next().await;
    assert!(!second.reset && second.complete);
    assert_eq!(second.revision, first.revision + 1);
    assert_eq!(second.removed_services, [key("s1")]);
    assert!(second.upserted_services.is_empty());
    assert_eq!(second.upserted_endpoints.len(), 1);
}

#[tokio::test]
async fn changes_during_an_unacknowledged_revision_are_compacted_into_one_delta() {
    let h = harness(Some(cluster(1, 2))).await;
    let mut agent = Agent::subscribe(&h.url, None).await;
    let first = agent.next().await;
    for host in 3..10 {
        h.publish(cluster(1, host));
    }
    agent.answer(first.revision, pb::AckStatus::Applied).await;
    let second = agent.next().await;
    assert_eq!(second.revision, first.revision + 1);
    let address = &second.upserted_endpoints[0].ports[0].endpoints[0].address;
    assert_eq!(address, "10.244.1.9", "only the newest state is sent");
}

#[tokio::test]
async fn a_rejected_view_is_held_back_and_a_changed_one_goes_at_once_from_the_acknowledged_view() {
    let h = harness(Some(cluster(1, 2))).await;
    let mut agent = Agent::subscribe(&h.url, None).await;
    let first = agent.next().await;
    agent.answer(first.revision, pb::AckStatus::Rejected).await;
    let resent = tokio::time::timeout(Duration::from_millis(500), agent.rx.message()).await;
    assert!(
        resent.is_err(),
        "the rejected view went again at once: {resent:?}"
    );

    h.publish(cluster(1, 3));
    let changed = agent.next().await;
    assert!(
        changed.reset,
        "nothing was acknowledged, so the changed view is a reset"
    );
    assert_eq!(changed.revision, first.revision + 1);
    assert_eq!(first_address(&changed), "10.244.1.3");
}

#[test]
fn each_rejection_in_a_row_doubles_the_wait_before_a_view_goes_again_as_it_is() {
    let view = Arc::new(NodeView::default());
    let mut rejected = None;
    let mut waits = Vec::new();
    for _ in 0..6 {
        let next = RejectedView::after(rejected.take(), Arc::clone(&view));
        waits.push(next.backoff.as_secs());
        rejected = Some(next);
    }
    assert_eq!(waits, [30, 60, 120, 240, 300, 300]);
}

/// An agent that pipelines (protocol rule 12), subscribing with nothing held.
async fn pipelining_agent(url: &str) -> Agent {
    Agent::subscribe_with(
        url,
        pb::Subscribe {
            node_name: "node-1".into(),
            capabilities: Some(pb::Capabilities {
                pipelining: true,
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await
}

/// The address of the first endpoint a revision upserts.
fn first_address(revision: &pb::SyncResponse) -> &str {
    &revision.upserted_endpoints[0].ports[0].endpoints[0].address
}

#[tokio::test]
async fn an_agent_that_pipelines_gets_revisions_in_flight_up_to_the_bound_and_one_ack_answers_all()
{
    let h = harness(Some(cluster(1, 2))).await;
    let mut agent = pipelining_agent(&h.url).await;
    let first = agent.next().await;
    assert!(first.reset && first.complete);
    assert_eq!(first.base_revision, 0, "a reset builds on nothing");

    let mut newest = first;
    for host in 3..u8::try_from(PIPELINED_REVISIONS + 2).expect("small") {
        h.publish(cluster(1, host));
        let delta = agent.next().await;
        assert!(!delta.reset && delta.complete);
        assert_eq!(delta.revision, newest.revision + 1);
        assert_eq!(
            delta.base_revision, newest.revision,
            "built on the view sent"
        );
        assert_eq!(first_address(&delta), format!("10.244.1.{host}"));
        newest = delta;
    }

    // As many in flight as allowed: the next change waits for an answer.
    h.publish(cluster(1, 99));
    let waiting = tokio::time::timeout(Duration::from_millis(500), agent.rx.message()).await;
    assert!(
        waiting.is_err(),
        "a revision beyond the bound went out: {waiting:?}"
    );

    agent.answer(newest.revision, pb::AckStatus::Applied).await;
    let after = agent.next().await;
    assert_eq!(after.revision, newest.revision + 1);
    assert_eq!(
        after.base_revision, newest.revision,
        "the ack of the newest answered the ones before it"
    );
    assert_eq!(first_address(&after), "10.244.1.99");
}

#[tokio::test]
async fn a_rejection_drops_every_revision_in_flight_and_the_next_builds_on_the_acknowledged_one() {
    let h = harness(Some(cluster(1, 2))).await;
    let mut agent = pipelining_agent(&h.url).await;
    let first = agent.next().await;
    agent.answer(first.revision, pb::AckStatus::Applied).await;
    h.publish(cluster(1, 3));
    let second = agent.next().await;
    h.publish(cluster(1, 4));
    let third = agent.next().await;
    assert_eq!(
        (second.base_revision, third.base_revision),
        (first.revision, second.revision)
    );

    agent.answer(third.revision, pb::AckStatus::Rejected).await;
    // The NACK travels asynchronously; the change after it is what the next revision brings.
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.publish(cluster(1, 5));
    let retry = agent.next().await;
    assert!(!retry.reset, "the first revision was acknowledged");
    assert_eq!(retry.revision, third.revision + 1);
    assert_eq!(retry.base_revision, first.revision);
    assert_eq!(first_address(&retry), "10.244.1.5");
}

#[tokio::test]
async fn an_agent_resuming_from_its_acknowledged_revision_gets_a_delta() {
    let h = harness(Some(cluster(2, 2))).await;
    let mut agent = Agent::subscribe(&h.url, None).await;
    let first = agent.next().await;
    agent.answer(first.revision, pb::AckStatus::Applied).await;
    // The ack travels asynchronously; a fresh stream shows when it has been recorded.
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(agent);

    let resume = pb::ResumePoint {
        controller_epoch: first.controller_epoch.clone(),
        revision: first.revision,
    };
    let mut resumed = Agent::subscribe(&h.url, Some(resume)).await;
    h.publish(cluster(2, 3));
    let next = resumed.next().await;
    assert!(
        !next.reset,
        "resume from the acknowledged revision must not reset"
    );
    assert!(next.upserted_services.is_empty());
    assert_eq!(next.upserted_endpoints.len(), 2);

    let stale = pb::ResumePoint {
        controller_epoch: "other".into(),
        revision: first.revision,
    };
    let mut stranger = Agent::subscribe(&h.url, Some(stale)).await;
    assert!(stranger.next().await.reset, "an unknown epoch gets a reset");
}

/// The digests an agent holding `reset`'s resources presents.
fn digests_of(reset: &pb::SyncResponse) -> Vec<pb::ResourceDigest> {
    let entry = |kind: pb::ResourceKind, key: &Option<pb::ObjectKey>, digest| pb::ResourceDigest {
        kind: kind as i32,
        key: key.clone(),
        sha256_prefix: digest,
    };
    let services = reset.upserted_services.iter().map(|s| {
        entry(
            pb::ResourceKind::Service,
            &s.key,
            splitproxy_proto::digest(s),
        )
    });
    let endpoints = reset.upserted_endpoints.iter().map(|e| {
        entry(
            pb::ResourceKind::Endpoints,
            &e.key,
            splitproxy_proto::digest(e),
        )
    });
    services.chain(endpoints).collect()
}

#[tokio::test]
async fn an_agent_moving_to_another_replica_gets_a_delta_from_its_digests() {
    let first_replica = harness(Some(cluster(3, 2))).await;
    let mut agent = Agent::subscribe(&first_replica.url, None).await;
    let held = agent.next().await;
    assert!(held.reset);

    // The other replica has seen s2 go and every endpoint move; it never served this agent.
    let other_replica = harness(Some(cluster(2, 3))).await;
    let resume = pb::ResumePoint {
        controller_epoch: held.controller_epoch.clone(),
        revision: held.revision,
    };
    let mut moved =
        Agent::subscribe_holding(&other_replica.url, Some(resume), digests_of(&held)).await;
    let delta = moved.next().await;
    assert!(!delta.reset, "digests of the held state must avoid a reset");
    assert_ne!(delta.controller_epoch, held.controller_epoch);
    assert!(
        delta.upserted_services.is_empty(),
        "the Services are unchanged"
    );
    assert_eq!(delta.removed_services, [key("s2")]);
    let moved_endpoints: Vec<_> = delta
        .upserted_endpoints
        .iter()
        .map(|e| e.key.clone())
        .collect();
    assert_eq!(moved_endpoints, [Some(key("s0")), Some(key("s1"))]);
    assert!(
        delta.node_status.is_some(),
        "a delta from digests carries the status"
    );

    // Acknowledged, it is the base of the next delta like any other revision.
    moved.answer(delta.revision, pb::AckStatus::Applied).await;
    other_replica.publish(cluster(1, 3));
    let next = moved.next().await;
    assert!(!next.reset);
    assert_eq!(next.removed_services, [key("s1")]);
    assert!(next.node_status.is_none());
}

/// The bucket of the Service `name` (protocol rule 11).
fn bucket(name: &str) -> u32 {
    let bucket = splitproxy_proto::bucket_of("demo", name, splitproxy_proto::SUMMARY_BUCKETS);
    u32::try_from(bucket).expect("small")
}

/// What an agent that applied `reset` presents to another replica by summary.
fn resuming_by_summary(reset: &pb::SyncResponse) -> pb::Subscribe {
    let mut summary = pb::HeldSummary::with_buckets(splitproxy_proto::SUMMARY_BUCKETS);
    for digest in digests_of(reset) {
        let key = digest.key.expect("keyed");
        summary.add(&key.namespace, &key.name, digest.sha256_prefix);
    }
    pb::Subscribe {
        node_name: "node-1".into(),
        resume: Some(pb::ResumePoint {
            controller_epoch: reset.controller_epoch.clone(),
            revision: reset.revision,
        }),
        summary: Some(summary),
        ..Default::default()
    }
}

#[tokio::test]
async fn an_agent_whose_summary_matches_another_replicas_view_resumes_with_no_resources_sent() {
    let (first_metrics, other_metrics) = (Metrics::default(), Metrics::default());
    let first_replica = harness_recording(Some(cluster(3, 2)), first_metrics.clone()).await;
    let mut agent = Agent::subscribe(&first_replica.url, None).await;
    assert!(
        agent.reads_summary,
        "the controller says it reads summaries"
    );
    let held = agent.next().await;
    assert!(held.reset);

    let other_replica = harness_recording(Some(cluster(3, 2)), other_metrics.clone()).await;
    let mut moved = Agent::subscribe_with(&other_replica.url, resuming_by_summary(&held)).await;
    let first = moved.next().await;
    assert!(!first.reset, "a matching summary must avoid a reset");
    assert!(first.complete);
    assert_ne!(first.controller_epoch, held.controller_epoch);
    assert!(first.upserted_services.is_empty() && first.upserted_endpoints.is_empty());
    assert!(first.removed_services.is_empty() && first.removed_endpoints.is_empty());
    assert_eq!(first.replaced_buckets, None);
    assert!(first.node_status.is_some(), "it carries the status");
    // Counted by what each agent resumed from.
    let subscriptions = |metrics: &Metrics, resume| {
        let label = crate::metrics::ResumeLabel { resume };
        metrics.subscriptions.get_or_create(&label).get()
    };
    assert_eq!(subscriptions(&first_metrics, "none"), 1);
    assert_eq!(subscriptions(&other_metrics, "summary"), 1);
    assert_eq!(subscriptions(&other_metrics, "none"), 0);

    // Acknowledged, it is the base of the next delta like any other revision.
    moved.answer(first.revision, pb::AckStatus::Applied).await;
    other_replica.publish(cluster(2, 2));
    let next = moved.next().await;
    assert!(!next.reset);
    assert_eq!(next.removed_services, [key("s2")]);
}

#[tokio::test]
async fn an_agent_whose_summary_differs_gets_the_buckets_that_differ_replaced() {
    let first_replica = harness(Some(cluster(3, 2))).await;
    let mut agent = Agent::subscribe(&first_replica.url, None).await;
    let held = agent.next().await;

    // The other replica has seen s2 go and every endpoint move.
    let other_replica = harness(Some(cluster(2, 3))).await;
    let mut moved = Agent::subscribe_with(&other_replica.url, resuming_by_summary(&held)).await;
    let first = moved.next().await;
    assert!(!first.reset, "a summary must avoid a reset");
    let mut changed = vec![bucket("s0"), bucket("s1"), bucket("s2")];
    changed.sort_unstable();
    changed.dedup();
    let replaced = first.replaced_buckets.clone().expect("buckets replaced");
    assert_eq!(
        replaced.buckets, changed,
        "the buckets of the Services that changed"
    );
    // s2's bucket is replaced by nothing: the agent drops it. The others come whole.
    let upserted: Vec<_> = first
        .upserted_services
        .iter()
        .map(|s| s.key.clone())
        .collect();
    assert_eq!(upserted, [Some(key("s0")), Some(key("s1"))]);
    assert_eq!(first.upserted_endpoints.len(), 2);
    assert!(first.removed_services.is_empty());

    moved.answer(first.revision, pb::AckStatus::Applied).await;
    other_replica.publish(cluster(1, 3));
    let next = moved.next().await;
    assert!(!next.reset);
    assert_eq!(next.removed_services, [key("s1")]);
    assert_eq!(next.replaced_buckets, None);
}

#[tokio::test]
async fn an_agent_that_subscribes_before_the_first_full_read_is_told_when_to_come_back() {
    let h = harness(None).await;
    let (_requests, rx) = subscription(pb::Subscribe {
        node_name: "node-1".into(),
        ..Default::default()
    })
    .await;
    let mut client = NodeViewServiceClient::connect(h.url.clone())
        .await
        .expect("connect");
    let refused = client.sync(rx).await.expect_err("nothing read yet");
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    let retry_after = refused
        .metadata()
        .get(splitproxy_proto::RETRY_AFTER_MS)
        .and_then(|v| v.to_str().ok());
    assert_eq!(retry_after, Some("2000"));

    h.publish(cluster(2, 2));
    let mut agent = Agent::subscribe(&h.url, None).await;
    let first = agent.next().await;
    assert!(first.reset);
    assert_eq!(
        first.upserted_services.len(),
        2,
        "the first view is of the whole cluster, never an empty one"
    );
}

#[tokio::test]
async fn the_node_status_comes_with_the_reset_and_again_only_when_it_changes() {
    let eligible = |eligible: bool| -> ClusterState {
        let mut state = cluster(1, 2);
        Arc::make_mut(&mut state.nodes).insert(
            "node-1".into(),
            crate::nodes::NodeInfo {
                ineligible: (!eligible).then_some(crate::eligibility::Ineligible::ToBeDeleted),
                ..Default::default()
            },
        );
        state
    };
    let h = harness(Some(eligible(true))).await;
    let mut agent = Agent::subscribe(&h.url, None).await;
    let first = agent.next().await;
    assert!(first.reset);
    assert_eq!(first.node_status.map(|s| s.eligible), Some(true));
    agent.answer(first.revision, pb::AckStatus::Applied).await;

    h.publish(eligible(false));
    let tainted = agent.next().await;
    assert!(!tainted.reset && tainted.complete);
    assert!(tainted.upserted_services.is_empty() && tainted.upserted_endpoints.is_empty());
    assert_eq!(tainted.node_status.map(|s| s.eligible), Some(false));
    agent.answer(tainted.revision, pb::AckStatus::Applied).await;

    let mut moved = eligible(false);
    moved.endpoints = cluster(1, 3).endpoints;
    h.publish(moved);
    let endpoints_only = agent.next().await;
    assert_eq!(endpoints_only.upserted_endpoints.len(), 1);
    assert_eq!(endpoints_only.node_status, None, "unchanged, so not resent");
}

#[tokio::test]
async fn a_stream_whose_agent_stopped_reading_holds_no_replaced_cluster_state() {
    // About 3 MB: more than the stream's channel (4 messages) and HTTP/2 buffers (400 KiB) take
    // before its task parks in a send, with the agent's windows at HTTP/2's initial 64 KiB.
    let h = harness(Some(cluster(30_000, 2))).await;
    let first = h.tx.borrow().clone().expect("published");
    // One message read: the stream is sending the first state; then the agent stops reading.
    let tx = stalled_agent(&h.url, "node-1", 1).await;

    h.publish(cluster(1, 3));
    let mut holders = Arc::strong_count(&first);
    for _ in 0..50 {
        if holders == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        holders = Arc::strong_count(&first);
    }
    assert_eq!(
        holders, 1,
        "the parked stream still holds the replaced state"
    );
    drop(tx);
}

/// An agent stream with HTTP/2 windows as small as the protocol allows, that reads `messages`
/// (each part of a reset) and then stops reading; its response stream stays open.
async fn stalled_agent(url: &str, node: &str, messages: usize) -> mpsc::Sender<pb::SyncRequest> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
        .expect("url")
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .expect("connect");
    let (tx, rx) = subscription(pb::Subscribe {
        node_name: node.into(),
        ..Default::default()
    })
    .await;
    let mut responses = NodeViewServiceClient::new(channel)
        .sync(rx)
        .await
        .expect("stream")
        .into_inner();
    for _ in 0..messages {
        let message = responses.message().await.expect("stream open");
        assert!(message.is_some_and(|m| m.reset && !m.complete));
    }
    tokio::spawn(async move {
        let _unread = responses;
        std::future::pending::<()>().await;
    });
    tx
}

#[tokio::test]
async fn agents_that_stop_reading_their_first_revision_do_not_hold_up_the_others() {
    // Every first-revision slot taken by an agent that stopped reading a 3 MB reset; one more
    // agent still gets its whole reset once their slots time out.
    let h = harness(Some(cluster(30_000, 2))).await;
    let mut stalled = Vec::new();
    for index in 0..CONCURRENT_FIRST_REVISIONS {
        stalled.push(stalled_agent(&h.url, &format!("stalled-{index}"), 1).await);
    }
    let mut agent = Agent::subscribe(&h.url, None).await;
    let mut parts = 0;
    loop {
        let message = agent.next().await;
        assert!(message.reset, "the first revision is a reset");
        parts += 1;
        if message.complete {
            break;
        }
    }
    assert!(parts > 1, "a 3 MB reset comes in several messages");
    drop(stalled);
}

#[tokio::test]
async fn while_every_first_revision_slot_is_taken_an_agent_served_gets_one_revision_in_flight() {
    // A restart's storm: the agents still waiting for a first revision go first, and one
    // already served gets the changes meanwhile one delta per answer of its own.
    let h = harness(Some(cluster(30_000, 2))).await;
    let mut agent = pipelining_agent(&h.url).await;
    let reset = agent.whole().await;
    assert!(reset.reset);
    agent.answer(reset.revision, pb::AckStatus::Applied).await;
    let mut stalled = Vec::new();
    for index in 0..CONCURRENT_FIRST_REVISIONS {
        stalled.push(stalled_agent(&h.url, &format!("stalled-{index}"), 1).await);
    }

    h.publish(cluster(30_000, 3));
    let delta = agent.whole().await;
    assert!(!delta.reset);
    h.publish(cluster(30_000, 4));
    let waiting = tokio::time::timeout(Duration::from_millis(500), agent.rx.message()).await;
    assert!(
        waiting.is_err(),
        "a second revision went out during the storm: {waiting:?}"
    );
    agent.answer(delta.revision, pb::AckStatus::Applied).await;
    let after = agent.whole().await;
    assert_eq!(after.base_revision, delta.revision);
    drop(stalled);
}

#[tokio::test]
async fn an_agent_that_leaves_while_waiting_for_a_first_revision_has_no_view_computed() {
    let metrics = Metrics::default();
    let h = harness_recording(Some(cluster(30_000, 2)), metrics.clone()).await;
    let mut stalled = Vec::new();
    for index in 0..CONCURRENT_FIRST_REVISIONS {
        stalled.push(stalled_agent(&h.url, &format!("stalled-{index}"), 1).await);
    }
    let computed = metrics.streams.view_computations.get();
    // Waits for a slot behind the stalled agents, and gives up.
    drop(Agent::subscribe(&h.url, None).await);
    // The next one gets its reset once the stalled agents' slots time out.
    let mut agent = Agent::subscribe(&h.url, None).await;
    agent.whole().await;
    assert_eq!(
        metrics.streams.view_computations.get(),
        computed + 1,
        "only the agent still there had a view computed"
    );
    drop(stalled);
}

#[tokio::test]
async fn what_departed_nodes_acknowledged_is_forgotten() {
    let (tx, rx) = watch::channel(None);
    let fanout = FanOut::new(rx);
    for node in ["node-1", "node-2"] {
        fanout.acknowledged.set(node, 3, Arc::default());
    }
    let forgetting = tokio::spawn({
        let fanout = fanout.clone();
        async move { fanout.forget_departed_nodes().await }
    });
    // node-2's Node object is gone.
    let mut state = cluster(1, 2);
    Arc::make_mut(&mut state.nodes).insert("node-1".into(), crate::nodes::NodeInfo::default());
    tx.send_replace(Some(Arc::new(state)));

    for _ in 0..300 {
        if fanout.acknowledged.nodes() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(fanout.acknowledged.get("node-2").is_none());
    assert_eq!(fanout.acknowledged.get("node-1").map(|(r, _)| r), Some(3));
    assert_eq!(fanout.acknowledged.nodes(), 1);
    drop(tx);
    forgetting.await.expect("ends with the source");
}

#[tokio::test]
async fn a_subscribe_with_more_digests_than_grpcs_default_4_mib_is_taken() {
    // As many Services in the cluster as held, so the digests are within what the cluster
    // could have left the agent.
    let h = harness(Some(cluster(40_000, 2))).await;
    // 40,000 Services held (80,000 digests, about 5 MB), none of which the cluster has.
    let held: Vec<pb::ResourceDigest> = (0..40_000)
        .flat_map(|i| {
            [pb::ResourceKind::Service, pb::ResourceKind::Endpoints].map(|kind| {
                pb::ResourceDigest {
                    kind: kind as i32,
                    key: Some(key(&format!("held-service-with-a-longer-name-{i:06}"))),
                    sha256_prefix: 7,
                }
            })
        })
        .collect();
    assert!(
        pb::Subscribe {
            held: held.clone(),
            ..Default::default()
        }
        .encoded_len()
            > 4 << 20
    );
    let mut agent = Agent::subscribe_holding(&h.url, None, held).await;
    let mut removed = 0;
    loop {
        let part = agent.next().await;
        assert!(!part.reset, "a delta from the digests");
        removed += part.removed_services.len();
        if part.complete {
            break;
        }
    }
    assert_eq!(removed, 40_000);
}

#[tokio::test]
async fn a_replica_over_its_share_of_the_nodes_sheds_its_oldest_streams() {
    let nodes = (1..=4)
        .map(|n| (format!("node-{n}"), crate::nodes::NodeInfo::default()))
        .collect();
    let state = ClusterState::of(BTreeMap::new(), BTreeMap::new(), nodes);
    let (tx, rx) = watch::channel(Some(Arc::new(state.followed_by(None))));
    let h = Harness {
        tx,
        url: String::new(),
    };
    let metrics = Metrics::default();
    let fanout = FanOut::new(rx).with_metrics(metrics.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    let (replicas_tx, replicas) = watch::channel(1);
    tokio::spawn({
        let fanout = fanout.clone();
        async move { fanout.share_nodes(replicas).await }
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(fanout.into_service())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut agents = Vec::new();
    for n in 1..=4 {
        let subscribe = pb::Subscribe {
            node_name: format!("node-{n}"),
            ..Default::default()
        };
        let mut agent = Agent::subscribe_with(&url, subscribe).await;
        let first = agent.next().await;
        agent.answer(first.revision, pb::AckStatus::Applied).await;
        agents.push(agent);
    }
    // A lone replica keeps every node.
    assert_eq!(metrics.node_share.get(), 0);

    // A second replica is ready: each keeps two of the four nodes.
    replicas_tx.send(2).expect("share_nodes listens");
    for oldest in &mut agents[..2] {
        let ended = tokio::time::timeout(Duration::from_secs(30), oldest.rx.message())
            .await
            .expect("shed within 30 s")
            .expect_err("the stream ends with a status");
        assert_eq!(ended.code(), tonic::Code::Unavailable, "{ended:?}");
        assert_eq!(splitproxy_proto::retry_after(&ended), Some(Duration::ZERO));
    }
    assert_eq!(metrics.node_share.get(), 2);
    assert_eq!(metrics.shed_streams.get(), 2);

    // The newer two stay, and go on receiving changes.
    h.publish(cluster(1, 2));
    for kept in &mut agents[2..] {
        let delta = kept.next().await;
        assert_eq!(delta.upserted_services.len(), 1);
    }
    assert_eq!(metrics.shed_streams.get(), 2, "no more than the excess");
}

#[tokio::test]
async fn a_subscribe_listing_more_than_the_cluster_could_have_left_gets_a_reset() {
    let h = harness(Some(cluster(2, 2))).await;
    let digest = |i: usize| pb::ResourceDigest {
        kind: pb::ResourceKind::Service as i32,
        key: Some(key(&format!("x{i}"))),
        sha256_prefix: 1,
    };
    let too_many = 2 * 4 + SPARE_HELD_DIGESTS + 1;
    let mut agent =
        Agent::subscribe_holding(&h.url, None, (0..too_many).map(digest).collect()).await;
    let first = agent.next().await;
    assert!(first.reset, "the digests were read: {first:?}");

    let mut agent = Agent::subscribe_holding(&h.url, None, (0..3).map(digest).collect()).await;
    let first = agent.next().await;
    assert!(
        !first.reset,
        "a few digests are read, and answered with a delta"
    );
}

/// Polls `done` every 100 ms for up to 30 s; whether it came true.
async fn eventually(mut done: impl FnMut() -> bool) -> bool {
    for _ in 0..300 {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done()
}

#[tokio::test]
async fn a_stream_whose_agent_leaves_a_revision_unanswered_past_the_limit_is_ended() {
    let metrics = Metrics::default();
    let limit = Duration::from_secs(1);
    let h = harness_of(Some(cluster(2, 2)), |fanout| {
        fanout
            .with_metrics(metrics.clone())
            .with_fall_behind_limit(limit)
    })
    .await;
    // An agent that reads its reset and never answers it.
    let mut agent = Agent::subscribe(&h.url, None).await;
    let reset = agent.next().await;
    assert!(reset.reset && reset.complete);
    let ended = tokio::time::timeout(Duration::from_secs(30), agent.rx.message())
        .await
        .expect("the stream ends within 30 s");
    let status = ended.expect_err("the stream ends with a status");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(
        splitproxy_proto::retry_after(&status),
        Some(Duration::ZERO),
        "come back at once, and resume"
    );
    assert_eq!(metrics.streams.fallen_behind_streams.get(), 1);

    // One that stops reading in the middle of its first revision: ended as well, and its
    // record gone.
    let stalled = harness_of(Some(cluster(30_000, 2)), |fanout| {
        fanout
            .with_metrics(metrics.clone())
            .with_fall_behind_limit(limit)
    })
    .await;
    let tx = stalled_agent(&stalled.url, "node-2", 1).await;
    let counted = eventually(|| metrics.streams.fallen_behind_streams.get() == 2).await;
    assert!(counted, "the stalled stream is ended");
    assert!(
        eventually(|| metrics.agents.streams().is_empty()).await,
        "no stream is left"
    );
    drop(tx);
}

#[tokio::test(start_paused = true)]
async fn what_nodes_without_a_stream_for_the_fall_behind_limit_acknowledged_is_forgotten() {
    let (tx, rx) = watch::channel(None);
    let limit = Duration::from_secs(300);
    let fanout = FanOut::new(rx).with_fall_behind_limit(limit);
    for node in ["node-1", "node-2", "node-3"] {
        fanout.acknowledged.set(node, 3, Arc::default());
    }
    // node-2's stream ended long ago, node-3's just now; node-1's is open.
    fanout.acknowledged.left("node-2");
    let forgetting = tokio::spawn({
        let fanout = fanout.clone();
        async move { fanout.forget_departed_nodes().await }
    });
    tokio::time::sleep(limit - Duration::from_secs(1)).await;
    fanout.acknowledged.left("node-3");
    // Past the sweep at the limit.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(fanout.acknowledged.get("node-2").is_none(), "forgotten");
    assert!(
        fanout.acknowledged.get("node-1").is_some(),
        "its stream is open"
    );
    assert!(
        fanout.acknowledged.get("node-3").is_some(),
        "not yet {limit:?} without a stream when last looked"
    );
    // Past the next sweep.
    tokio::time::sleep(limit).await;
    assert_eq!(fanout.acknowledged.nodes(), 1);
    drop(tx);
    forgetting.await.expect("ends with the source");
}
