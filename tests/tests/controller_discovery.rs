//! A controller deployment that needs no control-plane node and no person making certificates,
//! against the real API server, with `deploy/base/rbac.yaml`'s permissions and nothing more: the
//! replicas make one CA between them in a Secret and publish it; the agent finds the ready
//! replicas in their Service's EndpointSlices (no VIP, no address list), checks their
//! certificates against the Service's name, and follows when the ready replica changes.
//! Needs root.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    addresses::{self, CONTROL_PLANE},
    control_plane::{
        AGENT_ACCOUNT, AGENT_NAMESPACE, API_PORT, Binaries, CONTROLLER_SERVICE, ControlPlane,
        controller_service_yaml, web_service_yaml,
    },
    eventually, expect_reached,
    lab::{Lab, Process},
    serve, workspace_binary,
};
use std::{path::Path, time::Duration};

const CONVERGE: Duration = Duration::from_secs(90);
const POD_PORT: u16 = 8080;
const CA: &str = "splitproxy-controller-ca";
const SERVICE: &str = CONTROLLER_SERVICE;
/// The two replicas' ports: both run on the control-plane host.
const PORTS: [u16; 2] = [10660, 10670];

/// The controller Service and one EndpointSlice per replica, `ready` saying which replica is.
fn controller_endpoints(ip: &str, ready: [bool; 2]) -> String {
    controller_service_yaml(ip, &PORTS, &ready)
}

/// A kubeconfig for a token of `account` (the API server's audience), as its Pod would get.
fn account_kubeconfig(lab: &Lab, control_plane: &ControlPlane, account: &str) -> Result<String> {
    let token = control_plane.kubectl(lab, &["-n", AGENT_NAMESPACE, "create", "token", account])?;
    let file = control_plane.kubeconfig_for_token(account, token.trim())?;
    Ok(file.to_string_lossy().into_owned())
}

/// A field (`path`, JSONPath) of the CA's Secret or ConfigMap (`kind`).
fn ca_object(lab: &Lab, control_plane: &ControlPlane, kind: &str, path: &str) -> Result<String> {
    control_plane.kubectl(
        lab,
        &[
            "-n",
            AGENT_NAMESPACE,
            "get",
            kind,
            CA,
            &format!("-o=jsonpath={path}"),
        ],
    )
}

fn web_url(lab: &Lab, control_plane: &ControlPlane, name: &str) -> Result<String> {
    Ok(format!(
        "http://{}/",
        control_plane.cluster_ip(lab, "demo", name)?
    ))
}

/// The controller URLs the agent subscribed to, in order.
fn subscriptions(agent: &Process) -> Vec<String> {
    agent
        .log()
        .lines()
        .filter(|line| line.contains("subscribed"))
        .filter_map(|line| {
            let (_, rest) = line.split_once("controller=")?;
            Some(rest.split_whitespace().next()?.to_owned())
        })
        .collect()
}

#[test]
fn agents_find_controllers_through_their_service_and_trust_the_ca_the_controllers_made()
-> Result<()> {
    let binaries = Binaries::ensure()?;
    let mut lab = Lab::new("discovery")?;
    let cp_host = lab.add_host("cp", CONTROL_PLANE)?;
    let nodes = lab.add_nodes(2)?;
    let control_plane = ControlPlane::start(&mut lab, &cp_host, binaries)?;
    for node in &nodes {
        control_plane.register_node(&lab, node)?;
    }
    let cp_ip = cp_host.ip().to_string();
    // deploy/'s ServiceAccounts and permissions, in the namespace kustomize would give them.
    control_plane.kubectl(&lab, &["create", "namespace", AGENT_NAMESPACE])?;
    let rbac = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/base/rbac.yaml");
    control_plane.kubectl(
        &lab,
        &[
            "-n",
            AGENT_NAMESPACE,
            "apply",
            "-f",
            &rbac.to_string_lossy(),
        ],
    )?;
    control_plane.kubectl(&lab, &["create", "namespace", "demo"])?;
    let pod = lab.add_pod(&nodes[1], "web-a", addresses::pod_ip(2, 2))?;
    serve(&mut lab, &pod, "web-a", POD_PORT)?;
    control_plane.create_pod(&lab, "demo", &pod, "web", POD_PORT, true)?;
    control_plane.kubectl_apply(&lab, &web_service_yaml("demo", "web"))?;
    control_plane.kubectl_apply(&lab, &controller_endpoints(&cp_ip, [true, false]))?;

    // Two replicas start together, as a Deployment's would, as the controller's ServiceAccount.
    let controller_kubeconfig = account_kubeconfig(&lab, &control_plane, "splitproxy-controller")?;
    let tls = [
        format!("--tls-ca-secret={AGENT_NAMESPACE}/{CA}"),
        format!("--tls-san={SERVICE}.{AGENT_NAMESPACE}.svc,{cp_ip}"),
    ];
    let mut controllers = Vec::new();
    for port in PORTS {
        controllers.push(control_plane.start_controller_with_tls(
            &mut lab,
            Path::new(&controller_kubeconfig),
            port,
            &tls,
        )?);
    }
    let controller_logs = |controllers: &[Process]| {
        controllers
            .iter()
            .map(Process::log)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let published = eventually("the CA is published", CONVERGE, || {
        ca_object(&lab, &control_plane, "configmap", "{.data.ca\\.crt}")
    })
    .with_context(|| controller_logs(&controllers))?;
    let secret_cert = ca_object(&lab, &control_plane, "secret", "{.data.tls\\.crt}")?;
    let decoded = lab.exec_ok(
        &cp_host,
        "sh",
        &["-c", &format!("echo {} | base64 -d", secret_cert.trim())],
    )?;
    ensure!(
        decoded.trim() == published.trim(),
        "the ConfigMap does not publish the Secret's CA"
    );
    let ca_file = tempfile::NamedTempFile::new()?;
    std::fs::write(ca_file.path(), &published)?;
    let created = controller_logs(&controllers)
        .matches("wrote the controllers' CA")
        .count();
    ensure!(created == 1, "{created} replicas wrote a CA");

    // The agent: a Pod-bound token for the controllers, an API token for the EndpointSlices,
    // and the API server's real address, as deploy/ gives it.
    let token = control_plane.agent_token(&lab, nodes[0].name())?;
    let agent_kubeconfig = account_kubeconfig(&lab, &control_plane, AGENT_ACCOUNT)?;
    let master = format!("https://{cp_ip}:{API_PORT}");
    let agent = lab.spawn(
        &nodes[0],
        workspace_binary("splitproxy-agent")?,
        &[
            "--hostname-override",
            nodes[0].name(),
            "--controller-service",
            &format!("{AGENT_NAMESPACE}/{SERVICE}"),
            "--kubeconfig",
            &agent_kubeconfig,
            "--master",
            &master,
            "--token-file",
            &token.to_string_lossy(),
            "--controller-ca-file",
            &ca_file.path().to_string_lossy(),
        ],
    )?;
    let web = web_url(&lab, &control_plane, "web")?;
    eventually("node-1 reaches the Service", CONVERGE, || {
        expect_reached(&lab, &nodes[0], &web, 5)
    })
    .with_context(|| format!("{}\n{}", controller_logs(&controllers), agent.log()))?;
    let first = format!("https://{cp_ip}:{}", PORTS[0]);
    ensure!(
        subscriptions(&agent) == [first.clone()],
        "the agent subscribed to {:?}, not only the ready replica",
        subscriptions(&agent)
    );

    // The ready replica changes and the first one goes away: the agent follows, and the
    // second replica's view programs a new Service.
    control_plane.kubectl_apply(&lab, &controller_endpoints(&cp_ip, [false, true]))?;
    let first_replica = controllers.remove(0);
    lab.kill(&first_replica)?;
    control_plane.kubectl_apply(&lab, &web_service_yaml("demo", "web-2"))?;
    let web2 = web_url(&lab, &control_plane, "web-2")?;
    eventually(
        "node-1 reaches a Service made after the switch",
        CONVERGE,
        || expect_reached(&lab, &nodes[0], &web2, 5),
    )
    .with_context(|| format!("{}\n{}", controller_logs(&controllers), agent.log()))?;
    let second = format!("https://{cp_ip}:{}", PORTS[1]);
    ensure!(
        subscriptions(&agent).last() == Some(&second),
        "the agent last subscribed to {:?}",
        subscriptions(&agent)
    );

    // A replica started later takes the same CA: the agent, which trusts only the published
    // one, follows it too.
    controllers.push(control_plane.start_controller_with_tls(
        &mut lab,
        Path::new(&controller_kubeconfig),
        PORTS[0],
        &tls,
    )?);
    control_plane.kubectl_apply(&lab, &controller_endpoints(&cp_ip, [true, false]))?;
    let second_replica = controllers.remove(0);
    lab.kill(&second_replica)?;
    eventually("the agent follows the restarted replica", CONVERGE, || {
        ensure!(
            subscriptions(&agent).last() == Some(&first),
            "{:?}",
            subscriptions(&agent)
        );
        expect_reached(&lab, &nodes[0], &web2, 5)
    })
    .with_context(|| format!("{}\n{}", controller_logs(&controllers), agent.log()))?;
    ensure!(
        ca_object(&lab, &control_plane, "configmap", "{.data.ca\\.crt}")?.trim()
            == published.trim(),
        "the CA changed"
    );

    println!(
        "the agent followed the ready replica: {:?}",
        subscriptions(&agent)
    );
    // The CA's key never reaches a log.
    let key = ca_object(&lab, &control_plane, "secret", "{.data.tls\\.key}")?;
    let logs = format!(
        "{}\n{}\n{}\n{}",
        first_replica.log(),
        second_replica.log(),
        controller_logs(&controllers),
        agent.log()
    );
    ensure!(
        !logs.contains(key.trim()) && !logs.contains("PRIVATE KEY"),
        "the CA key appears in a log"
    );
    Ok(())
}
