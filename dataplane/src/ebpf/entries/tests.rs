//! Tests of the entries a state asks for and of the order they are written in.
//!
//! Test addresses: the unit tests' plan ([`crate::testing::fixtures`]).
#![allow(clippy::unwrap_used)]

use super::*;
use crate::testing::fixtures::{local, ready, service, state};
use crate::testing::nftables::{draining, tcp};
use crate::{Protocol, Service, ServicePort, TrafficPolicy};

fn key(address: &str, port: u16, protocol: Protocol, slot: u32) -> SlotKey {
    SlotKey {
        address: address.parse().unwrap(),
        port,
        protocol,
        slot,
    }
}

fn header(count: u32) -> SlotValue {
    SlotValue::Header { count, drop: false }
}

fn endpoint(address: &str) -> SlotValue {
    SlotValue::Endpoint(address.parse().unwrap())
}

fn web(endpoints: Vec<crate::Endpoint>) -> Service {
    service(
        "ns",
        "web",
        &["172.30.0.41", "fd00:172:30::41"],
        vec![tcp("p80", 80, None, endpoints)],
    )
}

#[test]
fn a_port_gets_a_header_with_its_count_then_one_slot_per_endpoint() {
    let entries = desired(&state(vec![web(vec![
        ready("10.180.2.1", 8080),
        local("10.180.0.1", 8080),
        ready("fd00:10:180:2::1", 8080),
    ])]));
    let http = key("172.30.0.41", 80, Protocol::Tcp, 0);
    assert_eq!(
        entries,
        Entries::from([
            (http, header(2)),
            (http.with_slot(1), endpoint("10.180.2.1:8080")),
            (http.with_slot(2), endpoint("10.180.0.1:8080")),
        ]),
        "IPv4 only: the IPv6 cluster IP and endpoint have no entry"
    );
}

#[test]
fn each_protocol_of_a_port_number_is_its_own_port() {
    let dns = service(
        "kube-system",
        "dns",
        &["172.30.0.10"],
        vec![
            ServicePort::new(
                "dns",
                Protocol::Udp,
                53,
                None,
                vec![ready("10.180.2.1", 53)],
            ),
            ServicePort::new(
                "dns-tcp",
                Protocol::Tcp,
                53,
                None,
                vec![ready("10.180.2.2", 53)],
            ),
        ],
    );
    let entries = desired(&state(vec![dns]));
    let udp = key("172.30.0.10", 53, Protocol::Udp, 1);
    let tcp = key("172.30.0.10", 53, Protocol::Tcp, 1);
    assert_eq!(entries.get(&udp), Some(&endpoint("10.180.2.1:53")));
    assert_eq!(entries.get(&tcp), Some(&endpoint("10.180.2.2:53")));
}

#[test]
fn a_port_without_endpoints_refuses_and_one_whose_local_policy_finds_none_drops() {
    let refused = desired(&state(vec![web(Vec::new())]));
    let http = key("172.30.0.41", 80, Protocol::Tcp, 0);
    assert_eq!(refused, Entries::from([(http, header(0))]));

    let mut local_only = web(vec![ready("10.180.2.1", 8080)]);
    local_only.internal_traffic_policy = TrafficPolicy::Local;
    let dropped = desired(&state(vec![local_only]));
    assert_eq!(
        dropped,
        Entries::from([(
            http,
            SlotValue::Header {
                count: 0,
                drop: true
            }
        )])
    );
}

#[test]
fn local_internal_policy_uses_only_this_nodes_endpoints() {
    let mut local_only = web(vec![ready("10.180.2.1", 8080), local("10.180.0.1", 8080)]);
    local_only.internal_traffic_policy = TrafficPolicy::Local;
    let entries = desired(&state(vec![local_only]));
    let http = key("172.30.0.41", 80, Protocol::Tcp, 0);
    assert_eq!(entries.get(&http), Some(&header(1)));
    assert_eq!(
        entries.get(&http.with_slot(1)),
        Some(&endpoint("10.180.0.1:8080"))
    );
}

#[test]
fn terminating_endpoints_serve_only_when_none_is_ready() {
    let http = key("172.30.0.41", 80, Protocol::Tcp, 0);
    let mixed = desired(&state(vec![web(vec![
        draining("10.180.2.1", 8080, false),
        ready("10.180.2.2", 8080),
    ])]));
    assert_eq!(mixed.get(&http), Some(&header(1)));
    assert_eq!(
        mixed.get(&http.with_slot(1)),
        Some(&endpoint("10.180.2.2:8080"))
    );

    let draining_only = desired(&state(vec![web(vec![draining("10.180.2.1", 8080, false)])]));
    assert_eq!(
        draining_only.get(&http.with_slot(1)),
        Some(&endpoint("10.180.2.1:8080"))
    );
}

/// Applies `writes` to `entries`, checking after each that every header's slots exist.
fn replay(mut entries: Entries, writes: &[Write]) -> Entries {
    for write in writes {
        match *write {
            Write::Put(key, value) => entries.insert(key, value),
            Write::Delete(key) => entries.remove(&key),
        };
        for (key, value) in &entries {
            if let SlotValue::Header { count, .. } = value {
                for slot in 1..=*count {
                    assert!(
                        entries.contains_key(&key.with_slot(slot)),
                        "after {write:?}, {key:?} counts slot {slot}, which is missing"
                    );
                }
            }
        }
    }
    entries
}

#[test]
fn every_write_leaves_each_header_with_all_its_slots() {
    let two = web(vec![ready("10.180.2.1", 8080), ready("10.180.2.2", 8080)]);
    let three = web(vec![
        ready("10.180.2.3", 8080),
        ready("10.180.2.1", 8080),
        ready("10.180.2.4", 8080),
    ]);
    let other = service(
        "ns",
        "other",
        &["172.30.0.42"],
        vec![tcp("p", 81, None, vec![ready("10.180.2.9", 81)])],
    );
    let states = [
        state(vec![]),
        state(vec![two.clone()]),
        state(vec![three.clone(), other.clone()]),
        state(vec![two, other.clone()]),
        state(vec![other]),
        state(vec![three]),
        state(vec![]),
    ];
    let mut current = Entries::new();
    for next in &states {
        let target = desired(next);
        let writes = writes(&current, &target);
        current = replay(current, &writes);
        assert_eq!(current, target);
    }
}

#[test]
fn nothing_is_written_when_nothing_changed() {
    let entries = desired(&state(vec![web(vec![ready("10.180.2.1", 8080)])]));
    assert_eq!(writes(&entries, &entries), Vec::new());
}
