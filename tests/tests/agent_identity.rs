//! Agents prove which node they are, and receive only that node's view: over TLS, with static
//! tokens on the manifests source and with Pod-bound ServiceAccount tokens reviewed by the real
//! API server. Rogue subscriptions are made with the real grpcurl and the real agent binary.
//! Needs root.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    addresses::{self, CONTROL_PLANE, EXTERNAL_CLIENT},
    control_plane::{
        AGENT_ACCOUNT, AGENT_AUDIENCE, AGENT_NAMESPACE, Binaries, ControlPlane, web_service_yaml,
    },
    demo_cluster::{CONTROLLER_PORT, DemoCluster},
    eventually, hit,
    lab::Lab,
    pki, serve,
    subscribe::{Answer, subscribe},
    workspace_binary,
};
use std::{path::Path, time::Duration};

const CONVERGE: Duration = Duration::from_secs(90);
const POD_PORT: u16 = 8080;

fn expect_refused(answer: &Answer, code: &str, what: &str) -> Result<()> {
    ensure!(
        !answer.served && answer.output.contains(&format!("Code: {code}")),
        "{what}: expected {code}, got:\n{}",
        answer.output
    );
    Ok(())
}

fn expect_served(answer: &Answer, what: &str) -> Result<()> {
    ensure!(
        answer.served && answer.output.contains("controllerEpoch"),
        "{what}: expected the node's view, got:\n{}",
        answer.output
    );
    Ok(())
}

/// No token appears in a log: neither ones the controller accepted nor ones it refused.
fn expect_no_secret_in(logs: &str, secrets: &[&str]) -> Result<()> {
    for secret in secrets {
        ensure!(
            !logs.contains(secret),
            "a token appears in the logs:\n{logs}"
        );
    }
    Ok(())
}

#[test]
fn manifests_source_serves_each_token_only_its_own_node() -> Result<()> {
    let mut cluster = DemoCluster::start("identity")?;
    // The agents reach the controller over TLS with their tokens: traffic flows.
    eventually("traffic reaches the ready endpoints", CONVERGE, || {
        cluster.check_traffic(20).map(drop)
    })
    .with_context(|| cluster.logs())?;

    let address = format!("{}:{CONTROLLER_PORT}", cluster.control_plane.ip());
    let ca = cluster.controller_tls().ca.clone();
    let read = |node: &str| std::fs::read_to_string(cluster.token_file(node));
    let (token1, token2) = (read("node-1")?, read("node-2")?);
    let external = cluster.external.clone();
    let ask = |token: Option<&str>, node: &str| {
        subscribe(&cluster.lab, &external, &address, &ca, token, node)
    };

    expect_served(&ask(Some(&token1), "node-1")?, "node-1's token for node-1")?;
    expect_refused(
        &ask(Some(&token1), "node-2")?,
        "PermissionDenied",
        "node-1's token for node-2",
    )?;
    expect_refused(&ask(None, "node-1")?, "Unauthenticated", "no token")?;
    let forged = pki::random_token()?;
    expect_refused(
        &ask(Some(&forged), "node-1")?,
        "Unauthenticated",
        "an unknown token",
    )?;
    // Plaintext to the TLS port gets no answer at all.
    let plaintext = cluster.lab.exec(
        &external,
        "grpcurl",
        &["-plaintext", "-max-time", "10", &address, "list"],
    )?;
    ensure!(
        !plaintext.status.success(),
        "plaintext reached the view port"
    );

    // A real agent holding node-1's token but claiming node-2 (on a host outside the cluster)
    // is refused and programs nothing.
    let rogue = cluster.lab.spawn(
        &external,
        workspace_binary("splitproxy-agent")?,
        &[
            "--controller",
            &cluster.controller_url(),
            "--controller-ca-file",
            &ca.to_string_lossy(),
            "--token-file",
            &cluster.token_file("node-1").to_string_lossy(),
            "--hostname-override",
            "node-2",
        ],
    )?;
    eventually("the rogue agent is refused", CONVERGE, || {
        let log = rogue.log();
        ensure!(
            log.contains("cannot receive the view of node"),
            "not yet:\n{log}"
        );
        Ok(())
    })?;
    let rules = cluster.run(&external, "iptables-save", &["-t", "nat"])?;
    ensure!(
        !rules.contains("KUBE-SVC-"),
        "the rogue agent programmed Services:\n{rules}"
    );

    let metrics = cluster.run(
        &cluster.control_plane,
        "curl",
        &["-sf", "http://127.0.0.1:10662/metrics"],
    )?;
    for reason in ["wrong_node", "missing", "invalid"] {
        let series = format!("splitproxy_controller_refused_streams_total{{reason=\"{reason}\"}}");
        ensure!(
            metrics.lines().any(|line| line.starts_with(&series)),
            "no {series} in\n{metrics}"
        );
    }
    let mut logs = cluster.logs();
    logs.push_str(&rogue.log());
    expect_no_secret_in(&logs, &[token1.trim(), token2.trim(), &forged])?;
    // The real agents were never disturbed.
    cluster.check_traffic(20)?;
    Ok(())
}

/// A copy of `token` (a JWT the API server signed) with its lifetime moved into the past,
/// signed again with the service-account key, so that only its expiry makes it invalid.
fn expired_copy(token: &str, signing_key: &Path, dir: &Path) -> Result<String> {
    use data_encoding::BASE64URL_NOPAD as B64;
    let mut parts = token.trim().split('.');
    let (Some(header), Some(payload)) = (parts.next(), parts.next()) else {
        anyhow::bail!("not a JWT");
    };
    let mut claims: serde_json::Value = serde_json::from_slice(&B64.decode(payload.as_bytes())?)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    claims["iat"] = (now - 7200).into();
    claims["nbf"] = (now - 7200).into();
    claims["exp"] = (now - 3600).into();
    let signed = format!("{header}.{}", B64.encode(&serde_json::to_vec(&claims)?));
    let input = dir.join("expired.input");
    let signature = dir.join("expired.sig");
    std::fs::write(&input, &signed)?;
    pki::openssl(&[
        "dgst",
        "-sha256",
        "-sign",
        &signing_key.to_string_lossy(),
        "-out",
        &signature.to_string_lossy(),
        &input.to_string_lossy(),
    ])?;
    Ok(format!(
        "{signed}.{}",
        B64.encode(&std::fs::read(&signature)?)
    ))
}

#[test]
fn api_server_reviews_decide_which_node_a_token_may_receive() -> Result<()> {
    let binaries = Binaries::ensure()?;
    let mut lab = Lab::new("idreview")?;
    let cp_host = lab.add_host("cp", CONTROL_PLANE)?;
    let external = lab.add_host("ext", EXTERNAL_CLIENT)?;
    let nodes = lab.add_nodes(2)?;
    let control_plane = ControlPlane::start(&mut lab, &cp_host, binaries)?;
    for node in &nodes {
        control_plane.register_node(&lab, node)?;
    }
    control_plane.create_namespace(&lab, "demo")?;
    let pod = lab.add_pod(&nodes[1], "web-a", addresses::pod_ip(2, 2))?;
    serve(&mut lab, &pod, "web-a", POD_PORT)?;
    control_plane.create_pod(&lab, "demo", &pod, "web", POD_PORT, true)?;
    control_plane.kubectl_apply(&lab, &web_service_yaml("demo", "web"))?;
    let controller = control_plane.start_controller(&mut lab, &control_plane.admin_kubeconfig())?;
    let agent = control_plane.start_agent(&mut lab, &nodes[0])?;
    let cluster_ip = control_plane
        .kubectl(
            &lab,
            &[
                "-n",
                "demo",
                "get",
                "service",
                "web",
                "-o=jsonpath={.spec.clusterIP}",
            ],
        )?
        .trim()
        .to_owned();
    // node-1's agent, with a token bound to a Pod on node-1, gets node-1's view.
    eventually("node-1 reaches the Service", CONVERGE, || {
        let report = hit(&lab, &nodes[0], &format!("http://{cluster_ip}/"), 5)?;
        ensure!(report.failures == 0, "{report:?}");
        Ok(())
    })
    .with_context(|| format!("{}\n{}", controller.log(), agent.log()))?;

    let address = format!("{}:{CONTROLLER_PORT}", cp_host.ip());
    let ca = control_plane.controller_tls().ca.clone();
    let ask =
        |token: Option<&str>, node: &str| subscribe(&lab, &external, &address, &ca, token, node);
    let token1 = std::fs::read_to_string(control_plane.agent_token(&lab, "node-1")?)?;
    expect_served(&ask(Some(&token1), "node-1")?, "node-1's token for node-1")?;
    expect_refused(
        &ask(Some(&token1), "node-2")?,
        "PermissionDenied",
        "node-1's token for node-2",
    )?;
    expect_refused(&ask(None, "node-1")?, "Unauthenticated", "no token")?;

    let scratch = tempfile::tempdir()?;
    let expired = expired_copy(
        &token1,
        &control_plane.service_account_key(),
        scratch.path(),
    )?;
    expect_refused(
        &ask(Some(&expired), "node-1")?,
        "Unauthenticated",
        "node-1's token, expired",
    )?;

    let bound_token = |account: &str, audience: &str, pod: &str| {
        control_plane.kubectl(
            &lab,
            &[
                "-n",
                AGENT_NAMESPACE,
                "create",
                "token",
                account,
                "--bound-object-kind=Pod",
                &format!("--bound-object-name={pod}"),
                &format!("--audience={audience}"),
            ],
        )
    };
    let agent_pod = format!("{AGENT_ACCOUNT}-node-1");
    let wrong_audience = bound_token(AGENT_ACCOUNT, "not-splitproxy", &agent_pod)?;
    expect_refused(
        &ask(Some(wrong_audience.trim()), "node-1")?,
        "Unauthenticated",
        "a token for another audience",
    )?;
    // Another ServiceAccount of the same namespace, even bound to a Pod on the node, is not
    // an agent.
    control_plane.kubectl(
        &lab,
        &["-n", AGENT_NAMESPACE, "create", "serviceaccount", "other"],
    )?;
    control_plane.kubectl_apply(
        &lab,
        &format!(
            "apiVersion: v1
kind: Pod
metadata:
  name: other-node-1
  namespace: {AGENT_NAMESPACE}
spec:
  nodeName: node-1
  serviceAccountName: other
  automountServiceAccountToken: false
  containers:
  - name: other
    image: registry.invalid/other:e2e
"
        ),
    )?;
    let other = bound_token("other", AGENT_AUDIENCE, "other-node-1")?;
    expect_refused(
        &ask(Some(other.trim()), "node-1")?,
        "Unauthenticated",
        "another ServiceAccount's token",
    )?;
    // A token whose Pod is gone is revoked. Without a kubelet to finish a graceful deletion,
    // the Pod is first marked Failed, as a kubelet would, so the deletion is immediate.
    let agent_pod2 = format!("{AGENT_ACCOUNT}-node-2");
    let token2 = std::fs::read_to_string(control_plane.agent_token(&lab, "node-2")?)?;
    control_plane.kubectl(
        &lab,
        &[
            "-n",
            AGENT_NAMESPACE,
            "patch",
            "pod",
            &agent_pod2,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Failed"}}"#,
        ],
    )?;
    control_plane.kubectl(&lab, &["-n", AGENT_NAMESPACE, "delete", "pod", &agent_pod2])?;
    eventually("the deleted Pod's token is refused", CONVERGE, || {
        expect_refused(
            &ask(Some(&token2), "node-2")?,
            "Unauthenticated",
            "a token of a deleted Pod",
        )
    })?;

    let logs = format!("{}\n{}", controller.log(), agent.log());
    expect_no_secret_in(
        &logs,
        &[
            token1.trim(),
            token2.trim(),
            &expired,
            wrong_audience.trim(),
            other.trim(),
        ],
    )?;
    Ok(())
}
