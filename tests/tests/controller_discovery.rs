//! A controller deployment that needs no control-plane node and no person making certificates,
//! against the real API server, with `deploy/base/rbac.yaml`'s permissions and nothing more, and
//! the CA's key out of the controllers: `splitproxy-ca keep` (the Job) makes one CA in the Secret
//! however many run at once and publishes it; each replica's sidecar (`splitproxy-ca issue`)
//! issues its certificate from the CA files a kubelet would mount; the agent finds the ready
//! replicas in their Service's EndpointSlices (no VIP, no address list), checks their
//! certificates against the Service's name, and follows when the ready replica changes. Then a
//! CA rollover (`splitproxy-ca rollover`) replaces the CA under the agent's open stream, which it
//! never leaves, and after it the replicas serve certificates only the new CA verifies.
//! Needs root.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    addresses::{self, CONTROL_PLANE},
    control_plane::{
        AGENT_ACCOUNT, AGENT_NAMESPACE, API_PORT, Binaries, CONTROLLER_SERVICE, ControlPlane,
        controller_service_yaml, web_service_yaml,
    },
    eventually, expect_reached,
    lab::{HasNamespace, Lab, Node, Process},
    serve, workspace_binary,
};
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

const CONVERGE: Duration = Duration::from_secs(90);
const POD_PORT: u16 = 8080;
const CA: &str = "splitproxy-controller-ca";
const SERVICE: &str = CONTROLLER_SERVICE;
/// The two replicas' ports: both run on the control-plane host.
const PORTS: [u16; 2] = [10660, 10670];
/// The rollover's wait between steps: longer than the files take to reach the controllers here
/// (the test's kubelet stand-in copies them every second, the sidecar reads every 5 s, the
/// controller every 5 s).
const ROLLOVER_STEP_SECONDS: &str = "20";
/// Longest a rollover may take here: two steps, and a generous margin for a loaded machine.
const ROLLOVER: Duration = Duration::from_secs(180);

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

/// Waits until the agent on `node` last subscribed to `replica` and reaches the Service at
/// `web` through it.
fn follows(lab: &Lab, node: &Node, agent: &Process, replica: &str, web: &str) -> Result<()> {
    eventually("the agent follows the replica", CONVERGE, || {
        let subscribed = subscriptions(agent);
        ensure!(
            subscribed.last().map(String::as_str) == Some(replica),
            "{subscribed:?}"
        );
        expect_reached(lab, node, web, 5)
    })
    .with_context(|| agent.log())
}

/// The key `key` of the CA Secret, decoded.
fn secret_file(lab: &Lab, control_plane: &ControlPlane, key: &str) -> Result<String> {
    control_plane.kubectl(
        lab,
        &[
            "-n",
            AGENT_NAMESPACE,
            "get",
            "secret",
            CA,
            &format!("-o=go-template={{{{index .data \"{key}\" | base64decode}}}}"),
        ],
    )
}

/// What a kubelet keeps in the controller Pods' and the agent's volumes: the CA Secret's
/// certificate and key (the sidecars' mount), the published bundle (the agent's), and a memory
/// volume per replica for its serving certificate.
struct Mounts {
    dir: tempfile::TempDir,
}

impl Mounts {
    fn new() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir(dir.path().join("ca"))?;
        Ok(Self { dir })
    }

    fn ca_dir(&self) -> PathBuf {
        self.dir.path().join("ca")
    }

    fn agent_ca(&self) -> PathBuf {
        self.dir.path().join("agent-ca.crt")
    }

    /// The certificate and key files of the replica on `port`.
    fn serving(&self, port: u16) -> (PathBuf, PathBuf) {
        let dir = self.dir.path().join(format!("serving-{port}"));
        let _ = std::fs::create_dir(&dir);
        (dir.join("tls.crt"), dir.join("tls.key"))
    }

    /// Starts the controller replica on `port`, serving what its sidecar writes.
    fn start_replica(
        &self,
        lab: &mut Lab,
        control_plane: &ControlPlane,
        kubeconfig: &str,
        port: u16,
    ) -> Result<Process> {
        let (cert, key) = self.serving(port);
        control_plane.start_controller_with_tls(
            lab,
            Path::new(kubeconfig),
            port,
            &[
                format!("--tls-cert-file={}", cert.display()),
                format!("--tls-private-key-file={}", key.display()),
            ],
        )
    }

    /// Starts the replica on `PORTS[ready]`, makes it the ready one and stops the one that was
    /// (`controllers[0]`), which it returns.
    fn hand_over(
        &self,
        lab: &mut Lab,
        control_plane: &ControlPlane,
        kubeconfig: &str,
        controllers: &mut Vec<Process>,
        ready: usize,
    ) -> Result<Process> {
        let started = self.start_replica(lab, control_plane, kubeconfig, PORTS[ready])?;
        controllers.push(started);
        let ip = control_plane.host().ip().to_string();
        let mut which = [false; 2];
        which[ready] = true;
        control_plane.kubectl_apply(lab, &controller_endpoints(&ip, which))?;
        let stopped = controllers.remove(0);
        lab.kill(&stopped)?;
        Ok(stopped)
    }

    /// Copies the Secret and the ConfigMap as they are now, each file replaced whole.
    fn copy(&self, lab: &Lab, control_plane: &ControlPlane) -> Result<()> {
        let replace = |path: PathBuf, contents: String| -> Result<()> {
            let aside = path.with_extension("new");
            std::fs::write(&aside, contents)?;
            Ok(std::fs::rename(aside, path)?)
        };
        for key in ["tls.crt", "tls.key"] {
            replace(
                self.ca_dir().join(key),
                secret_file(lab, control_plane, key)?,
            )?;
        }
        replace(
            self.agent_ca(),
            ca_object(lab, control_plane, "configmap", "{.data.ca\\.crt}")?,
        )
    }
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
fn agents_find_controllers_through_their_service_and_keep_their_stream_through_a_ca_rollover()
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
    control_plane.create_namespace(&lab, AGENT_NAMESPACE)?;
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
    control_plane.create_namespace(&lab, "demo")?;
    let pod = lab.add_pod(&nodes[1], "web-a", addresses::pod_ip(2, 2))?;
    serve(&mut lab, &pod, "web-a", POD_PORT)?;
    control_plane.create_pod(&lab, "demo", &pod, "web", POD_PORT, true)?;
    control_plane.kubectl_apply(&lab, &web_service_yaml("demo", "web"))?;
    control_plane.kubectl_apply(&lab, &controller_endpoints(&cp_ip, [true, false]))?;

    // The CA Job, as its own ServiceAccount: two runs at once make one CA between them.
    let ca_kubeconfig = account_kubeconfig(&lab, &control_plane, "splitproxy-ca")?;
    let ca_args = |command: &str| {
        vec![
            command.to_owned(),
            format!("--secret={AGENT_NAMESPACE}/{CA}"),
            format!("--kubeconfig={ca_kubeconfig}"),
        ]
    };
    let mut ca_runs = Vec::new();
    for _ in 0..2 {
        let args = ca_args("keep");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ca_runs.push(lab.spawn(&cp_host, workspace_binary("splitproxy-ca")?, &args)?);
    }
    let ca_logs = |runs: &[Process]| runs.iter().map(Process::log).collect::<Vec<_>>().join("\n");
    eventually("both CA runs finish", CONVERGE, || {
        let logs = ca_logs(&ca_runs);
        let done = logs.matches("the CA is kept").count();
        ensure!(done == 2, "{done} of 2 runs finished");
        Ok(())
    })
    .with_context(|| ca_logs(&ca_runs))?;
    let created = ca_logs(&ca_runs).matches("wrote a new CA").count();
    ensure!(created == 1, "{created} runs wrote a CA");
    let published = ca_object(&lab, &control_plane, "configmap", "{.data.ca\\.crt}")?;
    let secret_cert = secret_file(&lab, &control_plane, "tls.crt")?;
    ensure!(
        secret_cert.trim() == published.trim(),
        "the ConfigMap does not publish the Secret's CA"
    );

    // What the kubelet does: the Secret into the sidecars' volume, the ConfigMap into the
    // agent's. The sidecars issue each replica's certificate; the controllers, as their own
    // ServiceAccount (with no right to the Secret), serve it.
    let mounts = Mounts::new()?;
    mounts.copy(&lab, &control_plane)?;
    let controller_kubeconfig = account_kubeconfig(&lab, &control_plane, "splitproxy-controller")?;
    let mut sidecars = Vec::new();
    let mut controllers = Vec::new();
    for port in PORTS {
        let (cert, key) = mounts.serving(port);
        sidecars.push(lab.spawn(
            &cp_host,
            workspace_binary("splitproxy-ca")?,
            &[
                "issue",
                &format!("--ca-dir={}", mounts.ca_dir().display()),
                &format!("--cert-file={}", cert.display()),
                &format!("--key-file={}", key.display()),
                &format!("--san={SERVICE}.{AGENT_NAMESPACE}.svc,{cp_ip}"),
            ],
        )?);
        controllers.push(mounts.start_replica(
            &mut lab,
            &control_plane,
            &controller_kubeconfig,
            port,
        )?);
    }
    let controller_logs = |controllers: &[Process]| {
        controllers
            .iter()
            .map(Process::log)
            .collect::<Vec<_>>()
            .join("\n")
    };

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
            &mounts.agent_ca().to_string_lossy(),
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

    // A replica started later serves a certificate of the same CA: the agent, which trusts
    // only the published one, follows it too.
    let second_replica = mounts.hand_over(
        &mut lab,
        &control_plane,
        &controller_kubeconfig,
        &mut controllers,
        0,
    )?;
    follows(&lab, &nodes[0], &agent, &first, &web2)
        .with_context(|| controller_logs(&controllers))?;
    ensure!(
        ca_object(&lab, &control_plane, "configmap", "{.data.ca\\.crt}")?.trim()
            == published.trim(),
        "the CA changed"
    );

    println!(
        "the agent followed the ready replica: {:?}",
        subscriptions(&agent)
    );

    // A CA rollover under the agent's open stream, the kubelet stand-in copying the Secret and
    // the ConfigMap as they change: the agent never leaves its stream, and Services keep
    // reaching it.
    let old_ca = tempfile::NamedTempFile::new()?;
    std::fs::write(old_ca.path(), &published)?;
    let streams_before = subscriptions(&agent).len();
    let args = {
        let mut args = ca_args("rollover");
        args.push(format!("--step-seconds={ROLLOVER_STEP_SECONDS}"));
        args
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let rollover = lab.spawn(&cp_host, workspace_binary("splitproxy-ca")?, &args)?;
    let started = Instant::now();
    while !rollover.log().contains("step=Finished") {
        ensure!(
            started.elapsed() < ROLLOVER,
            "the rollover did not finish: {}",
            rollover.log()
        );
        mounts.copy(&lab, &control_plane)?;
        std::thread::sleep(Duration::from_secs(1));
    }
    mounts.copy(&lab, &control_plane)?;
    println!(
        "CA rollover: {:.0} s, the agent on {} stream(s) before and after",
        started.elapsed().as_secs_f64(),
        streams_before
    );
    let bundle = ca_object(&lab, &control_plane, "configmap", "{.data.ca\\.crt}")?;
    ensure!(
        bundle.matches("BEGIN CERTIFICATE").count() == 1 && bundle.trim() != published.trim(),
        "after the rollover the published bundle is {bundle}"
    );
    ensure!(
        subscriptions(&agent).len() == streams_before,
        "the agent left its stream during the rollover: {:?}\n{}",
        subscriptions(&agent),
        agent.log()
    );
    expect_reached(&lab, &nodes[0], &web2, 5)?;

    // The replica serves a certificate of the new CA only (once it read its files again).
    let url = format!("https://{cp_ip}:{}/", PORTS[0]);
    let tls_check = |ca: &Path| -> Result<i32> {
        let output = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                cp_host.ns_name(),
                "curl",
                "-sS",
                "-o",
                "/dev/null",
            ])
            .args(["--max-time", "5", "--cacert"])
            .arg(ca)
            .arg(&url)
            .output()?;
        Ok(output.status.code().unwrap_or(-1))
    };
    const UNVERIFIED: i32 = 60;
    eventually(
        "the replica serves a certificate of the new CA",
        CONVERGE,
        || {
            let (with_new, with_old) = (tls_check(&mounts.agent_ca())?, tls_check(old_ca.path())?);
            ensure!(
                with_new != UNVERIFIED && with_old == UNVERIFIED,
                "curl exits {with_new} trusting the new CA, {with_old} trusting the old one"
            );
            Ok(())
        },
    )?;
    // And the agent, moving to the other replica, connects with the new bundle.
    let third_replica = mounts.hand_over(
        &mut lab,
        &control_plane,
        &controller_kubeconfig,
        &mut controllers,
        1,
    )?;
    control_plane.kubectl_apply(&lab, &web_service_yaml("demo", "web-3"))?;
    let web3 = web_url(&lab, &control_plane, "web-3")?;
    follows(&lab, &nodes[0], &agent, &second, &web3)
        .with_context(|| controller_logs(&controllers))?;

    // No CA key reaches a log.
    let key = secret_file(&lab, &control_plane, "tls.key")?;
    let logs = format!(
        "{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}",
        first_replica.log(),
        second_replica.log(),
        third_replica.log(),
        controller_logs(&controllers),
        ca_logs(&ca_runs),
        ca_logs(&sidecars),
        rollover.log(),
        agent.log()
    );
    ensure!(
        !logs.contains(key.trim()) && !logs.contains("PRIVATE KEY"),
        "a CA key appears in a log"
    );
    Ok(())
}
