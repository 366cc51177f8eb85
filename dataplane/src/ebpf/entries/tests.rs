//! Tests of the entries a state asks for and of the order they are written in.
//!
//! Test addresses: the unit tests' plan ([`crate::testing::fixtures`]).
#![allow(clippy::unwrap_used)]

use super::*;
use crate::testing::fixtures::{local, ready, service, state};
use crate::testing::nftables::{draining, tcp};
use crate::{Protocol, ProxyState, Service, ServicePort, TrafficPolicy};

/// The node's own traffic's entry.
fn key(address: &str, port: u16, protocol: Protocol, slot: u32) -> SlotKey {
    SlotKey {
        address: address.parse().unwrap(),
        port,
        protocol,
        scope: Scope::Node,
        slot,
    }
}

/// The entry for traffic from outside.
fn outside_key(address: &str, port: u16, slot: u32) -> SlotKey {
    SlotKey {
        scope: Scope::Outside,
        ..key(address, port, Protocol::Tcp, slot)
    }
}

fn header(count: u32) -> SlotValue {
    SlotValue::Header {
        count,
        drop: false,
        masquerade: false,
        affinity_seconds: 0,
    }
}

fn endpoint(address: &str) -> SlotValue {
    SlotValue::Endpoint(address.parse().unwrap())
}

/// The entries of `state` on a node without node-port addresses.
fn entries_of(state: &ProxyState) -> Entries {
    desired(state, &[]).entries
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
    let entries = entries_of(&state(vec![web(vec![
        ready("10.180.2.1", 8080),
        local("10.180.0.1", 8080),
        ready("fd00:10:180:2::1", 8080),
    ])]));
    let http = key("172.30.0.41", 80, Protocol::Tcp, 0);
    let http6 = key("fd00:172:30::41", 80, Protocol::Tcp, 0);
    assert_eq!(
        entries,
        Entries::from([
            (http, header(2)),
            (http.with_slot(1), endpoint("10.180.2.1:8080")),
            (http.with_slot(2), endpoint("10.180.0.1:8080")),
            (http6, header(1)),
            (http6.with_slot(1), endpoint("[fd00:10:180:2::1]:8080")),
        ]),
        "each family's cluster IP with that family's endpoints"
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
    let entries = entries_of(&state(vec![dns]));
    let udp = key("172.30.0.10", 53, Protocol::Udp, 1);
    let tcp = key("172.30.0.10", 53, Protocol::Tcp, 1);
    assert_eq!(entries.get(&udp), Some(&endpoint("10.180.2.1:53")));
    assert_eq!(entries.get(&tcp), Some(&endpoint("10.180.2.2:53")));
}

#[test]
fn a_port_without_endpoints_refuses_and_one_whose_local_policy_finds_none_drops() {
    let refused = entries_of(&state(vec![web(Vec::new())]));
    let http = key("172.30.0.41", 80, Protocol::Tcp, 0);
    let http6 = key("fd00:172:30::41", 80, Protocol::Tcp, 0);
    assert_eq!(
        refused,
        Entries::from([(http, header(0)), (http6, header(0))])
    );

    let mut local_only = web(vec![ready("10.180.2.1", 8080)]);
    local_only.internal_traffic_policy = TrafficPolicy::Local;
    let dropped = entries_of(&state(vec![local_only]));
    let drop = SlotValue::Header {
        count: 0,
        drop: true,
        masquerade: false,
        affinity_seconds: 0,
    };
    assert_eq!(
        dropped,
        Entries::from([(http, drop), (http6, header(0))]),
        "IPv6 has no endpoint at all: refused"
    );
}

#[test]
fn local_internal_policy_uses_only_this_nodes_endpoints() {
    let mut local_only = web(vec![ready("10.180.2.1", 8080), local("10.180.0.1", 8080)]);
    local_only.internal_traffic_policy = TrafficPolicy::Local;
    let entries = entries_of(&state(vec![local_only]));
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
    let mixed = entries_of(&state(vec![web(vec![
        draining("10.180.2.1", 8080, false),
        ready("10.180.2.2", 8080),
    ])]));
    assert_eq!(mixed.get(&http), Some(&header(1)));
    assert_eq!(
        mixed.get(&http.with_slot(1)),
        Some(&endpoint("10.180.2.2:8080"))
    );

    let draining_only = entries_of(&state(vec![web(vec![draining("10.180.2.1", 8080, false)])]));
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
        let target = entries_of(next);
        let writes = writes(&current, &target);
        current = replay(current, &writes);
        assert_eq!(current, target);
    }
}

#[test]
fn nothing_is_written_when_nothing_changed() {
    let entries = entries_of(&state(vec![web(vec![ready("10.180.2.1", 8080)])]));
    assert_eq!(writes(&entries, &entries), Vec::new());
}

/// The node's address in the unit tests' plan.
const NODE: &str = "192.168.0.2";

fn node() -> Vec<IpAddr> {
    vec![NODE.parse().unwrap()]
}

/// `web` with node port 30080, external IP 192.168.99.1 and load-balancer IP 1.2.3.4, both
/// traffic policies Local, one endpoint here and one elsewhere.
fn exposed_web() -> Service {
    let mut web = service(
        "ns",
        "web",
        &["172.30.0.41"],
        vec![tcp(
            "p80",
            80,
            Some(30080),
            vec![local("10.180.0.1", 8080), ready("10.180.2.1", 8080)],
        )],
    );
    web.external_ips = vec!["192.168.99.1".parse().unwrap()];
    web.load_balancer_ips = vec!["1.2.3.4".parse().unwrap()];
    web.internal_traffic_policy = TrafficPolicy::Local;
    web.external_traffic_policy = TrafficPolicy::Local;
    web
}

#[test]
fn node_ports_external_and_load_balancer_ips_send_the_nodes_own_traffic_to_every_endpoint() {
    let entries = desired(&state(vec![exposed_web()]), &node()).entries;
    let cluster_ip = key("172.30.0.41", 80, Protocol::Tcp, 0);
    assert_eq!(
        entries.get(&cluster_ip),
        Some(&header(1)),
        "iTP Local: here only"
    );
    for outside in [
        key(NODE, 30080, Protocol::Tcp, 0),
        key("192.168.99.1", 80, Protocol::Tcp, 0),
        key("1.2.3.4", 80, Protocol::Tcp, 0),
    ] {
        assert_eq!(
            entries.get(&outside),
            Some(&header(2)),
            "{outside:?}: the node's own traffic short-circuits eTP Local, as upstream"
        );
        assert_eq!(
            entries.get(&outside.with_slot(2)),
            Some(&endpoint("10.180.2.1:8080"))
        );
    }
    // And for traffic from outside, eTP Local: the local endpoint only, the client's own address.
    assert_eq!(entries.len(), 2 + 3 * 3 + 3 * 2);
}

#[test]
fn traffic_from_outside_goes_where_the_external_policy_says_masqueraded_only_under_cluster() {
    let local = desired(&state(vec![exposed_web()]), &node()).entries;
    for address in [NODE, "192.168.99.1", "1.2.3.4"] {
        let port = if address == NODE { 30080 } else { 80 };
        let header = outside_key(address, port, 0);
        assert_eq!(local.get(&header), Some(&self::header(1)), "{address}");
        assert_eq!(
            local.get(&header.with_slot(1)),
            Some(&endpoint("10.180.0.1:8080"))
        );
    }
    let mut cluster = exposed_web();
    cluster.external_traffic_policy = TrafficPolicy::Cluster;
    let entries = desired(&state(vec![cluster.clone()]), &node()).entries;
    let masqueraded = SlotValue::Header {
        count: 2,
        drop: false,
        masquerade: true,
        affinity_seconds: 0,
    };
    assert_eq!(
        entries.get(&outside_key(NODE, 30080, 0)),
        Some(&masqueraded)
    );

    // eTP Local with every endpoint elsewhere: dropped, as upstream's rules drop it.
    let mut elsewhere = exposed_web();
    elsewhere.ports[0].endpoints = vec![ready("10.180.2.1", 8080)];
    let entries = desired(&state(vec![elsewhere]), &node()).entries;
    let dropped = SlotValue::Header {
        count: 0,
        drop: true,
        masquerade: false,
        affinity_seconds: 0,
    };
    assert_eq!(entries.get(&outside_key(NODE, 30080, 0)), Some(&dropped));
    // No endpoint at all: left to the node, which refuses it.
    cluster.ports[0].endpoints.clear();
    let entries = desired(&state(vec![cluster]), &node()).entries;
    let refused = SlotValue::Header {
        count: 0,
        drop: false,
        masquerade: true,
        affinity_seconds: 0,
    };
    assert_eq!(entries.get(&outside_key(NODE, 30080, 0)), Some(&refused));
}

#[test]
fn outside_traffic_to_a_port_without_endpoints_is_refused_by_the_table_and_dropping_ports_are_not()
{
    let mut none = exposed_web();
    none.ports[0].endpoints.clear();
    let mut elsewhere = exposed_web();
    elsewhere.key.name = "elsewhere".to_owned();
    elsewhere.cluster_ips = vec!["172.30.0.42".parse().unwrap()];
    elsewhere.external_ips.clear();
    elsewhere.load_balancer_ips.clear();
    elsewhere.ports[0].node_port = Some(30081);
    elsewhere.ports[0].endpoints = vec![ready("10.180.2.1", 8080)];
    let mut plain = web(vec![]);
    plain.key.name = "plain".to_owned();
    plain.cluster_ips = vec!["172.30.0.43".parse().unwrap()];
    let entries = desired(&state(vec![none, elsewhere, plain]), &node()).entries;
    let refused: Vec<_> = refused_from_outside(&entries).collect();
    let at = |address: &str, port| (address.parse().unwrap(), Protocol::Tcp, port);
    assert_eq!(
        refused,
        [at("1.2.3.4", 80), at(NODE, 30080), at("192.168.99.1", 80)],
        "the node port, external and load-balancer IPs of the Service without endpoints; not \
         its cluster IP (the socket layer refuses the node's own), not eTP Local's drop"
    );
}

#[test]
fn a_single_stack_service_gets_no_entries_of_the_other_family() {
    let mut web6 = exposed_web();
    web6.cluster_ips = vec!["fd00:172:30::41".parse().unwrap()];
    web6.ports[0].endpoints = vec![local("fd00:10:180::1", 8080)];
    let node_ips = [NODE.parse().unwrap(), "fd00:192:168::2".parse().unwrap()];
    let entries = desired(&state(vec![web6]), &node_ips).entries;
    assert!(!entries.is_empty());
    assert!(
        entries.keys().all(|key| key.address.is_ipv6()),
        "the node's IPv4 address takes no node port of an IPv6-only Service: {entries:?}"
    );
}

#[test]
fn a_load_balancer_ip_with_source_ranges_is_left_to_the_network() {
    let mut web = exposed_web();
    web.load_balancer_source_ranges = vec!["203.0.113.0/25".parse().unwrap()];
    let entries = desired(&state(vec![web]), &node()).entries;
    assert!(!entries.contains_key(&key("1.2.3.4", 80, Protocol::Tcp, 0)));
    assert!(!entries.contains_key(&outside_key("1.2.3.4", 80, 0)));
    assert!(entries.contains_key(&key("192.168.99.1", 80, Protocol::Tcp, 0)));
}

/// A Service `name` with one port 80 endpoint at `endpoint`, on `cluster_ip`, with `external`
/// as its external IPs.
fn claimant(name: &str, cluster_ip: &str, external: &[&str], endpoint: &str) -> Service {
    let mut service = service(
        "ns",
        name,
        &[cluster_ip],
        vec![tcp("p80", 80, None, vec![ready(endpoint, 80)])],
    );
    service.external_ips = external.iter().map(|ip| ip.parse().unwrap()).collect();
    service
}

#[test]
fn a_cluster_ip_keeps_its_key_against_another_services_external_ip_and_else_the_first_name_wins() {
    // "a" names "b"'s cluster IP as an external IP (CVE-2020-8554), and shares one with "c".
    let a = claimant(
        "a",
        "172.30.0.1",
        &["172.30.0.2", "192.168.99.1"],
        "10.180.2.1",
    );
    let b = claimant("b", "172.30.0.2", &[], "10.180.2.2");
    let c = claimant("c", "172.30.0.3", &["192.168.99.1"], "10.180.2.3");
    let desired = desired(&state(vec![c, b, a]), &[]);
    let slot = |address| desired.entries.get(&key(address, 80, Protocol::Tcp, 1));
    assert_eq!(slot("172.30.0.2"), Some(&endpoint("10.180.2.2:80")));
    assert_eq!(slot("192.168.99.1"), Some(&endpoint("10.180.2.1:80")));
    assert_eq!(
        desired.claims[&key("192.168.99.1", 80, Protocol::Tcp, 0)],
        2
    );
    assert_eq!(desired.claims[&key("172.30.0.2", 80, Protocol::Tcp, 0)], 2);
    assert_eq!(desired.claims[&key("172.30.0.1", 80, Protocol::Tcp, 0)], 1);
}

#[test]
fn only_a_change_of_keys_no_other_service_claims_is_written_alone() {
    let a = claimant("a", "172.30.0.1", &["192.168.99.1"], "10.180.2.1");
    let b = claimant("b", "172.30.0.2", &[], "10.180.2.2");
    let mut claims = desired(&state(vec![a.clone(), b.clone()]), &[]).claims;
    let moved = claimant("a", "172.30.0.1", &["192.168.99.1"], "10.180.2.9");
    assert!(reclaim(
        &mut claims,
        &frontends(&a, &[]),
        &frontends(&moved, &[])
    ));
    // "b" now claims "a"'s external IP too: the whole map is reconciled, and so is every later
    // change of either while they clash.
    let clashing = claimant("b", "172.30.0.2", &["192.168.99.1"], "10.180.2.2");
    assert!(!reclaim(
        &mut claims,
        &frontends(&b, &[]),
        &frontends(&clashing, &[])
    ));
    assert!(!reclaim(
        &mut claims,
        &frontends(&moved, &[]),
        &frontends(&a, &[])
    ));
    assert_eq!(claims, desired(&state(vec![a, clashing]), &[]).claims);
}

#[test]
fn a_service_naming_one_key_twice_claims_it_once() {
    let mut web = exposed_web();
    web.load_balancer_ips = web.external_ips.clone();
    let mut claims = desired(&state(vec![web.clone()]), &node()).claims;
    assert!(claims.values().all(|n| *n == 1));
    assert!(reclaim(
        &mut claims,
        &frontends(&web, &node()),
        &frontends(&web, &node())
    ));
}

#[test]
fn each_header_carries_its_services_affinity_timeout() {
    let mut web = exposed_web();
    web.session_affinity = Some(std::time::Duration::from_secs(10_800));
    let entries = desired(&state(vec![web]), &node()).entries;
    let headers: Vec<&SlotValue> = entries
        .iter()
        .filter(|(key, _)| key.slot == 0)
        .map(|(_, value)| value)
        .collect();
    assert_eq!(
        headers.len(),
        4 + 3,
        "the cluster IP, then three from the node and outside"
    );
    for header in headers {
        assert!(
            matches!(
                header,
                SlotValue::Header {
                    affinity_seconds: 10_800,
                    ..
                }
            ),
            "{header:?}"
        );
    }
}

#[test]
fn the_udp_endpoints_a_port_reached_from_outside_lost_are_the_ones_to_forget() {
    let mut dns = service(
        "ns",
        "dns",
        &["172.30.0.10"],
        vec![
            ServicePort::new(
                "dns",
                Protocol::Udp,
                53,
                Some(30053),
                vec![ready("10.180.2.1", 53), ready("10.180.2.2", 53)],
            ),
            ServicePort::new(
                "dns-tcp",
                Protocol::Tcp,
                53,
                Some(30054),
                vec![ready("10.180.2.1", 53), ready("10.180.2.2", 53)],
            ),
        ],
    );
    let before = desired(&state(vec![dns.clone()]), &node()).entries;
    for port in &mut dns.ports {
        port.endpoints
            .retain(|endpoint| endpoint.ip.to_string() == "10.180.2.2");
    }
    let after = desired(&state(vec![dns]), &node()).entries;
    assert_eq!(
        gone_udp_endpoints(&before, &after),
        HashSet::from([(
            format!("{NODE}:30053").parse().unwrap(),
            "10.180.2.1:53".parse().unwrap()
        )]),
        "UDP only (a TCP connection keeps its endpoint, which may be finishing it), from outside \
         only (the node's own sockets hold no flow)"
    );
}
