//! Test addresses: the unit tests' plan ([`crate::testing::fixtures`]), through the sets' tests'
//! examples, which these render.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::ipvs::sets::IpSets;
use crate::ipvs::sets::tests::{example_v4, example_v6, options, sets_of};
use crate::testing::rules::assert_rules_eq;

fn pod_cidrs() -> NodeOptions {
    NodeOptions::default().with_cluster_cidrs([
        "10.0.0.0/8".parse().unwrap(),
        "fd00:10::/48".parse().unwrap(),
    ])
}

fn render_v4(options_: &NodeOptions) -> IpvsRules {
    render(&sets_of(&example_v4(), &options(IpFamily::V4)), options_)
}

/// The `KUBE-SERVICES` rule marking cluster-IP traffic, if any.
fn cluster_ip_masquerade(rules: &IpvsRules) -> Vec<&str> {
    rules
        .nat
        .payload
        .lines()
        .filter(|line| line.contains("KUBE-CLUSTER-IP") && line.ends_with("-j KUBE-MARK-MASQ"))
        .collect()
}

fn rule_lines(payload: &str) -> u32 {
    u32::try_from(
        payload
            .lines()
            .filter(|line| line.starts_with("-A "))
            .count(),
    )
    .unwrap()
}

#[test]
fn the_ipv4_example_with_a_cluster_cidr_renders_upstreams_layout() {
    let rules = render_v4(&pod_cidrs());

    // Rules of a set are written only while it has entries: no UDP node port, no eTP Local
    // external IP here. The KUBE-IPVS-FILTER rules are written whatever the sets hold.
    assert_rules_eq(
        &rules.nat.payload,
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN
-A KUBE-POSTROUTING -m comment --comment "endpoint reaching itself, to masquerade" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE
-A KUBE-SERVICES -m comment --comment "load-balancer IP:port" -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER
-A KUBE-LOAD-BALANCER -m comment --comment "load-balancer IP:port with eTP Local" -m set --match-set KUBE-LOAD-BALANCER-LOCAL dst,dst -j RETURN
-A KUBE-NODE-PORT -p tcp -m comment --comment "TCP node port with eTP Local" -m set --match-set KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN
-A KUBE-NODE-PORT -p tcp -m comment --comment "TCP node port" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ
-A KUBE-NODE-PORT -p sctp -m comment --comment "SCTP node port" -m set --match-set KUBE-NODE-PORT-SCTP-HASH dst,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES ! -s 10.0.0.0/8 -m comment --comment "cluster IP:port to masquerade" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m comment --comment "external IP:port" -m set --match-set KUBE-EXTERNAL-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m comment --comment "external IP:port" -m set --match-set KUBE-EXTERNAL-IP dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT
-A KUBE-SERVICES -m comment --comment "external IP:port" -m set --match-set KUBE-EXTERNAL-IP dst,dst -m addrtype --dst-type LOCAL -j ACCEPT
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
COMMIT
"#,
    );
    // `web/private`'s ranges leave the node out, so the node is kept from its VIP.
    assert_rules_eq(
        &rules.filter.payload,
        r#"*filter
:KUBE-FORWARD - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
:KUBE-IPVS-FILTER - [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
-A KUBE-PROXY-FIREWALL -m comment --comment "load-balancer IP:port with source ranges" -m set --match-set KUBE-LOAD-BALANCER-FW dst,dst -j KUBE-SOURCE-RANGES-FIREWALL
-A KUBE-SOURCE-RANGES-FIREWALL -m comment --comment "load-balancer IP:port from an allowed range" -m set --match-set KUBE-LOAD-BALANCER-SOURCE-CIDR dst,dst,src -j RETURN
-A KUBE-SOURCE-RANGES-FIREWALL -m comment --comment "node reaching its own load-balancer IP:port" -m set --match-set KUBE-LOAD-BALANCER-SOURCE-IP dst,dst,src -j RETURN
-A KUBE-SOURCE-RANGES-FIREWALL -j DROP
-A KUBE-IPVS-OUT-FILTER -s 1.2.3.10/32 -m ipvs --vproto 6 --vaddr 1.2.3.10/32 --vport 443 -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-NODE-PORT -m comment --comment "health check node port" -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT
-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j RETURN
-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable
COMMIT
"#,
    );
    assert_eq!(rules.nat.rule_count, 19);
    assert_eq!(rules.filter.rule_count, 14);
}

#[test]
fn the_ipv6_example_matches_the_kube_6_sets_with_the_ipv6_pod_cidr() {
    let rules = render(
        &sets_of(&example_v6(), &options(IpFamily::V6)),
        &pod_cidrs(),
    );

    // eTP Local external IPs are accepted without a mark; the UDP load balancer's ranges leave
    // the node out.
    assert_rules_eq(
        &rules.nat.payload,
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A KUBE-SERVICES -s ::1/128 -j RETURN
-A KUBE-POSTROUTING -m comment --comment "endpoint reaching itself, to masquerade" -m set --match-set KUBE-6-LOOP-BACK dst,dst,src -j MASQUERADE
-A KUBE-SERVICES -m comment --comment "load-balancer IP:port" -m set --match-set KUBE-6-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER
-A KUBE-NODE-PORT -p tcp -m comment --comment "TCP node port with eTP Local" -m set --match-set KUBE-6-NODE-PORT-LOCAL-TCP dst -j RETURN
-A KUBE-NODE-PORT -p tcp -m comment --comment "TCP node port" -m set --match-set KUBE-6-NODE-PORT-TCP dst -j KUBE-MARK-MASQ
-A KUBE-NODE-PORT -p udp -m comment --comment "UDP node port" -m set --match-set KUBE-6-NODE-PORT-UDP dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES ! -s fd00:10::/48 -m comment --comment "cluster IP:port to masquerade" -m set --match-set KUBE-6-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m comment --comment "external IP:port with eTP Local" -m set --match-set KUBE-6-EXTERNAL-IP-LOCAL dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT
-A KUBE-SERVICES -m comment --comment "external IP:port with eTP Local" -m set --match-set KUBE-6-EXTERNAL-IP-LOCAL dst,dst -m addrtype --dst-type LOCAL -j ACCEPT
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m set --match-set KUBE-6-CLUSTER-IP dst,dst -j ACCEPT
-A KUBE-SERVICES -m set --match-set KUBE-6-LOAD-BALANCER dst,dst -j ACCEPT
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
COMMIT
"#,
    );
    assert_rules_eq(
        &rules.filter.payload,
        r#"*filter
:KUBE-FORWARD - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
:KUBE-IPVS-FILTER - [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
-A KUBE-PROXY-FIREWALL -m comment --comment "load-balancer IP:port with source ranges" -m set --match-set KUBE-6-LOAD-BALANCER-FW dst,dst -j KUBE-SOURCE-RANGES-FIREWALL
-A KUBE-SOURCE-RANGES-FIREWALL -m comment --comment "load-balancer IP:port from an allowed range" -m set --match-set KUBE-6-LOAD-BALANCER-SOURCE-CID dst,dst,src -j RETURN
-A KUBE-SOURCE-RANGES-FIREWALL -j DROP
-A KUBE-IPVS-OUT-FILTER -s 2001:db8:1b::9/128 -m ipvs --vproto 17 --vaddr 2001:db8:1b::9/128 --vport 443 -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-NODE-PORT -m comment --comment "health check node port" -m set --match-set KUBE-6-HEALTH-CHECK-NODE-PORT dst -j ACCEPT
-A KUBE-IPVS-FILTER -m set --match-set KUBE-6-LOAD-BALANCER dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-6-CLUSTER-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-6-EXTERNAL-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-6-EXTERNAL-IP-LOCAL dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-6-HEALTH-CHECK-NODE-PORT dst -j RETURN
-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-6-IPVS-IPS dst -j REJECT --reject-with icmp6-port-unreachable
COMMIT
"#,
    );
}

#[test]
fn with_no_service_only_the_fixed_rules_are_written() {
    let rules = render(&IpSets::empty(IpFamily::V4), &pod_cidrs());

    assert_rules_eq(
        &rules.nat.payload,
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
COMMIT
"#,
    );
    assert_rules_eq(
        &rules.filter.payload,
        r#"*filter
:KUBE-FORWARD - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
:KUBE-IPVS-FILTER - [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
-A KUBE-SOURCE-RANGES-FIREWALL -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-NODE-PORT -m comment --comment "health check node port" -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT
-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j RETURN
-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable
COMMIT
"#,
    );
    assert_eq!(rules.nat.rule_count, 7);
    assert_eq!(rules.filter.rule_count, 10);
}

#[test]
fn without_a_cluster_cidr_only_the_nodes_connections_from_a_vip_are_marked() {
    let rules = render_v4(&NodeOptions::default());

    assert_eq!(
        cluster_ip_masquerade(&rules),
        [
            r#"-A KUBE-SERVICES -m comment --comment "cluster IP:port to masquerade" -m set --match-set KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ"#
        ]
    );
}

#[test]
fn a_cluster_cidr_of_the_other_family_is_no_detector() {
    let options_ = NodeOptions::default().with_cluster_cidrs(["fd00:10::/48".parse().unwrap()]);

    let rules = render_v4(&options_);

    assert!(cluster_ip_masquerade(&rules)[0].contains(" src,dst "));
}

#[test]
fn masquerade_all_marks_every_cluster_ip_packet_and_wins_over_the_cluster_cidr() {
    for options_ in [
        NodeOptions::default().with_masquerade_all(true),
        pod_cidrs().with_masquerade_all(true),
    ] {
        let rules = render_v4(&options_);

        assert_eq!(
            cluster_ip_masquerade(&rules),
            [
                r#"-A KUBE-SERVICES -m comment --comment "cluster IP:port to masquerade" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ"#
            ]
        );
    }
}

#[test]
fn masquerade_all_changes_nothing_but_the_cluster_ip_rule() {
    let plain = render_v4(&pod_cidrs());
    let all = render_v4(&pod_cidrs().with_masquerade_all(true));

    let differing: Vec<(&str, &str)> = plain
        .nat
        .payload
        .lines()
        .zip(all.nat.payload.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert_eq!(differing.len(), 1);
    assert_eq!(plain.filter, all.filter);
}

#[test]
fn rule_counts_are_the_rules_in_each_payload() {
    for rules in [
        render_v4(&pod_cidrs()),
        render_v4(&NodeOptions::default()),
        render(
            &sets_of(&example_v6(), &options(IpFamily::V6)),
            &pod_cidrs(),
        ),
    ] {
        assert_eq!(rules.nat.rule_count, rule_lines(&rules.nat.payload));
        assert_eq!(rules.filter.rule_count, rule_lines(&rules.filter.payload));
    }
}

#[test]
fn every_chain_written_is_declared_and_each_table_is_committed() {
    let rules = render_v4(&pod_cidrs());

    for (payload, declared) in [
        (&rules.nat.payload, &NAT_CHAINS[..]),
        (&rules.filter.payload, &FILTER_CHAINS[..]),
    ] {
        for line in payload.lines().filter(|line| line.starts_with("-A ")) {
            let chain = line.split(' ').nth(1).unwrap();
            assert!(declared.contains(&chain), "{line}");
        }
        for chain in declared {
            assert!(
                payload.contains(&format!("\n:{chain} - [0:0]\n")),
                "{chain}"
            );
        }
        assert!(payload.ends_with("\nCOMMIT\n"));
    }
}

#[test]
fn the_jumps_are_upstreams_in_its_order_and_none_is_only_for_new_connections() {
    let jumps: Vec<String> = JUMPS
        .iter()
        .map(|jump| format!("{} {} {}", jump.table, jump.chain, jump.rule_text()))
        .collect();

    assert_eq!(
        jumps,
        [
            r#"nat OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#,
            r#"nat PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#,
            r#"nat POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING"#,
            r#"filter FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD"#,
            r#"filter INPUT -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT"#,
            r#"filter INPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL"#,
            r#"filter FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL"#,
            r#"filter INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER"#,
            r#"filter OUTPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER"#,
        ]
    );
    assert!(JUMPS.iter().all(|jump| !jump.new_only));
    // Every target is a chain the payloads declare.
    for jump in &JUMPS {
        let chains: &[&str] = if jump.table == "nat" {
            &NAT_CHAINS
        } else {
            &FILTER_CHAINS
        };
        assert!(chains.contains(&jump.target), "{jump:?}");
    }
}
