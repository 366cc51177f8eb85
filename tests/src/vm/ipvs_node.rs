//! An IPVS node in the VM for the tests that share it: the script building node 1 with a client
//! and a server pod, a run of it with the tools those tests inspect IPVS with, and its output
//! split into the `== NAME` sections the scripts print.
//!
//! Addresses (`crate::addresses`): the VM's root namespace is node 1 (198.18.0.11); its pods
//! `client` (10.244.1.10) and `server` (10.244.1.20, `sp-testpod` on port 8080) are Calico-style
//! veth pods.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};

use super::{Vm, VmImage};
use crate::{HitReport, workspace_binary};

/// The start of every script: node 1, its pods, and the test server answering on its pod address.
pub const NODE_WITH_PODS: &str = r#"
set -eu
sysctl -qw net.ipv4.ip_forward=1
# The node's LAN (a dummy: nothing is out there). Its default route is what lets the pods' veths
# answer ARP for the gateway by proxy, as the kernel proxies only for addresses it routes elsewhere.
ip link add eth0 type dummy
ip addr add 198.18.0.11/24 dev eth0
ip link set eth0 up
ip route add default via 198.18.0.1

# A Calico-style pod: a /32 behind a veth, routed by the node, gateway 169.254.1.1 by proxy ARP.
pod() {
    ip netns add "$1"
    ip link add "cali-$1" type veth peer name eth0 netns "$1"
    ip link set "cali-$1" up
    echo 1 >"/proc/sys/net/ipv4/conf/cali-$1/proxy_arp"
    ip route add "$2/32" dev "cali-$1"
    ip -n "$1" link set lo up
    ip -n "$1" link set eth0 up
    ip -n "$1" addr add "$2/32" dev eth0
    ip -n "$1" route add 169.254.1.1 dev eth0 scope link
    ip -n "$1" route add default via 169.254.1.1 dev eth0
}
pod client 10.244.1.10
pod server 10.244.1.20

ip netns exec server sp-testpod serve --name server-pod --listen 0.0.0.0:8080 &
tries=0
until ip netns exec client sp-testpod hit --url http://10.244.1.20:8080/ --count 1 \
        --timeout-ms 500 | grep -q '"server-pod"'; do
    tries=$((tries + 1))
    [ "$tries" -lt 50 ] || { echo "the server never answered its pod address"; exit 1; }
    sleep 0.1
done
"#;

/// The sections of a script's output: each `== NAME` line's name with the text after it.
pub type Sections = BTreeMap<String, String>;

/// Boots the VM on [`NODE_WITH_PODS`] then `script`, with `ip`, `ipvsadm`, `ipset`, `iptables`,
/// `sp-testpod` and the `veth`, `dummy`, `ip_vs` and `ip_vs_rr` modules, plus what `configure`
/// adds; prints how long it took and what the script printed, and returns its sections. `None`
/// when the VM tools cannot be set up outside CI (said on stderr); under `CI=true` that fails.
///
/// # Errors
///
/// If the VM cannot run, or the script exits non-zero.
pub fn run(script: &str, configure: impl FnOnce(Vm) -> Vm) -> Result<Option<Sections>> {
    let Some(image) = VmImage::for_test()? else {
        return Ok(None);
    };
    let vm = Vm::new(image)?
        .with_host_files([
            "/usr/bin/ip",
            "/usr/sbin/ipvsadm",
            "/usr/sbin/ipset",
            "/usr/sbin/iptables",
            "/usr/sbin/iptables-restore",
            // iptables loads its matches and targets from here.
            "/usr/lib/x86_64-linux-gnu/xtables",
            // ipset looks protocol names (`tcp:80`) up here.
            "/etc/protocols",
        ])
        .with_file(workspace_binary("sp-testpod")?, "/usr/local/bin/sp-testpod")
        .with_modules(["veth", "dummy", "ip_vs", "ip_vs_rr"]);
    let run = configure(vm).run(&format!("{NODE_WITH_PODS}{script}"))?;
    println!(
        "VM ({:?}): guest booted and loaded modules in {:.2} s; qemu ran {:.2} s in all",
        run.accel,
        run.guest_boot.as_secs_f64(),
        run.wall.as_secs_f64()
    );
    println!("{}", run.output);
    ensure!(
        run.status == 0,
        "the script in the VM exited {}",
        run.status
    );
    Ok(Some(sections(&run.output)))
}

/// The output split at `== NAME` lines: each name with the text after it.
#[must_use]
pub fn sections(output: &str) -> Sections {
    let mut sections = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in output.lines() {
        if let Some(name) = line.strip_prefix("== ") {
            sections.extend(current.take());
            current = Some((name.to_owned(), String::new()));
        } else if let Some((_, text)) = current.as_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    sections.extend(current);
    sections
}

/// Section `name`.
///
/// # Errors
///
/// If the script printed no such section.
pub fn section<'a>(sections: &'a Sections, name: &str) -> Result<&'a str> {
    sections
        .get(name)
        .map(String::as_str)
        .with_context(|| format!("no section {name:?} in the script's output"))
}

/// The JSON line `sp-testpod hit` printed in section `name`.
///
/// # Errors
///
/// If there is no such section or no report in it.
pub fn hit_report(sections: &Sections, name: &str) -> Result<HitReport> {
    let text = section(sections, name)?;
    let line = text
        .lines()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("no hit report in {name:?}:\n{text}"))?;
    serde_json::from_str(line).with_context(|| format!("parsing the hit report {line:?}"))
}
