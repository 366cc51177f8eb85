//! Tests of the iptables backend: the rendered nat payload, and the executor against fake tools.
//!
//! Test IP conventions (as upstream's `proxier_test.go`):
//!
//! | thing        | addresses                    |
//! |--------------|------------------------------|
//! | pods         | `10.0.0.0/8`; endpoints `10.180.0.x`, `10.180.2.x`, IPv6 `fd00:10:180::x`; `is_local` ones (this node) only in `10.180.0.x` |
//! | cluster IPs  | `172.30.0.0/16`, IPv6 `fd00:172:30::x` |
//! | node         | `192.168.0.2`                |
//! | external     | `203.0.113.0/24`             |
//! | external IPs | `192.168.99.x`               |
//! | LB ingress   | `1.2.3.x`                    |
#![allow(clippy::unwrap_used)]

mod dual_stack;

use super::{Config, Dataplane, Error, Iptables, JUMPS, canaries, render_filter, render_nat};
use crate::NodeOptions;
use crate::local_traffic::PodInterfaces;
use crate::testing::{rules::assert_rules_eq, scratch::Scratch};
use crate::{Endpoint, Protocol, ProxyState, Service, ServiceKey, ServicePort, TrafficPolicy};
use std::{collections::BTreeSet, time::Duration};

// ---------------------------------------------------------------------------------------------
// Fixtures

fn state(services: Vec<Service>) -> ProxyState {
    services.into_iter().collect()
}

fn service(namespace: &str, name: &str, cluster_ips: &[&str], ports: Vec<ServicePort>) -> Service {
    let cluster_ips = cluster_ips.iter().map(|ip| ip.parse().unwrap()).collect();
    Service::new(ServiceKey::new(namespace, name), cluster_ips, ports)
}

fn ready(ip: &str, port: u16) -> Endpoint {
    Endpoint {
        ip: ip.parse().unwrap(),
        port,
        ready: true,
        serving: true,
        terminating: false,
        is_local: false,
        topology_excluded: false,
    }
}

/// A ready endpoint on this node.
fn local(ip: &str, port: u16) -> Endpoint {
    Endpoint {
        is_local: true,
        ..ready(ip, port)
    }
}

/// Terminating but still serving: used only when no endpoint is ready.
fn terminating(ip: &str, port: u16) -> Endpoint {
    Endpoint {
        ready: false,
        terminating: true,
        ..ready(ip, port)
    }
}

/// Terminating and no longer serving: never used.
fn gone(ip: &str, port: u16) -> Endpoint {
    Endpoint {
        serving: false,
        ..terminating(ip, port)
    }
}

/// Starting up: neither ready nor serving, never used.
fn starting(ip: &str, port: u16) -> Endpoint {
    Endpoint {
        ready: false,
        serving: false,
        ..ready(ip, port)
    }
}

fn ips(texts: &[&str]) -> Vec<std::net::IpAddr> {
    texts.iter().map(|ip| ip.parse().unwrap()).collect()
}

fn chains(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|name| (*name).to_owned()).collect()
}

// ---------------------------------------------------------------------------------------------
// Render

#[test]
fn cluster_ip_and_node_port_service_spreads_over_three_endpoints() {
    let state = state(vec![service(
        "ns1",
        "svc1",
        &["172.30.0.41"],
        vec![ServicePort::new(
            "p80",
            Protocol::Tcp,
            80,
            Some(3001),
            vec![
                ready("10.180.0.1", 80),
                ready("10.180.0.2", 80),
                ready("10.180.0.3", 80),
            ],
        )],
    )]);

    let nat = render_nat(&state, &NodeOptions::default(), &BTreeSet::new());

    assert_rules_eq(
        &nat.payload,
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
:KUBE-SEP-LXVODXWDISEETFEF - [0:0]
:KUBE-SEP-ICDUIKC33SFI6ZPR - [0:0]
:KUBE-EXT-XPGD46QRK7WJZT7O - [0:0]
-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -m tcp -p tcp --dport 3001 -j KUBE-EXT-XPGD46QRK7WJZT7O
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-SXIVWICOYRO3J4NJ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.2:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-LXVODXWDISEETFEF
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.3:80" -j KUBE-SEP-ICDUIKC33SFI6ZPR
-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80
-A KUBE-SEP-LXVODXWDISEETFEF -m comment --comment ns1/svc1:p80 -s 10.180.0.2 -j KUBE-MARK-MASQ
-A KUBE-SEP-LXVODXWDISEETFEF -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.2:80
-A KUBE-SEP-ICDUIKC33SFI6ZPR -m comment --comment ns1/svc1:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ
-A KUBE-SEP-ICDUIKC33SFI6ZPR -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80
-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "masquerade traffic for ns1/svc1:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-SVC-XPGD46QRK7WJZT7O
COMMIT
"#,
    );
    assert_eq!(nat.rule_count, 18);
}

#[test]
fn stale_chains_are_flushed_and_deleted_but_live_and_foreign_ones_are_kept() {
    // svc1 went away; svc2 is still there; CNI-HOSTPORT-DNAT belongs to someone else.
    let existing = chains(&[
        "PREROUTING",
        "OUTPUT",
        "KUBE-SERVICES",
        "CNI-HOSTPORT-DNAT",
        "KUBE-SVC-XPGD46QRK7WJZT7O",
        "KUBE-SVL-XPGD46QRK7WJZT7O",
        "KUBE-EXT-XPGD46QRK7WJZT7O",
        "KUBE-FW-XPGD46QRK7WJZT7O",
        "KUBE-SEP-SXIVWICOYRO3J4NJ",
        "KUBE-SVC-GNZBNJ2PO5MGZ6GT",
        "KUBE-SEP-RS4RBKLTHTF2IUXJ",
    ]);
    let state = state(vec![service(
        "ns2",
        "svc2",
        &["172.30.0.42"],
        vec![ServicePort::new(
            "p80",
            Protocol::Tcp,
            80,
            None,
            vec![ready("10.180.0.2", 80)],
        )],
    )]);

    let nat = render_nat(&state, &NodeOptions::default(), &existing);

    assert_rules_eq(
        &nat.payload,
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SVC-GNZBNJ2PO5MGZ6GT - [0:0]
:KUBE-SEP-RS4RBKLTHTF2IUXJ - [0:0]
:KUBE-EXT-XPGD46QRK7WJZT7O - [0:0]
:KUBE-FW-XPGD46QRK7WJZT7O - [0:0]
:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
:KUBE-SVL-XPGD46QRK7WJZT7O - [0:0]
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.2:80" -j KUBE-SEP-RS4RBKLTHTF2IUXJ
-A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -s 10.180.0.2 -j KUBE-MARK-MASQ
-A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.2:80
-X KUBE-EXT-XPGD46QRK7WJZT7O
-X KUBE-FW-XPGD46QRK7WJZT7O
-X KUBE-SEP-SXIVWICOYRO3J4NJ
-X KUBE-SVC-XPGD46QRK7WJZT7O
-X KUBE-SVL-XPGD46QRK7WJZT7O
COMMIT
"#,
    );
    assert_eq!(nat.rule_count, 9);
}

#[test]
fn port_without_usable_endpoints_gets_no_chains() {
    // p80's endpoints are terminating and no longer serving, or still starting; p81 has none.
    let state = state(vec![service(
        "ns3",
        "svc3",
        &["172.30.0.43"],
        vec![
            ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                Some(3003),
                vec![gone("10.180.0.3", 80), starting("10.180.0.4", 80)],
            ),
            ServicePort::new("p81", Protocol::Tcp, 81, None, vec![]),
        ],
    )]);

    let nat = render_nat(&state, &NodeOptions::default(), &BTreeSet::new());

    assert_rules_eq(
        &nat.payload,
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
COMMIT
"#,
    );
    assert_eq!(nat.rule_count, 5);
}

#[test]
fn serving_terminating_endpoints_take_traffic_only_while_none_is_ready() {
    // svc3 has only draining endpoints (one no longer serving); svc4 has a ready one as well.
    let state = state(vec![
        service(
            "ns3",
            "svc3",
            &["172.30.0.43"],
            vec![ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                None,
                vec![
                    terminating("10.180.0.3", 80),
                    gone("10.180.0.4", 80),
                    terminating("10.180.0.5", 80),
                ],
            )],
        ),
        service(
            "ns4",
            "svc4",
            &["172.30.0.44"],
            vec![ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                None,
                vec![terminating("10.180.0.6", 80), ready("10.180.0.7", 80)],
            )],
        ),
    ]);

    let nat = render_nat(&state, &NodeOptions::default(), &BTreeSet::new());

    assert_rules_eq(
        &nat.payload,
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SVC-X27LE4BHSL4DOUIK - [0:0]
:KUBE-SEP-OYPFS5VJICHGATKP - [0:0]
:KUBE-SEP-NY72AAESATAM7FRG - [0:0]
:KUBE-SVC-4SW47YFZTEDKD3PK - [0:0]
:KUBE-SEP-KV4FMR6WJFBQE3OH - [0:0]
-A KUBE-SERVICES -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 --dport 80 -j KUBE-SVC-X27LE4BHSL4DOUIK
-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> 10.180.0.3:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-OYPFS5VJICHGATKP
-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> 10.180.0.5:80" -j KUBE-SEP-NY72AAESATAM7FRG
-A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ
-A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80
-A KUBE-SEP-NY72AAESATAM7FRG -m comment --comment ns3/svc3:p80 -s 10.180.0.5 -j KUBE-MARK-MASQ
-A KUBE-SEP-NY72AAESATAM7FRG -m comment --comment ns3/svc3:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.5:80
-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.7:80" -j KUBE-SEP-KV4FMR6WJFBQE3OH
-A KUBE-SEP-KV4FMR6WJFBQE3OH -m comment --comment ns4/svc4:p80 -s 10.180.0.7 -j KUBE-MARK-MASQ
-A KUBE-SEP-KV4FMR6WJFBQE3OH -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.7:80
COMMIT
"#,
    );
    assert!(
        render_filter(&state)
            .payload
            .lines()
            .all(|l| !l.contains("REJECT"))
    );
}

#[test]
fn external_and_load_balancer_ips_go_through_the_external_chain() {
    // svc2 has every external destination; svc7 only an external IP, which is enough for an EXT
    // chain. IPv6 external and load-balancer IPs are left out.
    let state = state(vec![
        Service {
            external_ips: ips(&["192.168.99.22", "fd00:192:168::22"]),
            load_balancer_ips: ips(&["1.2.3.4", "fd00:1:2::4"]),
            ..service(
                "ns2",
                "svc2",
                &["172.30.0.42"],
                vec![ServicePort::new(
                    "p80",
                    Protocol::Tcp,
                    80,
                    Some(3002),
                    vec![ready("10.180.0.2", 80)],
                )],
            )
        },
        Service {
            external_ips: ips(&["192.168.99.27"]),
            ..service(
                "ns7",
                "svc7",
                &["172.30.0.47"],
                vec![ServicePort::new(
                    "p80",
                    Protocol::Tcp,
                    80,
                    None,
                    vec![ready("10.180.0.7", 80)],
                )],
            )
        },
    ]);

    let nat = render_nat(&state, &NodeOptions::default(), &BTreeSet::new());

    assert_rules_eq(
        &nat.payload,
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SVC-GNZBNJ2PO5MGZ6GT - [0:0]
:KUBE-SEP-RS4RBKLTHTF2IUXJ - [0:0]
:KUBE-EXT-GNZBNJ2PO5MGZ6GT - [0:0]
:KUBE-SVC-KPEMU3PDPRCEMWRI - [0:0]
:KUBE-SEP-HZXTC6EBGJZ64CAL - [0:0]
:KUBE-EXT-KPEMU3PDPRCEMWRI - [0:0]
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 external IP" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 loadbalancer IP" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-SERVICES -m comment --comment "ns7/svc7:p80 cluster IP" -m tcp -p tcp -d 172.30.0.47 --dport 80 -j KUBE-SVC-KPEMU3PDPRCEMWRI
-A KUBE-SERVICES -m comment --comment "ns7/svc7:p80 external IP" -m tcp -p tcp -d 192.168.99.27 --dport 80 -j KUBE-EXT-KPEMU3PDPRCEMWRI
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -m tcp -p tcp --dport 3002 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.2:80" -j KUBE-SEP-RS4RBKLTHTF2IUXJ
-A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -s 10.180.0.2 -j KUBE-MARK-MASQ
-A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.2:80
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "masquerade traffic for ns2/svc2:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-SVC-KPEMU3PDPRCEMWRI -m comment --comment "ns7/svc7:p80 -> 10.180.0.7:80" -j KUBE-SEP-HZXTC6EBGJZ64CAL
-A KUBE-SEP-HZXTC6EBGJZ64CAL -m comment --comment ns7/svc7:p80 -s 10.180.0.7 -j KUBE-MARK-MASQ
-A KUBE-SEP-HZXTC6EBGJZ64CAL -m comment --comment ns7/svc7:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.7:80
-A KUBE-EXT-KPEMU3PDPRCEMWRI -m comment --comment "masquerade traffic for ns7/svc7:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-KPEMU3PDPRCEMWRI -j KUBE-SVC-KPEMU3PDPRCEMWRI
COMMIT
"#,
    );
    assert_eq!(nat.rule_count, 21);
    assert!(!render_filter(&state).payload.contains("-d 192.168.99."));
}

#[test]
fn external_and_load_balancer_ips_without_endpoints_are_rejected() {
    let state = state(vec![Service {
        external_ips: ips(&["192.168.99.26"]),
        load_balancer_ips: ips(&["1.2.3.6"]),
        ..service(
            "ns6",
            "svc6",
            &["172.30.0.46"],
            vec![ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                Some(3006),
                vec![starting("10.180.0.6", 80)],
            )],
        )
    }]);

    let filter = render_filter(&state);

    assert_rules_eq(
        &filter.payload,
        r#"*filter
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-FIREWALL - [0:0]
-A KUBE-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j REJECT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp -p tcp -d 192.168.99.26 --dport 80 -j REJECT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp -p tcp -d 1.2.3.6 --dport 80 -j REJECT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3006 -j REJECT
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
COMMIT
"#,
    );
    assert_eq!(filter.rule_count, 8);
    assert!(
        !render_nat(&state, &NodeOptions::default(), &BTreeSet::new())
            .payload
            .contains("svc6"),
        "a port without endpoints has no nat rules"
    );
}

#[test]
fn session_affinity_checks_recent_clients_first_and_remembers_them_on_dnat() {
    let state = state(vec![Service {
        session_affinity: Some(Duration::from_secs(10800)),
        ..service(
            "ns1",
            "svc1",
            &["172.30.0.41"],
            vec![ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                None,
                vec![ready("10.180.0.1", 80), ready("10.180.0.2", 80)],
            )],
        )
    }]);

    let nat = render_nat(&state, &NodeOptions::default(), &BTreeSet::new());

    assert_rules_eq(
        &nat.payload,
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
:KUBE-SEP-LXVODXWDISEETFEF - [0:0]
-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -m recent --name KUBE-SEP-SXIVWICOYRO3J4NJ --rcheck --seconds 10800 --reap -j KUBE-SEP-SXIVWICOYRO3J4NJ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.2:80" -m recent --name KUBE-SEP-LXVODXWDISEETFEF --rcheck --seconds 10800 --reap -j KUBE-SEP-LXVODXWDISEETFEF
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-SXIVWICOYRO3J4NJ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.2:80" -j KUBE-SEP-LXVODXWDISEETFEF
-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m recent --name KUBE-SEP-SXIVWICOYRO3J4NJ --set -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80
-A KUBE-SEP-LXVODXWDISEETFEF -m comment --comment ns1/svc1:p80 -s 10.180.0.2 -j KUBE-MARK-MASQ
-A KUBE-SEP-LXVODXWDISEETFEF -m comment --comment ns1/svc1:p80 -m recent --name KUBE-SEP-LXVODXWDISEETFEF --set -m tcp -p tcp -j DNAT --to-destination 10.180.0.2:80
COMMIT
"#,
    );
    assert_eq!(nat.rule_count, 14);
}

/// `ns2/svc2`: `externalTrafficPolicy: Local`, port `p80` (80/TCP) with node port 3002.
fn external_local_svc2(endpoints: Vec<Endpoint>) -> Service {
    Service {
        external_traffic_policy: TrafficPolicy::Local,
        ..service(
            "ns2",
            "svc2",
            &["172.30.0.42"],
            vec![ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                Some(3002),
                endpoints,
            )],
        )
    }
}

#[test]
fn external_traffic_policy_local_keeps_external_clients_on_local_endpoints() {
    let state = state(vec![Service {
        external_ips: ips(&["192.168.99.22"]),
        ..external_local_svc2(vec![local("10.180.0.2", 80), ready("10.180.2.1", 80)])
    }]);

    let nat = render_nat(&state, &NodeOptions::default(), &BTreeSet::new());

    // Cluster-IP traffic spreads over both endpoints; external traffic from the node itself is
    // masqueraded and short-circuited to KUBE-SVC; all other external traffic goes to KUBE-SVL,
    // unmasqueraded. No "pod traffic" rule: there is no cluster CIDR to detect pods by.
    assert_rules_eq(
        &nat.payload,
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SVC-GNZBNJ2PO5MGZ6GT - [0:0]
:KUBE-SVL-GNZBNJ2PO5MGZ6GT - [0:0]
:KUBE-SEP-RS4RBKLTHTF2IUXJ - [0:0]
:KUBE-SEP-CL5TTP32JTFBIVMN - [0:0]
:KUBE-EXT-GNZBNJ2PO5MGZ6GT - [0:0]
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 external IP" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -m tcp -p tcp --dport 3002 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.2:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-RS4RBKLTHTF2IUXJ
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.2.1:80" -j KUBE-SEP-CL5TTP32JTFBIVMN
-A KUBE-SVL-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.2:80" -j KUBE-SEP-RS4RBKLTHTF2IUXJ
-A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -s 10.180.0.2 -j KUBE-MARK-MASQ
-A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.2:80
-A KUBE-SEP-CL5TTP32JTFBIVMN -m comment --comment ns2/svc2:p80 -s 10.180.2.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-CL5TTP32JTFBIVMN -m comment --comment ns2/svc2:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.2.1:80
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "masquerade LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "route LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -j KUBE-SVL-GNZBNJ2PO5MGZ6GT
COMMIT
"#,
    );
    assert_eq!(nat.rule_count, 18);
    assert!(!render_filter(&state).payload.contains("ns2/svc2"));
}

#[test]
fn topology_excluded_endpoints_get_no_cluster_rule_but_local_ones_keep_their_local_rule() {
    let elsewhere = |endpoint: Endpoint| Endpoint {
        topology_excluded: true,
        ..endpoint
    };
    let state = state(vec![external_local_svc2(vec![
        elsewhere(local("10.180.0.2", 80)),
        ready("10.180.2.1", 80),
        elsewhere(ready("10.180.2.2", 80)),
    ])]);

    let nat = render_nat(&state, &NodeOptions::default(), &BTreeSet::new());

    // KUBE-SVC holds only the endpoint the hints leave to this node; KUBE-SVL still holds the
    // local one; the endpoint sent elsewhere that is not local gets no chain at all. The rest of
    // the payload is the eTP Local layout of the test above.
    let endpoint_rules: Vec<&str> = nat
        .payload
        .lines()
        .filter(|line| {
            ["-A KUBE-SVC-", "-A KUBE-SVL-", ":KUBE-SEP-"]
                .iter()
                .any(|prefix| line.starts_with(prefix))
        })
        .collect();
    assert_rules_eq(
        &endpoint_rules.join("\n"),
        r#":KUBE-SEP-CL5TTP32JTFBIVMN - [0:0]
:KUBE-SEP-RS4RBKLTHTF2IUXJ - [0:0]
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.2.1:80" -j KUBE-SEP-CL5TTP32JTFBIVMN
-A KUBE-SVL-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.2:80" -j KUBE-SEP-RS4RBKLTHTF2IUXJ"#,
    );
    assert!(!nat.payload.contains("10.180.2.2"));
    assert_eq!(nat.rule_count, 16);
}

#[test]
fn external_traffic_policy_local_without_local_endpoints_drops_external_traffic() {
    let state = state(vec![Service {
        external_ips: ips(&["192.168.99.25"]),
        load_balancer_ips: ips(&["1.2.3.5"]),
        external_traffic_policy: TrafficPolicy::Local,
        ..service(
            "ns5",
            "svc5",
            &["172.30.0.45"],
            vec![ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                Some(3005),
                vec![ready("10.180.2.5", 80)],
            )],
        )
    }]);

    let nat = render_nat(&state, &NodeOptions::default(), &BTreeSet::new());
    let filter = render_filter(&state);

    // The EXT chain still short-circuits the node's own traffic, then lets the rest fall out.
    let ext: Vec<&str> = nat
        .payload
        .lines()
        .filter(|l| l.starts_with("-A KUBE-EXT-"))
        .collect();
    assert_eq!(
        ext,
        [
            r#"-A KUBE-EXT-NUKIZ6OKUXPJNT4C -m comment --comment "masquerade LOCAL traffic for ns5/svc5:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ"#,
            r#"-A KUBE-EXT-NUKIZ6OKUXPJNT4C -m comment --comment "route LOCAL traffic for ns5/svc5:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-NUKIZ6OKUXPJNT4C"#,
        ]
    );
    assert!(!nat.payload.contains("KUBE-SVL-"), "{}", nat.payload);
    assert!(
        nat.payload.contains(r#"-A KUBE-SERVICES -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp -p tcp -d 172.30.0.45 --dport 80 -j KUBE-SVC-NUKIZ6OKUXPJNT4C"#),
        "{}",
        nat.payload
    );
    assert_rules_eq(
        &filter.payload,
        r#"*filter
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-FIREWALL - [0:0]
-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns5/svc5:p80 has no local endpoints" -m tcp -p tcp -d 192.168.99.25 --dport 80 -j DROP
-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns5/svc5:p80 has no local endpoints" -m tcp -p tcp -d 1.2.3.5 --dport 80 -j DROP
-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns5/svc5:p80 has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3005 -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
COMMIT
"#,
    );
}

#[test]
fn internal_traffic_policy_local_uses_local_endpoints_or_drops() {
    // svc3 has a local endpoint (and session affinity, which the SVL chain honours too); svc4 has
    // endpoints on other nodes only.
    let state = state(vec![
        Service {
            internal_traffic_policy: TrafficPolicy::Local,
            session_affinity: Some(Duration::from_secs(60)),
            ..service(
                "ns3",
                "svc3",
                &["172.30.0.43"],
                vec![ServicePort::new(
                    "p80",
                    Protocol::Tcp,
                    80,
                    None,
                    vec![local("10.180.0.3", 80), ready("10.180.2.3", 80)],
                )],
            )
        },
        Service {
            internal_traffic_policy: TrafficPolicy::Local,
            ..service(
                "ns4",
                "svc4",
                &["172.30.0.44"],
                vec![ServicePort::new(
                    "p80",
                    Protocol::Tcp,
                    80,
                    None,
                    vec![ready("10.180.2.4", 80)],
                )],
            )
        },
    ]);

    let nat = render_nat(&state, &NodeOptions::default(), &BTreeSet::new());
    let filter = render_filter(&state);

    assert_rules_eq(
        &nat.payload,
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SVL-X27LE4BHSL4DOUIK - [0:0]
:KUBE-SEP-OYPFS5VJICHGATKP - [0:0]
-A KUBE-SERVICES -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 --dport 80 -j KUBE-SVL-X27LE4BHSL4DOUIK
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SVL-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> 10.180.0.3:80" -m recent --name KUBE-SEP-OYPFS5VJICHGATKP --rcheck --seconds 60 --reap -j KUBE-SEP-OYPFS5VJICHGATKP
-A KUBE-SVL-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> 10.180.0.3:80" -j KUBE-SEP-OYPFS5VJICHGATKP
-A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ
-A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -m recent --name KUBE-SEP-OYPFS5VJICHGATKP --set -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80
COMMIT
"#,
    );
    assert_rules_eq(
        &filter.payload,
        r#"*filter
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-FIREWALL - [0:0]
-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 has no local endpoints" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
COMMIT
"#,
    );
}

/// `ns5/svc5:p80`: a load-balancer IP open to two IPv4 ranges (and an IPv6 one this renderer
/// skips), a node port, one endpoint.
fn source_ranged_service() -> ProxyState {
    state(vec![Service {
        load_balancer_ips: ips(&["5.6.7.8"]),
        load_balancer_source_ranges: vec![
            "203.0.113.0/25".parse().unwrap(),
            "198.51.100.0/24".parse().unwrap(),
            "fd00:203::/64".parse().unwrap(),
        ],
        ..service(
            "ns5",
            "svc5",
            &["172.30.0.45"],
            vec![ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                Some(3005),
                vec![ready("10.180.2.5", 80)],
            )],
        )
    }])
}

#[test]
fn load_balancer_source_ranges_filter_load_balancer_ips_only() {
    let state = source_ranged_service();

    let nat = render_nat(&state, &NodeOptions::default(), &BTreeSet::new());
    let filter = render_filter(&state);

    // Load-balancer traffic from an allowed source continues to KUBE-EXT; the rest falls out of
    // KUBE-FW untranslated and is dropped by the filter table. The node port is not filtered.
    assert_rules_eq(
        &nat.payload,
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SVC-NUKIZ6OKUXPJNT4C - [0:0]
:KUBE-SEP-YPA7HIMEQIB5XUUL - [0:0]
:KUBE-EXT-NUKIZ6OKUXPJNT4C - [0:0]
:KUBE-FW-NUKIZ6OKUXPJNT4C - [0:0]
-A KUBE-SERVICES -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp -p tcp -d 172.30.0.45 --dport 80 -j KUBE-SVC-NUKIZ6OKUXPJNT4C
-A KUBE-SERVICES -m comment --comment "ns5/svc5:p80 loadbalancer IP" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j KUBE-FW-NUKIZ6OKUXPJNT4C
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -m comment --comment ns5/svc5:p80 -m tcp -p tcp --dport 3005 -j KUBE-EXT-NUKIZ6OKUXPJNT4C
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.2.5:80" -j KUBE-SEP-YPA7HIMEQIB5XUUL
-A KUBE-SEP-YPA7HIMEQIB5XUUL -m comment --comment ns5/svc5:p80 -s 10.180.2.5 -j KUBE-MARK-MASQ
-A KUBE-SEP-YPA7HIMEQIB5XUUL -m comment --comment ns5/svc5:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.2.5:80
-A KUBE-EXT-NUKIZ6OKUXPJNT4C -m comment --comment "masquerade traffic for ns5/svc5:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-NUKIZ6OKUXPJNT4C -j KUBE-SVC-NUKIZ6OKUXPJNT4C
-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 loadbalancer IP" -s 203.0.113.0/25 -j KUBE-EXT-NUKIZ6OKUXPJNT4C
-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 loadbalancer IP" -s 198.51.100.0/24 -j KUBE-EXT-NUKIZ6OKUXPJNT4C
-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "other traffic to ns5/svc5:p80 will be dropped by KUBE-PROXY-FIREWALL"
COMMIT
"#,
    );
    assert_rules_eq(
        &filter.payload,
        r#"*filter
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-FIREWALL - [0:0]
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-PROXY-FIREWALL -m comment --comment "ns5/svc5:p80 traffic not accepted by KUBE-FW-NUKIZ6OKUXPJNT4C" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j DROP
-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
COMMIT
"#,
    );
}

#[test]
fn source_ranges_holding_the_node_ip_also_accept_the_load_balancer_ips_themselves() {
    let state = source_ranged_service();
    let firewall_rules = |node_ip: &str| {
        let options = NodeOptions::default().with_node_ips([node_ip.parse().unwrap()]);
        render_nat(&state, &options, &BTreeSet::new())
            .payload
            .lines()
            .filter(|line| line.starts_with("-A KUBE-FW-"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
            .join("\n")
    };

    // As upstream's allowFromNode: a node holding its VIP locally connects from the VIP.
    assert_rules_eq(
        &firewall_rules("198.51.100.7"),
        r#"-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 loadbalancer IP" -s 203.0.113.0/25 -j KUBE-EXT-NUKIZ6OKUXPJNT4C
-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 loadbalancer IP" -s 198.51.100.0/24 -j KUBE-EXT-NUKIZ6OKUXPJNT4C
-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 loadbalancer IP" -s 5.6.7.8 -j KUBE-EXT-NUKIZ6OKUXPJNT4C
-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "other traffic to ns5/svc5:p80 will be dropped by KUBE-PROXY-FIREWALL""#,
    );
    assert!(!firewall_rules("192.0.2.7").contains("-s 5.6.7.8"));
}

#[test]
fn source_ranges_without_load_balancer_ips_or_endpoints_write_no_firewall() {
    let ranged = |ingress: &[&str], endpoints| Service {
        load_balancer_ips: ips(ingress),
        load_balancer_source_ranges: vec!["203.0.113.0/25".parse().unwrap()],
        ..service(
            "ns5",
            "svc5",
            &["172.30.0.45"],
            vec![ServicePort::new("p80", Protocol::Tcp, 80, None, endpoints)],
        )
    };
    for state in [
        state(vec![ranged(&[], vec![ready("10.180.2.5", 80)])]),
        state(vec![ranged(&["5.6.7.8"], vec![])]),
    ] {
        let payload = format!(
            "{}{}",
            render_filter(&state).payload,
            render_nat(&state, &NodeOptions::default(), &BTreeSet::new()).payload
        );
        assert!(!payload.contains("KUBE-FW-"), "{payload}");
        assert!(!payload.contains("-A KUBE-PROXY-FIREWALL"), "{payload}");
    }
}

#[test]
fn ipv6_cluster_ips_and_endpoints_are_left_out() {
    let state = state(vec![service(
        "ns4",
        "svc4",
        &["172.30.0.44", "fd00:172:30::44"],
        vec![ServicePort::new(
            "p80",
            Protocol::Tcp,
            80,
            None,
            vec![ready("10.180.0.4", 80), ready("fd00:10:180::4", 80)],
        )],
    )]);

    let nat = render_nat(&state, &NodeOptions::default(), &BTreeSet::new());

    assert_rules_eq(
        &nat.payload,
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SVC-4SW47YFZTEDKD3PK - [0:0]
:KUBE-SEP-UKSFD7AGPMPPLUHC - [0:0]
-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.4:80" -j KUBE-SEP-UKSFD7AGPMPPLUHC
-A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -s 10.180.0.4 -j KUBE-MARK-MASQ
-A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.4:80
COMMIT
"#,
    );
}

#[test]
fn udp_port_matches_and_dnats_udp() {
    let state = state(vec![service(
        "ns5",
        "svc5",
        &["172.30.0.45"],
        vec![ServicePort::new(
            "dns",
            Protocol::Udp,
            53,
            None,
            vec![ready("10.180.2.5", 53)],
        )],
    )]);

    let payload = render_nat(&state, &NodeOptions::default(), &BTreeSet::new()).payload;

    for line in [
        r#"-A KUBE-SERVICES -m comment --comment "ns5/svc5:dns cluster IP" -m udp -p udp -d 172.30.0.45 --dport 53 -j KUBE-SVC-P5TF35VZD6JC4ICL"#,
        r#"-A KUBE-SEP-L3KNRUI7BOKUP4AG -m comment --comment ns5/svc5:dns -m udp -p udp -j DNAT --to-destination 10.180.2.5:53"#,
    ] {
        assert!(
            payload.lines().any(|l| l == line),
            "missing {line} in\n{payload}"
        );
    }
}

#[test]
fn duplicate_endpoints_get_one_chain() {
    let state = state(vec![service(
        "ns1",
        "svc1",
        &["172.30.0.41"],
        vec![ServicePort::new(
            "p80",
            Protocol::Tcp,
            80,
            None,
            vec![ready("10.180.0.1", 80), ready("10.180.0.1", 80)],
        )],
    )]);

    let payload = render_nat(&state, &NodeOptions::default(), &BTreeSet::new()).payload;

    assert_eq!(payload.matches(":KUBE-SEP-SXIVWICOYRO3J4NJ ").count(), 1);
    assert!(!payload.contains("--probability"), "{payload}");
}

/// Every fixture above at once, with stale chains, for the structural checks below.
fn everything() -> (ProxyState, BTreeSet<String>) {
    let state = state(vec![
        service(
            "ns1",
            "svc1",
            &["172.30.0.41"],
            vec![ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                Some(3001),
                vec![ready("10.180.0.1", 80), ready("10.180.0.2", 80)],
            )],
        ),
        service(
            "ns3",
            "svc3",
            &["172.30.0.43"],
            vec![ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                Some(3003),
                vec![],
            )],
        ),
        service(
            "ns5",
            "svc5",
            &["172.30.0.45", "fd00:172:30::45"],
            vec![ServicePort::new(
                "",
                Protocol::Udp,
                53,
                Some(3005),
                vec![ready("10.180.2.5", 53), terminating("10.180.2.6", 53)],
            )],
        ),
    ]);
    let existing = chains(&[
        "PREROUTING",
        "KUBE-SVC-GNZBNJ2PO5MGZ6GT",
        "KUBE-SEP-RS4RBKLTHTF2IUXJ",
    ]);
    (state, existing)
}

#[test]
fn payload_is_well_formed_iptables_restore_input() {
    let (state, existing) = everything();
    let nat = render_nat(&state, &NodeOptions::default(), &existing);
    let lines: Vec<&str> = nat.payload.lines().collect();

    assert!(nat.payload.ends_with("COMMIT\n"), "{}", nat.payload);
    assert_eq!(lines.first(), Some(&"*nat"));
    assert_eq!(lines.last(), Some(&"COMMIT"));
    let body = &lines[1..lines.len() - 1];

    // Sections come in order: declarations, rules, deletions.
    let section = |line: &str| {
        if line.starts_with(':') {
            0
        } else if line.starts_with("-A ") {
            1
        } else if line.starts_with("-X ") {
            2
        } else {
            panic!("not a restore line: {line:?}")
        }
    };
    let sections: Vec<u8> = body.iter().map(|l| section(l)).collect();
    assert!(
        sections.is_sorted(),
        "sections out of order:\n{}",
        nat.payload
    );

    // Quotes are balanced, so iptables-restore splits every rule as intended.
    for line in body {
        assert_eq!(
            line.matches('"').count() % 2,
            0,
            "unbalanced quotes: {line}"
        );
    }

    // Each chain is declared once, in the `:NAME - [0:0]` form.
    let declared: Vec<&str> = body
        .iter()
        .filter_map(|l| l.strip_prefix(':'))
        .map(|d| d.strip_suffix(" - [0:0]").unwrap())
        .collect();
    let unique: BTreeSet<&str> = declared.iter().copied().collect();
    assert_eq!(unique.len(), declared.len(), "a chain is declared twice");

    // Rules go to declared chains; jumps go to declared, not deleted, chains or to targets.
    let deleted: BTreeSet<&str> = body.iter().filter_map(|l| l.strip_prefix("-X ")).collect();
    assert!(deleted.is_subset(&unique));
    let targets = ["MARK", "MASQUERADE", "RETURN", "DNAT"];
    for rule in body.iter().filter_map(|l| l.strip_prefix("-A ")) {
        let chain = rule.split(' ').next().unwrap();
        assert!(unique.contains(chain), "rule in undeclared chain: {rule}");
        let target = rule
            .split(" -j ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap();
        assert!(
            targets.contains(&target) || (unique.contains(target) && !deleted.contains(target)),
            "jump to a missing chain: {rule}"
        );
    }

    assert_eq!(
        nat.rule_count as usize,
        body.iter().filter(|l| l.starts_with("-A ")).count()
    );
}

#[test]
fn node_ports_jump_is_the_last_rule_of_kube_services() {
    let (state, existing) = everything();
    let payload = render_nat(&state, &NodeOptions::default(), &existing).payload;

    let last = payload
        .lines()
        .rfind(|l| l.starts_with("-A KUBE-SERVICES "))
        .unwrap();
    assert!(
        last.ends_with("-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"),
        "{last}"
    );
}

#[test]
fn rendering_is_deterministic() {
    let (state, existing) = everything();
    assert_eq!(
        render_nat(&state, &NodeOptions::default(), &existing),
        render_nat(&state, &NodeOptions::default(), &existing)
    );
}

#[test]
fn ports_without_usable_endpoints_are_rejected_on_cluster_ip_and_node_port() {
    let state = state(vec![
        service(
            "ns1",
            "empty",
            &["172.30.0.46"],
            vec![ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                Some(3003),
                vec![gone("10.180.0.9", 80)],
            )],
        ),
        service(
            "ns2",
            "served",
            &["172.30.0.47"],
            vec![ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                None,
                vec![ready("10.180.0.1", 80)],
            )],
        ),
    ]);
    let filter = render_filter(&state);
    assert_rules_eq(
        &filter.payload,
        r#"*filter
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-FIREWALL - [0:0]
-A KUBE-SERVICES -m comment --comment "ns1/empty:p80 has no endpoints" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j REJECT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns1/empty:p80 has no endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3003 -j REJECT
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
COMMIT
"#,
    );
    assert_eq!(filter.rule_count, 6);
}

// ---------------------------------------------------------------------------------------------
// Executor

#[test]
fn command_prefix_goes_before_every_command() {
    let args = ["-t".to_owned(), "nat".to_owned()];

    let plain = Config::default().command_line("iptables-save", &args);
    assert_eq!(plain, ("iptables-save".to_owned(), args.to_vec()));

    let in_netns = Config::default()
        .with_command_prefix(["ip", "netns", "exec", "ns1"])
        .command_line("iptables-save", &args);
    assert_eq!(in_netns.0, "ip");
    assert_eq!(
        in_netns.1,
        ["netns", "exec", "ns1", "iptables-save", "-t", "nat"]
    );
}

#[test]
fn jumps_are_kube_proxys_and_inserted_first() {
    let commands: Vec<String> = JUMPS
        .iter()
        .flat_map(|jump| [jump.check_args(5).join(" "), jump.insert_args(5).join(" ")])
        .collect();
    assert_eq!(
        commands,
        [
            "-w 5 -t nat -C PREROUTING -m comment --comment kubernetes service portals -j KUBE-SERVICES",
            "-w 5 -t nat -I PREROUTING 1 -m comment --comment kubernetes service portals -j KUBE-SERVICES",
            "-w 5 -t nat -C OUTPUT -m comment --comment kubernetes service portals -j KUBE-SERVICES",
            "-w 5 -t nat -I OUTPUT 1 -m comment --comment kubernetes service portals -j KUBE-SERVICES",
            "-w 5 -t nat -C POSTROUTING -m comment --comment kubernetes postrouting rules -j KUBE-POSTROUTING",
            "-w 5 -t nat -I POSTROUTING 1 -m comment --comment kubernetes postrouting rules -j KUBE-POSTROUTING",
            "-w 5 -t filter -C INPUT -m conntrack --ctstate NEW -m comment --comment kubernetes externally-visible service portals -j KUBE-EXTERNAL-SERVICES",
            "-w 5 -t filter -I INPUT 1 -m conntrack --ctstate NEW -m comment --comment kubernetes externally-visible service portals -j KUBE-EXTERNAL-SERVICES",
            "-w 5 -t filter -C FORWARD -m conntrack --ctstate NEW -m comment --comment kubernetes externally-visible service portals -j KUBE-EXTERNAL-SERVICES",
            "-w 5 -t filter -I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment kubernetes externally-visible service portals -j KUBE-EXTERNAL-SERVICES",
            "-w 5 -t filter -C INPUT -m comment --comment kubernetes health check service ports -j KUBE-NODEPORTS",
            "-w 5 -t filter -I INPUT 1 -m comment --comment kubernetes health check service ports -j KUBE-NODEPORTS",
            "-w 5 -t filter -C FORWARD -m conntrack --ctstate NEW -m comment --comment kubernetes service portals -j KUBE-SERVICES",
            "-w 5 -t filter -I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment kubernetes service portals -j KUBE-SERVICES",
            "-w 5 -t filter -C OUTPUT -m conntrack --ctstate NEW -m comment --comment kubernetes service portals -j KUBE-SERVICES",
            "-w 5 -t filter -I OUTPUT 1 -m conntrack --ctstate NEW -m comment --comment kubernetes service portals -j KUBE-SERVICES",
            "-w 5 -t filter -C FORWARD -m comment --comment kubernetes forwarding rules -j KUBE-FORWARD",
            "-w 5 -t filter -I FORWARD 1 -m comment --comment kubernetes forwarding rules -j KUBE-FORWARD",
            "-w 5 -t filter -C INPUT -m conntrack --ctstate NEW -m comment --comment kubernetes load balancer firewall -j KUBE-PROXY-FIREWALL",
            "-w 5 -t filter -I INPUT 1 -m conntrack --ctstate NEW -m comment --comment kubernetes load balancer firewall -j KUBE-PROXY-FIREWALL",
            "-w 5 -t filter -C OUTPUT -m conntrack --ctstate NEW -m comment --comment kubernetes load balancer firewall -j KUBE-PROXY-FIREWALL",
            "-w 5 -t filter -I OUTPUT 1 -m conntrack --ctstate NEW -m comment --comment kubernetes load balancer firewall -j KUBE-PROXY-FIREWALL",
            "-w 5 -t filter -C FORWARD -m conntrack --ctstate NEW -m comment --comment kubernetes load balancer firewall -j KUBE-PROXY-FIREWALL",
            "-w 5 -t filter -I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment kubernetes load balancer firewall -j KUBE-PROXY-FIREWALL",
        ]
    );
}

#[test]
fn mode_is_iptables() {
    assert_eq!(Iptables::new().mode(), "iptables");
}

/// An executor whose tools are one `sh` script: `sh -c SCRIPT DIR TOOL ARGS...`. The script logs
/// each call to `DIR/calls`; `iptables-save` prints `DIR/saved` (initially `saved`),
/// `iptables-restore` copies its input to `DIR/payload`, `iptables -C` fails with `check_exit`
/// for PREROUTING only, and `iptables -S` (the canary probe) succeeds. `conntrack`
/// answers as conntrack-tools does when nothing matches (exit 1, "0 flow entries"), or fails with
/// another message while `DIR/conntrack-fails` exists.
fn fake_tools(scratch: &Scratch, saved: &str, restore_exit: u8, check_exit: u8) -> Iptables {
    let script = format!(
        r#"dir=$0; tool=$1; shift
echo "$tool $*" >> "$dir/calls"
case "$tool" in
  iptables-save) cat "$dir/saved" ;;
  iptables-restore) cat > "$dir/payload"; [ -e "$dir/restore-fails" ] && {{ echo 'iptables-restore: line 9 failed' >&2; exit 2; }}; [ {restore_exit} = 0 ] || {{ echo 'iptables-restore: line 2 failed' >&2; exit {restore_exit}; }} ;;
  iptables) case "$*" in *"-C PREROUTING"*) echo 'Bad rule' >&2; exit {check_exit} ;;
    *" -S "*) grep -q ":$(echo "$*" | awk '{{print $NF}}') " "$dir/saved" || exit 1 ;; esac ;;
  conntrack) [ -e "$dir/conntrack-fails" ] && {{ echo 'conntrack v1.4.7 (conntrack-tools): Operation failed: such conntrack doesn'"'"'t exist' >&2; exit 1; }}
    echo 'conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.' >&2; exit 1 ;;
esac"#
    );
    std::fs::write(scratch.0.join("saved"), saved).unwrap();
    let dir = scratch.0.to_string_lossy().into_owned();
    Iptables::with_config(Config::default().with_command_prefix([
        "sh".to_owned(),
        "-c".to_owned(),
        script,
        dir,
    ]))
}

const SAVED: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SVC-GNZBNJ2PO5MGZ6GT - [0:0]\nCOMMIT\n";

#[tokio::test]
async fn sync_restores_the_render_and_inserts_only_missing_jumps() {
    let scratch = Scratch::new("sync");
    let mut iptables = fake_tools(&scratch, SAVED, 0, 1);
    let (state, _) = everything();

    let report = iptables.sync(&state).await.unwrap();

    let expected = render_nat(
        &state,
        &NodeOptions::default(),
        &chains(&["PREROUTING", "KUBE-SVC-GNZBNJ2PO5MGZ6GT"]),
    );
    let filter = render_filter(&state);
    assert_eq!(
        report.rules_written(),
        [
            ("filter".to_owned(), filter.rule_count),
            ("nat".to_owned(), expected.rule_count)
        ]
    );
    assert_rules_eq(
        &scratch.read("payload"),
        &format!("{}{}{}", filter.payload, expected.payload, canaries()),
    );
    assert!(expected.payload.contains("-X KUBE-SVC-GNZBNJ2PO5MGZ6GT"));
    assert_rules_eq(
        &scratch.read("calls"),
        r#"iptables-save -t nat
iptables-restore -w 5 --noflush
iptables -w 5 -t nat -C PREROUTING -m comment --comment kubernetes service portals -j KUBE-SERVICES
iptables -w 5 -t nat -I PREROUTING 1 -m comment --comment kubernetes service portals -j KUBE-SERVICES
iptables -w 5 -t nat -C OUTPUT -m comment --comment kubernetes service portals -j KUBE-SERVICES
iptables -w 5 -t nat -C POSTROUTING -m comment --comment kubernetes postrouting rules -j KUBE-POSTROUTING
iptables -w 5 -t filter -C INPUT -m conntrack --ctstate NEW -m comment --comment kubernetes externally-visible service portals -j KUBE-EXTERNAL-SERVICES
iptables -w 5 -t filter -C FORWARD -m conntrack --ctstate NEW -m comment --comment kubernetes externally-visible service portals -j KUBE-EXTERNAL-SERVICES
iptables -w 5 -t filter -C INPUT -m comment --comment kubernetes health check service ports -j KUBE-NODEPORTS
iptables -w 5 -t filter -C FORWARD -m conntrack --ctstate NEW -m comment --comment kubernetes service portals -j KUBE-SERVICES
iptables -w 5 -t filter -C OUTPUT -m conntrack --ctstate NEW -m comment --comment kubernetes service portals -j KUBE-SERVICES
iptables -w 5 -t filter -C FORWARD -m comment --comment kubernetes forwarding rules -j KUBE-FORWARD
iptables -w 5 -t filter -C INPUT -m conntrack --ctstate NEW -m comment --comment kubernetes load balancer firewall -j KUBE-PROXY-FIREWALL
iptables -w 5 -t filter -C OUTPUT -m conntrack --ctstate NEW -m comment --comment kubernetes load balancer firewall -j KUBE-PROXY-FIREWALL
iptables -w 5 -t filter -C FORWARD -m conntrack --ctstate NEW -m comment --comment kubernetes load balancer firewall -j KUBE-PROXY-FIREWALL
iptables -w 5 -t filter -S KUBE-FIREWALL
iptables -w 5 -t filter -N KUBE-FIREWALL
iptables -w 5 -t filter -C INPUT -j KUBE-FIREWALL
iptables -w 5 -t filter -C OUTPUT -j KUBE-FIREWALL
"#,
    );
}

#[tokio::test]
async fn rejected_restore_reports_its_stderr_and_installs_no_jumps() {
    let scratch = Scratch::new("restore");
    let mut iptables = fake_tools(&scratch, SAVED, 2, 1);

    let err = iptables.sync(&ProxyState::default()).await.unwrap_err();

    assert!(
        matches!(&err, Error::Restore { stderr, .. } if stderr == "iptables-restore: line 2 failed"),
        "{err:?}"
    );
    assert!(err.to_string().contains("line 2 failed"), "{err}");
    // The first sync is full: kube-proxy counts it as a restore failure, not a partial one.
    assert_eq!(
        crate::SyncError::failed_step(&err),
        crate::FailedStep::Restore { partial: false }
    );
    assert!(!scratch.read("calls").contains("iptables -w"));
}

#[tokio::test]
async fn a_refused_partial_sync_says_it_was_partial_and_the_next_sync_is_full() {
    let scratch = Scratch::new("partial-restore");
    let saved = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n";
    let mut iptables = fake_tools(&scratch, saved, 0, 0);
    let (state, _) = everything();
    assert!(iptables.sync(&state).await.unwrap().full);

    std::fs::write(scratch.0.join("restore-fails"), "").unwrap();
    let err = iptables.sync(&state).await.unwrap_err();
    assert_eq!(
        crate::SyncError::failed_step(&err),
        crate::FailedStep::Restore { partial: true },
        "{err:?}"
    );

    std::fs::remove_file(scratch.0.join("restore-fails")).unwrap();
    assert!(iptables.sync(&state).await.unwrap().full);
}

#[tokio::test]
async fn failing_jump_check_is_an_error_not_an_insert() {
    let scratch = Scratch::new("check");
    // Exit status 4 is iptables' "resource problem" (e.g. the lock), not "rule missing".
    let mut iptables = fake_tools(&scratch, SAVED, 0, 4);

    let err = iptables.sync(&ProxyState::default()).await.unwrap_err();

    assert!(
        matches!(&err, Error::Jump { chain: "PREROUTING", stderr, .. } if stderr == "Bad rule"),
        "{err:?}"
    );
    assert!(!scratch.read("calls").contains("-I PREROUTING"));
}

#[tokio::test]
async fn failed_save_reports_its_stderr() {
    let mut iptables = Iptables::with_config(Config::default().with_command_prefix([
        "sh",
        "-c",
        "echo 'iptables-save: no such table' >&2; exit 1",
    ]));

    let err = iptables.sync(&ProxyState::default()).await.unwrap_err();

    assert!(
        matches!(&err, Error::Save { stderr, .. } if stderr == "iptables-save: no such table"),
        "{err:?}"
    );
}

#[tokio::test]
async fn missing_binary_is_a_run_error_naming_it() {
    let mut iptables = Iptables::with_config(Config {
        iptables_save: "/nonexistent/iptables-save".to_owned(),
        ..Config::default()
    });

    let err = iptables.sync(&ProxyState::default()).await.unwrap_err();

    assert!(
        matches!(&err, Error::Run(run) if run.program == "/nonexistent/iptables-save"),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "could not run /nonexistent/iptables-save");
}

#[test]
fn health_check_node_ports_of_local_policy_services_are_accepted_even_without_endpoints() {
    let local_policy = |name: &str, cluster_ip: &str, endpoints: Vec<Endpoint>| Service {
        external_traffic_policy: TrafficPolicy::Local,
        health_check_node_port: Some(30000),
        ..service(
            "ns1",
            name,
            &[cluster_ip],
            vec![
                ServicePort::new("p80", Protocol::Tcp, 80, Some(3001), endpoints.clone()),
                ServicePort::new("p81", Protocol::Udp, 81, Some(3002), endpoints),
            ],
        )
    };
    let state = state(vec![
        local_policy("svc1", "172.30.0.41", vec![local("10.180.0.1", 80)]),
        Service {
            health_check_node_port: Some(30002),
            ..local_policy("svc2", "172.30.0.42", Vec::new())
        },
        // A health-check port left on a Cluster-policy Service serves nothing: no ACCEPT.
        Service {
            external_traffic_policy: TrafficPolicy::Cluster,
            health_check_node_port: Some(30003),
            ..local_policy("svc3", "172.30.0.43", vec![ready("10.180.2.3", 80)])
        },
    ]);

    let filter = render_filter(&state);

    let accepts: Vec<&str> = filter
        .payload
        .lines()
        .filter(|l| l.starts_with("-A KUBE-NODEPORTS"))
        .collect();
    assert_eq!(
        accepts,
        [
            r#"-A KUBE-NODEPORTS -m comment --comment "ns1/svc1:p80 health check node port" -m tcp -p tcp --dport 30000 -j ACCEPT"#,
            r#"-A KUBE-NODEPORTS -m comment --comment "ns1/svc1:p81 health check node port" -m tcp -p tcp --dport 30000 -j ACCEPT"#,
            r#"-A KUBE-NODEPORTS -m comment --comment "ns1/svc2:p80 health check node port" -m tcp -p tcp --dport 30002 -j ACCEPT"#,
            r#"-A KUBE-NODEPORTS -m comment --comment "ns1/svc2:p81 health check node port" -m tcp -p tcp --dport 30002 -j ACCEPT"#,
        ]
    );
    assert!(filter.payload.contains(":KUBE-NODEPORTS - [0:0]\n"));
    let rules = filter
        .payload
        .lines()
        .filter(|l| l.starts_with("-A "))
        .count();
    assert_eq!(filter.rule_count as usize, rules);
}

// ---------------------------------------------------------------------------------------------
// Render options: cluster CIDR and masquerade-all

/// `--cluster-cidr` as upstream's tests set it, after an IPv6 one this renderer skips.
fn cluster_cidr() -> NodeOptions {
    NodeOptions::default().with_cluster_cidrs([
        "fd00:10::/64".parse().unwrap(),
        "10.0.0.0/8".parse().unwrap(),
    ])
}

/// `ns1/svc1:p80`: cluster IP and node port, one endpoint.
fn one_node_port_service() -> ProxyState {
    state(vec![service(
        "ns1",
        "svc1",
        &["172.30.0.41"],
        vec![ServicePort::new(
            "p80",
            Protocol::Tcp,
            80,
            Some(3001),
            vec![ready("10.180.0.1", 80)],
        )],
    )])
}

/// The rules of the chains whose names start with `prefix`.
fn rules_of<'a>(payload: &'a str, prefix: &str) -> Vec<&'a str> {
    payload
        .lines()
        .filter(|line| line.starts_with(&format!("-A {prefix}")))
        .collect()
}

#[test]
fn cluster_cidr_masquerades_cluster_ip_traffic_from_outside_the_pod_network() {
    let nat = render_nat(&one_node_port_service(), &cluster_cidr(), &BTreeSet::new());

    // The first rule of KUBE-SVC marks what does not come from 10.0.0.0/8 (the node itself, or a
    // client routing the Service range through it); the external chain is unchanged.
    assert_rules_eq(
        &nat.payload,
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
:KUBE-EXT-XPGD46QRK7WJZT7O - [0:0]
-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -m tcp -p tcp --dport 3001 -j KUBE-EXT-XPGD46QRK7WJZT7O
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80
-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "masquerade traffic for ns1/svc1:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-SVC-XPGD46QRK7WJZT7O
COMMIT
"#,
    );
    assert_eq!(nat.rule_count, 13);
}

#[test]
fn masquerade_all_marks_every_cluster_ip_packet_whatever_the_cluster_cidr() {
    for options in [
        NodeOptions::default().with_masquerade_all(true),
        cluster_cidr().with_masquerade_all(true),
    ] {
        let nat = render_nat(&one_node_port_service(), &options, &BTreeSet::new());

        assert_eq!(
            rules_of(&nat.payload, "KUBE-SVC-"),
            [
                r#"-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-MARK-MASQ"#,
                r#"-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ"#,
            ],
            "{options:?}"
        );
    }
}

#[test]
fn without_an_ipv4_cluster_cidr_cluster_ip_traffic_is_not_marked() {
    let ipv6_only = NodeOptions::default().with_cluster_cidrs(["fd00:10::/64".parse().unwrap()]);

    let nat = render_nat(&one_node_port_service(), &ipv6_only, &BTreeSet::new());

    assert_eq!(
        nat,
        render_nat(
            &one_node_port_service(),
            &NodeOptions::default(),
            &BTreeSet::new()
        )
    );
    assert!(
        !nat.payload
            .contains("cluster IP\" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-MARK-MASQ")
    );
    assert!(!nat.payload.contains("! -s"));
}

#[test]
fn cluster_cidr_sends_pod_traffic_for_external_local_destinations_to_every_endpoint() {
    let state = state(vec![Service {
        external_ips: ips(&["192.168.99.22"]),
        external_traffic_policy: TrafficPolicy::Local,
        ..service(
            "ns2",
            "svc2",
            &["172.30.0.42"],
            vec![ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                Some(3002),
                vec![local("10.180.0.2", 80), ready("10.180.2.1", 80)],
            )],
        )
    }]);

    let nat = render_nat(&state, &cluster_cidr(), &BTreeSet::new());

    // As upstream's worked example: pod traffic first goes to KUBE-SVC unmasqueraded, then the
    // node's own traffic (masqueraded), then everyone else to the local endpoints only.
    assert_rules_eq(
        &nat.payload,
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SVC-GNZBNJ2PO5MGZ6GT - [0:0]
:KUBE-SVL-GNZBNJ2PO5MGZ6GT - [0:0]
:KUBE-SEP-RS4RBKLTHTF2IUXJ - [0:0]
:KUBE-SEP-CL5TTP32JTFBIVMN - [0:0]
:KUBE-EXT-GNZBNJ2PO5MGZ6GT - [0:0]
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 external IP" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -m tcp -p tcp --dport 3002 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.2:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-RS4RBKLTHTF2IUXJ
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.2.1:80" -j KUBE-SEP-CL5TTP32JTFBIVMN
-A KUBE-SVL-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.2:80" -j KUBE-SEP-RS4RBKLTHTF2IUXJ
-A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -s 10.180.0.2 -j KUBE-MARK-MASQ
-A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.2:80
-A KUBE-SEP-CL5TTP32JTFBIVMN -m comment --comment ns2/svc2:p80 -s 10.180.2.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-CL5TTP32JTFBIVMN -m comment --comment ns2/svc2:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.2.1:80
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "pod traffic for ns2/svc2:p80 external destinations" -s 10.0.0.0/8 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "masquerade LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "route LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -j KUBE-SVL-GNZBNJ2PO5MGZ6GT
COMMIT
"#,
    );
    assert_eq!(nat.rule_count, 20);
}

#[test]
fn internal_traffic_policy_local_marks_in_the_local_chain() {
    let state = state(vec![Service {
        internal_traffic_policy: TrafficPolicy::Local,
        ..service(
            "ns3",
            "svc3",
            &["172.30.0.43"],
            vec![ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                None,
                vec![local("10.180.0.3", 80), ready("10.180.2.3", 80)],
            )],
        )
    }]);

    let nat = render_nat(&state, &cluster_cidr(), &BTreeSet::new());

    // Upstream writes the rule into the chain cluster-IP traffic goes to: here KUBE-SVL.
    assert_eq!(
        rules_of(&nat.payload, "KUBE-SVL-"),
        [
            r#"-A KUBE-SVL-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ"#,
            r#"-A KUBE-SVL-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> 10.180.0.3:80" -j KUBE-SEP-OYPFS5VJICHGATKP"#,
        ]
    );
    assert!(rules_of(&nat.payload, "KUBE-SVC-").is_empty());
}

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
    let mut iptables = fake_tools(&scratch, SAVED, 0, 0);

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
    let mut iptables = fake_tools(&scratch, SAVED, 0, 0);

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
    let mut iptables = fake_tools(&scratch, SAVED, 0, 0);
    iptables
        .sync(&udp_dns(&["10.180.0.1", "10.180.2.1"]))
        .await
        .unwrap();

    // A sync whose jump check fails applied nothing as far as the cleanup is concerned.
    let mut failing = Iptables {
        tools: fake_tools(&scratch, SAVED, 0, 4).tools,
        applied: iptables.applied.clone(),
        ..Iptables::default()
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
    let mut iptables = fake_tools(&scratch, SAVED, 0, 0);
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
    let mut ip6tables = fake_tools(&scratch, SAVED, 0, 0);
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
    let mut iptables = fake_tools(&scratch, SAVED, 0, 0);
    iptables.sync(&state).await.unwrap();
    std::fs::write(scratch.0.join("saved"), scratch.read("payload")).unwrap();

    // The jump check fails after the restore: the sync fails.
    iptables.tools = fake_tools(&scratch, &scratch.read("saved"), 0, 4).tools;
    iptables.full_syncs = crate::full_sync::FullSyncClock::default();
    iptables.sync(&state).await.unwrap_err();

    iptables.tools = fake_tools(&scratch, &scratch.read("saved"), 0, 0).tools;
    let next = iptables.sync(&state).await.unwrap();
    assert!(next.full);
    assert!(scratch.read("payload").contains("-A KUBE-SEP-"));
}

#[tokio::test]
async fn a_family_without_services_still_syncs_partially_after_its_first_sync() {
    // A dual-stack node's IPv6 family often has no Service at all: nothing per-Service was
    // written, yet the kernel holds what the first sync wrote.
    let scratch = Scratch::new("partial-empty");
    let mut iptables = fake_tools(&scratch, SAVED, 0, 0);
    assert!(iptables.sync(&ProxyState::default()).await.unwrap().full);
    std::fs::write(scratch.0.join("saved"), scratch.read("payload")).unwrap();

    let next = iptables.sync(&ProxyState::default()).await.unwrap();

    assert!(!next.full);
    // Only the first sync read the kernel's chains.
    assert_eq!(scratch.read("calls").matches("iptables-save").count(), 1);
}

#[test]
fn pod_interfaces_replace_the_cluster_cidr_as_the_local_traffic_detector() {
    for (interfaces, matched) in [
        (PodInterfaces::Bridge("cni0".to_owned()), "cni0"),
        (PodInterfaces::Prefix("veth".to_owned()), "veth+"),
    ] {
        let options = cluster_cidr().with_pod_interfaces(Some(interfaces));
        let nat = render_nat(&one_node_port_service(), &options, &BTreeSet::new());
        assert_eq!(
            rules_of(&nat.payload, "KUBE-SVC-")[0],
            format!(
                "-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -i {matched} -j KUBE-MARK-MASQ"
            )
        );
        assert!(!nat.payload.contains("10.0.0.0/8"), "{}", nat.payload);
    }
}

#[test]
fn the_masquerade_bit_sets_every_mark() {
    let options = NodeOptions::default().with_masquerade_bit(0);
    let nat = render_nat(&one_node_port_service(), &options, &BTreeSet::new());
    assert!(
        nat.payload
            .contains("-A KUBE-MARK-MASQ -j MARK --or-mark 0x1\n"),
        "{}",
        nat.payload
    );
    assert!(
        nat.payload
            .contains("-A KUBE-POSTROUTING -m mark ! --mark 0x1/0x1 -j RETURN\n"),
        "{}",
        nat.payload
    );
    assert!(!nat.payload.contains("0x4000"), "{}", nat.payload);
}
