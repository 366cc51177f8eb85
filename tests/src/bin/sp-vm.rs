//! `sp-vm`: runs a shell script in the IPVS-capable qemu VM of `splitproxy_e2e::vm`, by hand.
//!
//! ```text
//! sp-vm --host-file /usr/sbin/ipvsadm --module ip_vs \
//!     'ipvsadm -A -t 10.96.0.10:80 -s rr; ipvsadm -Ln'
//! sp-vm --file target/debug/sp-testpod=/usr/local/bin/sp-testpod 'sp-testpod --version'
//! ```
//!
//! Prints the script's output, then how long the VM took on stderr, and exits with the script's
//! status. Needs what `tests/vm/build-vm.sh` sets up (it runs it).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use splitproxy_e2e::vm::{Vm, VmImage};

/// Runs a script as root in a VM on the pinned Debian kernel, and prints its output.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// A host file or folder to copy to the same path in the VM, with its shared libraries.
    #[arg(long = "host-file", value_name = "PATH")]
    host_files: Vec<PathBuf>,
    /// A host file to copy to another path in the VM: `HOST=GUEST`.
    #[arg(long = "file", value_name = "HOST=GUEST", value_parser = parse_mapping)]
    files: Vec<(PathBuf, PathBuf)>,
    /// A kernel module to load before the script (with its dependencies).
    #[arg(long = "module", value_name = "NAME")]
    modules: Vec<String>,
    /// The bash script to run.
    script: String,
}

/// Splits `HOST=GUEST`.
fn parse_mapping(text: &str) -> Result<(PathBuf, PathBuf), String> {
    let (host, guest) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not HOST=GUEST"))?;
    Ok((host.into(), guest.into()))
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(status) => ExitCode::from(u8::try_from(status).unwrap_or(1)),
        Err(e) => {
            eprintln!("sp-vm: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Boots the VM and returns the script's exit status.
fn run(cli: Cli) -> Result<i32> {
    let image = VmImage::setup().context("setting up the VM")?;
    let mut vm = Vm::new(image)?
        .with_host_files(&cli.host_files)
        .with_modules(cli.modules);
    for (host, guest) in cli.files {
        vm = vm.with_file(host, guest);
    }
    let run = vm.run(&cli.script)?;
    print!("{}", run.output);
    eprintln!(
        "sp-vm: {:?}, script started after {:.2} s of guest uptime, qemu ran {:.2} s",
        run.accel,
        run.guest_boot.as_secs_f64(),
        run.wall.as_secs_f64()
    );
    Ok(run.status)
}
