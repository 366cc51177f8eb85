//! Tests of the stale-flow diff and of reading `conntrack -D`'s answer.
//!
//! Test addresses: the unit tests' plan ([`crate::testing::fixtures`]).
#![allow(clippy::unwrap_used)]

use super::{Deletion, Destination, IpFamily, deleted_count, stale_flows};
use crate::testing::fixtures::{self, state};
use crate::{Endpoint, Protocol, ProxyState, Service, ServiceKey, ServicePort, TrafficPolicy};

fn dns(protocol: Protocol, node_port: Option<u16>, endpoints: Vec<Endpoint>) -> Service {
    Service::new(
        ServiceKey::new("kube-system", "dns"),
        vec!["172.30.0.10".parse().unwrap()],
        vec![ServicePort::new("dns", protocol, 53, node_port, endpoints)],
    )
}

/// A ready endpoint on port 5353.
fn ready(ip: &str) -> Endpoint {
    fixtures::ready(ip, 5353)
}

fn draining(ip: &str) -> Endpoint {
    Endpoint {
        ready: false,
        terminating: true,
        ..ready(ip)
    }
}

fn starting(ip: &str) -> Endpoint {
    Endpoint {
        ready: false,
        serving: false,
        ..ready(ip)
    }
}

/// The deletions as `conntrack` command lines, for readable comparisons.
fn commands(deletions: &[Deletion]) -> Vec<String> {
    deletions
        .iter()
        .map(|d| format!("conntrack {}", d.args().join(" ")))
        .collect()
}

fn v4(previous: &ProxyState, current: &ProxyState) -> Vec<String> {
    commands(&stale_flows(previous, current, IpFamily::V4))
}

#[test]
fn removed_udp_endpoint_loses_its_flows_to_the_cluster_ip_and_node_port() {
    let before = state(vec![dns(
        Protocol::Udp,
        Some(30053),
        vec![ready("10.180.0.1"), ready("10.180.2.1")],
    )]);
    let after = state(vec![dns(
        Protocol::Udp,
        Some(30053),
        vec![ready("10.180.2.1")],
    )]);

    assert_eq!(
        v4(&before, &after),
        [
            "conntrack -D -p udp --orig-dst 172.30.0.10 --dport 53 --reply-src 10.180.0.1",
            "conntrack -D -p udp --dport 30053 --reply-src 10.180.0.1",
        ]
    );
}

#[test]
fn removed_endpoint_loses_its_flows_to_external_and_load_balancer_ips() {
    let mut before = dns(
        Protocol::Udp,
        None,
        vec![ready("10.180.0.1"), ready("10.180.2.1")],
    );
    before.external_ips = vec!["192.168.99.1".parse().unwrap()];
    before.load_balancer_ips = vec!["1.2.3.4".parse().unwrap()];
    let mut after = before.clone();
    after.ports[0].endpoints.remove(0);

    assert_eq!(
        v4(&state(vec![before]), &state(vec![after])),
        [
            "conntrack -D -p udp --orig-dst 1.2.3.4 --dport 53 --reply-src 10.180.0.1",
            "conntrack -D -p udp --orig-dst 172.30.0.10 --dport 53 --reply-src 10.180.0.1",
            "conntrack -D -p udp --orig-dst 192.168.99.1 --dport 53 --reply-src 10.180.0.1",
        ]
    );
}

#[test]
fn endpoint_that_topology_hints_steer_away_from_keeps_its_flows() {
    // It still serves the nodes of its own zone; only new connections from here go elsewhere.
    let before = dns(
        Protocol::Udp,
        Some(30053),
        vec![ready("10.180.0.1"), ready("10.180.2.1")],
    );
    let mut after = before.clone();
    after.ports[0].endpoints[1].topology_excluded = true;

    assert!(v4(&state(vec![before]), &state(vec![after])).is_empty());
}

#[test]
fn endpoint_that_stops_being_usable_counts_as_removed() {
    // Not ready any more while another is: no rule sends traffic to it.
    let before = state(vec![dns(
        Protocol::Udp,
        None,
        vec![ready("10.180.0.1"), ready("10.180.2.1")],
    )]);
    let after = state(vec![dns(
        Protocol::Udp,
        None,
        vec![draining("10.180.0.1"), ready("10.180.2.1")],
    )]);

    assert_eq!(
        v4(&before, &after),
        ["conntrack -D -p udp --orig-dst 172.30.0.10 --dport 53 --reply-src 10.180.0.1"]
    );
}

#[test]
fn endpoint_that_was_never_usable_leaves_nothing_to_delete() {
    let before = state(vec![dns(
        Protocol::Udp,
        None,
        vec![starting("10.180.0.1"), ready("10.180.2.1")],
    )]);
    let after = state(vec![dns(Protocol::Udp, None, vec![ready("10.180.2.1")])]);

    assert!(v4(&before, &after).is_empty());
}

#[test]
fn tcp_ports_are_left_alone() {
    let before = state(vec![dns(
        Protocol::Tcp,
        Some(30053),
        vec![ready("10.180.0.1"), ready("10.180.2.1")],
    )]);
    let after = state(vec![dns(Protocol::Tcp, Some(30053), Vec::new())]);

    assert!(v4(&before, &after).is_empty());
    assert!(v4(&after, &before).is_empty());
}

#[test]
fn sctp_ports_are_cleaned_like_udp() {
    let before = state(vec![dns(Protocol::Sctp, None, vec![ready("10.180.0.1")])]);
    let after = state(vec![dns(Protocol::Sctp, None, vec![ready("10.180.2.1")])]);

    assert_eq!(
        v4(&before, &after),
        ["conntrack -D -p sctp --orig-dst 172.30.0.10 --dport 53 --reply-src 10.180.0.1"]
    );
}

#[test]
fn port_that_gets_its_first_endpoint_loses_every_flow_to_it() {
    let mut before = dns(Protocol::Udp, Some(30053), vec![starting("10.180.0.1")]);
    before.load_balancer_ips = vec!["1.2.3.4".parse().unwrap()];
    let mut after = before.clone();
    after.ports[0].endpoints = vec![ready("10.180.0.1")];

    assert_eq!(
        v4(&state(vec![before]), &state(vec![after])),
        [
            "conntrack -D -p udp --orig-dst 1.2.3.4 --dport 53",
            "conntrack -D -p udp --orig-dst 172.30.0.10 --dport 53",
            "conntrack -D -p udp --dport 30053",
        ]
    );
}

#[test]
fn new_service_with_endpoints_counts_as_getting_its_first_endpoint() {
    let after = state(vec![dns(Protocol::Udp, None, vec![ready("10.180.0.1")])]);

    assert_eq!(
        v4(&ProxyState::default(), &after),
        ["conntrack -D -p udp --orig-dst 172.30.0.10 --dport 53"]
    );
}

#[test]
fn deleted_service_loses_the_flows_to_its_endpoints() {
    let before = state(vec![dns(Protocol::Udp, None, vec![ready("10.180.0.1")])]);

    assert_eq!(
        v4(&before, &ProxyState::default()),
        ["conntrack -D -p udp --orig-dst 172.30.0.10 --dport 53 --reply-src 10.180.0.1"]
    );
}

#[test]
fn unchanged_state_deletes_nothing() {
    let same = state(vec![dns(
        Protocol::Udp,
        Some(30053),
        vec![ready("10.180.0.1"), ready("10.180.2.1")],
    )]);

    assert!(v4(&same, &same).is_empty());
}

#[test]
fn local_endpoints_kept_for_a_local_policy_are_still_usable() {
    // With no ready endpoint left anywhere, the local draining one still takes local traffic.
    let mut before = dns(Protocol::Udp, None, vec![ready("10.180.2.1")]);
    before.internal_traffic_policy = TrafficPolicy::Local;
    let local_draining = Endpoint {
        is_local: true,
        ..draining("10.180.0.1")
    };
    before.ports[0].endpoints.push(local_draining.clone());
    let mut after = before.clone();
    after.ports[0].endpoints = vec![local_draining];

    assert_eq!(
        v4(&state(vec![before]), &state(vec![after])),
        ["conntrack -D -p udp --orig-dst 172.30.0.10 --dport 53 --reply-src 10.180.2.1"]
    );
}

#[test]
fn each_family_sees_only_its_own_addresses() {
    let mut before = dns(
        Protocol::Udp,
        Some(30053),
        vec![ready("10.180.0.1"), ready("fd00:10:180::1")],
    );
    before.cluster_ips.push("fd00:172:30::10".parse().unwrap());
    let mut after = before.clone();
    after.ports[0].endpoints = vec![ready("10.180.0.1")];
    let (before, after) = (state(vec![before]), state(vec![after]));

    assert!(v4(&before, &after).is_empty());
    assert_eq!(
        commands(&stale_flows(&before, &after, IpFamily::V6)),
        [
            "conntrack -D -p udp -f ipv6 --orig-dst fd00:172:30::10 --dport 53 --reply-src fd00:10:180::1",
            "conntrack -D -p udp -f ipv6 --dport 30053 --reply-src fd00:10:180::1",
        ]
    );
}

#[test]
fn deletions_are_typed_values() {
    let before = state(vec![dns(Protocol::Udp, None, vec![ready("10.180.0.1")])]);

    assert_eq!(
        stale_flows(&before, &ProxyState::default(), IpFamily::V4),
        [Deletion {
            family: IpFamily::V4,
            protocol: Protocol::Udp,
            destination: Destination::Address {
                ip: "172.30.0.10".parse().unwrap(),
                port: 53,
            },
            reply_source: Some("10.180.0.1".parse().unwrap()),
        }]
    );
}

#[test]
fn conntrack_counts_are_read_from_its_summary_line() {
    let zero = "conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.\n";
    let some = "conntrack v1.4.7 (conntrack-tools): 12 flow entries have been deleted.\n";
    assert_eq!(deleted_count(zero), Some(0));
    assert_eq!(deleted_count(some), Some(12));
    assert_eq!(
        deleted_count("conntrack v1.4.7 (conntrack-tools): Operation failed: invalid parameters"),
        None
    );
}
