//! What anyone who reaches the controller's port can do without a credential, and that it does
//! not stop the cluster: a host on the node network floods the node view port (`sp-flood`: idle TCP connections,
//! `Sync` streams with random tokens and with forged ServiceAccount JWTs that only the API
//! server can refuse, health `Watch` streams) while a legitimate agent keeps receiving changes
//! and reconnects after a restart. Real etcd, kube-apiserver (whose TokenReviews are counted),
//! controller and agent, real traffic between network namespaces. Needs root and the cached
//! Kubernetes build.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    addresses,
    control_plane::{
        AGENT_ACCOUNT, AGENT_AUDIENCE, AGENT_NAMESPACE, ControlPlane, one_endpoint_service_yaml,
    },
    controller_metric, eventually, hit,
    lab::{Lab, Node, Process},
    serve, workspace_binary,
};
use std::time::{Duration, Instant};

const NAMESPACE: &str = "demo";
const POD_PORT: u16 = 8080;
const FLOOD_SECONDS: u64 = 60;
/// Generous: the API server, the controller, the agent and the flood share a 2-core machine.
const CONVERGE: Duration = Duration::from_secs(120);

/// `web`, whose one endpoint is `ip`.
fn web(ip: impl std::fmt::Display) -> String {
    one_endpoint_service_yaml(NAMESPACE, "web", POD_PORT, &ip.to_string())
}

/// The TokenReviews the API server has answered so far.
fn token_reviews(lab: &Lab, control_plane: &ControlPlane) -> Result<f64> {
    let metrics = control_plane.metrics(lab)?;
    let reviews = metrics
        .lines()
        .filter(|line| {
            line.starts_with("apiserver_request_total{")
                && line.contains("resource=\"tokenreviews\"")
                && line.contains("verb=\"POST\"")
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    Ok(reviews)
}

/// Fails unless every request from `node` to `url` is answered by `pod`.
fn answered_by(lab: &Lab, node: &Node, url: &str, pod: &str) -> Result<()> {
    let report = hit(lab, node, url, 5)?;
    ensure!(
        report.answers.get(pod) == Some(&5),
        "expected {pod}: {report:?}"
    );
    Ok(())
}

#[test]
fn a_flood_without_credentials_costs_a_bounded_handful_and_the_agent_keeps_its_updates()
-> Result<()> {
    let (mut lab, cp_host, nodes, control_plane) =
        ControlPlane::lab_with_two_nodes("flood", NAMESPACE)?;
    let (a_ip, b_ip) = (addresses::pod_ip(1, 2), addresses::pod_ip(1, 3));
    for (name, ip) in [("web-a", a_ip), ("web-b", b_ip)] {
        let pod = lab.add_pod(&nodes[0], name, ip)?;
        serve(&mut lab, &pod, name, POD_PORT)?;
    }
    // Anyone on the node network: the controller's port is on every node's address. One host
    // holds connections open and watches health; another sends forged tokens.
    let holder = lab.add_host("holder", addresses::EXTERNAL_CLIENT)?;
    let forger = lab.add_host("forger", std::net::Ipv4Addr::new(198, 18, 0, 4))?;
    control_plane.kubectl_apply(&lab, &web(a_ip))?;
    let ip = control_plane.cluster_ip(&lab, NAMESPACE, "web")?;
    let url = format!("http://{ip}:80/");

    let controller = control_plane.start_controller(&mut lab, &control_plane.admin_kubeconfig())?;
    let agent = control_plane.start_agent(&mut lab, &nodes[0])?;
    let mut processes = vec![controller, agent];
    let logs = |processes: &[Process]| -> String {
        processes.iter().map(|p| p.log_tail(30)).collect::<String>()
    };
    // Moves web to `pod` at `ip`; returns how long until node-1's agent serves the move.
    let move_to = |lab: &Lab, processes: &[Process], ip, pod: &str| -> Result<Duration> {
        let started = Instant::now();
        control_plane.kubectl_apply(lab, &web(ip))?;
        eventually(&format!("web to answer from {pod}"), CONVERGE, || {
            answered_by(lab, &nodes[0], &url, pod)
        })
        .with_context(|| logs(processes))?;
        Ok(started.elapsed())
    };
    move_to(&lab, &processes, a_ip, "web-a")?;
    let quiet = move_to(&lab, &processes, b_ip, "web-b")?;
    let reviews_before = token_reviews(&lab, &control_plane)?;

    // The flood.
    let ca = control_plane
        .controller_tls()
        .ca
        .to_string_lossy()
        .into_owned();
    let account = format!("system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_ACCOUNT}");
    let seconds = FLOOD_SECONDS.to_string();
    let controller_url =
        control_plane.controller_url(splitproxy_e2e::control_plane::CONTROLLER_PORT);
    let flood = |lab: &mut Lab, host: &splitproxy_e2e::lab::Host, roles: &[&str]| {
        let mut args = vec![
            "--controller",
            &controller_url,
            "--ca-file",
            &ca,
            "--account",
            &account,
            "--audience",
            AGENT_AUDIENCE,
            "--seconds",
            &seconds,
        ];
        args.extend(roles);
        lab.spawn(host, workspace_binary("sp-flood")?, &args)
    };
    let floods = [
        flood(&mut lab, &holder, &["--callers", "0"])?,
        flood(
            &mut lab,
            &forger,
            &["--idle", "0", "--watches", "0", "--tokens", "forged"],
        )?,
    ];
    // Let it build up, then change the Service and restart the agent under it.
    std::thread::sleep(Duration::from_secs(15));
    let flooded = move_to(&lab, &processes, a_ip, "web-a")?;
    let agent = processes.remove(1);
    lab.kill(&agent)?;
    processes.push(control_plane.start_agent(&mut lab, &nodes[0])?);
    let restarted = move_to(&lab, &processes, b_ip, "web-b")?;

    let mut counts = std::collections::BTreeMap::<String, u64>::new();
    for flood in &floods {
        let finished = Duration::from_secs(FLOOD_SECONDS + 120);
        let outcome = eventually("sp-flood to finish", finished, || {
            let log = flood.log();
            let line = log.lines().find(|line| line.starts_with('{'));
            line.map(str::to_owned).context("no outcome yet")
        })
        .with_context(|| flood.log_tail(20))?;
        let these: std::collections::BTreeMap<String, u64> = serde_json::from_str(&outcome)
            .with_context(|| format!("sp-flood printed {outcome:?}"))?;
        for (what, count) in these {
            *counts.entry(what).or_default() += count;
        }
    }
    let reviews = token_reviews(&lab, &control_plane)? - reviews_before;
    let refused = |reason: &str| {
        controller_metric(
            &lab,
            &cp_host,
            &format!("splitproxy_controller_refused_streams_total{{reason=\"{reason}\"}}"),
        )
    };
    let memory = controller_metric(&lab, &cp_host, "process_resident_memory_bytes")?;
    println!("flood over {FLOOD_SECONDS} s: {counts:?}");
    println!(
        "a change reached the agent in {:.1} s before the flood, {:.1} s during it, and {:.1} s \
         after the agent restarted during it; the API server answered {reviews} TokenReviews \
         during the flood; refused streams: invalid {:?}, unavailable {:?}; controller memory {:.0} MiB",
        quiet.as_secs_f64(),
        flooded.as_secs_f64(),
        restarted.as_secs_f64(),
        refused("invalid")?,
        refused("unavailable")?,
        memory.unwrap_or(0.0) / f64::from(1 << 20),
    );
    let forged = counts
        .get("sync forged: Unauthenticated")
        .copied()
        .unwrap_or(0)
        + counts.get("sync forged: Unavailable").copied().unwrap_or(0);
    ensure!(forged > 100, "the flood sent few forged tokens: {counts:?}");
    // One address gets five reviews at once and one a second after; the restarted agent one.
    let bound = 5.0 + FLOOD_SECONDS as f64 + 5.0;
    ensure!(
        reviews <= bound,
        "the API server answered {reviews} TokenReviews during the flood (bound {bound})"
    );
    // Idle connections end at the TLS handshake timeout (10 s), all others at the deadline for
    // an authenticated stream (20 s): none is held longer.
    let held_long: Vec<&String> = counts
        .keys()
        .filter(|what| {
            what.rsplit_once("held ")
                .and_then(|(_, held)| held.split('-').next()?.parse::<u64>().ok())
                .is_some_and(|low| low >= 25)
        })
        .collect();
    ensure!(
        held_long.is_empty(),
        "connections held too long: {held_long:?} in {counts:?}"
    );
    Ok(())
}
