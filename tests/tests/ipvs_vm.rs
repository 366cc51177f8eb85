//! IPVS for real, in a qemu VM on the pinned Debian kernel (`tests/vm/build-vm.sh`), since the
//! development kernel has no IPVS: a client pod reaches a virtual server only once it has a real
//! server behind it, the real server sees the client's own address (masquerading mode rewrites
//! only the destination), and `ipvsadm` lists and counts the connections; and kube-proxy's way
//! of masquerading in IPVS mode (an ipset of Services matched by iptables, nf_tables backend)
//! makes the server see the node instead. Groundwork for the IPVS dataplane
//! (issue 8). Needs root.
//!
//! Without qemu or the kernel package this test says so and stops, except under `CI=true`, where
//! that is a failure.
//!
//! Addresses (`splitproxy_e2e::addresses`): the VM's root namespace is node 1 (198.18.0.11); its
//! pods `client` (10.244.1.10) and `server` (10.244.1.20, `sp-testpod` on port 8080) are
//! Calico-style veth pods; the virtual server is the ClusterIP 10.96.0.10:80 on the dummy
//! `kube-ipvs0`, as kube-proxy's IPVS mode puts it.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    addresses::node_ip,
    vm::ipvs_node::{self, Sections, hit_report},
};
use std::collections::BTreeMap;

const VIP: &str = "10.96.0.10:80";
const SERVER: &str = "10.244.1.20:8080";
/// The client's address, which the server sees unless the node masquerades.
const CLIENT: &str = "10.244.1.10";

/// After the node and its pods: the virtual server `VIP` with no real server yet.
const SETUP: &str = r#"
ip link add kube-ipvs0 type dummy
ip addr add 10.96.0.10/32 dev kube-ipvs0
ipvsadm -A -t 10.96.0.10:80 -s rr
"#;

/// Runs after `SETUP`: the virtual server without, then with its real server.
const REAL_SERVER: &str = r#"
echo "== without real server"
ip netns exec client sp-testpod hit --url http://10.96.0.10:80/source --count 3 --timeout-ms 2000

ipvsadm -a -t 10.96.0.10:80 -r 10.244.1.20:8080 -m
echo "== with real server"
ip netns exec client sp-testpod hit --url http://10.96.0.10:80/source --count 5 --timeout-ms 5000
echo "== connections"
ipvsadm -Lnc
# The kernel folds its per-CPU counters into these totals every 2 s, so a slow guest may show
# some of the connections before the rest; wait for all five.
tries=0
until ipvsadm -Ln --stats | grep -q -- '-> 10.244.1.20:8080 *5 '; do
    tries=$((tries + 1))
    [ "$tries" -lt 60 ] || break
    sleep 0.5
done
echo "== stats"
ipvsadm -Ln --stats
"#;

/// Runs after `SETUP`, with the real server in place: kube-proxy's IPVS-mode masquerading, an
/// ipset of Service addresses matched in `nat` to mark packets, and the marked ones masqueraded on
/// the way out; first with the set empty, then holding the Service.
const MASQUERADE: &str = r#"
ipvsadm -a -t 10.96.0.10:80 -r 10.244.1.20:8080 -m
# IPVS keeps conntrack entries for its connections only with this, and MASQUERADE needs them.
sysctl -qw net.ipv4.vs.conntrack=1
ipset create KUBE-CLUSTER-IP hash:ip,port
iptables-restore <<'RULES'
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A POSTROUTING -j KUBE-POSTROUTING
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE
COMMIT
RULES
echo "== set empty"
ip netns exec client sp-testpod hit --url http://10.96.0.10:80/source --count 3 --timeout-ms 5000
ipset add KUBE-CLUSTER-IP 10.96.0.10,tcp:80
echo "== set holds the service"
ip netns exec client sp-testpod hit --url http://10.96.0.10:80/source --count 3 --timeout-ms 5000
echo "== rules"
iptables -t nat -S
"#;

#[test]
fn a_virtual_server_answers_through_its_real_server_in_a_vm() -> Result<()> {
    let Some(sections) = run_in_vm(REAL_SERVER)? else {
        return Ok(());
    };

    let before = hit_report(&sections, "without real server")?;
    ensure!(
        before.answered() == 0 && before.failures == 3,
        "{VIP} answered without a real server: {before:?}"
    );

    let after = hit_report(&sections, "with real server")?;
    // The server answers `/source` with its name and the client address it saw.
    let expected = BTreeMap::from([(format!("server-pod {CLIENT}"), 5)]);
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

#[test]
fn services_in_an_ipset_are_masqueraded_by_iptables_in_a_vm() -> Result<()> {
    let Some(sections) = run_in_vm(MASQUERADE)? else {
        return Ok(());
    };
    let rules = sections.get("rules").map_or("", String::as_str);

    let unmarked = hit_report(&sections, "set empty")?;
    let expected = BTreeMap::from([(format!("server-pod {CLIENT}"), 3)]);
    ensure!(
        unmarked.answers == expected,
        "with the set empty the server must see the client: expected {expected:?}, got \
         {unmarked:?}\n{rules}"
    );

    let marked = hit_report(&sections, "set holds the service")?;
    let expected = BTreeMap::from([(format!("server-pod {}", node_ip(1)), 3)]);
    ensure!(
        marked.answers == expected,
        "with the Service in the set the server must see the node: expected {expected:?}, got \
         {marked:?}\n{rules}"
    );
    Ok(())
}

/// Boots the VM on the node with its pods, `SETUP`, then `script`.
fn run_in_vm(script: &str) -> Result<Option<Sections>> {
    ipvs_node::run(&format!("{SETUP}{script}"), |vm| vm)
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
