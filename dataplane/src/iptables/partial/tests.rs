#![allow(clippy::unwrap_used)]

use super::*;
use crate::IpFamily;
use crate::NodeOptions;
use crate::testing::steps::Steps;
use crate::{Endpoint, Protocol, ServicePort, TrafficPolicy};
use std::collections::BTreeMap;

fn endpoint(ip: &str, is_local: bool) -> Endpoint {
    Endpoint {
        is_local,
        ..Endpoint::ready(std::net::SocketAddr::new(ip.parse().unwrap(), 8080))
    }
}

/// Service `ns/name` on `172.30.0.<index>:80` (node port 30000 + index), over `endpoints`.
fn web(index: u8, endpoints: Vec<Endpoint>) -> Service {
    let port = ServicePort::new(
        "http",
        Protocol::Tcp,
        80,
        Some(30_000 + u16::from(index)),
        endpoints,
    );
    Service::new(
        ServiceKey::new("ns", format!("web{index}")),
        vec![format!("172.30.0.{index}").parse().unwrap()],
        vec![port],
    )
}

fn options() -> FamilyOptions {
    FamilyOptions::new(
        IpFamily::V4,
        &NodeOptions::default().with_cluster_cidrs(["10.0.0.0/8".parse().unwrap()]),
    )
}

/// The nat and filter chains `iptables-restore --noflush` leaves behind, as a map of chain to
/// rules: a declaration creates or flushes its chain, `-A` appends, `-X` deletes; chains a
/// payload does not name keep their rules.
#[derive(Debug, Default, PartialEq, Eq)]
struct Kernel(BTreeMap<(String, String), Vec<String>>);

impl Kernel {
    fn restore(&mut self, payload: &str) {
        let mut table = String::new();
        for line in payload.lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = name.to_owned();
            } else if let Some(declaration) = line.strip_prefix(':') {
                let chain = declaration.split(' ').next().unwrap().to_owned();
                self.0.insert((table.clone(), chain), Vec::new());
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let chain = rule.split(' ').next().unwrap().to_owned();
                let rules = self.0.get_mut(&(table.clone(), chain));
                rules
                    .expect("rule for an undeclared chain")
                    .push(line.to_owned());
            } else if let Some(chain) = line.strip_prefix("-X ") {
                assert!(self.0.remove(&(table.clone(), chain.to_owned())).is_some());
            }
        }
    }

    fn rule_count(&self, table: &str) -> u32 {
        let rules = self.0.iter().filter(|((t, _), _)| t == table);
        u32::try_from(rules.map(|(_, rules)| rules.len()).sum::<usize>()).unwrap()
    }
}

/// The first sync of `state`, full, onto empty tables: what was rendered and what the kernel
/// holds after it.
fn first_sync(state: &ProxyState) -> (Rendered, Kernel) {
    let (rendered, _) = Rendered::default().update(state, &options());
    let mut kernel = Kernel::default();
    kernel.restore(
        &full(&rendered, &BTreeSet::new(), &options())
            .tables()
            .concat(),
    );
    (rendered, kernel)
}

/// The kernel after a full sync of `state` onto empty tables.
fn synced_from_scratch(state: &ProxyState) -> Kernel {
    first_sync(state).1
}

fn two_services() -> ProxyState {
    [
        web(1, vec![endpoint("10.180.0.1", true)]),
        web(2, vec![endpoint("10.180.0.2", false)]),
    ]
    .into_iter()
    .collect()
}

fn count(counts: &[(String, u32)], table: &str) -> u32 {
    counts
        .iter()
        .find(|(name, _)| name == table)
        .map_or(0, |(_, n)| *n)
}

#[test]
fn unchanged_services_are_neither_rendered_again_nor_written() {
    let state = two_services();
    let (before, _) = first_sync(&state);

    let (after, changed) = before.update(&state.clone(), &options());
    assert!(changed.is_empty());
    let same = |key: &ServiceKey| Arc::ptr_eq(&before.rules[key], &after.rules[key]);
    assert!(state.services.keys().all(same), "rendered again");

    let payload = partial(&before, &after, &changed, &options());
    assert!(
        !payload.tables().concat().contains(":KUBE-SVC-"),
        "{}",
        payload.tables().concat()
    );
    assert!(
        !payload.tables().concat().contains("-A KUBE-SEP-"),
        "{}",
        payload.tables().concat()
    );
    // The shared chains still point at the chains left in place.
    assert!(
        payload.tables().concat().contains("-A KUBE-SERVICES"),
        "{}",
        payload.tables().concat()
    );
    let everything = full(&after, &BTreeSet::new(), &options());
    assert_eq!(payload.rules_total, everything.rules_total);
    assert!(count(&payload.rules_written, "nat") < count(&everything.rules_written, "nat"));
}

#[test]
fn a_moved_endpoint_rewrites_only_its_services_changed_chains() {
    let state = two_services();
    let (before, mut kernel) = first_sync(&state);
    let mut moved = state.clone();
    moved.insert(web(2, vec![endpoint("10.180.0.3", false)]));

    let (after, changed) = before.update(&moved, &options());
    assert_eq!(changed, [ServiceKey::new("ns", "web2")]);
    let payload = partial(&before, &after, &changed, &options());

    let declared: Vec<&str> = payload
        .nat
        .lines()
        .filter(|line| line.starts_with(":KUBE-SVC-") || line.starts_with(":KUBE-SEP-"))
        .collect();
    // The spreading chain and the new endpoint's chain; the old endpoint's chain is declared
    // only to be deleted.
    assert_eq!(declared.len(), 3, "{}", payload.tables().concat());
    assert!(
        payload
            .tables()
            .concat()
            .contains("--to-destination 10.180.0.3:8080")
    );
    assert!(
        !payload.tables().concat().contains("10.180.0.1"),
        "{}",
        payload.tables().concat()
    );
    assert_eq!(
        payload.tables().concat().matches("\n-X KUBE-SEP-").count(),
        1
    );

    kernel.restore(&payload.tables().concat());
    assert_eq!(kernel, synced_from_scratch(&moved));
}

#[test]
fn a_removed_service_loses_its_chains_and_a_chain_that_empties_is_flushed() {
    let state = two_services();
    let (before, mut kernel) = first_sync(&state);
    let mut next = state.clone();
    next.services.remove(&ServiceKey::new("ns", "web1"));
    // Traffic from outside goes to local endpoints only, and there is none: KUBE-EXT stays,
    // without its jump on.
    let mut local_only = web(2, vec![endpoint("10.180.0.2", false)]);
    local_only.external_traffic_policy = TrafficPolicy::Local;
    next.insert(local_only);

    let (after, changed) = before.update(&next, &options());
    let payload = partial(&before, &after, &changed, &options());
    kernel.restore(&payload.tables().concat());

    assert_eq!(kernel, synced_from_scratch(&next));
    assert_eq!(
        count(&payload.rules_total, "nat"),
        kernel.rule_count("nat"),
        "{payload:?}"
    );
}

#[test]
fn partial_syncs_leave_the_kernel_as_a_full_sync_from_scratch_would() {
    let mut steps = Steps(7);
    let mut state = ProxyState::default();
    let (mut rendered, mut kernel) = first_sync(&state);
    for step in 0..300 {
        // Change one to three Services per sync: endpoints, policies, or the Service's presence.
        for _ in 0..=steps.below(3) {
            let index = u8::try_from(steps.below(12)).unwrap() + 1;
            let endpoints = (0..steps.below(4))
                .map(|i| {
                    let host = 1 + i * 10 + steps.below(3);
                    endpoint(&format!("10.180.0.{host}"), steps.below(2) == 0)
                })
                .collect();
            let mut service = web(index, endpoints);
            match steps.below(5) {
                0 => {
                    state.services.remove(&service.key);
                    continue;
                }
                1 => service.external_traffic_policy = TrafficPolicy::Local,
                2 => service.internal_traffic_policy = TrafficPolicy::Local,
                3 => service.session_affinity = Some(std::time::Duration::from_secs(60)),
                _ => {}
            }
            state.insert(service);
        }
        let (next, changed) = rendered.update(&state, &options());
        let payload = partial(&rendered, &next, &changed, &options());
        kernel.restore(&payload.tables().concat());
        let expected = synced_from_scratch(&state);
        assert_eq!(
            kernel,
            expected,
            "step {step}: {}",
            payload.tables().concat()
        );
        assert_eq!(
            count(&payload.rules_total, "nat"),
            expected.rule_count("nat")
        );
        rendered = next;
    }
}

#[test]
fn a_full_sync_deletes_owned_chains_no_service_writes_and_leaves_foreign_ones() {
    let state = two_services();
    let (rendered, _) = Rendered::default().update(&state, &options());
    let existing: BTreeSet<String> = ["KUBE-SVC-GONE1234", "MY-OWN-CHAIN"]
        .map(str::to_owned)
        .into();

    let payload = full(&rendered, &existing, &options());

    assert!(
        payload
            .tables()
            .concat()
            .contains(":KUBE-SVC-GONE1234 - [0:0]\n")
    );
    assert!(
        payload
            .tables()
            .concat()
            .contains("\n-X KUBE-SVC-GONE1234\n")
    );
    assert!(!payload.tables().concat().contains("MY-OWN-CHAIN"));
    assert_eq!(payload.rules_written, payload.rules_total);
}
