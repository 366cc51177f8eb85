//! The executor against fake tools: what it runs, and what it leaves alone when nothing changed.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::NodeOptions;
use crate::ipvs::rules::render;
use crate::ipvs::sets::SetId;
use crate::ipvs::sets::tests::{example_v4, options, sets_of};
use crate::testing::scratch::Scratch;
use std::collections::BTreeSet;
use std::time::Duration;

/// A `Netfilter` for IPv4 whose tools are one `sh` script (`sh -c SCRIPT DIR TOOL ARGS...`): each
/// call is logged to `DIR/calls`, `ipset` and `iptables-restore` copy their input to
/// `DIR/ipset` and `DIR/payload`, `iptables-save` prints nothing (no jump is there), the canary
/// probe (`iptables -S`) succeeds, and `iptables-restore` fails while `DIR/restore-fails`
/// exists.
fn fake(scratch: &Scratch) -> Netfilter {
    fake_probing_every(scratch, iptables::Config::default().canary_interval)
}

/// [`fake`], probing the canaries every `interval`.
fn fake_probing_every(scratch: &Scratch, interval: Duration) -> Netfilter {
    let script = r#"dir=$0; tool=$1; shift
echo "$tool $*" >> "$dir/calls"
case "$tool" in
  ipset) cat > "$dir/ipset" ;;
  iptables-restore) cat > "$dir/payload"; [ -e "$dir/restore-fails" ] && { echo 'iptables-restore: line 3 failed' >&2; exit 2; }; true ;;
esac"#;
    let config = iptables::Config::default().with_command_prefix([
        "sh".to_owned(),
        "-c".to_owned(),
        script.to_owned(),
        scratch.0.to_string_lossy().into_owned(),
    ]);
    Netfilter::new(
        "ipset",
        &config.with_canary_interval(interval),
        &Families::default(),
    )
}

/// Syncs `sets` and their rules, then returns the calls made and clears the log.
async fn sync(netfilter: &mut Netfilter, scratch: &Scratch, sets: IpSets) -> Vec<String> {
    let rules = [render(&sets, &NodeOptions::default())];
    let _ = netfilter.sync(vec![sets], &rules).await;
    // No file when nothing ran.
    let calls = std::fs::read_to_string(scratch.0.join("calls")).unwrap_or_default();
    let _ = std::fs::remove_file(scratch.0.join("calls"));
    calls
        .lines()
        .map(|call| call.split(' ').next().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn an_unchanged_sync_runs_nothing_but_the_canary_probes_when_they_are_due() {
    let scratch = Scratch::new("ipvs-netfilter-unchanged");
    let mut netfilter = fake(&scratch);
    let sets = sets_of(&example_v4(), &options(IpFamily::V4));
    sync(&mut netfilter, &scratch, sets.clone()).await;
    let second = sync(&mut netfilter, &scratch, sets).await;
    assert!(second.is_empty(), "within the canary interval: {second:?}");
}

#[tokio::test]
async fn an_unchanged_sync_runs_only_the_canary_probes() {
    let scratch = Scratch::new("ipvs-netfilter-unchanged-probing");
    let mut netfilter = fake_probing_every(&scratch, Duration::ZERO);
    let sets = sets_of(&example_v4(), &options(IpFamily::V4));

    let first = sync(&mut netfilter, &scratch, sets.clone()).await;
    assert_eq!(first.first().map(String::as_str), Some("ipset"));
    assert!(first.contains(&"iptables-restore".to_owned()));
    assert!(
        scratch.read("ipset").matches(" -exist\n").count() >= SetId::ALL.len(),
        "every set is created on the first sync:\n{}",
        scratch.read("ipset")
    );
    // No canary to probe yet; the tables read once, and every jump inserted by the restore.
    assert_eq!(
        first[1..],
        ["iptables-save", "iptables-save", "iptables-restore"]
    );
    let payload = scratch.read("payload");
    assert_eq!(
        payload
            .lines()
            .filter(|line| line.starts_with("-I "))
            .count(),
        JUMPS.len(),
        "{payload}"
    );

    let second = sync(&mut netfilter, &scratch, sets).await;
    assert_eq!(second, ["iptables", "iptables", "iptables"]);
}

#[tokio::test]
async fn a_changed_set_is_the_only_one_written() {
    let scratch = Scratch::new("ipvs-netfilter-changed");
    let mut netfilter = fake(&scratch);
    let before = sets_of(&example_v4(), &options(IpFamily::V4));
    sync(&mut netfilter, &scratch, before).await;

    let mut state = example_v4();
    let key = state.services.keys().next().unwrap().clone();
    let mut service = (*state.services[&key]).clone();
    service.cluster_ips = vec!["172.30.0.99".parse().unwrap()];
    state.insert(service);
    let calls = sync(
        &mut netfilter,
        &scratch,
        sets_of(&state, &options(IpFamily::V4)),
    )
    .await;

    assert!(!calls.contains(&"iptables-restore".to_owned()), "{calls:?}");
    let script = scratch.read("ipset");
    let written: BTreeSet<&str> = script
        .lines()
        .filter_map(|line| line.strip_prefix("swap "))
        .filter_map(|line| line.split(' ').nth(1))
        .collect();
    assert_eq!(
        written,
        ["KUBE-CLUSTER-IP", "KUBE-IPVS-IPS"].into(),
        "only the sets holding the moved cluster IP:\n{script}"
    );
}

#[tokio::test]
async fn a_failed_restore_makes_the_next_sync_write_every_set() {
    let scratch = Scratch::new("ipvs-netfilter-failed");
    let mut netfilter = fake(&scratch);
    let sets = sets_of(&example_v4(), &options(IpFamily::V4));
    sync(&mut netfilter, &scratch, sets.clone()).await;

    std::fs::write(scratch.0.join("restore-fails"), "").unwrap();
    // Other rules, so that they are written.
    let rules = [render(
        &sets,
        &NodeOptions::default().with_masquerade_all(true),
    )];
    let failed = netfilter.sync(vec![sets.clone()], &rules).await;
    assert!(matches!(failed, Err(Error::Iptables { .. })), "{failed:?}");
    std::fs::remove_file(scratch.0.join("restore-fails")).unwrap();
    std::fs::remove_file(scratch.0.join("calls")).unwrap();

    let calls = sync(&mut netfilter, &scratch, sets).await;
    assert_eq!(
        calls.first().map(String::as_str),
        Some("ipset"),
        "{calls:?}"
    );
    assert!(calls.contains(&"iptables-restore".to_owned()), "{calls:?}");
}
