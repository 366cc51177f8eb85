//! `--nodeport-addresses` with real traffic: node ports answer on every node address by default,
//! and only on the selected ones (CIDRs or `primary`) when the flag is set. Needs root;
//! `scripts/test.sh` builds the binaries first.

#![allow(clippy::unwrap_used)]

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    demo_cluster::{DemoCluster, NODE_PORT},
    eventually, hit,
};
use std::time::Duration;

/// The longest wait for rules to converge; generous because CI machines are slow and shared.
const CONVERGE: Duration = Duration::from_secs(90);
const REQUESTS: u32 = 20;
/// A second address of node-1 (on its loopback device), routed to node-1 by the external host.
const SECOND_ADDRESS: &str = "198.51.100.1";
/// One more, added while the agent runs.
const THIRD_ADDRESS: &str = "198.51.100.2";

/// Requests from the external host to node-1's node port on `address`: answered and failed.
fn from_outside(cluster: &DemoCluster, address: &str) -> Result<(u32, u32)> {
    let url = format!("http://{address}:{NODE_PORT}/");
    let report = hit(&cluster.lab, &cluster.external, &url, REQUESTS)?;
    Ok((REQUESTS - report.failures, report.failures))
}

/// Waits until node-1's node port answers on its LAN address and, as `second_answers` says, on
/// the second address (refused at once otherwise: nothing listens there).
fn expect_node_port(cluster: &DemoCluster, second_answers: bool, what: &str) -> Result<()> {
    let lan = cluster.nodes[0].ip().to_string();
    eventually(what, CONVERGE, || {
        let (answered, failed) = from_outside(cluster, &lan)?;
        ensure!(failed == 0, "{failed} of {REQUESTS} failed on {lan}");
        let (answered_second, _) = from_outside(cluster, SECOND_ADDRESS)?;
        let expected = if second_answers { REQUESTS } else { 0 };
        ensure!(
            answered_second == expected,
            "{answered_second} of {REQUESTS} answered on {SECOND_ADDRESS} (wanted {expected}); {answered} on {lan}"
        );
        Ok(())
    })
    .with_context(|| cluster.logs())
}

#[test]
fn node_ports_answer_only_on_the_selected_node_addresses() -> Result<()> {
    let mut cluster = DemoCluster::start("npaddr")?;
    let lan = cluster.nodes[0].ip().to_string();

    cluster.add_node_address(0, SECOND_ADDRESS)?;

    expect_node_port(
        &cluster,
        true,
        "by default, node ports on every node address",
    )?;

    cluster.restart_agent(0, &["--nodeport-addresses", "198.18.0.0/24"])?;
    expect_node_port(&cluster, false, "node ports only on 198.18.0.0/24")?;

    cluster.restart_agent(0, &["--nodeport-addresses", "primary"])?;
    expect_node_port(&cluster, false, "node ports only on the primary IP")?;
    // As upstream, per family: the node has no IPv6 primary IP, so IPv6 takes every address.
    // The check above holds already under the previous selection: wait for the restarted
    // agent's start-up line rather than read its log at once.
    eventually("the agent names its node-port addresses", CONVERGE, || {
        let log = cluster.agents[0].log();
        ensure!(
            log.contains(&format!("[{lan}, ::]")),
            "the agent does not name {lan} (and every IPv6 address) as its node-port addresses:\n{log}"
        );
        Ok(())
    })?;

    cluster.restart_agent(0, &["--nodeport-addresses", "198.51.100.0/24"])?;
    eventually("node ports only on the second address", CONVERGE, || {
        let (answered, _) = from_outside(&cluster, SECOND_ADDRESS)?;
        ensure!(answered == REQUESTS, "{answered} of {REQUESTS} answered");
        let (answered_lan, _) = from_outside(&cluster, &lan)?;
        ensure!(answered_lan == 0, "{answered_lan} answered on {lan}");
        Ok(())
    })
    .with_context(|| cluster.logs())?;

    // An address the node gains inside the selection takes node ports too, without a restart:
    // the selection is matched again at each sync (every sync period at the latest), as
    // upstream.
    cluster.add_node_address(0, THIRD_ADDRESS)?;
    eventually("node ports on an address added later", CONVERGE, || {
        let (answered, _) = from_outside(&cluster, THIRD_ADDRESS)?;
        ensure!(answered == REQUESTS, "{answered} of {REQUESTS} answered");
        Ok(())
    })
    .with_context(|| cluster.logs())?;
    Ok(())
}
