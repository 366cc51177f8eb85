//! splitproxy installed the way a user installs it, on a real cluster (`scripts/cluster.sh`):
//! images built here and imported into four kubelet nodes, then `kubectl apply -k` of an overlay
//! of `deploy/` that sets only the images, the mode, the cluster CIDR and the API server's
//! address. No kube-proxy is ever installed, and nobody makes certificates. Needs root; slow (the
//! first run builds the images).
//!
//! What a cluster operator would check: the controllers run on ordinary nodes (the control-plane
//! nodes are tainted), with the CA they made themselves, and the agents find them through their
//! Service; the cluster DNS answers through its Service IP on a new cluster; a rolling update of the agent DaemonSet and then of the controller Deployment, under
//! steady traffic from pods to a Service name and to a node port, loses no request; and after
//! every node's rules are flushed and every splitproxy process killed at once (a full restart of
//! the cluster, as far as Service rules go) Services come back with nobody acting. Then the
//! operator switches the agents to ebpf mode (`deploy/ebpf/` applied over `deploy/`), which rolls
//! node by node without a failed request, and every ebpf agent killed at once fails no request
//! either: the programs stay attached while the kubelets restart the agents.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    eventually,
    real_cluster::{
        DNS_SERVICE_IP, KUBERNETES_SERVICE_IP, NODES, Proxy, RealCluster, SPLITPROXY_NAMESPACE,
    },
};
use std::{
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

/// Generous bounds: four kubelets, the control plane and the workload share two cores.
const READY: Duration = Duration::from_secs(300);
const ROLLOUT: Duration = Duration::from_secs(600);
const RECOVERY: Duration = Duration::from_secs(300);
/// The namespace of the test's workload.
const NAMESPACE: &str = "traffic";
/// The node port of the `web` Service.
const NODE_PORT: u16 = 30080;

fn workload() -> String {
    // Three web pods, and two clients that send requests in a loop, one line per request:
    // `ok <pod>` or `fail <error>`. One resolves the Service's name through the cluster DNS (so
    // both Service IPs are crossed) from worker-1; the other calls worker-1's node port from
    // worker-2.
    let client = |name: &str, node: &str, url: &str| {
        format!(
            r#"---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {NAMESPACE}
spec:
  nodeSelector:
    kubernetes.io/hostname: {node}
  containers:
  - name: client
    image: registry.k8s.io/e2e-test-images/agnhost:2.63.0
    command:
    - bash
    - -c
    - |
      while true; do
        if answer=$(curl -sS -m 2 {url} 2>&1); then echo "ok $answer"; else echo "fail $answer"; fi
        sleep 0.1
      done
"#
        )
    };
    let mut yaml = format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {NAMESPACE}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: {NAMESPACE}
spec:
  replicas: 3
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
      - name: web
        image: registry.k8s.io/e2e-test-images/agnhost:2.63.0
        args: [netexec, --http-port=8080]
        readinessProbe:
          httpGet:
            path: /healthz
            port: 8080
          periodSeconds: 2
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: {NAMESPACE}
spec:
  type: NodePort
  selector:
    app: web
  ports:
  - port: 80
    targetPort: 8080
    nodePort: {NODE_PORT}
"#
    );
    yaml += &client(
        "by-name",
        "worker-1",
        &format!("http://web.{NAMESPACE}.svc.cluster.local/hostname"),
    );
    yaml += &client(
        "by-node-port",
        "worker-2",
        &format!("http://198.19.0.20:{NODE_PORT}/hostname"),
    );
    yaml
}

/// The clients' request lines so far.
struct Tally {
    lines: Vec<usize>,
}

const CLIENTS: [&str; 2] = ["by-name", "by-node-port"];

impl Tally {
    fn now(cluster: &RealCluster) -> Result<Self> {
        let mut lines = Vec::new();
        for client in CLIENTS {
            lines.push(cluster.logs(NAMESPACE, client)?.lines().count());
        }
        Ok(Self { lines })
    }

    /// The requests each client made since `self`, and the failed ones (with their errors).
    fn since(&self, cluster: &RealCluster) -> Result<Vec<(usize, Vec<String>)>> {
        let mut outcomes = Vec::new();
        for (client, start) in CLIENTS.iter().zip(&self.lines) {
            let log = cluster.logs(NAMESPACE, client)?;
            let new: Vec<&str> = log.lines().skip(*start).collect();
            let failed = new
                .iter()
                .filter(|line| !line.starts_with("ok "))
                .map(|line| (*line).to_owned())
                .collect();
            outcomes.push((new.len(), failed));
        }
        Ok(outcomes)
    }
}

/// Starts the workload and waits until the cluster DNS answers and both clients succeed.
fn start_traffic(cluster: &RealCluster) -> Result<()> {
    cluster.apply(&workload())?;
    for pod in CLIENTS {
        cluster.wait_ready(NAMESPACE, pod, READY)?;
    }
    cluster.kubectl(&[
        "-n",
        NAMESPACE,
        "rollout",
        "status",
        "deployment/web",
        &format!("--timeout={}s", READY.as_secs()),
    ])?;
    eventually(
        "the cluster DNS answers through its Service IP",
        READY,
        || dns_answers(cluster),
    )?;
    // Both clients succeed before anything is disturbed.
    eventually("both clients succeed", READY, || {
        let before = Tally::now(cluster)?;
        std::thread::sleep(Duration::from_secs(3));
        for (sent, failed) in before.since(cluster)? {
            ensure!(
                sent > 0 && failed.is_empty(),
                "{} of {sent} failed",
                failed.len()
            );
        }
        Ok(())
    })
}

/// The controllers run in `namespace` on two nodes that are not control-plane nodes, with the
/// CA they made.
fn controllers_on_ordinary_nodes(cluster: &RealCluster, namespace: &str) -> Result<()> {
    let nodes = cluster.kubectl(&[
        "-n",
        namespace,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=splitproxy-controller",
        "-o",
        "jsonpath={.items[*].spec.nodeName}",
    ])?;
    let nodes: Vec<&str> = nodes.split_whitespace().collect();
    ensure!(
        nodes.len() == 2 && nodes.iter().all(|node| !node.starts_with("cp-")),
        "the controllers run on {nodes:?}, not on two ordinary nodes"
    );
    cluster.kubectl(&[
        "-n",
        namespace,
        "get",
        "secret,configmap",
        "splitproxy-controller-ca",
    ])?;
    Ok(())
}

/// Runs `step` under the clients' traffic; prints and checks that no request failed.
fn without_loss(
    cluster: &RealCluster,
    what: &str,
    step: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let before = Tally::now(cluster)?;
    let started = Instant::now();
    step()?;
    // Requests in flight when the step ended are counted too.
    std::thread::sleep(Duration::from_secs(5));
    let outcomes = before.since(cluster)?;
    for (client, (sent, failed)) in CLIENTS.iter().zip(&outcomes) {
        println!(
            "{what}: {client}: {sent} requests in {:.0} s, {} failed",
            started.elapsed().as_secs_f64(),
            failed.len()
        );
        ensure!(*sent > 0, "{what}: {client} sent nothing");
        ensure!(
            failed.is_empty(),
            "{what}: {client} lost {} of {sent} requests: {:?}",
            failed.len(),
            &failed[..failed.len().min(10)]
        );
    }
    Ok(())
}

/// How many times splitproxy's containers have been restarted, all Pods together.
fn restart_count(cluster: &RealCluster) -> Result<usize> {
    let counts = cluster.kubectl(&[
        "-n",
        SPLITPROXY_NAMESPACE,
        "get",
        "pods",
        "-o",
        "jsonpath={.items[*].status.containerStatuses[*].restartCount}",
    ])?;
    counts
        .split_whitespace()
        .map(|count| count.parse::<usize>().context("a restart count"))
        .sum()
}

fn rollout(cluster: &RealCluster, kind: &str) -> Result<()> {
    cluster.kubectl(&["-n", SPLITPROXY_NAMESPACE, "rollout", "restart", kind])?;
    cluster.kubectl(&[
        "-n",
        SPLITPROXY_NAMESPACE,
        "rollout",
        "status",
        kind,
        &format!("--timeout={}s", ROLLOUT.as_secs()),
    ])?;
    Ok(())
}

/// The cluster DNS answers `kubernetes.default` through its Service IP, from a pod.
fn dns_answers(cluster: &RealCluster) -> Result<()> {
    let answer = cluster.exec(
        NAMESPACE,
        "by-name",
        &[
            "dig",
            "+short",
            "+time=2",
            "+tries=1",
            &format!("@{DNS_SERVICE_IP}"),
            "kubernetes.default.svc.cluster.local",
        ],
    )?;
    ensure!(
        answer.trim() == KUBERNETES_SERVICE_IP,
        "kube-dns answered {answer:?}"
    );
    Ok(())
}

/// What a full restart does to Service rules, on every node at once: every splitproxy process
/// killed (the kubelets start them again) and the whole netfilter ruleset and conntrack table
/// emptied.
fn restart_everything() -> Result<()> {
    let mut flushes = Vec::new();
    for node in NODES {
        flushes.push(std::thread::spawn(move || {
            RealCluster::on_node(node, &["nft", "flush", "ruleset"])?;
            RealCluster::on_node(node, &["conntrack", "-F"]).map(drop)
        }));
    }
    kill_all("^/usr/local/bin/splitproxy-(agent|controller)")?;
    for flush in flushes {
        flush
            .join()
            .map_err(|_| anyhow::anyhow!("a flush thread panicked"))??;
    }
    Ok(())
}

/// Kills, with SIGKILL, every process whose command line matches `pattern`; at least one must.
fn kill_all(pattern: &str) -> Result<()> {
    let killed = std::process::Command::new("pkill")
        .args(["-9", "-f", pattern])
        .status()
        .context("running pkill")?;
    ensure!(killed.success(), "found no process matching {pattern}");
    Ok(())
}

/// The tests share the one lab cluster: one at a time.
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

#[test]
fn splitproxy_from_deploy_serves_a_real_cluster_through_rollouts_restarts_and_a_switch_to_ebpf()
-> Result<()> {
    let _cluster = ONE_CLUSTER.lock().unwrap_or_else(PoisonError::into_inner);
    let cluster = RealCluster::fresh()?;
    let started = Instant::now();
    cluster.install(Proxy::SplitproxyIptables)?;
    println!(
        "install: splitproxy from deploy/ ready, cluster DNS serving, in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    agents_ready(&cluster)?;
    controllers_on_ordinary_nodes(&cluster, SPLITPROXY_NAMESPACE)?;

    start_traffic(&cluster)?;

    without_loss(&cluster, "agent DaemonSet rollout", || {
        rollout(&cluster, "daemonset/splitproxy-agent")
    })?;
    without_loss(&cluster, "controller Deployment rollout", || {
        rollout(&cluster, "deployment/splitproxy-controller")
    })?;

    let restarts_before = restart_count(&cluster)?;
    let restarted = Instant::now();
    restart_everything()?;
    eventually("Services answer again after the restart", RECOVERY, || {
        dns_answers(&cluster)?;
        for client in CLIENTS {
            let log = cluster.logs(NAMESPACE, client)?;
            let last = log.lines().last().unwrap_or_default();
            ensure!(last.starts_with("ok "), "{client} last saw {last:?}");
        }
        Ok(())
    })?;
    let recovered = restarted.elapsed();
    // Every agent and controller was killed and started again by its kubelet.
    eventually("every splitproxy container restarted", READY, || {
        let restarts = restart_count(&cluster)?;
        ensure!(
            restarts >= restarts_before + NODES.len() + 2,
            "{restarts_before} restarts before, {restarts} now"
        );
        Ok(())
    })?;
    println!(
        "full restart: Services answered again {:.0} s after every node's rules were flushed",
        recovered.as_secs_f64()
    );

    // An operator switching modes: deploy/ebpf applied over deploy/. The agents roll node by
    // node; each ebpf agent programs its node, then removes the iptables rules it took over.
    for node in NODES {
        ensure!(
            has_service_chains(node)?,
            "{node} has no iptables Service chain in iptables mode"
        );
    }
    without_loss(&cluster, "switch from iptables to ebpf mode", || {
        cluster.install(Proxy::SplitproxyEbpf)
    })?;
    for node in NODES {
        let mode = RealCluster::on_node(
            node,
            &["curl", "-sS", "-m", "5", "http://127.0.0.1:10249/proxyMode"],
        )?;
        ensure!(
            mode == "ebpf",
            "{node}'s agent serves {mode:?} at /proxyMode"
        );
        ensure!(
            !has_service_chains(node)?,
            "{node} keeps iptables mode's Service chains after the switch"
        );
    }
    // Fail static: with every agent killed at once, the programs pinned in each node's BPF
    // filesystem go on balancing, and each restarted agent reconciles its maps in place.
    let restarts_before = restart_count(&cluster)?;
    without_loss(&cluster, "every ebpf agent killed and restarted", || {
        kill_all("^/usr/local/bin/splitproxy-agent")?;
        eventually("every agent restarted and ready", READY, || {
            let restarts = restart_count(&cluster)?;
            ensure!(
                restarts >= restarts_before + NODES.len(),
                "{restarts_before} restarts before, {restarts} now"
            );
            agents_ready(&cluster)
        })
    })?;
    cluster.down()
}

/// Whether `node` has a Service chain of kube-proxy's iptables layout, in either iptables
/// variant (the agent's wrapper picks the node's).
fn has_service_chains(node: &str) -> Result<bool> {
    let mut found = false;
    for save in ["iptables-nft-save", "iptables-legacy-save"] {
        found |= RealCluster::on_node(node, &[save, "-t", "nat"])?.contains(":KUBE-SVC-");
    }
    Ok(found)
}

/// Every node's agent is ready.
fn agents_ready(cluster: &RealCluster) -> Result<()> {
    let ready = cluster.kubectl(&[
        "-n",
        SPLITPROXY_NAMESPACE,
        "get",
        "daemonset/splitproxy-agent",
        "-o",
        "jsonpath={.status.numberReady}",
    ])?;
    ensure!(ready == NODES.len().to_string(), "{ready} agents ready");
    Ok(())
}

#[test]
fn kubeadms_kube_proxy_turns_into_splitproxy_in_place_without_loss() -> Result<()> {
    let _cluster = ONE_CLUSTER.lock().unwrap_or_else(PoisonError::into_inner);
    let cluster = RealCluster::fresh()?;
    cluster.install(Proxy::KubeProxy)?;
    start_traffic(&cluster)?;
    // kubeadm's DaemonSet and ConfigMap stay; the overlay changes the DaemonSet's image and
    // command, and node by node kube-proxy hands its chains to the agent.
    without_loss(&cluster, "migration from kube-proxy", || {
        cluster.install(Proxy::SplitproxyMigrated)
    })?;
    let images = cluster.kubectl(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "k8s-app=kube-proxy",
        "-o",
        "jsonpath={.items[*].spec.containers[0].image}",
    ])?;
    let images: Vec<&str> = images.split_whitespace().collect();
    ensure!(
        images.len() == NODES.len()
            && images
                .iter()
                .all(|image| image.contains("splitproxy/agent")),
        "the kube-proxy Pods run {images:?}"
    );
    controllers_on_ordinary_nodes(&cluster, "kube-system")?;
    // A Service made now is programmed by the agents (not left over from kube-proxy): they
    // follow the controllers.
    cluster.apply(&format!(
        "apiVersion: v1
kind: Service
metadata:
  name: web-after
  namespace: {NAMESPACE}
spec:
  selector:
    app: web
  ports:
  - port: 80
    targetPort: 8080
"
    ))?;
    eventually("a Service made after the migration answers", READY, || {
        cluster
            .exec(
                NAMESPACE,
                "by-name",
                &[
                    "curl",
                    "-sS",
                    "-m",
                    "2",
                    &format!("http://web-after.{NAMESPACE}.svc.cluster.local/hostname"),
                ],
            )
            .map(drop)
    })?;
    dns_answers(&cluster)
}
