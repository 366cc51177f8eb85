//! The node's options in the rendered rules: cluster CIDR, masquerade-all and the rest.
#![allow(clippy::unwrap_used)]

use super::*;

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
