#![allow(clippy::unwrap_used)]

use super::*;

/// A rendered payload in kube-proxy's layout: two Services, one stale chain.
const RENDERED: &str = "\
*filter
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -d 172.30.0.9/32 -p tcp -m tcp --dport 80 -j REJECT
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-AAAA - [0:0]
:KUBE-SEP-AAAA1 - [0:0]
:KUBE-SVC-BBBB - [0:0]
:KUBE-SEP-BBBB1 - [0:0]
:KUBE-SVC-GONE - [0:0]
-A KUBE-SERVICES -d 172.30.0.1/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-AAAA
-A KUBE-SERVICES -d 172.30.0.2/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-BBBB
-A KUBE-SVC-AAAA -j KUBE-SEP-AAAA1
-A KUBE-SEP-AAAA1 -p tcp -m tcp -j DNAT --to-destination 10.180.0.1:80
-A KUBE-SVC-BBBB -j KUBE-SEP-BBBB1
-A KUBE-SEP-BBBB1 -p tcp -m tcp -j DNAT --to-destination 10.180.0.2:80
-X KUBE-SVC-GONE
COMMIT
";

fn all_existing(payload: &str) -> BTreeSet<(String, String)> {
    per_service_chains(payload).0.into_keys().collect()
}

fn count(counts: &[(String, u32)], table: &str) -> u32 {
    counts
        .iter()
        .find(|(name, _)| name == table)
        .map_or(0, |(_, n)| *n)
}

#[test]
fn without_a_previous_sync_everything_is_written() {
    let trimmed = trim(RENDERED, &WrittenChains::default(), &all_existing(RENDERED));
    assert_eq!(trimmed.payload, RENDERED);
    assert_eq!(trimmed.rules_written, trimmed.rules_total);
    assert_eq!(count(&trimmed.rules_total, "filter"), 1);
    assert_eq!(count(&trimmed.rules_total, "nat"), 6);
}

#[test]
fn unchanged_service_chains_are_left_out_and_top_level_chains_kept() {
    let first = trim(RENDERED, &WrittenChains::default(), &BTreeSet::new());
    let second = trim(RENDERED, &first.chains, &all_existing(RENDERED));
    assert!(!second.payload.contains("KUBE-SEP-"), "{}", second.payload);
    assert!(
        !second.payload.contains(":KUBE-SVC-AAAA"),
        "{}",
        second.payload
    );
    assert!(
        !second.payload.contains("-A KUBE-SVC-"),
        "{}",
        second.payload
    );
    // The dispatch still points at the chains left in place; stale ones still go.
    assert!(
        second.payload.contains("-j KUBE-SVC-AAAA"),
        "{}",
        second.payload
    );
    assert!(
        second.payload.contains("-X KUBE-SVC-GONE"),
        "{}",
        second.payload
    );
    assert!(
        second.payload.contains(":KUBE-SVC-GONE"),
        "{}",
        second.payload
    );
    assert_eq!(count(&second.rules_written, "nat"), 2);
    assert_eq!(count(&second.rules_written, "filter"), 1);
    assert_eq!(second.rules_total, first.rules_total);
}

#[test]
fn only_the_changed_services_chains_are_written() {
    let first = trim(RENDERED, &WrittenChains::default(), &BTreeSet::new());
    let moved = RENDERED.replace("10.180.0.2:80", "10.180.0.3:80");
    let second = trim(&moved, &first.chains, &all_existing(&moved));
    assert!(
        second.payload.contains(":KUBE-SEP-BBBB1 - [0:0]\n"),
        "{}",
        second.payload
    );
    assert!(
        second.payload.contains("10.180.0.3:80"),
        "{}",
        second.payload
    );
    assert!(!second.payload.contains("AAAA1"), "{}", second.payload);
    assert_eq!(count(&second.rules_written, "nat"), 3);
    // The next comparison is against what was written now.
    let third = trim(&moved, &second.chains, &all_existing(&moved));
    assert!(!third.payload.contains("KUBE-SEP-"), "{}", third.payload);
}

#[test]
fn a_chain_the_kernel_lost_is_written_again() {
    let first = trim(RENDERED, &WrittenChains::default(), &BTreeSet::new());
    let mut existing = all_existing(RENDERED);
    existing.remove(&("nat".to_owned(), "KUBE-SEP-AAAA1".to_owned()));
    let second = trim(RENDERED, &first.chains, &existing);
    assert!(
        second.payload.contains(":KUBE-SEP-AAAA1 - [0:0]\n"),
        "{}",
        second.payload
    );
    assert!(
        second
            .payload
            .contains("-A KUBE-SEP-AAAA1 -p tcp -m tcp -j DNAT"),
        "{}",
        second.payload
    );
    assert!(
        !second.payload.contains("-A KUBE-SVC-AAAA"),
        "{}",
        second.payload
    );
}

#[test]
fn a_chain_that_became_empty_is_written_empty() {
    let first = trim(RENDERED, &WrittenChains::default(), &BTreeSet::new());
    let emptied = RENDERED.replace("-A KUBE-SVC-BBBB -j KUBE-SEP-BBBB1\n", "");
    let second = trim(&emptied, &first.chains, &all_existing(&emptied));
    assert!(
        second.payload.contains(":KUBE-SVC-BBBB - [0:0]\n"),
        "{}",
        second.payload
    );
}
