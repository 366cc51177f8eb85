//! IPVS for real, in a qemu VM on the pinned Debian kernel (`tests/vm/build-vm.sh`), since the
//! development kernel has no IPVS: a client pod reaches a virtual server only once it has a real
//! server behind it, the real server sees the client's own address (masquerading mode rewrites
//! only the destination), and `ipvsadm` lists and counts the connections. Groundwork for the IPVS dataplane
//! (issue 8). Needs root.
//!
//! Without qemu or the kernel package this test says so and stops, except under `CI=true`, where
//! that is a failure.
//!
//! Addresses (`splitproxy_e2e::addresses`): the VM's root namespace is node 1 (198.18.0.11); its pods `client`
//! (10.244.1.10) and `server` (10.244.1.20, `sp-testpod` on port 8080) are Calico-style veth
//! pods; the virtual server is the ClusterIP 10.96.0.10:80 on the dummy `kube-ipvs0`, as
//! kube-proxy's IPVS mode puts it.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    HitReport,
    vm::{Vm, VmImage},
    workspace_binary,
};
use std::collections::BTreeMap;

const VIP: &str = "10.96.0.10:80";
const SERVER: &str = "10.244.1.20:8080";

/// Runs in the VM. Prints the sections `== NAME` that the test reads.
const SCRIPT: &str = r#"
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
until ip netns exec client sp-testpod hit --url http://10.244.1.20:8080/ --count 1 --timeout-ms 500 \
        | grep -q '"server-pod"'; do
    tries=$((tries + 1))
    [ "$tries" -lt 50 ] || { echo "the server never answered its pod address"; exit 1; }
    sleep 0.1
done

ip link add kube-ipvs0 type dummy
ip addr add 10.96.0.10/32 dev kube-ipvs0
ipvsadm -A -t 10.96.0.10:80 -s rr
echo "== without real server"
ip netns exec client sp-testpod hit --url http://10.96.0.10:80/source --count 3 --timeout-ms 2000

ipvsadm -a -t 10.96.0.10:80 -r 10.244.1.20:8080 -m
echo "== with real server"
ip netns exec client sp-testpod hit --url http://10.96.0.10:80/source --count 5 --timeout-ms 5000
echo "== connections"
ipvsadm -Lnc
# The kernel folds its per-CPU counters into these totals every 2 s; wait for them to show up.
tries=0
until ipvsadm -Ln --stats | grep -q -- '-> 10.244.1.20:8080 *[1-9]'; do
    tries=$((tries + 1))
    [ "$tries" -lt 60 ] || break
    sleep 0.5
done
echo "== stats"
ipvsadm -Ln --stats
"#;

#[test]
fn a_virtual_server_answers_through_its_real_server_in_a_vm() -> Result<()> {
    let image = match VmImage::setup() {
        Ok(image) => image,
        Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
            eprintln!("SKIPPED ipvs_vm: the VM tools cannot be set up here: {e:#}");
            return Ok(());
        }
        Err(e) => return Err(e.context("the VM tools must be set up under CI=true")),
    };
    let vm = Vm::new(image)?
        .with_host_files(["/usr/bin/ip", "/usr/sbin/ipvsadm"])
        .with_file(workspace_binary("sp-testpod")?, "/usr/local/bin/sp-testpod")
        .with_modules(["veth", "dummy", "ip_vs", "ip_vs_rr"]);
    let run = vm.run(SCRIPT)?;
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
    let sections = sections(&run.output);

    let before = hit_report(&sections, "without real server")?;
    ensure!(
        before.answered() == 0 && before.failures == 3,
        "{VIP} answered without a real server: {before:?}"
    );

    let after = hit_report(&sections, "with real server")?;
    // The server answers `/source` with its name and the client address it saw.
    let expected = BTreeMap::from([("server-pod 10.244.1.10".to_owned(), 5)]);
    ensure!(
        after.answers == expected && after.failures == 0,
        "{VIP} through {SERVER}: expected {expected:?} (the client's own address), got {after:?}"
    );

    let table = sections
        .get("connections")
        .context("no ipvsadm connection table")?;
    let entries = table.lines().filter(|l| l.contains(SERVER)).count();
    ensure!(
        entries == 5,
        "ipvsadm lists {entries} connections to {SERVER}, expected 5:\n{table}"
    );

    let stats = sections.get("stats").context("no ipvsadm stats")?;
    let connections = real_server_connections(stats, SERVER)
        .with_context(|| format!("{SERVER} missing from ipvsadm -Ln --stats:\n{stats}"))?;
    ensure!(
        connections == 5,
        "ipvsadm counts {connections} connections to {SERVER}, expected 5:\n{stats}"
    );
    Ok(())
}

/// The output split at `== NAME` lines: each name with the text after it.
fn sections(output: &str) -> BTreeMap<String, String> {
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

/// The JSON line `sp-testpod hit` printed in section `name`.
fn hit_report(sections: &BTreeMap<String, String>, name: &str) -> Result<HitReport> {
    let text = sections
        .get(name)
        .with_context(|| format!("no section {name:?}"))?;
    let line = text
        .lines()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("no hit report in {name:?}:\n{text}"))?;
    serde_json::from_str(line).with_context(|| format!("parsing the hit report {line:?}"))
}

/// The `Conns` column of the line `  -> ADDRESS …` in `ipvsadm -Ln --stats`.
fn real_server_connections(stats: &str, address: &str) -> Option<u64> {
    stats.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        (fields.next() == Some("->") && fields.next() == Some(address))
            .then(|| fields.next()?.parse().ok())
            .flatten()
    })
}
