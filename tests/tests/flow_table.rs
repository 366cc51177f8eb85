//! The shared packet-flow table (`splitproxy_dataplane::testing::flow_table`) with real traffic on this
//! machine's kernel, against the iptables, nftables and ebpf modes: `sp-flows` runs inside a
//! namespace standing in for the node, builds each scenario's pods and outside clients as namespaces behind it,
//! programs the scenario with the backend and makes every row's connections (the same runner the
//! IPVS mode's VM test uses). The packet tracer proves the same table against the rendered
//! rules; this proves the kernel does what the tracer says. Needs root. In ebpf mode the node's
//! namespace gets its own cgroup, which the socket programs attach to and the rows' pods and node
//! processes start in; outside clients stay out of it, as another machine's processes would.
//!
//! Addresses: the table's own block. The node's `eth0` leads to the lab's LAN bridge, where
//! nothing answers. Its first addresses, `198.19.255.1` and `fd00:10::1`, are ones no row uses,
//! so masquerading shows even on the node's own connections: IPv4 masquerading takes the node's
//! first address for traffic leaving through a pod's veth (which has none), IPv6 source selection
//! the address sharing the longest prefix with the pod's (`fd00:10:244::/48`).

use std::process::Command;

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{bpffs::BpfFs, flows::Verdict, lab::Lab, workspace_binary};

/// Runs `sp-flows MODE` in a lab node and judges what it printed.
fn run_flows(mode: &str) -> Result<Verdict> {
    let mut lab = Lab::new(mode)?;
    let node = lab.add_namespace("node")?;
    // The ebpf mode's socket programs act on a cgroup: the node's own, where sp-flows starts
    // the rows' clients from pods and from the node.
    let mut mode_args = vec![mode.to_owned()];
    let _bpffs = if mode == "ebpf" {
        let bpffs = BpfFs::mount()?;
        let cgroup = lab.namespace_cgroup(&node)?;
        mode_args.extend([
            "--cgroup".to_owned(),
            cgroup.display().to_string(),
            "--bpf-root".to_owned(),
            bpffs.path().display().to_string(),
        ]);
        Some(bpffs)
    } else {
        None
    };
    let lan = lab.lan_ns().to_owned();
    let ip = |args: &[&str]| -> Result<()> {
        let output = Command::new("ip")
            .args(args)
            .output()
            .context("running ip")?;
        ensure!(
            output.status.success(),
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    };
    ip(&[
        "-n", &node, "link", "add", "eth0", "type", "veth", "peer", "name", "flows0", "netns", &lan,
    ])?;
    ip(&["-n", &lan, "link", "set", "flows0", "master", "br0", "up"])?;
    // No ARP: a packet to an address nobody holds leaves and is never answered, as on a LAN
    // where nothing holds it (rather than failing with "no route to host" after ARP gives up).
    ip(&["-n", &node, "link", "set", "eth0", "arp", "off", "up"])?;
    ip(&["-n", &node, "addr", "add", "198.19.255.1/32", "dev", "eth0"])?;
    ip(&[
        "-n",
        &node,
        "addr",
        "add",
        "fd00:10::1/128",
        "dev",
        "eth0",
        "nodad",
    ])?;

    let sp_flows = workspace_binary("sp-flows")?;
    let bin_dir = sp_flows.parent().context("sp-flows has no directory")?;
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let prefix = format!("{}h-", lab.prefix());
    let output = Command::new("ip")
        .args(["netns", "exec", &node])
        .arg(&sp_flows)
        .args(&mode_args)
        .args(["--prefix", &prefix])
        .env("PATH", path)
        .output()
        .context("running sp-flows")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    ensure!(
        output.status.success(),
        "sp-flows exited {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Verdict::of(&stdout)
}

#[test]
fn every_row_of_the_packet_flow_table_holds_for_the_iptables_mode_with_real_traffic() -> Result<()>
{
    let verdict = run_flows("iptables")?;
    println!("{verdict}");
    verdict.ensure_held(95)
}

#[test]
fn every_row_of_the_packet_flow_table_holds_for_the_nftables_mode_with_real_traffic() -> Result<()>
{
    let verdict = run_flows("nftables")?;
    println!("{verdict}");
    verdict.ensure_held(95)
}

#[test]
fn every_row_of_the_packet_flow_table_the_ebpf_mode_serves_holds_with_real_traffic() -> Result<()> {
    let verdict = run_flows("ebpf")?;
    println!("{verdict}");
    verdict.ensure_held(89)
}
