//! Controller replicas sharing the nodes (protocol rule 13), against the real API server: three
//! agents crowd onto the one ready replica; once a second replica is ready in the controllers'
//! Service, the first sheds its oldest agent beyond its share, which moves to the second without
//! a reset, and both replicas' nodes take the next change; then the first is told to stop
//! (SIGTERM) and sends its agents to the second before it exits, none seeing its stream break.
//! Needs root.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    addresses::{self, CONTROL_PLANE},
    control_plane::{
        AGENT_NAMESPACE, Binaries, CONTROLLER_SERVICE, ControlPlane, controller_service_yaml,
        followed_controller, web_service_yaml,
    },
    eventually, expect_reached,
    lab::{Lab, Node, Process},
    scrape, serve,
};
use std::time::Duration;

const CONVERGE: Duration = Duration::from_secs(90);
const POD_PORT: u16 = 8080;
/// The replicas' ports on the control-plane host; agents list them in this order.
const PORTS: [u16; 2] = [10660, 10670];

fn web_url(lab: &Lab, control_plane: &ControlPlane, name: &str) -> Result<String> {
    Ok(format!(
        "http://{}/",
        control_plane.cluster_ip(lab, "demo", name)?
    ))
}

/// How many agents follow each replica.
fn agents_per_replica(
    lab: &Lab,
    control_plane: &ControlPlane,
    nodes: &[Node],
) -> Result<[usize; 2]> {
    let mut counts = [0; 2];
    for node in nodes {
        let url = followed_controller(lab, node)?;
        let replica = PORTS
            .iter()
            .position(|&port| control_plane.controller_url(port) == url)
            .with_context(|| format!("{} follows {url}", node.name()))?;
        counts[replica] += 1;
    }
    Ok(counts)
}

/// Fails unless every node reaches `url`.
fn every_node_reaches(lab: &Lab, nodes: &[Node], url: &str) -> Result<()> {
    for node in nodes {
        expect_reached(lab, node, url, 3)?;
    }
    Ok(())
}

/// A series of the replica on `port`'s metrics, 0 while not exported.
fn replica_metric(lab: &Lab, control_plane: &ControlPlane, port: u16, series: &str) -> Result<f64> {
    Ok(scrape(lab, control_plane.host(), port + 2, series)?.unwrap_or(0.0))
}

#[test]
fn a_replica_made_ready_takes_its_share_of_the_nodes_from_the_one_they_crowded_onto() -> Result<()>
{
    let binaries = Binaries::ensure()?;
    let mut lab = Lab::new("share")?;
    let cp_host = lab.add_host("cp", CONTROL_PLANE)?;
    let nodes = lab.add_nodes(3)?;
    let control_plane = ControlPlane::start(&mut lab, &cp_host, binaries)?;
    for node in &nodes {
        control_plane.register_node(&lab, node)?;
    }
    let cp_ip = cp_host.ip().to_string();
    control_plane.create_namespace(&lab, AGENT_NAMESPACE)?;
    control_plane.create_namespace(&lab, "demo")?;
    let pod = lab.add_pod(&nodes[0], "web-a", addresses::pod_ip(1, 2))?;
    serve(&mut lab, &pod, "web-a", POD_PORT)?;
    control_plane.create_pod(&lab, "demo", &pod, "web", POD_PORT, true)?;
    control_plane.kubectl_apply(&lab, &web_service_yaml("demo", "web"))?;
    // Only the first replica is ready, as while the second starts.
    control_plane.kubectl_apply(
        &lab,
        &controller_service_yaml(&cp_ip, &PORTS, &[true, false]),
    )?;

    let kubeconfig = control_plane.admin_kubeconfig();
    let mut flags = control_plane.controller_tls().controller_flags();
    flags.push(format!(
        "--controller-service={AGENT_NAMESPACE}/{CONTROLLER_SERVICE}"
    ));
    let mut replicas = Vec::new();
    for port in PORTS {
        replicas.push(control_plane.start_controller_with_tls(
            &mut lab,
            &kubeconfig,
            port,
            &flags,
        )?);
    }
    let logs = |replicas: &[Process], agents: &[Process]| {
        replicas
            .iter()
            .chain(agents)
            .map(Process::log)
            .collect::<Vec<_>>()
            .join("\n")
    };
    // Agents try the replicas in the order listed: every one starts on the first.
    let urls: Vec<String> = PORTS
        .iter()
        .map(|&p| control_plane.controller_url(p))
        .collect();
    let mut agents = Vec::new();
    for node in &nodes {
        agents.push(control_plane.start_agent_following(&mut lab, node, &urls)?);
    }
    let web = web_url(&lab, &control_plane, "web")?;
    eventually(
        "every node reaches web through the first replica",
        CONVERGE,
        || {
            for node in &nodes {
                expect_reached(&lab, node, &web, 3)?;
            }
            let counts = agents_per_replica(&lab, &control_plane, &nodes)?;
            ensure!(counts == [3, 0], "agents per replica: {counts:?}");
            Ok(())
        },
    )
    .with_context(|| logs(&replicas, &agents))?;
    let share = "splitproxy_controller_node_share";
    ensure!(
        replica_metric(&lab, &control_plane, PORTS[0], share)? == 0.0,
        "a lone ready replica keeps every node"
    );

    // The second replica is ready: three nodes over two replicas is two each at most, so the
    // first sheds one agent, which moves on to the second.
    control_plane.kubectl_apply(
        &lab,
        &controller_service_yaml(&cp_ip, &PORTS, &[true, true]),
    )?;
    eventually("the agents spread over both replicas", CONVERGE, || {
        let counts = agents_per_replica(&lab, &control_plane, &nodes)?;
        ensure!(counts == [2, 1], "agents per replica: {counts:?}");
        Ok(())
    })
    .with_context(|| logs(&replicas, &agents))?;
    for port in PORTS {
        let limit = replica_metric(&lab, &control_plane, port, share)?;
        ensure!(limit == 2.0, "replica {port} keeps {limit} nodes");
    }
    let shed = replica_metric(
        &lab,
        &control_plane,
        PORTS[0],
        "splitproxy_controller_shed_streams_total",
    )?;
    ensure!(shed == 1.0, "the first replica shed {shed} agents");
    // The moved agent kept what it held: the second replica resumed it from its summary.
    let resumed = |resume: &str| {
        replica_metric(
            &lab,
            &control_plane,
            PORTS[1],
            &format!("splitproxy_controller_subscriptions_total{{resume=\"{resume}\"}}"),
        )
    };
    ensure!(
        resumed("summary")? == 1.0 && resumed("none")? == 0.0,
        "the second replica resumed {} by summary and reset {}",
        resumed("summary")?,
        resumed("none")?
    );

    // Both replicas' nodes take the next change.
    control_plane.kubectl_apply(&lab, &web_service_yaml("demo", "web-2"))?;
    let web2 = web_url(&lab, &control_plane, "web-2")?;
    eventually(
        "every node reaches a Service made after the move",
        CONVERGE,
        || every_node_reaches(&lab, &nodes, &web2),
    )
    .with_context(|| logs(&replicas, &agents))?;
    println!(
        "agents per replica after the second became ready: {:?}",
        agents_per_replica(&lab, &control_plane, &nodes)?
    );

    // The first replica is told to stop, as the kubelet does in a rolling update: it sends its
    // agents to the second before it exits. Each resumes there from its summary, and none sees
    // its stream break.
    let stopped = std::process::Command::new("kill")
        .args(["-TERM", &replicas[0].pid().to_string()])
        .status()?;
    ensure!(stopped.success(), "kill -TERM failed");
    eventually("every agent on the second replica", CONVERGE, || {
        let counts = agents_per_replica(&lab, &control_plane, &nodes)?;
        ensure!(counts == [0, 3], "agents per replica: {counts:?}");
        Ok(())
    })
    .with_context(|| logs(&replicas, &agents))?;
    eventually("the first replica to exit", CONVERGE, || {
        let log = replicas[0].log();
        ensure!(
            log.contains("every agent moved; stopping"),
            "not drained yet"
        );
        Ok(())
    })
    .with_context(|| logs(&replicas, &agents))?;
    ensure!(
        resumed("summary")? == 3.0 && resumed("none")? == 0.0,
        "after the drain the second replica resumed {} by summary and reset {}",
        resumed("summary")?,
        resumed("none")?
    );
    for agent in &agents {
        let log = agent.log();
        ensure!(
            !log.contains("transport error") && !log.contains("h2 protocol error"),
            "an agent's stream broke:\n{}",
            agent.log_tail(20)
        );
    }
    let moved = agents
        .iter()
        .filter(|agent| {
            agent
                .log()
                .contains("this controller replica is shutting down")
        })
        .count();
    ensure!(
        moved == 2,
        "{moved} agents were sent on by the stopping replica"
    );
    eventually(
        "every node reaches web-2 through the second replica",
        CONVERGE,
        || every_node_reaches(&lab, &nodes, &web2),
    )
    .with_context(|| logs(&replicas, &agents))?;
    Ok(())
}
