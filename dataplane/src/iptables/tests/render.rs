//! The rendered nat and filter payloads, against kube-proxy's own examples.
#![allow(clippy::unwrap_used)]

use super::*;

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
            external_ips: ips(&["192.168.99.22", "2001:db8:99::22"]),
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
