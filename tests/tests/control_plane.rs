//! splitproxy against a real control plane: etcd, kube-apiserver and kube-controller-manager built
//! from the official Kubernetes modules, driven with kubectl. The controller runs with a token of
//! its own `deploy/` ServiceAccount, so the RBAC there is proven sufficient. Needs root.
//!
//! Addresses: see `splitproxy_e2e::addresses`; the API server listens on the control-plane host.

use anyhow::{Context, Result, ensure};
use splitproxy_dataplane::{Protocol, iptables::chain_names};
use splitproxy_e2e::{
    addresses::{self, CONTROL_PLANE, EXTERNAL_CLIENT},
    control_plane::{Binaries, ControlPlane},
    eventually, expect_answers, hit,
    lab::{HasNamespace, Lab, Node, Pod, Process},
    load_report, serve, start_load,
};
use std::{collections::BTreeSet, path::Path, time::Duration};

const NAMESPACE: &str = "demo";
const CLUSTER_IP: &str = "10.96.0.10";
const NODE_PORT: u16 = 30080;
const POD_PORT: u16 = 8080;
const REQUESTS: u32 = 40;
/// Generous: the API server, the EndpointSlice controller and the agents all run on a shared
/// 2-core machine.
const CONVERGE: Duration = Duration::from_secs(120);

struct Cluster {
    lab: Lab,
    control_plane: ControlPlane,
    nodes: Vec<Node>,
    external: splitproxy_e2e::lab::Host,
    agents: Vec<Process>,
    controller: Option<Process>,
}

impl Cluster {
    fn url(&self) -> String {
        format!("http://{CLUSTER_IP}:80/")
    }

    /// Traffic from both nodes to the cluster IP and from outside to both node ports is answered,
    /// only and all by `expected`.
    fn check(&self, expected: &[&str]) -> Result<()> {
        let wanted: BTreeSet<&str> = expected.iter().copied().collect();
        let mut targets: Vec<(&dyn HasNamespace, String)> = Vec::new();
        for node in &self.nodes {
            targets.push((node, self.url()));
            targets.push((&self.external, format!("http://{}:{NODE_PORT}/", node.ip())));
        }
        for (from, url) in targets {
            expect_answers(&self.lab, from, &url, REQUESTS, &wanted)?;
        }
        Ok(())
    }

    fn converge(&self, what: &str, expected: &[&str]) -> Result<()> {
        eventually(what, CONVERGE, || self.check(expected)).with_context(|| self.logs())
    }

    fn logs(&self) -> String {
        let mut text = self.control_plane.logs();
        for process in self.controller.iter().chain(&self.agents) {
            text.push_str(&process.log_tail(30));
        }
        text
    }

    /// Watches the API server serves right now (its own gauge of long-running WATCH requests).
    fn watches(&self) -> Result<u64> {
        let metrics = self.control_plane.metrics(&self.lab)?;
        let total: f64 = metrics
            .lines()
            .filter(|l| {
                l.starts_with("apiserver_longrunning_requests{") && l.contains("verb=\"WATCH\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        Ok(total as u64)
    }
}

fn repo_path(relative: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn services_from_a_real_api_server_reach_ready_pods_and_survive_its_restart() -> Result<()> {
    let binaries = Binaries::ensure()?;
    let mut lab = Lab::new("cp")?;
    let cp_host = lab.add_host("cp", CONTROL_PLANE)?;
    let external = lab.add_host("ext", EXTERNAL_CLIENT)?;
    let nodes = lab.add_nodes(2)?;
    let control_plane = ControlPlane::start(&mut lab, &cp_host, binaries)?;

    // The controller runs as its own ServiceAccount, with exactly the deploy/ RBAC.
    control_plane.kubectl(
        &lab,
        &["apply", "-f", &repo_path("deploy/base/namespace.yaml")],
    )?;
    // The whole deploy/ base and its variants are accepted by the real API server (dry run:
    // they need images).
    for folder in ["deploy", "deploy/ebpf", "deploy/migrate-from-kube-proxy"] {
        control_plane
            .kubectl(
                &lab,
                &["apply", "--dry-run=server", "-k", &repo_path(folder)],
            )
            .with_context(|| format!("{folder}/ must pass server-side validation"))?;
    }

    control_plane.kubectl(
        &lab,
        &[
            "apply",
            "-n",
            "splitproxy-system",
            "-f",
            &repo_path("deploy/base/rbac.yaml"),
        ],
    )?;
    // The controller reads the cluster and asks the API server whose agent token is whose:
    // nothing more, in its own namespace too (which may be kube-system): not its CA. Only the
    // CA's own account keeps the CA, in the two objects deploy/ ships, creating nothing. The
    // agent only finds the controllers.
    let cluster_wide = [
        ("services", "", "list watch"),
        ("nodes", "", "list watch"),
        ("endpointslices.discovery.k8s.io", "", "list watch"),
        ("servicecidrs.networking.k8s.io", "", "list watch"),
        ("tokenreviews.authentication.k8s.io", "", "create"),
    ];
    for namespace in ["default", "splitproxy-system"] {
        check_least_privilege(
            &control_plane,
            &lab,
            "splitproxy-controller",
            namespace,
            &cluster_wide,
        )?;
    }
    check_least_privilege(&control_plane, &lab, "splitproxy-ca", "default", &[])?;
    check_least_privilege(
        &control_plane,
        &lab,
        "splitproxy-ca",
        "splitproxy-system",
        &[
            ("secrets", "splitproxy-controller-ca", "get update"),
            ("configmaps", "splitproxy-controller-ca", "get patch"),
        ],
    )?;
    check_least_privilege(&control_plane, &lab, "splitproxy-agent", "default", &[])?;
    check_least_privilege(
        &control_plane,
        &lab,
        "splitproxy-agent",
        "splitproxy-system",
        &[("endpointslices.discovery.k8s.io", "", "list")],
    )?;
    let token = control_plane.kubectl(
        &lab,
        &[
            "-n",
            "splitproxy-system",
            "create",
            "token",
            "splitproxy-controller",
            "--duration=2h",
        ],
    )?;
    let kubeconfig = control_plane.kubeconfig_for_token("controller", token.trim())?;

    for node in &nodes {
        control_plane.register_node(&lab, node)?;
    }
    control_plane.create_namespace(&lab, NAMESPACE)?;
    let mut pods: Vec<Pod> = Vec::new();
    for (name, node, host) in [("web-a", 0, 2), ("web-b", 1, 2), ("web-c", 1, 3)] {
        let n = u8::try_from(node + 1)?;
        let pod = lab.add_pod(&nodes[node], name, addresses::pod_ip(n, host))?;
        serve(&mut lab, &pod, name, POD_PORT)?;
        pods.push(pod);
    }
    control_plane.create_pod(&lab, NAMESPACE, &pods[0], "web", POD_PORT, true)?;
    control_plane.create_pod(&lab, NAMESPACE, &pods[1], "web", POD_PORT, true)?;
    control_plane.kubectl_apply(
        &lab,
        &format!(
            "apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: {NAMESPACE}
spec:
  type: NodePort
  clusterIP: {CLUSTER_IP}
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: web
    nodePort: {NODE_PORT}
"
        ),
    )?;

    let controller = control_plane.start_controller(&mut lab, &kubeconfig)?;
    let mut cluster = Cluster {
        lab,
        control_plane,
        nodes,
        external,
        agents: Vec::new(),
        controller: Some(controller),
    };
    // Let the controller's watches open before counting them.
    eventually("the controller watches the API server", CONVERGE, || {
        let watches = cluster.watches()?;
        ensure!(watches >= 3, "{watches} watches");
        Ok(())
    })?;
    let watches_without_agents = cluster.watches()?;
    for node in &cluster.nodes {
        let agent = cluster.control_plane.start_agent(&mut cluster.lab, node)?;
        cluster.agents.push(agent);
    }

    cluster.converge(
        "traffic reaches the ready pods web-a and web-b",
        &["web-a", "web-b"],
    )?;
    let watches_with_agents = cluster.watches()?;
    println!(
        "API-server watches: {watches_without_agents} with the controller alone, \
         {watches_with_agents} with {} agents",
        cluster.agents.len()
    );
    ensure!(
        watches_with_agents == watches_without_agents,
        "agents must not open watches: {watches_without_agents} before, {watches_with_agents} after"
    );

    // A new pod turning Ready gets traffic; a pod turning not-ready leaves rotation.
    cluster
        .control_plane
        .create_pod(&cluster.lab, NAMESPACE, &pods[2], "web", POD_PORT, false)?;
    cluster
        .control_plane
        .set_pod_ready(&cluster.lab, NAMESPACE, &pods[2], true)?;
    cluster.converge("web-c joins once Ready", &["web-a", "web-b", "web-c"])?;
    // The EndpointSlice controller's last-change-trigger-time reached the agents: they report
    // network programming latency as kube-proxy does.
    let metrics = cluster.lab.exec_ok(
        &cluster.nodes[0],
        "curl",
        &["-sf", "http://127.0.0.1:10249/metrics"],
    )?;
    let programmed = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                r#"kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} "#,
            )
        })
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    ensure!(
        programmed > 0,
        "no network programming latency observed:\n{metrics}"
    );
    cluster
        .control_plane
        .set_pod_ready(&cluster.lab, NAMESPACE, &pods[0], false)?;
    cluster.converge("web-a leaves once not ready", &["web-b", "web-c"])?;

    // A Service labelled for another proxy is left alone; removing the label hands it to us.
    cluster.control_plane.kubectl_apply(
        &cluster.lab,
        &format!(
            "apiVersion: v1
kind: Service
metadata:
  name: web-other
  namespace: {NAMESPACE}
  labels:
    service.kubernetes.io/service-proxy-name: foo-bar
spec:
  clusterIP: 10.96.0.11
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: web
"
        ),
    )?;
    let other_url = "http://10.96.0.11:80/";
    let node1 = cluster.nodes[0].clone();
    // Once the slices of web-other exist, a claimed Service would be programmed within a sync.
    eventually("web-other has endpoint slices", CONVERGE, || {
        let slices = cluster.control_plane.kubectl(
            &cluster.lab,
            &[
                "-n",
                NAMESPACE,
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=web-other",
                "-o",
                "name",
            ],
        )?;
        ensure!(!slices.trim().is_empty(), "no slices yet");
        Ok(())
    })?;
    cluster.converge("web-b and web-c still serve web", &["web-b", "web-c"])?;
    let nat = cluster
        .lab
        .exec_ok(&node1, "iptables-save", &["-t", "nat"])?;
    ensure!(
        !nat.contains("10.96.0.11"),
        "another proxy's Service was programmed:\n{nat}"
    );
    cluster.control_plane.kubectl(
        &cluster.lab,
        &[
            "-n",
            NAMESPACE,
            "label",
            "service",
            "web-other",
            "service.kubernetes.io/service-proxy-name-",
        ],
    )?;
    eventually("web-other is served once unlabelled", CONVERGE, || {
        let report = hit(&cluster.lab, &node1, other_url, REQUESTS)?;
        ensure!(
            report.failures == 0 && report.answered() == REQUESTS,
            "{report:?}"
        );
        Ok(())
    })
    .with_context(|| cluster.logs())?;

    // kube-apiserver killed and restarted under steady traffic: no request fails, and changes made
    // after the restart still reach the nodes.
    let url = cluster.url();
    let load = start_load(&mut cluster.lab, &node1, &url, 600, 50)?;
    cluster.control_plane.kill_apiserver(&mut cluster.lab)?;
    std::thread::sleep(Duration::from_secs(2));
    cluster.control_plane.start_apiserver(&mut cluster.lab)?;
    let report = eventually("the steady load finishes", Duration::from_secs(300), || {
        load_report(&load)?.context("still running")
    })?;
    println!(
        "Steady load across the API-server restart: {} answered, {} failed",
        report.answered(),
        report.failures
    );
    ensure!(
        report.failures == 0 && report.answered() == 600,
        "requests failed across the restart: {report:?}"
    );
    cluster
        .control_plane
        .set_pod_ready(&cluster.lab, NAMESPACE, &pods[0], true)?;
    cluster.converge(
        "web-a returns after the API-server restart",
        &["web-a", "web-b", "web-c"],
    )?;

    // A LoadBalancer Service without node ports: the API server allocates none, the VIP ingress
    // IP is programmed, the Proxy one is left to the load balancer.
    check_load_balancer_without_node_ports(&cluster)?;

    // A deleted Service's rules are gone.
    cluster
        .control_plane
        .kubectl(&cluster.lab, &["-n", NAMESPACE, "delete", "service", "web"])?;
    let web_chain = chain_names::service_chain(&format!("{NAMESPACE}/web:http"), Protocol::Tcp);
    eventually("the deleted Service's rules are removed", CONVERGE, || {
        let nat = cluster
            .lab
            .exec_ok(&node1, "iptables-save", &["-t", "nat"])?;
        ensure!(
            !nat.contains(&web_chain) && !nat.contains(CLUSTER_IP),
            "rules remain:\n{nat}"
        );
        Ok(())
    })
    .with_context(|| cluster.logs())?;
    Ok(())
}

/// `web-lb`: `allocateLoadBalancerNodePorts: false`, ingress `192.0.2.50` (ipMode VIP) and
/// `192.0.2.51` (ipMode Proxy), both routed to node-1 by the external host.
fn check_load_balancer_without_node_ports(cluster: &Cluster) -> Result<()> {
    let (vip, proxied) = ("192.0.2.50", "192.0.2.51");
    cluster.control_plane.kubectl_apply(
        &cluster.lab,
        &format!(
            "apiVersion: v1
kind: Service
metadata:
  name: web-lb
  namespace: {NAMESPACE}
spec:
  type: LoadBalancer
  allocateLoadBalancerNodePorts: false
  clusterIP: 10.96.0.12
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: web
"
        ),
    )?;
    let node_ports = cluster.control_plane.kubectl(
        &cluster.lab,
        &[
            "-n",
            NAMESPACE,
            "get",
            "service",
            "web-lb",
            "-o",
            "jsonpath={.spec.ports[*].nodePort}",
        ],
    )?;
    ensure!(
        node_ports.trim().is_empty(),
        "the API server allocated node ports {node_ports:?}"
    );
    let status = format!(
        r#"{{"status":{{"loadBalancer":{{"ingress":[{{"ip":"{vip}","ipMode":"VIP"}},{{"ip":"{proxied}","ipMode":"Proxy"}}]}}}}}}"#
    );
    cluster.control_plane.kubectl(
        &cluster.lab,
        &[
            "-n",
            NAMESPACE,
            "patch",
            "service",
            "web-lb",
            "--subresource",
            "status",
            "--type",
            "merge",
            "-p",
            &status,
        ],
    )?;
    let node1 = cluster.nodes[0].ip().to_string();
    for ip in [vip, proxied] {
        cluster.lab.exec_ok(
            &cluster.external,
            "ip",
            &["route", "add", &format!("{ip}/32"), "via", &node1],
        )?;
    }
    eventually("the VIP ingress IP reaches the pods", CONVERGE, || {
        let report = hit(
            &cluster.lab,
            &cluster.external,
            &format!("http://{vip}:80/"),
            REQUESTS,
        )?;
        ensure!(report.failures == 0, "{report:?}");
        Ok(())
    })
    .with_context(|| cluster.logs())?;
    let nat = cluster
        .lab
        .exec_ok(&cluster.nodes[0], "iptables-save", &["-t", "nat"])?;
    let lb_chain = chain_names::service_chain(&format!("{NAMESPACE}/web-lb:http"), Protocol::Tcp);
    ensure!(
        nat.contains(&lb_chain) && !nat.contains(proxied),
        "expected {lb_chain} and no rule for {proxied}:\n{nat}"
    );
    let report = hit(
        &cluster.lab,
        &cluster.external,
        &format!("http://{proxied}:80/"),
        1,
    )?;
    ensure!(
        report.answered() == 0,
        "the Proxy ingress IP was answered: {report:?}"
    );
    Ok(())
}

/// The controller's account may list and watch Services, EndpointSlices and Nodes, and otherwise
/// only do what every authenticated user may (discovery, self reviews).
/// One row of `kubectl auth can-i --list`: resource, resource names, verbs.
type Grant = (String, String, String);

/// The rows of `kubectl auth can-i --list` but the ones every account has and non-resource URLs.
fn grants(can_i: &str) -> BTreeSet<Grant> {
    let everyone = [
        "selfsubjectreviews.authentication.k8s.io",
        "selfsubjectaccessreviews.authorization.k8s.io",
        "selfsubjectrulesreviews.authorization.k8s.io",
    ];
    let mut granted = BTreeSet::new();
    for line in can_i.lines().skip(1) {
        // RESOURCE [NON-RESOURCE URLS] [RESOURCE NAMES] [VERBS]; non-resource rows start with
        // an empty resource column.
        let Some((resource, rest)) = line.split_once(char::is_whitespace) else {
            continue;
        };
        if resource.is_empty() || resource.starts_with('/') || everyone.contains(&resource) {
            continue;
        }
        let groups: Vec<&str> = rest
            .split('[')
            .skip(1)
            .map(|group| group.trim().trim_end_matches(']'))
            .collect();
        if let [_, names, verbs] = groups[..] {
            granted.insert((resource.to_owned(), names.to_owned(), verbs.to_owned()));
        }
    }
    granted
}

/// `account` may do exactly `needed` (resource, resource names, verbs) in `namespace`.
fn check_least_privilege(
    control_plane: &ControlPlane,
    lab: &Lab,
    account: &str,
    namespace: &str,
    needed: &[(&str, &str, &str)],
) -> Result<()> {
    let can_i = control_plane.kubectl(
        lab,
        &[
            "auth",
            "can-i",
            "--list",
            "-n",
            namespace,
            &format!("--as=system:serviceaccount:splitproxy-system:{account}"),
        ],
    )?;
    let needed: BTreeSet<Grant> = needed
        .iter()
        .map(|(resource, names, verbs)| {
            (
                (*resource).to_owned(),
                (*names).to_owned(),
                (*verbs).to_owned(),
            )
        })
        .collect();
    let granted = grants(&can_i);
    ensure!(
        granted == needed,
        "{account} in {namespace}: more than it needs {:?}, missing {:?}:\n{can_i}",
        granted.difference(&needed).collect::<Vec<_>>(),
        needed.difference(&granted).collect::<Vec<_>>()
    );
    Ok(())
}
