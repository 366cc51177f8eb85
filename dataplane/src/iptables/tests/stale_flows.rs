//! Stale UDP and SCTP flows deleted after a sync, against fake tools: which `conntrack -D` run,
//! and what a failing one does.
#![allow(clippy::unwrap_used)]

use super::*;

/// A UDP Service `ns1/dns` on 172.30.0.10:53 (node port 30053) with endpoints at `endpoints`.
fn udp_dns(endpoints: &[&str]) -> ProxyState {
    state(vec![service(
        "ns1",
        "dns",
        &["172.30.0.10"],
        vec![ServicePort::new(
            "dns",
            Protocol::Udp,
            53,
            Some(30053),
            endpoints.iter().map(|ip| ready(ip, 5353)).collect(),
        )],
    )])
}

/// The `conntrack` lines of the fake tools' call log.
fn conntrack_calls(scratch: &Scratch) -> Vec<String> {
    scratch
        .read("calls")
        .lines()
        .filter(|line| line.starts_with("conntrack "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn sync_deletes_the_flows_of_a_removed_udp_endpoint_after_the_rules() {
    let scratch = Scratch::new("conntrack");
    let mut iptables = fake_tools(&scratch, SAVED, 0);

    iptables
        .sync(&udp_dns(&["10.180.0.1", "10.180.2.1"]))
        .await
        .unwrap();
    // The first sync has no previous state: kube-proxy does not flush on startup.
    assert!(conntrack_calls(&scratch).is_empty());
    iptables.sync(&udp_dns(&["10.180.2.1"])).await.unwrap();

    assert_eq!(
        conntrack_calls(&scratch),
        [
            "conntrack -D -p udp --orig-dst 172.30.0.10 --dport 53 --reply-src 10.180.0.1",
            "conntrack -D -p udp --dport 30053 --reply-src 10.180.0.1",
        ]
    );
    // After the rules are in place: the last calls of the second sync.
    let calls = scratch.read("calls");
    let calls: Vec<&str> = calls.lines().collect();
    let restored = calls
        .iter()
        .rposition(|c| c.starts_with("iptables-restore"));
    let flows = calls.iter().position(|c| c.starts_with("conntrack"));
    assert!(flows > restored, "{calls:?}");
}

#[tokio::test]
async fn failed_conntrack_cleanup_does_not_fail_the_sync() {
    let scratch = Scratch::new("conntrack-fails");
    std::fs::write(scratch.0.join("conntrack-fails"), "").unwrap();
    let mut iptables = fake_tools(&scratch, SAVED, 0);

    iptables.sync(&ProxyState::default()).await.unwrap();
    let report = iptables.sync(&udp_dns(&["10.180.0.1"])).await.unwrap();

    assert_eq!(report.rules_written().len(), 2);
    assert_eq!(
        conntrack_calls(&scratch),
        [
            "conntrack -D -p udp --orig-dst 172.30.0.10 --dport 53",
            "conntrack -D -p udp --dport 30053"
        ]
    );
}

#[tokio::test]
async fn failed_sync_keeps_the_last_applied_state_for_the_cleanup() {
    let scratch = Scratch::new("conntrack-after-failure");
    let mut iptables = fake_tools(&scratch, SAVED, 0);
    iptables
        .sync(&udp_dns(&["10.180.0.1", "10.180.2.1"]))
        .await
        .unwrap();

    // A sync whose restore fails applied nothing as far as the cleanup is concerned.
    let mut failing = FamilyExecutor {
        tools: fake_tools(&scratch, SAVED, 2).tools,
        applied: iptables.applied.clone(),
        ..FamilyExecutor::default()
    };
    failing.sync(&udp_dns(&[])).await.unwrap_err();
    assert!(conntrack_calls(&scratch).is_empty());
    failing.sync(&udp_dns(&["10.180.2.1"])).await.unwrap_err();
    assert_eq!(failing.applied, iptables.applied);

    iptables.sync(&udp_dns(&["10.180.2.1"])).await.unwrap();
    assert_eq!(
        conntrack_calls(&scratch),
        [
            "conntrack -D -p udp --orig-dst 172.30.0.10 --dport 53 --reply-src 10.180.0.1",
            "conntrack -D -p udp --dport 30053 --reply-src 10.180.0.1",
        ]
    );
}

/// The calls of the fake tools after the first `skip` ones.
fn calls_after(scratch: &Scratch, skip: usize) -> Vec<String> {
    scratch
        .read("calls")
        .lines()
        .skip(skip)
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn unchanged_services_are_not_rewritten_until_a_canary_goes() {
    let scratch = Scratch::new("partial");
    let mut iptables = fake_tools(&scratch, SAVED, 0);
    let (state, _) = everything();
    let first = iptables.sync(&state).await.unwrap();
    assert!(first.full);
    // The kernel now holds what was restored, canaries included.
    std::fs::write(scratch.0.join("saved"), scratch.read("payload")).unwrap();

    let done = scratch.read("calls").lines().count();
    let second = iptables.sync(&state).await.unwrap();
    assert!(!second.full);
    let payload = scratch.read("payload");
    assert!(!payload.contains("-A KUBE-SEP-"), "{payload}");
    assert!(payload.contains("-A KUBE-SERVICES"), "{payload}");
    assert_eq!(second.rules_total(), first.rules_total());
    assert!(
        second.rules_written()[1].1 < first.rules_written()[1].1,
        "{second:?}"
    );
    // Within the canary interval of the full sync a partial one only restores, and writes no
    // canary: it trusts the jumps and the chains it wrote, with no iptables-save.
    assert_eq!(
        calls_after(&scratch, done),
        ["iptables-restore -w 5 --noflush"]
    );
    assert!(!payload.contains("KUBE-PROXY-CANARY"), "{payload}");

    // Once the interval is over the canaries are probed.
    iptables.tools.config_mut().canary_interval = Duration::ZERO;
    let done = scratch.read("calls").lines().count();
    assert!(!iptables.sync(&state).await.unwrap().full);
    assert_eq!(
        calls_after(&scratch, done),
        [
            "iptables -w 5 -t mangle -S KUBE-PROXY-CANARY",
            "iptables -w 5 -t nat -S KUBE-PROXY-CANARY",
            "iptables -w 5 -t filter -S KUBE-PROXY-CANARY",
            "iptables-restore -w 5 --noflush",
        ]
    );

    // Someone deletes our nat chains: the next sync writes everything and checks the jumps.
    std::fs::write(scratch.0.join("saved"), SAVED).unwrap();
    let third = iptables.sync(&state).await.unwrap();
    assert!(third.full);
    assert_eq!(third.rules_written(), first.rules_written());
    assert!(scratch.read("payload").contains("-A KUBE-SEP-"));
}

#[tokio::test]
async fn a_change_no_rule_of_the_family_shows_restores_nothing() {
    let scratch = Scratch::new("other-family");
    let mut ip6tables = fake_tools(&scratch, SAVED, 0);
    ip6tables.tools.config_mut().family = crate::IpFamily::V6;
    let with_endpoint = |ip| {
        state(vec![service(
            "ns1",
            "svc1",
            &["172.30.0.41"],
            vec![ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                None,
                vec![ready(ip, 80)],
            )],
        )])
    };
    assert!(
        ip6tables
            .sync(&with_endpoint("10.180.0.1"))
            .await
            .unwrap()
            .full
    );
    let done = scratch.read("calls").lines().count();

    // An IPv4 endpoint moves: the IPv6 rules are the same, so nothing is restored.
    let moved = ip6tables.sync(&with_endpoint("10.180.0.9")).await.unwrap();
    assert!(!moved.full);
    assert_eq!(calls_after(&scratch, done), Vec::<String>::new());
    assert!(
        moved.rules_written().iter().all(|(_, n)| *n == 0),
        "{moved:?}"
    );

    // A sync with no change at all (the periodic one) still rewrites the shared chains.
    ip6tables.sync(&with_endpoint("10.180.0.9")).await.unwrap();
    assert_eq!(
        calls_after(&scratch, done),
        ["iptables-restore -w 5 --noflush"]
    );
}

#[tokio::test]
async fn a_failed_sync_makes_the_next_one_full() {
    let scratch = Scratch::new("partial-after-failure");
    let (state, _) = everything();
    let mut iptables = fake_tools(&scratch, SAVED, 0);
    iptables.sync(&state).await.unwrap();
    std::fs::write(scratch.0.join("saved"), scratch.read("payload")).unwrap();

    // The restore fails: the sync fails.
    iptables.tools = fake_tools(&scratch, &scratch.read("saved"), 2).tools;
    iptables.full_syncs = crate::full_sync::FullSyncClock::default();
    iptables.sync(&state).await.unwrap_err();

    iptables.tools = fake_tools(&scratch, &scratch.read("saved"), 0).tools;
    let next = iptables.sync(&state).await.unwrap();
    assert!(next.full);
    assert!(scratch.read("payload").contains("-A KUBE-SEP-"));
}

#[tokio::test]
async fn a_family_without_services_still_syncs_partially_after_its_first_sync() {
    // A dual-stack node's IPv6 family often has no Service at all: nothing per-Service was
    // written, yet the kernel holds what the first sync wrote.
    let scratch = Scratch::new("partial-empty");
    let mut iptables = fake_tools(&scratch, SAVED, 0);
    assert!(iptables.sync(&ProxyState::default()).await.unwrap().full);
    std::fs::write(scratch.0.join("saved"), scratch.read("payload")).unwrap();

    let next = iptables.sync(&ProxyState::default()).await.unwrap();

    assert!(!next.full);
    // Only the first sync read the kernel's tables (nat and filter).
    assert_eq!(scratch.read("calls").matches("iptables-save").count(), 2);
}
