//! The shared packet-flow table with real traffic against the IPVS mode, in the qemu VM on a
//! stock kernel with IPVS (`tests/vm/build-vm.sh`): `sp-flows ipvs` builds every scenario's node,
//! pods and outside clients as network namespaces, programs the scenario with the IPVS backend
//! (virtual servers, `kube-ipvs0`, ipsets and iptables) and makes every row's connections.
//! Needs root.
//!
//! Addresses: the table's own block (`splitproxy_dataplane::testing::flow_table`); the node's addresses
//! sit on a dummy `eth0` in the VM's root namespace.

use std::time::Duration;

use anyhow::{Result, ensure};
use splitproxy_e2e::{
    flows::Verdict,
    vm::{Vm, VmImage},
    workspace_binary,
};

/// The node's LAN (a dummy), where anything not local goes: `sp-flows` routes it there.
///
/// Its first addresses are ones no row uses, as in the host's flow-table test (`dataplane/src/testing/flow_table.rs`):
/// IPv4 masquerading gives traffic leaving through a pod's veth (which has no address) the first
/// address of the node's first interface, and IPv6 source selection the address sharing the
/// longest prefix with the pod's, so with only a scenario's node IP there, the node's own
/// connections would look the same masqueraded or not.
const NODE: &str = r#"
set -eu
ip link add eth0 type dummy
ip link set eth0 up
ip addr add 198.19.255.1/32 dev eth0
ip addr add fd00:10::1/128 dev eth0 nodad
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

    let verdict = Verdict::of(&run.output)?;
    println!("{verdict}");
    verdict.ensure_held(90)
}
