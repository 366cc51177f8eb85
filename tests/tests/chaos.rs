//! Chaos under load against the real API server: two controller replicas serve at once and every
//! agent lists both; while client pods on each node and a host outside the cluster send a steady
//! stream of requests to several Services, the test kills, then freezes (SIGSTOP), the controller
//! replica the agents follow, kills and restarts an agent, restarts kube-apiserver and churns
//! endpoints. Requests to Services whose endpoints stay up must never fail; a change made right
//! after each fault must reach every node within a generous bound; the churned Service must end
//! with exactly its ready pods. Prints requests sent and failed per fault and Service, and each
//! convergence time.
//! Needs root.
//!
//! Addresses: see `splitproxy_e2e::addresses`. Services 10.96.0.20 (`stable-a`, node port 30020),
//! 10.96.0.21 (`stable-b`), 10.96.0.22 (`churn`, node port 30022); client pods are `.100` of
//! each node's pod CIDR.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    addresses::{self, CONTROL_PLANE, EXTERNAL_CLIENT},
    control_plane::{Binaries, ControlPlane, followed_controller},
    demo_cluster::{POD_PORT, PortSpec, service_yaml},
    eventually, expect_answers,
    lab::{Host, Lab, Node, Pod, Process},
    load::{Load, Outcome, Tally, tally},
    scrape, serve,
};
use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    time::{Duration, Instant, SystemTime},
};

/// The namespace of `demo_cluster::service_yaml`'s Services.
const NAMESPACE: &str = "demo";
/// The controller replicas' gRPC ports on the control-plane host; agents list them in this order.
const REPLICA_PORTS: [u16; 2] = [10660, 10670];
/// Requests per second to each load target.
const RATE: u32 = 5;
/// How long one request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// An upper bound on the whole run, so a stuck test does not load forever.
const MAX_LOAD: Duration = Duration::from_secs(1800);
/// Steady load between faults.
const SETTLE: Duration = Duration::from_secs(5);
/// Generous: the API server, the EndpointSlice controller, two controllers and three agents all
/// run on a shared 2-core machine.
const CONVERGE: Duration = Duration::from_secs(180);
/// Requests per convergence probe and vantage point: enough to see each of three pods.
const PROBE_REQUESTS: u32 = 20;

/// A Service of the test: its name, cluster IP, node port and the pods' `app` label.
struct Service {
    name: &'static str,
    cluster_ip: &'static str,
    node_port: Option<u16>,
}

const STABLE_A: Service = Service {
    name: "stable-a",
    cluster_ip: "10.96.0.20",
    node_port: Some(30020),
};
const STABLE_B: Service = Service {
    name: "stable-b",
    cluster_ip: "10.96.0.21",
    node_port: None,
};
const CHURN: Service = Service {
    name: "churn",
    cluster_ip: "10.96.0.22",
    node_port: Some(30022),
};
const SERVICES: [&Service; 3] = [&STABLE_A, &STABLE_B, &CHURN];

impl Service {
    fn yaml(&self) -> String {
        let kind = if self.node_port.is_some() {
            "NodePort"
        } else {
            "ClusterIP"
        };
        let spec = format!(
            "  type: {kind}\n  clusterIP: {}\n  selector:\n    app: {}",
            self.cluster_ip, self.name
        );
        let port = PortSpec {
            node_port: self.node_port,
            ..PortSpec::WEB
        };
        service_yaml(self.name, &spec, port, "")
    }

    fn cluster_url(&self) -> String {
        format!("http://{}:80/", self.cluster_ip)
    }

    fn stays_up(&self) -> bool {
        self.name != CHURN.name
    }
}

/// The churned Service's ready pods at the end.
const FINAL_CHURN: [&str; 3] = ["churn-1", "churn-2", "churn-5"];

/// The pods: (Service, pod name, node index, host part of its IP).
const PODS: [(&Service, &str, usize, u8); 9] = [
    (&STABLE_A, "stable-a-1", 0, 10),
    (&STABLE_A, "stable-a-2", 1, 10),
    (&STABLE_B, "stable-b-2", 1, 11),
    (&STABLE_B, "stable-b-3", 2, 10),
    (&CHURN, "churn-1", 0, 20),
    (&CHURN, "churn-2", 1, 20),
    (&CHURN, "churn-3", 2, 20),
    (&CHURN, "churn-4", 0, 21),
    (&CHURN, "churn-5", 1, 21),
];

struct Cluster {
    lab: Lab,
    control_plane: ControlPlane,
    kubeconfig: PathBuf,
    nodes: Vec<Node>,
    clients: Vec<Pod>,
    external: Host,
    /// The lab pods by name, and their servers.
    pods: BTreeMap<&'static str, (Pod, Process)>,
    /// One per replica port; `None` while killed.
    replicas: Vec<Option<Process>>,
    agents: Vec<Process>,
}

impl Cluster {
    fn start() -> Result<Self> {
        let binaries = Binaries::ensure()?;
        let mut lab = Lab::new("chaos")?;
        let cp_host = lab.add_host("cp", CONTROL_PLANE)?;
        let external = lab.add_host("ext", EXTERNAL_CLIENT)?;
        let nodes = lab.add_nodes(3)?;
        let control_plane = ControlPlane::start(&mut lab, &cp_host, binaries)?;
        let kubeconfig = control_plane.admin_kubeconfig();
        for node in &nodes {
            control_plane.register_node(&lab, node)?;
        }
        control_plane.create_namespace(&lab, NAMESPACE)?;
        let mut clients = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let n = u8::try_from(i + 1)?;
            clients.push(lab.add_pod(node, &format!("client-{n}"), addresses::pod_ip(n, 100))?);
        }
        let mut pods = BTreeMap::new();
        for (_, name, node, host) in PODS {
            let n = u8::try_from(node + 1)?;
            let pod = lab.add_pod(&nodes[node], name, addresses::pod_ip(n, host))?;
            let server = serve(&mut lab, &pod, name, POD_PORT)?;
            pods.insert(name, (pod, server));
        }
        let mut cluster = Self {
            lab,
            control_plane,
            kubeconfig,
            nodes,
            clients,
            external,
            pods,
            replicas: Vec::new(),
            agents: Vec::new(),
        };
        for service in SERVICES {
            cluster
                .control_plane
                .kubectl_apply(&cluster.lab, &service.yaml())?;
        }
        for port in REPLICA_PORTS {
            let replica = cluster.control_plane.start_controller_on(
                &mut cluster.lab,
                &cluster.kubeconfig,
                port,
            )?;
            cluster.replicas.push(Some(replica));
        }
        // Agents try the replicas in turn: once both serve, all start on the first.
        cluster.check_replicas_serving()?;
        for i in 0..cluster.nodes.len() {
            let agent = cluster.start_agent(i)?;
            cluster.agents.push(agent);
        }
        Ok(cluster)
    }

    fn replica_urls(&self) -> Vec<String> {
        REPLICA_PORTS
            .iter()
            .map(|&port| self.control_plane.controller_url(port))
            .collect()
    }

    fn start_agent(&mut self, node: usize) -> Result<Process> {
        let urls = self.replica_urls();
        self.control_plane
            .start_agent_following(&mut self.lab, &self.nodes[node], &urls)
    }

    fn pod(&self, name: &str) -> Result<&Pod> {
        self.pods
            .get(name)
            .map(|(pod, _)| pod)
            .with_context(|| format!("no pod {name}"))
    }

    /// Creates the Pod object of lab pod `name` (for its Service's selector).
    fn create_pod(&self, name: &str, ready: bool) -> Result<()> {
        let (service, ..) = PODS
            .iter()
            .find(|(_, pod, ..)| *pod == name)
            .with_context(|| format!("no pod {name}"))?;
        let pod = self.pod(name)?;
        self.control_plane
            .create_pod(&self.lab, NAMESPACE, pod, service.name, POD_PORT, ready)
    }

    fn set_ready(&self, name: &str, ready: bool) -> Result<()> {
        self.control_plane
            .set_pod_ready(&self.lab, NAMESPACE, self.pod(name)?, ready)
    }

    /// Every node serves `service` with exactly `expected`: through the cluster IP from each
    /// node's client pod, and through each node's node port from outside.
    fn check(&self, service: &Service, expected: &BTreeSet<&str>) -> Result<()> {
        for client in &self.clients {
            let url = service.cluster_url();
            expect_answers(&self.lab, client, &url, PROBE_REQUESTS, expected)?;
        }
        if let Some(port) = service.node_port {
            for node in &self.nodes {
                let url = format!("http://{}:{port}/", node.ip());
                expect_answers(&self.lab, &self.external, &url, PROBE_REQUESTS, expected)?;
            }
        }
        Ok(())
    }

    /// Waits until every node serves `service` with exactly `expected`; returns how long that took.
    fn converge(&self, what: &str, service: &Service, expected: &[&str]) -> Result<Duration> {
        let expected: BTreeSet<&str> = expected.iter().copied().collect();
        let start = Instant::now();
        eventually(what, CONVERGE, || self.check(service, &expected))
            .with_context(|| self.logs())?;
        Ok(start.elapsed())
    }

    /// The replica each agent streams from (an index into [`REPLICA_PORTS`], per node), as its
    /// inspection reports; fails while one is not connected.
    fn followed_replicas(&self) -> Result<Vec<usize>> {
        let urls = self.replica_urls();
        let mut followed = Vec::new();
        for node in &self.nodes {
            let url = followed_controller(&self.lab, node)?;
            let replica = urls
                .iter()
                .position(|u| *u == url)
                .with_context(|| format!("{} follows an unknown controller {url}", node.name()))?;
            followed.push(replica);
        }
        Ok(followed)
    }

    /// Both replicas answer the gRPC health check with SERVING: they read the cluster at once.
    fn check_replicas_serving(&self) -> Result<()> {
        let ca = self.control_plane.controller_tls().ca.to_string_lossy();
        for port in REPLICA_PORTS {
            let address = format!("{CONTROL_PLANE}:{port}");
            eventually("the replica is SERVING", CONVERGE, || {
                let health = self.lab.exec_ok(
                    &self.external,
                    "grpcurl",
                    &["-cacert", &ca, &address, "grpc.health.v1.Health/Check"],
                )?;
                ensure!(health.contains("SERVING") && !health.contains("NOT_SERVING"));
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Fails the replica every agent follows, makes `change` (to the churned Service), waits
    /// until every node serves `expected` for it and checks the agents moved to the other replica;
    /// then starts the failed replica afresh, so two serve again. Returns the convergence time.
    fn fail_followed_replica(
        &mut self,
        fault: ReplicaFault,
        expected: &[&str],
        change: impl FnOnce(&Self) -> Result<()>,
    ) -> Result<Duration> {
        let agents_on = eventually("every agent is connected", CONVERGE, || {
            self.followed_replicas()
        })
        .with_context(|| self.logs())?;
        // The replica most agents follow (all of them, unless they raced its start).
        let followed = (0..REPLICA_PORTS.len())
            .max_by_key(|r| agents_on.iter().filter(|a| *a == r).count())
            .context("no replicas")?;
        let replica = self.replicas[followed]
            .take()
            .context("the followed replica is running")?;
        match fault {
            ReplicaFault::Kill => self.lab.kill(&replica)?,
            ReplicaFault::Freeze => {
                let pid = replica.pid().to_string();
                self.lab.exec_ok(&replica, "kill", &["-STOP", &pid])?;
            }
        }
        change(self)?;
        let converged_in = self.converge(
            &format!("the change after replica {followed} failed ({fault:?})"),
            &CHURN,
            expected,
        )?;
        eventually("every agent left the failed replica", CONVERGE, || {
            let now = self.followed_replicas()?;
            ensure!(!now.contains(&followed), "agents follow replicas {now:?}");
            Ok(())
        })
        .with_context(|| self.logs())?;
        let moved = agents_on.iter().filter(|a| **a == followed).count();
        println!(
            "replica {followed} (followed by {moved} of {} agents) failed ({fault:?})",
            agents_on.len()
        );
        self.check_moved_by_summary(followed, moved)?;
        if fault == ReplicaFault::Freeze {
            self.lab.kill(&replica)?;
        }
        let restarted = self.control_plane.start_controller_on(
            &mut self.lab,
            &self.kubeconfig,
            REPLICA_PORTS[followed],
        )?;
        self.replicas[followed] = Some(restarted);
        self.check_replicas_serving()?;
        Ok(converged_in)
    }

    /// The `moved` agents that left replica `failed` held its state: the replicas they moved to
    /// counted them as resuming by summary (protocol rule 11), and none sent every digest.
    fn check_moved_by_summary(&self, failed: usize, moved: usize) -> Result<()> {
        let mut by_summary = 0.0;
        for (replica, port) in REPLICA_PORTS.iter().enumerate() {
            if replica == failed {
                continue;
            }
            let count = |resume: &str| {
                let series =
                    format!("splitproxy_controller_subscriptions_total{{resume=\"{resume}\"}}");
                let value = scrape(&self.lab, self.control_plane.host(), port + 2, &series)?;
                anyhow::Ok(value.unwrap_or(0.0))
            };
            by_summary += count("summary")?;
            let by_digests = count("digests")?;
            ensure!(
                by_digests == 0.0,
                "replica {replica} took every digest {by_digests} times"
            );
        }
        ensure!(
            by_summary >= moved as f64,
            "{moved} agents moved, {by_summary} subscriptions resumed by summary"
        );
        Ok(())
    }

    /// node-2's agent is killed and restarted; its rules keep serving meanwhile, and the change
    /// made right after reaches it.
    fn restart_agent(&mut self) -> Result<Duration> {
        let agent = self.agents[1].clone();
        self.lab.kill(&agent)?;
        std::thread::sleep(Duration::from_secs(2));
        self.agents[1] = self.start_agent(1)?;
        self.set_ready("churn-1", false)?;
        self.set_ready("churn-2", true)?;
        self.converge(
            "churn-1 leaves after node-2's agent restarted",
            &CHURN,
            &["churn-2", "churn-3"],
        )
    }

    /// kube-apiserver is killed and restarted; a pod added once it is back reaches every node.
    fn restart_apiserver(&mut self) -> Result<Duration> {
        self.control_plane.kill_apiserver(&mut self.lab)?;
        std::thread::sleep(Duration::from_secs(2));
        self.control_plane.start_apiserver(&mut self.lab)?;
        self.create_pod("churn-4", true)?;
        self.converge(
            "churn-4 joins after the API server restarted",
            &CHURN,
            &["churn-2", "churn-3", "churn-4"],
        )
    }

    /// Endpoints churn in quick succession: pods turn ready and not ready, one is deleted, one is
    /// added, ending with [`FINAL_CHURN`]. Once the deleted pod is out of every node's rules, its
    /// server stops, as a deleted pod's container would.
    fn churn_endpoints(&mut self) -> Result<Duration> {
        self.set_ready("churn-1", true)?;
        self.set_ready("churn-2", false)?;
        // Graceful, as a user deletes: the Pod stays Terminating (no kubelet confirms its end),
        // so its endpoint turns terminating and leaves rotation.
        self.control_plane.kubectl(
            &self.lab,
            &["-n", NAMESPACE, "delete", "pod", "churn-3", "--wait=false"],
        )?;
        self.create_pod("churn-5", true)?;
        self.set_ready("churn-2", true)?;
        self.set_ready("churn-4", false)?;
        let converged_in = self.converge("the churn settles", &CHURN, &FINAL_CHURN)?;
        let (_, server) = self.pods.get("churn-3").context("no pod churn-3")?.clone();
        self.lab.kill(&server)?;
        // What the kubelet would do once the container has stopped.
        self.control_plane.kubectl(
            &self.lab,
            &[
                "-n",
                NAMESPACE,
                "delete",
                "pod",
                "churn-3",
                "--grace-period=0",
                "--force",
            ],
        )?;
        Ok(converged_in)
    }

    fn logs(&self) -> String {
        let mut text = self.control_plane.logs();
        for process in self.replicas.iter().flatten().chain(&self.agents) {
            text.push_str(&process.log_tail(30));
        }
        text
    }
}

/// A fault: it is injected, a change to the churned Service is made right after, and the time
/// until every node serves that change is returned.
type Fault = fn(&mut Cluster) -> Result<Duration>;

/// How a controller replica fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReplicaFault {
    /// SIGKILL: its connections are reset at once.
    Kill,
    /// SIGSTOP: its connections stay open and silent.
    Freeze,
}

/// One stretch of the run: a fault (or none), and how long its change took to reach every node.
struct Phase {
    name: &'static str,
    from: SystemTime,
    converged_in: Option<Duration>,
}

/// The load generators: one in each node's client pod to every Service's cluster IP, one outside
/// the cluster to every node port of every node.
fn start_loads(cluster: &mut Cluster) -> Result<Vec<Load>> {
    let cluster_ip_targets: Vec<(&str, String)> =
        SERVICES.iter().map(|s| (s.name, s.cluster_url())).collect();
    let mut loads = Vec::new();
    for client in cluster.clients.clone() {
        loads.push(Load::start(
            &mut cluster.lab,
            &client,
            &cluster_ip_targets,
            RATE,
            REQUEST_TIMEOUT,
            MAX_LOAD,
        )?);
    }
    let mut node_port_targets = Vec::new();
    for service in SERVICES {
        if let Some(port) = service.node_port {
            for node in &cluster.nodes {
                node_port_targets.push((service.name, format!("http://{}:{port}/", node.ip())));
            }
        }
    }
    let external = cluster.external.clone();
    loads.push(Load::start(
        &mut cluster.lab,
        &external,
        &node_port_targets,
        RATE,
        REQUEST_TIMEOUT,
        MAX_LOAD,
    )?);
    Ok(loads)
}

#[test]
fn services_whose_endpoints_stay_up_never_fail_through_controller_agent_and_apiserver_faults()
-> Result<()> {
    let test_start = Instant::now();
    let mut cluster = Cluster::start()?;
    for (service, name, ..) in PODS {
        // churn-4 and churn-5 come later; churn-3 starts not ready.
        if !["churn-4", "churn-5"].contains(&name) {
            let ready = service.stays_up() || name != "churn-3";
            cluster.create_pod(name, ready)?;
        }
    }
    cluster.converge(
        "stable-a is served",
        &STABLE_A,
        &["stable-a-1", "stable-a-2"],
    )?;
    cluster.converge(
        "stable-b is served",
        &STABLE_B,
        &["stable-b-2", "stable-b-3"],
    )?;
    cluster.converge("churn is served", &CHURN, &["churn-1", "churn-2"])?;
    let setup = test_start.elapsed();

    let mut loads = start_loads(&mut cluster)?;
    let mut phases = vec![Phase {
        name: "steady load",
        from: SystemTime::now(),
        converged_in: None,
    }];
    std::thread::sleep(SETTLE);

    // Each fault, in turn, under the load; a change made right after it must reach every node.
    let faults: [(&str, Fault); 5] = [
        ("followed controller replica killed", |c| {
            c.fail_followed_replica(
                ReplicaFault::Kill,
                &["churn-1", "churn-2", "churn-3"],
                |c| c.set_ready("churn-3", true),
            )
        }),
        ("followed controller replica frozen", |c| {
            c.fail_followed_replica(ReplicaFault::Freeze, &["churn-1", "churn-3"], |c| {
                c.set_ready("churn-2", false)
            })
        }),
        ("agent on node-2 killed, restarted", Cluster::restart_agent),
        (
            "kube-apiserver killed, restarted",
            Cluster::restart_apiserver,
        ),
        ("endpoints churned", Cluster::churn_endpoints),
    ];
    for (name, fault) in faults {
        let from = SystemTime::now();
        let converged_in = fault(&mut cluster)?;
        println!("{name}: converged in {converged_in:?}");
        phases.push(Phase {
            name,
            from,
            converged_in: Some(converged_in),
        });
        std::thread::sleep(SETTLE);
    }

    let end = SystemTime::now();
    let mut outcomes: Vec<Outcome> = Vec::new();
    for load in loads.drain(..) {
        outcomes.extend(load.stop(&mut cluster.lab)?);
    }
    // The churned Service ends with exactly its ready pods, from every node.
    cluster.converge("churn ends with its ready pods", &CHURN, &FINAL_CHURN)?;

    let report = report(&phases, end, &outcomes);
    println!("{report}");
    println!(
        "Setup {:.0} s, whole test {:.0} s",
        setup.as_secs_f64(),
        test_start.elapsed().as_secs_f64()
    );
    let stable_failures: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| !o.ok && o.target != CHURN.name)
        .collect();
    ensure!(
        stable_failures.is_empty(),
        "{} requests failed to Services whose endpoints stayed up, first {:?}",
        stable_failures.len(),
        stable_failures.first()
    );
    ensure!(
        outcomes.len() > 1000,
        "only {} requests were made",
        outcomes.len()
    );
    Ok(())
}

/// The table: per phase and Service, requests sent and failed and who answered, with the
/// phase's convergence time; then totals.
fn report(phases: &[Phase], end: SystemTime, outcomes: &[Outcome]) -> String {
    let mut text = format!(
        "{:<36} {:>10} {:<9} {:>6} {:>6}  answered by / errors\n",
        "phase", "converged", "service", "sent", "failed"
    );
    let ends = phases.iter().skip(1).map(|p| p.from).chain([end]);
    let mut total = BTreeMap::<String, Tally>::new();
    for (phase, to) in phases.iter().zip(ends) {
        let converged = phase
            .converged_in
            .map_or_else(|| "-".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()));
        for (service, tally) in tally(outcomes, phase.from, to) {
            text.push_str(&row(phase.name, &converged, &service, &tally));
            let sum = total.entry(service).or_default();
            sum.sent += tally.sent;
            sum.failed += tally.failed;
        }
    }
    for (service, tally) in &total {
        text.push_str(&row("total", "", service, tally));
    }
    text
}

fn row(phase: &str, converged: &str, service: &str, tally: &Tally) -> String {
    let detail = if tally.errors.is_empty() {
        format!("{:?}", tally.answers)
    } else {
        format!("{:?} {:?}", tally.answers, tally.errors)
    };
    format!(
        "{phase:<36} {converged:>10} {service:<9} {:>6} {:>6}  {detail}\n",
        tally.sent, tally.failed
    )
}
