//! The lab itself: pods and nodes reach each other as in a cluster, outsiders do not reach pods,
//! and nothing is left behind, also when a test panics or a run was killed.
//!
//! Addresses (see `splitproxy_e2e::addresses`):
//!
//! | What            | Address                      |
//! |-----------------|------------------------------|
//! | external client | `198.18.0.3`                 |
//! | node1 / node2   | `198.18.0.11` / `198.18.0.12` |
//! | pod-a on node1  | `10.244.1.10`                |
//! | pod-b on node2  | `10.244.2.10`                |
//!
//! and their IPv6 twins (`fd00:198:18::3`, `fd00:198:18::11`, `fd00:10:244:1::10`, …).

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Result, ensure};
use splitproxy_e2e::addresses::{EXTERNAL_CLIENT, node_ip, pod_cidr, pod_ip};
use splitproxy_e2e::lab::{HasNamespace, Lab};
use splitproxy_e2e::{HitReport, eventually, hit, serve, workspace_binary};

/// How long a server may take to start listening on a slow, busy machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Names of all network namespaces on the machine.
fn netns_list() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(out.status.success(), "ip netns list failed: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// Hits `url` from `from` until one request is answered by `expected`, then returns a full run.
fn hit_when_up(
    lab: &Lab,
    from: &impl HasNamespace,
    url: &str,
    expected: &str,
) -> Result<HitReport> {
    eventually(
        &format!("{expected} answering {url} from {}", from.ns_name()),
        START_TIMEOUT,
        || {
            let report = hit(lab, from, url, 1)?;
            ensure!(report.answered_by(expected) == 1, "got {report:?}");
            Ok(())
        },
    )?;
    hit(lab, from, url, 10)
}

#[test]
fn pods_and_nodes_reach_pods_and_outsiders_do_not() -> Result<()> {
    let mut lab = Lab::new("self")?;
    let client = lab.add_host("client", EXTERNAL_CLIENT)?;
    let node1 = lab.add_node("node1", node_ip(1), pod_cidr(1))?;
    let node2 = lab.add_node("node2", node_ip(2), pod_cidr(2))?;
    let pod_a = lab.add_pod(&node1, "pod-a", pod_ip(1, 10))?;
    let pod_b = lab.add_pod(&node2, "pod-b", pod_ip(2, 10))?;
    let server_a = serve(&mut lab, &pod_a, "pod-a", 8080)?;
    let server_b = serve(&mut lab, &pod_b, "pod-b", 8080)?;
    let url_a = format!("http://{}:8080/", pod_a.ip());
    let url_b = format!("http://{}:8080/", pod_b.ip());

    let across = hit_when_up(&lab, &pod_a, &url_b, "pod-b")?;
    assert_eq!(
        across.answered_by("pod-b"),
        10,
        "pod-a → pod-b across nodes: {across:?}\n{}",
        server_b.log()
    );

    let local = hit_when_up(&lab, &node1, &url_a, "pod-a")?;
    assert_eq!(
        local.answered_by("pod-a"),
        10,
        "node1 → its pod-a: {local:?}\n{}",
        server_a.log()
    );

    let back = hit(&lab, &pod_b, &url_a, 5)?;
    assert_eq!(
        back.answered_by("pod-a"),
        5,
        "pod-b → pod-a across nodes: {back:?}"
    );

    let outside = hit(&lab, &client, &url_a, 3)?;
    assert_eq!(
        outside.answered(),
        0,
        "the external client must have no route to pods: {outside:?}"
    );
    assert_eq!(outside.failures, 3, "{outside:?}");

    let namespaces = lab.namespaces().to_vec();
    let pids = [server_a.pid(), server_b.pid()];
    assert_eq!(
        namespaces.len(),
        6,
        "lan, client, two nodes, two pods: {namespaces:?}"
    );
    drop(lab);

    let left: Vec<_> = netns_list()
        .into_iter()
        .filter(|ns| namespaces.contains(ns))
        .collect();
    assert!(
        left.is_empty(),
        "namespaces left after the lab was dropped: {left:?}"
    );
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "server {pid} still runs after the lab"
        );
    }
    Ok(())
}

#[test]
fn pods_and_nodes_reach_pods_over_ipv6_and_outsiders_do_not() -> Result<()> {
    let mut lab = Lab::new("selfsix")?;
    let client = lab.add_host("client", EXTERNAL_CLIENT)?;
    let node1 = lab.add_node("node1", node_ip(1), pod_cidr(1))?;
    let node2 = lab.add_node("node2", node_ip(2), pod_cidr(2))?;
    let pod_a = lab.add_pod(&node1, "pod-a", pod_ip(1, 10))?;
    let pod_b = lab.add_pod(&node2, "pod-b", pod_ip(2, 10))?;
    assert_eq!(pod_b.ip6().to_string(), "fd00:10:244:2::10");
    serve(&mut lab, &pod_a, "pod-a", 8080)?;
    serve(&mut lab, &pod_b, "pod-b", 8080)?;
    let url_a = format!("http://[{}]:8080/", pod_a.ip6());
    let url_b = format!("http://[{}]:8080/", pod_b.ip6());

    let across = hit_when_up(&lab, &pod_a, &url_b, "pod-b")?;
    assert_eq!(across.answered_by("pod-b"), 10, "pod-a → pod-b: {across:?}");
    let local = hit_when_up(&lab, &node1, &url_a, "pod-a")?;
    assert_eq!(local.answered_by("pod-a"), 10, "node1 → pod-a: {local:?}");
    let remote = hit(&lab, &node2, &url_a, 5)?;
    assert_eq!(remote.answered_by("pod-a"), 5, "node2 → pod-a: {remote:?}");
    // The same servers answer IPv4 too.
    let v4 = hit(&lab, &pod_b, &format!("http://{}:8080/", pod_a.ip()), 3)?;
    assert_eq!(
        v4.answered_by("pod-a"),
        3,
        "pod-b → pod-a over IPv4: {v4:?}"
    );

    let outside = hit(&lab, &client, &url_a, 3)?;
    assert_eq!(
        (outside.answered(), outside.failures),
        (0, 3),
        "the external client must have no IPv6 route to pods: {outside:?}"
    );
    let lan = format!("http://[{}]:8080/", node1.ip6());
    let nothing = hit(&lab, &client, &lan, 1)?;
    assert_eq!(
        nothing.failures, 1,
        "the LAN reaches the node over IPv6 and nothing listens there: {nothing:?}"
    );
    assert!(
        nothing.errors.iter().any(|e| e.contains("refused")),
        "{nothing:?}"
    );
    Ok(())
}

#[test]
fn a_panicking_test_still_removes_its_lab() {
    let made = std::panic::catch_unwind(|| {
        let mut lab = Lab::new("panic").unwrap();
        let node = lab.add_node("node1", node_ip(1), pod_cidr(1)).unwrap();
        let sleeper = lab.spawn(&node, "sleep", &["600"]).unwrap();
        std::panic::panic_any((lab.namespaces().to_vec(), sleeper.pid()));
    });
    let (namespaces, pid) = *made.unwrap_err().downcast::<(Vec<String>, u32)>().unwrap();
    assert_eq!(namespaces.len(), 2, "{namespaces:?}");
    let left: Vec<_> = netns_list()
        .into_iter()
        .filter(|ns| namespaces.contains(ns))
        .collect();
    assert!(left.is_empty(), "namespaces left after a panic: {left:?}");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "process {pid} still runs after a panic"
    );
}

#[test]
fn namespaces_left_by_a_dead_run_are_removed_with_their_processes() -> Result<()> {
    let mut gone = Command::new("true").spawn()?;
    gone.wait()?;
    let stale = format!("sp{}stale-lan", gone.id());
    let status = Command::new("ip").args(["netns", "add", &stale]).status()?;
    ensure!(status.success(), "cannot create {stale}");
    let mut orphan = Command::new("ip")
        .args(["netns", "exec", &stale, "sleep", "600"])
        .spawn()?;
    // `ip netns exec` enters the namespace a moment after it starts; a process not yet inside
    // is not one the namespace holds, so wait until it is.
    let orphan_pid = orphan.id().to_string();
    eventually(
        "the orphan to enter the stale namespace",
        START_TIMEOUT,
        || {
            let pids = Command::new("ip")
                .args(["netns", "pids", &stale])
                .output()?;
            let pids = String::from_utf8_lossy(&pids.stdout);
            ensure!(pids.split_whitespace().any(|p| p == orphan_pid), "not yet");
            Ok(())
        },
    )?;

    let lab = Lab::new("fresh")?;

    assert!(
        !netns_list().contains(&stale),
        "stale namespace {stale} survived Lab::new"
    );
    let killed = eventually(
        "the stale namespace's process to die",
        START_TIMEOUT,
        || {
            orphan
                .try_wait()?
                .ok_or_else(|| anyhow::anyhow!("still running"))
        },
    )?;
    assert!(!killed.success(), "{killed:?}");
    drop(lab);
    Ok(())
}

#[test]
fn commands_only_run_in_the_labs_own_namespaces() -> Result<()> {
    let lab = Lab::new("scope")?;
    let error = lab.exec("some-other-namespace", "true", &[]).unwrap_err();
    assert!(
        error.to_string().contains("not part of this lab"),
        "{error:#}"
    );
    let lan = lab.lan_ns().to_owned();
    let links = lab.exec_ok(&lan, "ip", &["-o", "link", "show", "br0"])?;
    assert!(links.contains("br0"), "{links}");
    Ok(())
}

#[test]
fn workspace_binaries_are_found_or_named_in_the_error() {
    assert!(workspace_binary("sp-testpod").unwrap().is_file());
    let error = workspace_binary("no-such-binary").unwrap_err().to_string();
    assert!(error.contains("cargo build --workspace --bins"), "{error}");
}
