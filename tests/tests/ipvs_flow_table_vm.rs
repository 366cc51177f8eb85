//! The shared packet-flow table with real traffic against the IPVS mode, in the qemu VM on a
//! stock kernel with IPVS (`tests/vm/build-vm.sh`): `sp-flows ipvs` builds every scenario's node,
//! pods and outside clients as network namespaces, programs the scenario with the IPVS backend
//! (virtual servers, `kube-ipvs0`, ipsets and iptables) and makes every row's connections.
//! Needs root.
//!
//! Addresses: the table's own block (`splitproxy_dataplane::flow_table`); the node's addresses
//! sit on a dummy `eth0` in the VM's root namespace.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use splitproxy_e2e::{
    vm::{Vm, VmImage},
    workspace_binary,
};

/// The node's LAN (a dummy), where anything not local goes: `sp-flows` routes it there.
///
/// Its first address is one no row uses: MASQUERADE gives traffic leaving through a pod's veth
/// (which has no address) the first address of the node's first interface, so with a scenario's
/// node IP there, the node's own connections would look the same masqueraded or not.
const NODE: &str = r#"
set -eu
ip link add eth0 type dummy
ip link set eth0 up
ip addr add 198.19.255.1/32 dev eth0
"#;

#[test]
fn every_row_of_the_packet_flow_table_holds_for_the_ipvs_mode_with_real_traffic() -> Result<()> {
    let Some(image) = VmImage::for_test()? else {
        return Ok(());
    };
    let run = Vm::new(image)?
        .with_host_files([
            "/usr/bin/ip",
            "/usr/sbin/ipvsadm",
            "/usr/sbin/ipset",
            "/usr/sbin/iptables",
            "/usr/sbin/iptables-save",
            "/usr/sbin/iptables-restore",
            "/usr/sbin/ip6tables",
            "/usr/sbin/ip6tables-save",
            "/usr/sbin/ip6tables-restore",
            "/usr/lib/x86_64-linux-gnu/xtables",
            "/etc/protocols",
        ])
        .with_file(workspace_binary("sp-testpod")?, "/usr/local/bin/sp-testpod")
        .with_file(workspace_binary("sp-flows")?, "/usr/local/bin/sp-flows")
        .with_modules(["veth", "dummy", "ip_vs", "ip_vs_rr"])
        .with_timeout(Duration::from_secs(900))
        .run(&format!("{NODE}sp-flows ipvs\n"))?;
    println!(
        "VM ({:?}): booted in {:.2} s; qemu ran {:.2} s in all",
        run.accel,
        run.guest_boot.as_secs_f64(),
        run.wall.as_secs_f64()
    );
    println!("{}", run.output);
    ensure!(run.status == 0, "sp-flows exited {}", run.status);

    let mut rows = Vec::new();
    for line in run.output.lines() {
        if let Some(json) = line.strip_prefix("ROW ") {
            let row: Value = serde_json::from_str(json).with_context(|| line.to_owned())?;
            rows.push(row);
        }
    }
    let (counted, pending): (Vec<&Value>, Vec<&Value>) =
        rows.iter().partition(|row| row["pending"].is_null());
    let failed: Vec<_> = counted.iter().filter(|row| row["ok"] != true).collect();
    let skipped = run
        .output
        .lines()
        .filter(|line| line.starts_with("SKIPPED "))
        .count();
    let differing = counted
        .iter()
        .filter(|row| !row["difference"].is_null())
        .count();
    println!(
        "{} rows: {} counted ({differing} where IPVS mode differs from the table, {} failed), {} \
         pending ({} of them already right), {skipped} skipped as not applicable",
        rows.len(),
        counted.len(),
        failed.len(),
        pending.len(),
        pending.iter().filter(|row| row["ok"] == true).count()
    );
    ensure!(
        rows.len() > 90,
        "the table has more rows than the {} that ran",
        rows.len()
    );
    ensure!(
        counted.len() >= 90,
        "only {} rows counted: the runner or the table lost rows",
        counted.len()
    );
    ensure!(
        failed.is_empty(),
        "rows the IPVS mode got wrong:\n{}",
        failed
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}
