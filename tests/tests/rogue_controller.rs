//! The agent against a misbehaving controller (`sp-rogue-controller`, speaking
//! `splitproxy.v1alpha1.NodeViewService`) that, after one good reset, sends malformed revisions:
//! revision 0, a key twice, a Service without a key and a delta of another epoch are rejected
//! (NACK with a reason); Services that cannot be programmed (invalid IPs, ports 0 and 65536, an
//! unknown protocol, an injected or huge name, ports sharing a name) are skipped and logged while
//! the rest of the revision is applied; parts out of order and a message above the gRPC limit
//! end the stream. Through all of it the agent stays up, and the Service of the good reset keeps
//! answering real traffic after the last broken stream, from a controller that sends nothing
//! more. Needs root; `scripts/test.sh` builds the binaries first.

#![allow(clippy::unwrap_used)]

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    agent_metric,
    demo_cluster::{CONTROLLER_PORT, DemoCluster, POD_PORT},
    eventually, workspace_binary,
};
use std::{net::Ipv4Addr, time::Duration};

/// The good Service's cluster IP (the rest of the test block: see `tests/src/addresses.rs`).
const GOOD_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 30);
const REQUESTS: u32 = 20;
/// Generous: two stream drops each wait out the agent's reconnect backoff.
const ALL_CASES: Duration = Duration::from_secs(180);

/// What the agent must answer to each case, as the rogue controller prints it: `rejected: …`
/// with a reason holding the text, `applied` with the text in the agent's log line skipping the
/// Service, or `stream closed`.
const EXPECTED: [(&str, &str, &str); 14] = [
    ("revision-zero", "rejected", "revision 0"),
    ("duplicate-keys", "rejected", "names demo/twice twice"),
    ("service-without-key", "rejected", "resource without a key"),
    (
        "delta-of-another-epoch",
        "rejected",
        "does not build on the applied state",
    ),
    (
        "invalid-cluster-ip",
        "applied",
        "invalid cluster IP \"10.96.9.999\"",
    ),
    ("port-zero", "applied", "port 0 out of range"),
    ("port-65536", "applied", "port 65536 out of range"),
    ("unknown-protocol", "applied", "unknown protocol 42"),
    (
        "injected-name",
        "applied",
        "invalid name \"evil\\\"\\n-A INPUT -j DROP\"",
    ),
    ("huge-name", "applied", "invalid name \"xxxxxxxx"),
    (
        "duplicate-port-names",
        "applied",
        "port name \"http\" used twice",
    ),
    (
        "invalid-endpoint-address",
        "applied",
        "invalid endpoint address \"10.244.1.300\"",
    ),
    ("parts-out-of-order", "stream closed", ""),
    ("oversized-message", "stream closed", ""),
];

#[test]
fn malformed_revisions_are_refused_and_the_last_good_rules_keep_serving() -> Result<()> {
    let mut cluster = DemoCluster::start("rogue")?;
    eventually(
        "the real controller's rules",
        Duration::from_secs(90),
        || cluster.check_traffic(REQUESTS),
    )
    .with_context(|| cluster.logs())?;
    // The rogue takes the real controller's place, at its address.
    cluster.kill_controller()?;
    let web_a = cluster.web_pod("web-a")?.ip();
    let listen = format!("{}:{CONTROLLER_PORT}", cluster.control_plane.ip());
    // It holds the real controller's certificate: the agents trust it, so only what it sends
    // is under test.
    let mut args = cluster.controller_tls().controller_flags();
    args.extend([
        "--listen".to_owned(),
        listen,
        "--cluster-ip".to_owned(),
        GOOD_IP.to_string(),
        "--endpoint".to_owned(),
        format!("{web_a}:{POD_PORT}"),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let rogue = cluster.lab.spawn(
        &cluster.control_plane,
        workspace_binary("sp-rogue-controller")?,
        &args,
    )?;
    let node = cluster.nodes[0].name().to_owned();
    eventually(
        "the rogue controller to go through every case",
        ALL_CASES,
        || {
            ensure!(
                rogue.log().contains(&format!("done {node}")),
                "not done yet"
            );
            Ok(())
        },
    )
    .with_context(|| format!("{}\n{}", rogue.log(), cluster.logs()))?;

    let answers = rogue.log();
    let agent_log = cluster.agents[0].log();
    for (case, outcome, text) in EXPECTED {
        let prefix = format!("case {node} {case} ");
        let answer = answers
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .with_context(|| format!("no answer to {case}:\n{answers}"))?;
        ensure!(
            answer.starts_with(outcome),
            "{case}: {answer}, not {outcome}"
        );
        let explained = match outcome {
            "rejected" => answer.contains(text),
            "applied" => agent_log.lines().any(|l| {
                l.contains("skipping service that cannot be programmed") && l.contains(text)
            }),
            _ => true,
        };
        ensure!(
            explained,
            "{case}: nothing says {text:?}:\n{answer}\n{agent_log}"
        );
        println!("{case}: {answer}");
    }

    let answered = cluster.answered(GOOD_IP, REQUESTS)?;
    ensure!(
        answered == REQUESTS,
        "the good Service answered {answered} of {REQUESTS}"
    );
    let rejected = agent_metric(
        &cluster.lab,
        &cluster.nodes[0],
        "splitproxy_agent_rejected_revisions_total",
    )?;
    ensure!(
        rejected == 4.0,
        "splitproxy_agent_rejected_revisions_total is {rejected}"
    );
    let agents = cluster.agents.clone();
    for agent in &agents {
        let exit = cluster.lab.exit_status(agent)?;
        ensure!(
            exit.is_none(),
            "an agent exited: {exit:?}\n{}",
            agent.log_tail(30)
        );
    }
    ensure!(
        cluster.lab.exit_status(&rogue)?.is_none(),
        "the rogue controller exited"
    );
    Ok(())
}
