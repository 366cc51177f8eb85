//! The ebpf mode's programs on the stock Debian kernel of the qemu VM (`tests/vm/build-vm.sh`),
//! the oldest kernel the project proves things on: `sp-ebpf` loads and attaches them to a cgroup,
//! syncs three Services and connects through them (TCP, UDP, refused), as
//! `dataplane/tests/ebpf_kernel.rs` does on the development kernel. Needs root; one VM boot.
//!
//! Without qemu or the kernel package this test says so and stops, except under `CI=true`, where
//! that is a failure.

use anyhow::{Result, ensure};
use splitproxy_e2e::vm::{Vm, VmImage};
use splitproxy_e2e::workspace_binary;

/// The VM's init mounts no cgroup v2 hierarchy and no BPF filesystem: the script does, puts
/// itself in a child cgroup and runs the smoke test there.
const SCRIPT: &str = r#"
mkdir -p /cgroup /bpf
mount -t cgroup2 none /cgroup
mount -t bpf bpffs /bpf
mkdir /cgroup/node
echo $$ > /cgroup/node/cgroup.procs
echo "kernel $(uname -r)"
sp-ebpf --cgroup /cgroup/node --bpf-root /bpf
"#;

#[test]
fn the_ebpf_programs_load_and_balance_on_the_vms_debian_kernel() -> Result<()> {
    let Some(image) = VmImage::for_test()? else {
        return Ok(());
    };
    let run = Vm::new(image)?
        .with_file(workspace_binary("sp-ebpf")?, "/usr/local/bin/sp-ebpf")
        .run(SCRIPT)?;
    println!("{}", run.output);
    ensure!(
        run.status == 0,
        "the smoke test in the VM exited {}:\n{}",
        run.status,
        run.output
    );
    for check in [
        "programs attached",
        "TCP to 10.96.0.10:80",
        "TCP over IPv6 to [::ffff:10.96.0.10]:80",
        "UDP to 10.96.0.53:80",
        "refused",
    ] {
        ensure!(
            run.output.contains(check),
            "no `{check}` in:\n{}",
            run.output
        );
    }
    Ok(())
}
