//! Tests of the transaction builder: the scripts of representative changes, random sequences of
//! syncs checked against an in-memory kernel model, and the real `nft` in a network namespace.
//!
//! Test addresses: the unit tests' plan ([`crate::testing::fixtures`]).
#![allow(clippy::unwrap_used)]

use super::*;
use crate::NodeOptions;
use crate::nftables::render::Options;
use crate::testing::fixtures::{ip, local, ready, service, state};
use crate::testing::nftables::{
    Model, Netns, assert_numbers_apart, normalize, options_v4, options_v6, resolve_listing,
    resolved, tcp,
};
use crate::testing::rules::assert_rules_eq;
use crate::testing::steps::Steps;
use crate::{Endpoint, ProxyState, Service, ServiceKey, TrafficPolicy};
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// Fixtures

/// An endpoint-map number limit the random sequences reach, so they number maps again often.
const SMALL_NUMBER_LIMIT: u32 = 24;

fn web(index: u8, endpoints: Vec<Endpoint>) -> Service {
    service(
        "ns",
        &format!("web{index}"),
        &[&format!("172.30.0.{index}")],
        vec![tcp("http", 80, Some(30_000 + u16::from(index)), endpoints)],
    )
}

fn two_services() -> ProxyState {
    state(vec![
        web(1, vec![ready("10.180.2.1", 8080)]),
        web(2, vec![local("10.180.0.2", 8080)]),
    ])
}

fn sticky(index: u8, timeout: u64, endpoints: Vec<Endpoint>) -> Service {
    let mut service = service(
        "ns",
        &format!("sticky{index}"),
        &[&format!("172.30.1.{index}")],
        vec![tcp("http", 80, None, endpoints)],
    );
    service.session_affinity = Some(Duration::from_secs(timeout));
    service
}

/// The transaction from `before` (in the kernel) to `after`, and `after`'s render.
fn step(before: &Rendered, after: &ProxyState, leftovers: &Leftovers) -> (Rendered, Transaction) {
    let next = before.update(after, before.options());
    let transaction = transaction(Some(before), &next, leftovers);
    (next, transaction)
}

/// The model kernel after a full transaction of `state` onto an empty one.
fn from_scratch(state: &ProxyState, options: &Options) -> Model {
    let mut model = Model::default();
    let rendered = Rendered::new(state, options);
    model
        .apply(&transaction(None, &rendered, &Leftovers::default()).script)
        .unwrap();
    model
}

/// `model` without the (empty) chains named in `stale`.
fn without(model: &Model, stale: &BTreeSet<String>) -> Model {
    let mut model = model.clone();
    if let Some(table) = &mut model.table {
        for chain in stale {
            let removed = table.chains.remove(chain);
            assert!(
                removed.as_ref().is_some_and(|(_, rules)| rules.is_empty()),
                "stale chain {chain} is not an empty chain: {removed:?}"
            );
        }
    }
    model
}

// ---------------------------------------------------------------------------------------------
// Incremental transactions

#[test]
fn nothing_changed_gives_an_empty_transaction() {
    let state = two_services();
    let rendered = Rendered::new(&state, &options_v4());

    let (_, transaction) = step(&rendered, &state, &Leftovers::default());

    assert!(transaction.is_empty(), "{}", transaction.script);
    assert_eq!(transaction.counts, Counts::default());
    assert!(transaction.stale_chains.is_empty());
}

#[test]
fn an_added_endpoint_rewrites_only_its_services_chain_and_adds_its_hairpin() {
    // Two endpoints where there was one: the chain picks from two fresh numbers of its map.
    let before = Rendered::new(&two_services(), &options_v4());
    let mut after = two_services();
    after.insert(web(
        1,
        vec![ready("10.180.2.1", 8080), local("10.180.0.1", 8080)],
    ));

    let (_, transaction) = step(&before, &after, &Leftovers::default());

    assert_rules_eq(
        &transaction.script,
        r#"add chain ip kube-proxy service-DGQCUPKV-ns/web1/tcp/http
flush chain ip kube-proxy service-DGQCUPKV-ns/web1/tcp/http
add rule ip kube-proxy service-DGQCUPKV-ns/web1/tcp/http meta l4proto tcp dnat ip addr . port to numgen random mod 2 offset 1 map @endpoints-tcp-DG
delete element ip kube-proxy endpoints-tcp-DG { 0 }
add element ip kube-proxy hairpin-connections { 10.180.0.1 . 10.180.0.1 . tcp . 8080 }
add element ip kube-proxy endpoints-tcp-DG { 1 : 10.180.2.1 . 8080 , 2 : 10.180.0.1 . 8080 }
"#,
    );
    assert_eq!(
        transaction.counts,
        Counts {
            chains_written: 1,
            rules_written: 1,
            elements_added: 3,
            elements_deleted: 1,
            ..Counts::default()
        }
    );
    assert!(!transaction.full);
}

#[test]
fn an_endpoint_replaced_by_another_changes_only_its_number_in_the_map() {
    let before = Rendered::new(&two_services(), &options_v4());
    let mut after = two_services();
    after.insert(web(1, vec![ready("10.180.2.9", 8080)]));

    let (_, transaction) = step(&before, &after, &Leftovers::default());

    assert_rules_eq(
        &transaction.script,
        r#"delete element ip kube-proxy endpoints-tcp-DG { 0 }
add element ip kube-proxy endpoints-tcp-DG { 0 : 10.180.2.9 . 8080 }
"#,
    );
    assert_eq!(transaction.counts.chains_written, 0);
}

#[test]
fn a_removed_service_loses_its_elements_now_and_its_chains_one_transaction_later() {
    let before = Rendered::new(&two_services(), &options_v4());
    let mut model = from_scratch(&two_services(), &options_v4());
    let mut after = two_services();
    after.services.remove(&ServiceKey::new("ns", "web1"));

    let (next, removal) = step(&before, &after, &Leftovers::default());

    assert_rules_eq(
        &removal.script,
        r#"flush chain ip kube-proxy service-DGQCUPKV-ns/web1/tcp/http
flush chain ip kube-proxy external-DGQCUPKV-ns/web1/tcp/http
delete element ip kube-proxy cluster-ips { 172.30.0.1 }
delete element ip kube-proxy service-ips { 172.30.0.1 . tcp . 80 }
delete element ip kube-proxy service-nodeports { tcp . 30001 }
delete map ip kube-proxy endpoints-tcp-DG
"#,
    );
    let stale: BTreeSet<String> = [
        "external-DGQCUPKV-ns/web1/tcp/http",
        "service-DGQCUPKV-ns/web1/tcp/http",
    ]
    .map(str::to_owned)
    .into();
    assert_eq!(removal.stale_chains, stale);
    model.apply(&removal.script).unwrap();
    assert_eq!(without(&model, &stale), from_scratch(&after, &options_v4()));

    // Deleting them in the same transaction is what kernels before 6.2 refuse.
    let mut eager = from_scratch(&two_services(), &options_v4());
    let refused = eager.apply(&format!(
        "{}add chain ip kube-proxy service-DGQCUPKV-ns/web1/tcp/http\ndelete chain ip kube-proxy service-DGQCUPKV-ns/web1/tcp/http\n",
        removal.script
    ));
    assert!(refused.is_err(), "the model lets a referenced chain go");

    let leftovers = Leftovers {
        chains: removal.stale_chains.clone(),
        ..Leftovers::default()
    };
    let (_, cleanup) = step(&next, &after, &leftovers);

    assert_rules_eq(
        &cleanup.script,
        r#"add chain ip kube-proxy external-DGQCUPKV-ns/web1/tcp/http
delete chain ip kube-proxy external-DGQCUPKV-ns/web1/tcp/http
add chain ip kube-proxy service-DGQCUPKV-ns/web1/tcp/http
delete chain ip kube-proxy service-DGQCUPKV-ns/web1/tcp/http
"#,
    );
    assert_eq!(cleanup.counts.chains_deleted, 2);
    assert!(cleanup.stale_chains.is_empty());
    model.apply(&cleanup.script).unwrap();
    assert_eq!(model, from_scratch(&after, &options_v4()));
}

#[test]
fn a_service_losing_its_last_endpoint_trades_its_dispatch_for_a_reject() {
    let before = Rendered::new(&two_services(), &options_v4());
    let mut after = two_services();
    after.insert(web(2, vec![]));

    let (_, transaction) = step(&before, &after, &Leftovers::default());

    assert_rules_eq(
        &transaction.script,
        r#"flush chain ip kube-proxy service-7KYF3G35-ns/web2/tcp/http
flush chain ip kube-proxy external-7KYF3G35-ns/web2/tcp/http
delete element ip kube-proxy hairpin-connections { 10.180.0.2 . 10.180.0.2 . tcp . 8080 }
delete element ip kube-proxy service-ips { 172.30.0.2 . tcp . 80 }
delete element ip kube-proxy service-nodeports { tcp . 30002 }
add element ip kube-proxy no-endpoint-services { 172.30.0.2 . tcp . 80 comment "ns/web2:http" : goto reject-chain }
add element ip kube-proxy no-endpoint-nodeports { tcp . 30002 comment "ns/web2:http" : goto reject-chain }
delete map ip kube-proxy endpoints-tcp-7K
"#,
    );
}

#[test]
fn a_changed_affinity_timeout_creates_the_sets_again_once_their_users_are_flushed() {
    let endpoints = vec![local("10.180.0.5", 8080)];
    let before = Rendered::new(
        &state(vec![sticky(5, 10800, endpoints.clone())]),
        &options_v4(),
    );
    let mut model = from_scratch(
        &state(vec![sticky(5, 10800, endpoints.clone())]),
        &options_v4(),
    );
    let after = state(vec![sticky(5, 60, endpoints)]);

    let (_, transaction) = step(&before, &after, &Leftovers::default());

    assert_rules_eq(
        &transaction.script,
        r#"add chain ip kube-proxy service-FMKM3JOL-ns/sticky5/tcp/http
flush chain ip kube-proxy service-FMKM3JOL-ns/sticky5/tcp/http
add chain ip kube-proxy endpoint-3KMJ5LX2-ns/sticky5/tcp/http__10.180.0.5/8080
flush chain ip kube-proxy endpoint-3KMJ5LX2-ns/sticky5/tcp/http__10.180.0.5/8080
delete set ip kube-proxy affinity-3KMJ5LX2-ns/sticky5/tcp/http__10.180.0.5/8080
add set ip kube-proxy affinity-3KMJ5LX2-ns/sticky5/tcp/http__10.180.0.5/8080 { type ipv4_addr ; flags dynamic,timeout ; timeout 60s ; }
add rule ip kube-proxy service-FMKM3JOL-ns/sticky5/tcp/http ip saddr @affinity-3KMJ5LX2-ns/sticky5/tcp/http__10.180.0.5/8080 goto endpoint-3KMJ5LX2-ns/sticky5/tcp/http__10.180.0.5/8080
add rule ip kube-proxy service-FMKM3JOL-ns/sticky5/tcp/http numgen random mod 1 vmap { 0 : goto endpoint-3KMJ5LX2-ns/sticky5/tcp/http__10.180.0.5/8080 }
add rule ip kube-proxy endpoint-3KMJ5LX2-ns/sticky5/tcp/http__10.180.0.5/8080 update @affinity-3KMJ5LX2-ns/sticky5/tcp/http__10.180.0.5/8080 { ip saddr }
add rule ip kube-proxy endpoint-3KMJ5LX2-ns/sticky5/tcp/http__10.180.0.5/8080 meta l4proto tcp dnat to 10.180.0.5:8080
"#,
    );
    model.apply(&transaction.script).unwrap();
}

#[test]
fn a_removed_sticky_endpoint_loses_its_set_after_the_chains_using_it_are_flushed() {
    let both = vec![local("10.180.0.5", 8080), ready("10.180.2.5", 8080)];
    let before_state = state(vec![sticky(5, 10800, both)]);
    let before = Rendered::new(&before_state, &options_v4());
    let mut model = from_scratch(&before_state, &options_v4());
    let after = state(vec![sticky(5, 10800, vec![ready("10.180.2.5", 8080)])]);

    let (_, transaction) = step(&before, &after, &Leftovers::default());

    assert_rules_eq(
        &transaction.script,
        r#"add chain ip kube-proxy service-FMKM3JOL-ns/sticky5/tcp/http
flush chain ip kube-proxy service-FMKM3JOL-ns/sticky5/tcp/http
flush chain ip kube-proxy endpoint-3KMJ5LX2-ns/sticky5/tcp/http__10.180.0.5/8080
delete set ip kube-proxy affinity-3KMJ5LX2-ns/sticky5/tcp/http__10.180.0.5/8080
add rule ip kube-proxy service-FMKM3JOL-ns/sticky5/tcp/http ip saddr @affinity-I3QLOSPO-ns/sticky5/tcp/http__10.180.2.5/8080 goto endpoint-I3QLOSPO-ns/sticky5/tcp/http__10.180.2.5/8080
add rule ip kube-proxy service-FMKM3JOL-ns/sticky5/tcp/http numgen random mod 1 vmap { 0 : goto endpoint-I3QLOSPO-ns/sticky5/tcp/http__10.180.2.5/8080 }
delete element ip kube-proxy hairpin-connections { 10.180.0.5 . 10.180.0.5 . tcp . 8080 }
"#,
    );
    assert_eq!(transaction.counts.sets_deleted, 1);
    model.apply(&transaction.script).unwrap();
    assert_eq!(
        without(&model, &transaction.stale_chains),
        from_scratch(&after, &options_v4())
    );
}

#[test]
fn when_the_first_holder_of_an_element_goes_the_next_ones_copy_takes_its_place() {
    // Both claim 192.168.99.11:80 and share the local endpoint 10.180.0.1:8080.
    let claim = |name: &str, cluster_ip: &str| {
        let mut service = service(
            "ns",
            name,
            &[cluster_ip],
            vec![tcp("http", 80, None, vec![local("10.180.0.1", 8080)])],
        );
        service.external_ips = vec![ip("192.168.99.11")];
        service
    };
    let both = state(vec![claim("a", "172.30.0.1"), claim("b", "172.30.0.2")]);
    let before = Rendered::new(&both, &options_v4());
    let mut model = from_scratch(&both, &options_v4());
    let mut after = both.clone();
    after.services.remove(&ServiceKey::new("ns", "a"));

    let (_, transaction) = step(&before, &after, &Leftovers::default());

    let elements: Vec<&str> = transaction
        .script
        .lines()
        .filter(|line| line.contains(" element "))
        .collect();
    assert_eq!(
        elements,
        [
            "delete element ip kube-proxy cluster-ips { 172.30.0.1 }",
            "delete element ip kube-proxy service-ips { 172.30.0.1 . tcp . 80 , 192.168.99.11 . tcp . 80 }",
            "add element ip kube-proxy service-ips { 192.168.99.11 . tcp . 80 : goto external-F2TLVHMA-ns/b/tcp/http }",
        ]
    );
    model.apply(&transaction.script).unwrap();
    assert_eq!(
        without(&model, &transaction.stale_chains),
        from_scratch(&after, &options_v4())
    );
}

// ---------------------------------------------------------------------------------------------
// Full transactions

#[test]
fn changed_options_make_the_transaction_full_and_the_previous_chains_stale() {
    let before = Rendered::new(&two_services(), &options_v4());
    let mut model = from_scratch(&two_services(), &options_v4());
    let after = state(vec![web(1, vec![ready("10.180.2.1", 8080)])]);
    let options = Options::new(
        IpFamily::V4,
        &NodeOptions::default().with_masquerade_all(true),
    );
    let next = before.update(&after, &options);

    let transaction = transaction(Some(&before), &next, &Leftovers::default());

    assert!(transaction.full);
    assert!(transaction.script.starts_with(
        "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\nflush table ip kube-proxy\n"
    ));
    let stale: BTreeSet<String> = [
        "external-7KYF3G35-ns/web2/tcp/http",
        "service-7KYF3G35-ns/web2/tcp/http",
    ]
    .map(str::to_owned)
    .into();
    assert_eq!(transaction.stale_chains, stale);
    model.apply(&transaction.script).unwrap();
    assert_eq!(without(&model, &stale), from_scratch(&after, &options));
}

#[test]
fn a_full_transaction_deletes_leftover_affinity_sets_and_reports_leftover_chains_stale() {
    let state = two_services();
    let rendered = Rendered::new(&state, &options_v4());
    let leftovers = Leftovers {
        chains: [
            "service-DGQCUPKV-ns/web1/tcp/http",
            "services",
            "service-OLD00000-ns/gone/tcp/http",
            "filter-output-post-dnat",
        ]
        .map(str::to_owned)
        .into(),
        sets: [
            "affinity-OLD00000-ns/gone/tcp/http__10.180.0.9/80",
            "cluster-ips",
        ]
        .map(str::to_owned)
        .into(),
    };

    let transaction = transaction(None, &rendered, &leftovers);

    let stale: BTreeSet<String> = [
        "filter-output-post-dnat",
        "service-OLD00000-ns/gone/tcp/http",
    ]
    .map(str::to_owned)
    .into();
    assert_eq!(transaction.stale_chains, stale);
    assert!(transaction.script.contains(
        "add set ip kube-proxy affinity-OLD00000-ns/gone/tcp/http__10.180.0.9/80 { type ipv4_addr ; flags dynamic,timeout ; }\ndelete set ip kube-proxy affinity-OLD00000-ns/gone/tcp/http__10.180.0.9/80\n"
    ));
    assert!(
        !transaction
            .script
            .contains("delete set ip kube-proxy cluster-ips")
    );
    assert_eq!(transaction.counts.sets_deleted, 1);
}

#[test]
fn leftovers_are_read_from_nft_listings_of_our_table_only() {
    // `nft list chains ip` and `nft --terse list sets ip` as nft 1.0.6 prints them.
    let listing = "table ip kube-proxy {
\tchain services {
\t}
\tchain service-X-ns/a/tcp/p {
\t}
\tchain nat-prerouting {
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t}
}
table ip other {
\tchain c {
\t}
}
table ip kube-proxy {
\tset cluster-ips {
\t\ttype ipv4_addr
\t}
\tset affinity-X-ns/a/tcp/p__10.180.0.1/80 {
\t\ttype ipv4_addr
\t\tflags dynamic,timeout
\t\ttimeout 1m
\t}
\tmap service-ips {
\t\ttype ipv4_addr . inet_proto . inet_service : verdict
\t}
}
";

    let leftovers = Leftovers::from_listing(IpFamily::V4, listing);

    assert_eq!(
        leftovers.chains,
        ["nat-prerouting", "service-X-ns/a/tcp/p", "services"]
            .map(str::to_owned)
            .into()
    );
    assert_eq!(
        leftovers.sets,
        [
            "affinity-X-ns/a/tcp/p__10.180.0.1/80",
            "cluster-ips",
            "service-ips"
        ]
        .map(str::to_owned)
        .into()
    );
    assert!(Leftovers::from_listing(IpFamily::V6, listing).is_empty());
}

#[test]
fn deleting_the_table_tolerates_its_absence() {
    assert_eq!(
        delete_table(IpFamily::V6),
        "add table ip6 kube-proxy { comment \"rules for kube-proxy\" ; }\ndelete table ip6 kube-proxy\n"
    );
}

// ---------------------------------------------------------------------------------------------
// Random sequences

/// A random change to one of a dozen Services (of `family`): endpoints (some on this node, some
/// terminating), policies, affinity and its timeout, external and load-balancer IPs, source
/// ranges, or its removal.
fn change(steps: &mut Steps, state: &mut ProxyState, family: IpFamily) {
    let index = steps.byte_below(12) + 1;
    let address = |v4: String, v6: String| match family {
        IpFamily::V4 => v4,
        IpFamily::V6 => v6,
    };
    let endpoints = (0..steps.below(4))
        .map(|i| {
            let host = 1 + i * 10 + steps.below(3);
            let mut endpoint = ready(
                &address(format!("10.180.0.{host}"), format!("fd00:10:180::{host}")),
                8080,
            );
            endpoint.is_local = steps.below(2) == 0;
            if steps.below(5) == 0 {
                endpoint.ready = false;
                endpoint.terminating = true;
            }
            endpoint
        })
        .collect();
    let cluster_ip = address(format!("172.30.0.{index}"), format!("fd00:172:30::{index}"));
    let mut service = service(
        "ns",
        &format!("svc{index}"),
        &[&cluster_ip],
        vec![tcp("http", 80, Some(30_000 + u16::from(index)), endpoints)],
    );
    match steps.below(8) {
        0 => {
            state.services.remove(&service.key);
            return;
        }
        1 => service.external_traffic_policy = TrafficPolicy::Local,
        2 => service.internal_traffic_policy = TrafficPolicy::Local,
        3 => service.session_affinity = Some(Duration::from_secs(60 + 60 * steps.below(2))),
        4 => {
            service.load_balancer_ips = vec![ip(&address(
                format!("1.2.3.{}", steps.below(3)),
                format!("2001:db8:1b::{}", steps.below(3)),
            ))];
            service.load_balancer_source_ranges = vec![
                address("203.0.113.0/25".into(), "2001:db8:203::/48".into())
                    .parse()
                    .unwrap(),
            ];
        }
        5 => {
            // Several Services may claim one external IP.
            service.external_ips = vec![ip(&address(
                format!("192.168.99.{}", steps.below(2)),
                format!("2001:db8:99::{}", steps.below(2)),
            ))];
        }
        _ => {}
    }
    state.insert(service);
}

#[test]
fn random_incremental_transactions_leave_the_model_kernel_as_a_full_one_would() {
    for (family, options) in [(IpFamily::V4, options_v4()), (IpFamily::V6, options_v6())] {
        let mut steps = Steps(11);
        let mut state = ProxyState::default();
        let mut rendered = Rendered::new(&state, &options).with_number_limit(SMALL_NUMBER_LIMIT);
        let mut model = from_scratch(&state, &options);
        let mut leftovers = Leftovers::default();
        for step_number in 0..400 {
            for _ in 0..=steps.below(3) {
                change(&mut steps, &mut state, family);
            }
            let (next, transaction) = step(&rendered, &state, &leftovers);
            assert_numbers_apart(&next);
            model.apply(&transaction.script).unwrap_or_else(|why| {
                panic!(
                    "{family:?} step {step_number}: {why}\n{}",
                    transaction.script
                )
            });
            assert_eq!(
                resolved(&without(&model, &transaction.stale_chains)),
                resolved(&from_scratch(&state, &options)),
                "{family:?} step {step_number}:\n{}",
                transaction.script
            );
            assert_eq!(
                next.rule_count(),
                Rendered::new(&state, &options).rule_count()
            );
            leftovers = Leftovers {
                chains: transaction.stale_chains,
                ..Leftovers::default()
            };
            rendered = next;
        }
    }
}

#[test]
fn a_full_transaction_after_a_failure_takes_over_whatever_the_kernel_holds() {
    let mut steps = Steps(5);
    let options = options_v4();
    let mut state = ProxyState::default();
    let mut rendered = Rendered::new(&state, &options).with_number_limit(SMALL_NUMBER_LIMIT);
    let mut model = from_scratch(&state, &options);
    let mut leftovers = Leftovers::default();
    for step_number in 0..100 {
        for _ in 0..=steps.below(3) {
            change(&mut steps, &mut state, IpFamily::V4);
        }
        let next = rendered.update(&state, &options);
        // Every fifth sync follows a failure: the kernel holds `rendered`, unknown to the builder.
        let transaction = if step_number % 5 == 4 {
            let mut known = leftovers.clone();
            known.extend(Leftovers::of(&rendered));
            transaction(None, &next, &known)
        } else {
            transaction(Some(&rendered), &next, &leftovers)
        };
        model
            .apply(&transaction.script)
            .unwrap_or_else(|why| panic!("step {step_number}: {why}\n{}", transaction.script));
        assert_eq!(
            resolved(&without(&model, &transaction.stale_chains)),
            resolved(&from_scratch(&state, &options)),
            "step {step_number}"
        );
        leftovers = Leftovers {
            chains: transaction.stale_chains,
            ..Leftovers::default()
        };
        rendered = next;
    }
}

// ---------------------------------------------------------------------------------------------
// The real nft

/// Runs `script` in `netns`, failing with nft's message and the script.
#[track_caller]
fn apply(netns: &Netns, script: &str) {
    if let Err(why) = netns.nft(script) {
        panic!("nft refused the script: {why}\n{script}");
    }
}

/// Checks that `netns` holds what a full transaction of `state` gives a fresh table in
/// `scratch`, but for the `stale` chains, which must be there empty.
#[track_caller]
fn assert_kernel_matches(
    netns: &Netns,
    scratch: &Netns,
    state: &ProxyState,
    options: &Options,
    stale: &BTreeSet<String>,
) {
    let family = crate::nftables::script::family_keyword(options.family());
    apply(scratch, &delete_table(options.family()));
    apply(
        scratch,
        &transaction(None, &Rendered::new(state, options), &Leftovers::default()).script,
    );
    let listing = netns.list(family);
    let kept = resolve_listing(normalize(&listing, stale));
    let everything = normalize(&listing, &BTreeSet::new());
    for chain in stale {
        let rules: Option<Vec<&String>> = everything
            .iter()
            .find(|(header, _)| header.starts_with(&format!("chain {chain} ")))
            .map(|(_, body)| {
                body.iter()
                    .filter(|line| !line.starts_with("type "))
                    .collect()
            });
        assert_eq!(rules, Some(Vec::new()), "stale chain {chain} is not empty");
    }
    let from_scratch = normalize(&scratch.list(family), &BTreeSet::new());
    assert_eq!(kept, resolve_listing(from_scratch));
}

/// A state with one of each kind of Service, in `family`.
fn varied(family: IpFamily) -> ProxyState {
    let mut state = ProxyState::default();
    let mut steps = Steps(3);
    for _ in 0..40 {
        change(&mut steps, &mut state, family);
    }
    state
}

#[test]
fn the_real_nft_applies_full_then_incremental_transactions_in_both_families() {
    let (Some(netns), Some(scratch)) = (Netns::new(), Netns::new()) else {
        return;
    };
    for (family, options) in [(IpFamily::V4, options_v4()), (IpFamily::V6, options_v6())] {
        let mut state = varied(family);
        let mut rendered = Rendered::new(&state, &options).with_number_limit(SMALL_NUMBER_LIMIT);
        apply(
            &netns,
            &transaction(None, &rendered, &Leftovers::default()).script,
        );
        assert_kernel_matches(&netns, &scratch, &state, &options, &BTreeSet::new());

        let mut steps = Steps(17);
        let mut leftovers = Leftovers::default();
        for _ in 0..25 {
            for _ in 0..=steps.below(3) {
                change(&mut steps, &mut state, family);
            }
            let (next, transaction) = step(&rendered, &state, &leftovers);
            apply(&netns, &transaction.script);
            assert_kernel_matches(
                &netns,
                &scratch,
                &state,
                &options,
                &transaction.stale_chains,
            );
            leftovers = Leftovers {
                chains: transaction.stale_chains,
                ..Leftovers::default()
            };
            rendered = next;
        }
    }
}

#[test]
fn the_real_nft_takes_over_an_older_table_with_a_full_transaction() {
    let (Some(netns), Some(scratch)) = (Netns::new(), Netns::new()) else {
        return;
    };
    // An older layout: another priority on a base chain, a base chain no longer used, a Service
    // chain still referenced from a map, a sticky endpoint's set and chain. (Sets and maps keep
    // the comment they were created with, so the old map has upstream's.)
    apply(
        &netns,
        r#"add table ip kube-proxy
add chain ip kube-proxy filter-input { type filter hook input priority -110 ; }
add chain ip kube-proxy filter-output-post-dnat { type filter hook output priority -90 ; }
add chain ip kube-proxy services
add chain ip kube-proxy service-OLD00000-ns/gone/tcp/http
add chain ip kube-proxy endpoint-OLD00000-ns/gone/tcp/http__10.180.0.9/80
add set ip kube-proxy affinity-OLD00000-ns/gone/tcp/http__10.180.0.9/80 { type ipv4_addr ; flags dynamic,timeout ; timeout 30s ; }
add rule ip kube-proxy service-OLD00000-ns/gone/tcp/http goto endpoint-OLD00000-ns/gone/tcp/http__10.180.0.9/80
add rule ip kube-proxy endpoint-OLD00000-ns/gone/tcp/http__10.180.0.9/80 update @affinity-OLD00000-ns/gone/tcp/http__10.180.0.9/80 { ip saddr }
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add element ip kube-proxy service-ips { 172.30.0.99 . tcp . 80 : goto service-OLD00000-ns/gone/tcp/http }
add rule ip kube-proxy filter-output-post-dnat jump services
"#,
    );
    let options = options_v4();
    let state = varied(IpFamily::V4);
    let rendered = Rendered::new(&state, &options);
    let leftovers = Leftovers::from_listing(IpFamily::V4, &netns.list("ip"));
    assert_eq!(leftovers.chains.len(), 5, "{leftovers:?}");
    assert_eq!(leftovers.sets.len(), 2, "{leftovers:?}");

    let full = transaction(None, &rendered, &leftovers);
    apply(&netns, &full.script);
    assert_kernel_matches(&netns, &scratch, &state, &options, &full.stale_chains);
    assert_eq!(full.stale_chains.len(), 3, "{:?}", full.stale_chains);

    let leftovers = Leftovers {
        chains: full.stale_chains,
        ..Leftovers::default()
    };
    let (_, cleanup) = step(&rendered, &state, &leftovers);
    apply(&netns, &cleanup.script);
    assert_kernel_matches(&netns, &scratch, &state, &options, &BTreeSet::new());
}

#[test]
fn the_real_nft_deletes_the_table_whether_or_not_it_exists() {
    let Some(netns) = Netns::new() else {
        return;
    };
    apply(&netns, &delete_table(IpFamily::V4));
    apply(
        &netns,
        &transaction(
            None,
            &Rendered::new(&two_services(), &options_v4()),
            &Leftovers::default(),
        )
        .script,
    );
    apply(&netns, &delete_table(IpFamily::V4));
    assert!(netns.nft("list table ip kube-proxy\n").is_err());
}
