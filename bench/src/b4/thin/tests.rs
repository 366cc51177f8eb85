use super::*;
use crate::{b1::serve_manifests, cluster::Shape};
use std::net::SocketAddr;
use tokio::{
    net::{TcpListener, TcpStream},
    task::JoinSet,
};

/// A loopback port forwarding each connection to the current backend; cutting drops every
/// forwarded connection at once, as a controller's death does.
#[derive(Clone)]
struct Forwarder {
    backend: Arc<Mutex<SocketAddr>>,
    connections: Arc<Mutex<JoinSet<()>>>,
}

impl Forwarder {
    async fn start(backend: SocketAddr) -> (Self, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("bound"));
        let forwarder = Self {
            backend: Arc::new(Mutex::new(backend)),
            connections: Arc::default(),
        };
        let accepting = forwarder.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let backend = *accepting.backend.lock().expect("lock");
                accepting
                    .connections
                    .lock()
                    .expect("lock")
                    .spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(backend).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
            }
        });
        (forwarder, url)
    }

    /// Sends new connections to `backend` and drops the open ones.
    fn switch_to(&self, backend: SocketAddr) {
        *self.backend.lock().expect("lock") = backend;
        self.connections.lock().expect("lock").abort_all();
    }
}

/// Starts a controller serving `dir`; returns its address.
async fn controller(dir: &std::path::Path) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("bound");
    tokio::spawn(serve_manifests(
        listener,
        dir.to_owned(),
        Default::default(),
    ));
    address
}

/// Waits up to a minute for `done` to hold of `record`.
async fn until(record: &Recorder, what: &str, done: impl Fn(&Record) -> bool) -> Record {
    for _ in 0..600 {
        let now = record.lock().expect("lock").clone();
        if done(&now) {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: not within a minute");
}

#[tokio::test]
async fn a_thin_client_is_served_as_an_agent_and_resumes_on_another_controller_without_a_reset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shape = Shape {
        services: 4,
        endpoints: 8,
        nodes: 2,
        zones: 0,
    };
    shape.write(dir.path()).expect("manifests");
    let (forwarder, url) = Forwarder::start(controller(dir.path()).await).await;
    let shared = Arc::new(Shared {
        keys: Keys::default(),
        encodings: Encodings::default(),
        changes: Changes::default(),
        services: shape.services,
        started: std::time::Instant::now(),
        urls: vec![url],
        periods: SyncPeriods::default(),
        sync_time: Duration::from_millis(10),
        derives_locality: true,
    });
    let record = Recorder::default();
    let node = Node {
        name: "node-0".into(),
        source: std::net::Ipv4Addr::LOCALHOST.into(),
    };
    let client = tokio::spawn(run(node, shared.clone(), record.clone()));
    let synced = until(&record, "first full sync", |r| r.full_sync.is_some()).await;
    assert_eq!(synced.resets, 1, "the first revision is a reset");

    // One endpoint of svc-2 stops being ready: the client sees that change, not before.
    let first = shape.endpoint_range(2).start;
    shared.changes.push(Change {
        key: shared.keys.id(&pb::ObjectKey {
            namespace: crate::cluster::NAMESPACE.into(),
            name: Shape::service_name(2),
        }),
        ip: Shape::endpoint_ip(first).to_string(),
        written: std::time::Instant::now(),
    });
    shape.rewrite(dir.path(), 2, false).expect("rewrite");
    until(&record, "the change", |r| {
        r.latencies.first().is_some_and(Option::is_some)
    })
    .await;

    // Another controller, with another epoch: the client's digests, taken over the bytes it
    // received, match what that controller computes, so it resumes with a delta.
    let before = record.lock().expect("lock").clone();
    forwarder.switch_to(controller(dir.path()).await);
    let resumed = until(&record, "resuming", |r| {
        r.applied_epoch != before.applied_epoch
    })
    .await;
    assert_eq!(resumed.resets, 1, "resumed from digests, without a reset");
    assert_eq!(resumed.upserts, before.upserts, "and nothing sent again");
    client.abort();
}

/// An endpoint set of `name` with `ready` and `not_ready` addresses, encoded.
fn endpoint_set(name: &str, ready: &[&str], not_ready: &[&str]) -> Bytes {
    let endpoint = |address: &&str, ready| pb::Endpoint {
        address: (*address).to_owned(),
        conditions: Some(pb::EndpointConditions {
            ready,
            ..Default::default()
        }),
        ..Default::default()
    };
    let set = pb::ServiceEndpoints {
        key: Some(pb::ObjectKey {
            namespace: "default".into(),
            name: name.into(),
        }),
        ports: vec![pb::PortEndpoints {
            endpoints: ready
                .iter()
                .map(|a| endpoint(a, true))
                .chain(not_ready.iter().map(|a| endpoint(a, false)))
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    };
    prost::Message::encode_to_vec(&set).into()
}

#[test]
fn equal_encodings_are_learned_once_and_say_which_changes_they_hold() {
    let keys = Keys::default();
    let encodings = Encodings::default();
    let changes = Changes::default();
    let first = endpoint_set("web", &["10.0.0.1"], &["10.0.0.2"]);
    // The same bytes in another buffer, as another client receives them.
    let again = Bytes::from(first.to_vec());
    let learned = encodings.learn(&keys, &first).expect("decodes");
    let relearned = encodings.learn(&keys, &again).expect("decodes");
    assert!(Arc::ptr_eq(&learned, &relearned), "learned once");
    assert_eq!(learned.digest, splitproxy_proto::digest_of_encoding(&first));
    let other = encodings
        .learn(&keys, &endpoint_set("web", &["10.0.0.1", "10.0.0.2"], &[]))
        .expect("decodes");
    assert_ne!(other.digest, learned.digest, "other bytes, another digest");
    assert_eq!(other.id, learned.id, "the same key");

    let written = std::time::Instant::now();
    for ip in ["10.0.0.1", "10.0.0.2", "10.0.0.3"] {
        changes.push(Change {
            key: learned.id,
            ip: ip.into(),
            written,
        });
    }
    let held: Vec<usize> = changes.held_in(&learned).into_iter().map(|c| c.0).collect();
    assert_eq!(held, [1, 2], "not ready, and gone, are held; ready is not");
    assert!(changes.held_in(&other).iter().all(|c| c.0 == 2));
}

#[test]
fn a_revision_replacing_buckets_drops_only_what_they_held() {
    let keys = Keys::default();
    let key = |name: &str| pb::ObjectKey {
        namespace: "default".into(),
        name: name.into(),
    };
    let bucket = |name: &str, count| {
        u32::try_from(splitproxy_proto::bucket_of("default", name, count)).expect("small")
    };
    // Two names in different buckets at the clients' count.
    let names: Vec<String> = (0..64).map(|i| format!("svc-{i}")).collect();
    let buckets = splitproxy_proto::SUMMARY_BUCKETS;
    let other = names
        .iter()
        .find(|n| bucket(n, buckets) != bucket(&names[0], buckets))
        .expect("another bucket");
    let held_both = || {
        let mut held = Held::default();
        for name in [&names[0], other] {
            held.services.insert(keys.id(&key(name)), 1);
            held.endpoints.insert(keys.id(&key(name)), 1);
        }
        held
    };
    let replacing = |count: usize, name: &str| Revision {
        replaced: Some(pb::ReplacedBuckets {
            bucket_count: u32::try_from(count).expect("small"),
            buckets: vec![bucket(name, count)],
        }),
        ..Revision::default()
    };
    let record = Recorder::default();

    let mut held = held_both();
    let _ = replacing(buckets, &names[0]).apply(&keys, &mut held, &record);
    let kept = keys.id(&key(other));
    assert_eq!(held.services.keys().collect::<Vec<_>>(), [&kept]);
    assert_eq!(held.endpoints.keys().collect::<Vec<_>>(), [&kept]);

    // Another count than the clients summarize in: each key is hashed into it.
    let mut held = held_both();
    let _ = replacing(1, &names[0]).apply(&keys, &mut held, &record);
    assert!(
        held.services.is_empty() && held.endpoints.is_empty(),
        "one bucket holds all"
    );
}
