//! The IPVS mode's planner and sync (`dataplane/src/ipvs/{plan,diff,apply}.rs`) on a real IPVS
//! kernel, in the qemu VM (`tests/vm/build-vm.sh`), driven through `sp-ipvs sync` as the agent
//! will drive them: a Service becomes a virtual server with its endpoint behind it, a second sync
//! of the same state changes nothing, an endpoint that moves while a client holds a connection to
//! it drains at weight 0 and goes once its closed connections have left IPVS's table (2
//! minutes in TIME_WAIT), and a virtual server the sync
//! does not own survives every sync. Needs root.
//!
//! Addresses (`splitproxy_e2e::vm::ipvs_node`): node 1 (198.18.0.11) with pods `client`
//! (10.244.1.10), `server` (10.244.1.20, `server-pod`) and `server2` (10.244.1.21, `server-2`),
//! each serving on 8080; the Service's VIP 10.96.0.10:80 on `kube-ipvs0`; another program's
//! virtual server 192.0.2.1:80.

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use splitproxy_e2e::{
    vm::ipvs_node::{self, Sections, hit_report, section},
    workspace_binary,
};
use std::{collections::BTreeMap, time::Duration};

const SCRIPT: &str = r#"
pod server2 10.244.1.21
ip netns exec server2 sp-testpod serve --name server-2 --listen 0.0.0.0:8080 &
ip link add kube-ipvs0 type dummy
ip addr add 10.96.0.10/32 dev kube-ipvs0
# Closed connections leave IPVS's table 2 s after their FIN, not 2 minutes.
ipvsadm --set 900 2 300
# Another program's virtual server.
ipvsadm -A -t 192.0.2.1:80 -s wlc

sync() { sp-ipvs sync --own 10.96.0.0/12 "$@"; }
echo "== first sync"
sync tcp:10.96.0.10:80=10.244.1.20:8080
echo "== second sync"
sync tcp:10.96.0.10:80=10.244.1.20:8080
echo "== traffic"
ip netns exec client sp-testpod hit --url http://10.96.0.10:80/ --count 3 --timeout-ms 5000

# A connection the client holds open to the first endpoint.
ip netns exec client bash -c 'exec 3<>/dev/tcp/10.96.0.10/80; exec sleep 600' &
holder=$!
tries=0
until ipvsadm -Ln | grep -Eq -- '-> 10.244.1.20:8080 +Masq +1 +1 '; do
    tries=$((tries + 1))
    [ "$tries" -lt 100 ] || { echo "the held connection never showed"; exit 1; }
    sleep 0.1
done
echo "== moved"
sync tcp:10.96.0.10:80=10.244.1.21:8080
echo "== moved, listed"
ipvsadm -Ln
echo "== moved, traffic"
ip netns exec client sp-testpod hit --url http://10.96.0.10:80/ --count 3 --timeout-ms 5000
echo "== moved again"
sync tcp:10.96.0.10:80=10.244.1.21:8080

kill "$holder"
# Closed connections stay in IPVS's table in TIME_WAIT for 2 minutes (not settable), and the
# endpoint counts them: sync until it goes.
tries=0
until report=$(sync tcp:10.96.0.10:80=10.244.1.21:8080) && [[ $report == *'"delete real'* ]]; do
    tries=$((tries + 1))
    [ "$tries" -lt 100 ] || { echo "the drained endpoint was never deleted"; break; }
    sleep 2
done
echo "== drained"
echo "$report"
echo "== removed"
sync
echo "== removed, listed"
ipvsadm -Ln
"#;

#[test]
fn the_ipvs_sync_programs_drains_and_removes_on_a_real_kernel_in_a_vm() -> Result<()> {
    let sp_ipvs = workspace_binary("sp-ipvs")?;
    let Some(sections) = ipvs_node::run(SCRIPT, |vm| {
        vm.with_file(sp_ipvs, "/usr/local/bin/sp-ipvs")
            .with_modules(["ip_vs_wlc"])
            // The drained endpoint's connections leave IPVS's table 2 minutes after they close.
            .with_timeout(Duration::from_secs(480))
    })?
    else {
        return Ok(());
    };

    let first = made(&sections, "first sync")?;
    ensure!(
        first
            == [
                "add tcp 10.96.0.10:80 rr",
                "add real tcp 10.96.0.10:80 10.244.1.20:8080 1"
            ],
        "the first sync made {first:?}"
    );
    let second = made(&sections, "second sync")?;
    ensure!(
        second.is_empty(),
        "a sync of the same state made {second:?}"
    );
    let traffic = hit_report(&sections, "traffic")?;
    ensure!(
        traffic
            .answers
            .keys()
            .all(|who| who.starts_with("server-pod"))
            && traffic.answered() == 3,
        "through the first endpoint: {traffic:?}"
    );

    // The endpoint moves while a connection to the old one is open: the old one drains.
    let moved = made(&sections, "moved")?;
    ensure!(
        moved
            == [
                "add real tcp 10.96.0.10:80 10.244.1.21:8080 1",
                "weight tcp 10.96.0.10:80 10.244.1.20:8080 0"
            ],
        "moving the endpoint made {moved:?}"
    );
    let listed = section(&sections, "moved, listed")?;
    ensure!(
        listed.contains("-> 10.244.1.20:8080")
            && listed
                .lines()
                .any(|l| l.contains("10.244.1.20:8080") && l.split_whitespace().nth(3) == Some("0")),
        "the old endpoint must stay at weight 0 while its connection is open:\n{listed}"
    );
    let after = hit_report(&sections, "moved, traffic")?;
    ensure!(
        after.answers.keys().all(|who| who.starts_with("server-2")) && after.answered() == 3,
        "new connections go to the new endpoint only: {after:?}"
    );
    let again = made(&sections, "moved again")?;
    ensure!(
        again.is_empty(),
        "a draining endpoint is left alone until it is empty: {again:?}"
    );

    // Once its connection has closed, the next sync deletes it.
    let drained = made(&sections, "drained")?;
    ensure!(
        drained == ["delete real tcp 10.96.0.10:80 10.244.1.20:8080"],
        "after the connection closed the sync made {drained:?}"
    );

    // No Service: the sync's virtual server goes, the other program's stays.
    let removed = made(&sections, "removed")?;
    ensure!(
        removed == ["delete tcp 10.96.0.10:80"],
        "without Services the sync made {removed:?}"
    );
    let left = section(&sections, "removed, listed")?;
    ensure!(
        left.contains("TCP  192.0.2.1:80 wlc") && !left.contains("10.96.0.10"),
        "only the other program's virtual server must be left:\n{left}"
    );
    Ok(())
}

/// The changes `sp-ipvs sync` printed in section `name` as made; fails on refused ones.
fn made(sections: &Sections, name: &str) -> Result<Vec<String>> {
    let text = section(sections, name)?;
    let line = text
        .lines()
        .find(|line| line.starts_with('{'))
        .with_context(|| format!("no sync report in section {name:?}:\n{text}"))?;
    let report: BTreeMap<String, Value> = serde_json::from_str(line)?;
    let list = |key: &str| -> Vec<String> {
        report[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    ensure!(
        list("refused").is_empty(),
        "{name}: refused {:?}",
        list("refused")
    );
    Ok(list("made"))
}
