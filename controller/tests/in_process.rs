//! The controller and an agent in one process, talking gRPC over loopback, the agent programming a
//! recording dataplane: what the node would program as the manifests change and as controllers
//! go away and come back.
//!
//! Test addresses, as in `fixtures/web.yaml`: cluster IP 10.96.0.10; pods 10.244.1.0/24 on
//! node-1 (the agent's node) and 10.244.2.0/24 on node-2.

use splitproxy_agent::{
    client::{self, ClientConfig, Controllers},
    metrics::Metrics,
    status::Status,
    sync::Applier,
};
use splitproxy_controller::{cluster::ServiceSelector, manifests::ManifestsDir, wiring};
use splitproxy_dataplane::{
    Endpoint, Protocol, ProxyState, Service, ServiceKey, ServicePort,
    testing::recording::RecordingDataplane,
};
use splitproxy_proto::v1alpha1 as pb;
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    time::Duration,
};
use tokio::{net::TcpListener, task::JoinHandle};

const NODE: &str = "node-1";
/// How long to wait for something that should happen in well under a second.
const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

/// The fixture after an edit: 10.244.2.2 became ready and 10.244.1.2 went away.
const EDITED: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: demo
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: web
    nodePort: 30080
  selector:
    app: web
---
apiVersion: v1
kind: List
items:
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web-abc12
    namespace: demo
    labels:
      kubernetes.io/service-name: web
  addressType: IPv4
  ports:
  - name: http
    port: 8080
    protocol: TCP
  endpoints:
  - addresses: [10.244.2.2]
    conditions: {ready: true}
    nodeName: node-2
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web-def34
    namespace: demo
    labels:
      kubernetes.io/service-name: web
  addressType: IPv4
  ports:
  - name: http
    port: 8080
    protocol: TCP
  endpoints:
  - addresses: [10.244.2.3]
    nodeName: node-2
---
apiVersion: v1
kind: Node
metadata:
  name: node-1
"#;

/// Aborts the tasks it holds when dropped, so a failing test leaves nothing running.
#[derive(Default)]
struct Tasks(Vec<JoinHandle<()>>);

impl Tasks {
    fn spawn(&mut self, future: impl Future<Output = ()> + Send + 'static) -> usize {
        self.0.push(tokio::spawn(future));
        self.0.len() - 1
    }

    async fn abort(&mut self, index: usize) {
        let task = &mut self.0[index];
        task.abort();
        let _ = task.await;
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// A loopback listener on a free port, and the URL an agent dials for it.
async fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .expect("binding a loopback port");
    let url = format!(
        "http://{}",
        listener
            .local_addr()
            .expect("a bound listener has an address")
    );
    (listener, url)
}

/// Runs a controller serving the manifests in `dir` on `listener`.
fn controller(tasks: &mut Tasks, listener: TcpListener, dir: &Path) -> usize {
    let dir = dir.to_owned();
    tasks.spawn(async move {
        let serving = wiring::Serving {
            selector: ServiceSelector::default(),
            metrics: splitproxy_controller::metrics::Metrics::default(),
            auth: splitproxy_controller::auth::AgentAuth::Open,
            tls: None,
            controller_service: None,
            fall_behind_limit: splitproxy_controller::fanout::FALL_BEHIND_LIMIT,
        };
        if let Err(err) = wiring::serve(listener, None, ManifestsDir::new(dir), serving).await {
            panic!("controller stopped: {err:?}");
        }
    })
}

/// Runs an agent for [`NODE`] that knows `controllers`; returns what its dataplane records and
/// its status.
fn agent(tasks: &mut Tasks, controllers: Vec<String>) -> (RecordingDataplane, Status, Metrics) {
    let dataplane = RecordingDataplane::default();
    let status = Status::default();
    // The registry's type comes from the agent's signature; the test reads the metrics directly.
    let metrics = Metrics::new(&mut Default::default());
    let config = ClientConfig {
        controllers: Controllers::Listed(controllers),
        node_name: NODE.into(),
        proxy_mode: pb::ProxyMode::Iptables,
        min_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        credentials: Default::default(),
    };
    let applier = Applier::new("node-1", dataplane.clone(), status.clone(), metrics.clone());
    tasks.spawn(client::run(
        config,
        applier,
        status.clone(),
        metrics.clone(),
    ));
    (dataplane, status, metrics)
}

/// Replaces `web.yaml` in `dir` the way editors and `kubectl` do: write aside, then rename.
fn write_manifest(dir: &Path, text: &str) {
    let aside = dir.join(".web.yaml.tmp");
    std::fs::write(&aside, text).expect("writing the manifest aside");
    std::fs::rename(&aside, dir.join("web.yaml")).expect("renaming the manifest into place");
}

/// A ready endpoint of `demo/web` on port 8080.
fn ready(ip: [u8; 4], is_local: bool) -> Endpoint {
    Endpoint {
        ip: IpAddr::V4(Ipv4Addr::from(ip)),
        port: 8080,
        ready: true,
        serving: true,
        terminating: false,
        is_local,
        topology_excluded: false,
    }
}

/// What the node programs when `demo/web` has `endpoints` behind its port `http`.
fn web_state(endpoints: Vec<Endpoint>) -> ProxyState {
    let key = ServiceKey {
        namespace: "demo".into(),
        name: "web".into(),
    };
    let service = Service {
        key,
        cluster_ips: vec![IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10))],
        ports: vec![ServicePort {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 80,
            node_port: Some(30080),
            endpoints,
        }],
        ..Default::default()
    };
    [service].into_iter().collect()
}

/// Polls `dataplane` until `done` holds for its recorded states; panics after [`WAIT`].
async fn wait_for(
    dataplane: &RecordingDataplane,
    what: &str,
    done: impl Fn(&[ProxyState]) -> bool,
) -> Vec<ProxyState> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let applied = dataplane.applied();
        if done(&applied) {
            return applied;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {WAIT:?} for {what}; recorded states: {applied:#?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Polls `status` until `done` holds; panics after [`WAIT`].
async fn wait_for_status(status: &Status, what: &str, done: impl Fn(&Status) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done(status) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {WAIT:?} for {what}; status: {:#?}",
            status.snapshot()
        );
        tokio::time::sleep(POLL).await;
    }
}

fn newest_is(expected: &ProxyState) -> impl Fn(&[ProxyState]) -> bool + '_ {
    move |applied| applied.last() == Some(expected)
}

fn assert_never_empty(applied: &[ProxyState]) {
    assert!(
        applied.iter().all(|s| !s.services.is_empty()),
        "an empty state was programmed (the node dropped every Service): {applied:#?}"
    );
}

/// What the node programs from the fixture: 10.244.1.2 (on this node, listed in both slices) and
/// 10.244.2.3 are ready; 10.244.2.2 is not.
fn fixture_state() -> ProxyState {
    web_state(vec![
        ready([10, 244, 1, 2], true),
        ready([10, 244, 2, 3], false),
    ])
}

/// What the node programs from [`EDITED`].
fn edited_state() -> ProxyState {
    web_state(vec![
        ready([10, 244, 2, 2], false),
        ready([10, 244, 2, 3], false),
    ])
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
}

/// A manifests directory holding the fixture, a controller serving it, and an agent that knows
/// that controller and, second, one on a reserved port that nothing serves yet.
struct Harness {
    manifests: tempfile::TempDir,
    tasks: Tasks,
    first: usize,
    second: Option<TcpListener>,
    second_url: String,
    dataplane: RecordingDataplane,
    status: Status,
    metrics: Metrics,
}

impl Harness {
    async fn start() -> Self {
        init_tracing();
        let manifests = tempfile::tempdir().expect("creating a temp dir");
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/web.yaml"),
            manifests.path().join("web.yaml"),
        )
        .expect("copying the fixture");
        let mut tasks = Tasks::default();
        let (first_listener, first_url) = listener().await;
        let (second_listener, second_url) = listener().await;
        let first = controller(&mut tasks, first_listener, manifests.path());
        let (dataplane, status, metrics) = agent(&mut tasks, vec![first_url, second_url.clone()]);
        Self {
            manifests,
            tasks,
            first,
            second: Some(second_listener),
            second_url,
            dataplane,
            status,
            metrics,
        }
    }

    fn edit_manifests(&self) {
        write_manifest(self.manifests.path(), EDITED);
    }

    async fn wait_for_newest(&self, what: &str, expected: &ProxyState) -> Vec<ProxyState> {
        let applied = wait_for(&self.dataplane, what, newest_is(expected)).await;
        assert_never_empty(&applied);
        applied
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agent_programs_the_ready_endpoints_of_its_node_view() {
    let harness = Harness::start().await;
    harness
        .wait_for_newest("the fixture's endpoints", &fixture_state())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn editing_the_manifests_reprograms_the_node() {
    let harness = Harness::start().await;
    harness
        .wait_for_newest("the fixture's endpoints", &fixture_state())
        .await;
    harness.edit_manifests();
    harness
        .wait_for_newest("the edited endpoints", &edited_state())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn losing_the_controller_keeps_the_rules_and_the_agent_fails_over_to_the_next_one() {
    let mut harness = Harness::start().await;
    let applied = harness
        .wait_for_newest("the fixture's endpoints", &fixture_state())
        .await;
    let first_epoch = harness.status.snapshot().state.epoch.clone();
    assert!(first_epoch.is_some());

    // The first controller goes away, listener and all. The agent moves on to the second, which
    // does not answer yet, and leaves the node's rules as they were (fail static).
    harness.tasks.abort(harness.first).await;
    let second_url = harness.second_url.clone();
    wait_for_status(
        &harness.status,
        "the agent to dial the second controller",
        |s| {
            let s = s.snapshot();
            !s.connected && s.controller == second_url
        },
    )
    .await;
    // Periodic resyncs may run meanwhile, but only ever with the state the node already had.
    let meanwhile = harness.dataplane.applied();
    assert!(
        meanwhile.starts_with(&applied)
            && meanwhile[applied.len()..]
                .iter()
                .all(|s| Some(s) == applied.last()),
        "nothing new is programmed while no controller answers: {meanwhile:#?}"
    );

    // What changes meanwhile reaches the node once the second controller serves.
    harness.edit_manifests();
    let second = harness
        .second
        .take()
        .expect("the second listener is unused");
    controller(&mut harness.tasks, second, harness.manifests.path());
    let applied = harness
        .wait_for_newest("the second controller's endpoints", &edited_state())
        .await;
    assert!(
        applied[..applied.len() - 1]
            .iter()
            .all(|s| *s == fixture_state()),
        "only the fixture's state came before the failover: {applied:#?}"
    );
    // The second controller never served this agent, yet sent a delta from the digests of what
    // the node held instead of a reset: only the first connection's revision was one.
    let snapshot = harness.status.snapshot();
    assert!(snapshot.connected && snapshot.controller == second_url);
    assert!(snapshot.state.epoch.is_some() && snapshot.state.epoch != first_epoch);
    assert_eq!(harness.metrics.reset_revisions_received.get(), 1);
}
