//! Tests of the tracer: each construct on a small hand-written payload, then the shared flow table
//! against the rendered rules.
//!
//! Test addresses (the flow table's block):
//!
//! | thing           | addresses                                        |
//! |-----------------|--------------------------------------------------|
//! | pods            | `10.244.0.0/16`; client `10.244.0.5`, endpoints `10.244.1.x`, `10.244.2.x`, `10.244.3.x` |
//! | cluster IPs     | `10.96.0.0/16`                                   |
//! | node            | `198.18.0.11`                                    |
//! | external client | `203.0.113.7`                                    |
#![allow(clippy::unwrap_used)]

use super::*;
use crate::IpFamily;
use crate::NodeOptions;
use crate::iptables::render::{render_filter_for, render_nat_for};
use crate::testing::fixtures::ip;
use crate::testing::flow_table::{self, CLIENT_POD, EXTERNAL_CLIENT, NODE_IP};

const NODE_IPS: [IpAddr; 1] = [NODE_IP];

fn flow(origin: Origin, source: IpAddr, protocol: Protocol, destination: &str, port: u16) -> Flow {
    Flow {
        name: "test flow",
        source,
        destination: ip(destination),
        protocol,
        port,
        origin,
    }
}

fn from_pod(destination: &str, port: u16) -> Flow {
    flow(Origin::Pod, CLIENT_POD, Protocol::Tcp, destination, port)
}

fn from_node(destination: &str, port: u16) -> Flow {
    flow(Origin::Node, NODE_IP, Protocol::Tcp, destination, port)
}

fn from_outside(destination: &str, port: u16) -> Flow {
    flow(
        Origin::External,
        EXTERNAL_CLIENT,
        Protocol::Tcp,
        destination,
        port,
    )
}

/// Traces `flow` through `payload` on the standard node; panics on errors.
#[track_caller]
fn outcome_of(payload: &str, flow: &Flow) -> Outcome {
    match trace(payload, flow, &NODE_IPS) {
        Ok(outcome) => outcome,
        Err(error) => panic!("{error}"),
    }
}

fn endpoints(targets: &[(&str, bool)]) -> Outcome {
    Outcome::Endpoints(
        targets
            .iter()
            .map(|(target, masquerade)| (target.parse().unwrap(), *masquerade))
            .collect(),
    )
}

#[track_caller]
fn unsupported_what(payload: &str) -> String {
    match Ruleset::parse(payload) {
        Err(TraceError::Unsupported { what, .. }) => what,
        other => panic!("expected an unsupported rule, got {other:?}"),
    }
}

/// One Service `10.96.0.10:80/TCP` with two endpoints, hairpin masquerade, and node port 30080:
/// the shape `render_nat` writes, with its POSTROUTING rules.
const TWO_ENDPOINTS: &str = r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SVC-WEB - [0:0]
:KUBE-SEP-WEB1 - [0:0]
:KUBE-SEP-WEB2 - [0:0]
:KUBE-EXT-WEB - [0:0]
-A KUBE-SERVICES -m comment --comment "default/web: cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j KUBE-SVC-WEB
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -m comment --comment default/web: -m tcp -p tcp --dport 30080 -j KUBE-EXT-WEB
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SVC-WEB -m comment --comment "default/web: -> 10.244.1.10:8080" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-WEB1
-A KUBE-SVC-WEB -m comment --comment "default/web: -> 10.244.2.10:8080" -j KUBE-SEP-WEB2
-A KUBE-SEP-WEB1 -m comment --comment default/web: -s 10.244.1.10 -j KUBE-MARK-MASQ
-A KUBE-SEP-WEB1 -m comment --comment default/web: -m tcp -p tcp -j DNAT --to-destination 10.244.1.10:8080
-A KUBE-SEP-WEB2 -m comment --comment default/web: -s 10.244.2.10 -j KUBE-MARK-MASQ
-A KUBE-SEP-WEB2 -m comment --comment default/web: -m tcp -p tcp -j DNAT --to-destination 10.244.2.10:8080
-A KUBE-EXT-WEB -m comment --comment "masquerade traffic for default/web: external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-WEB -j KUBE-SVC-WEB
COMMIT
"#;

// ---------------------------------------------------------------------------------------------
// nat: matches, jumps, branches, marks

#[test]
fn cluster_ip_traffic_reaches_both_endpoints_of_a_random_choice() {
    assert_eq!(
        outcome_of(TWO_ENDPOINTS, &from_pod("10.96.0.10", 80)),
        endpoints(&[("10.244.1.10:8080", false), ("10.244.2.10:8080", false)])
    );
}

#[test]
fn node_traffic_goes_through_output_and_reaches_the_same_endpoints() {
    assert_eq!(
        outcome_of(TWO_ENDPOINTS, &from_node("10.96.0.10", 80)),
        endpoints(&[("10.244.1.10:8080", false), ("10.244.2.10:8080", false)])
    );
}

#[test]
fn node_port_traffic_is_marked_and_masqueraded() {
    assert_eq!(
        outcome_of(TWO_ENDPOINTS, &from_outside("198.18.0.11", 30080)),
        endpoints(&[("10.244.1.10:8080", true), ("10.244.2.10:8080", true)])
    );
}

#[test]
fn node_ports_match_only_on_node_addresses() {
    assert_eq!(
        outcome_of(TWO_ENDPOINTS, &from_outside("198.18.0.12", 30080)),
        Outcome::Pass
    );
}

#[test]
fn endpoint_reaching_itself_is_masqueraded_on_that_branch_only() {
    let hairpin = flow(
        Origin::Pod,
        ip("10.244.2.10"),
        Protocol::Tcp,
        "10.96.0.10",
        80,
    );
    assert_eq!(
        outcome_of(TWO_ENDPOINTS, &hairpin),
        endpoints(&[("10.244.1.10:8080", false), ("10.244.2.10:8080", true)])
    );
}

#[test]
fn other_ports_protocols_and_addresses_pass() {
    let udp = flow(Origin::Pod, CLIENT_POD, Protocol::Udp, "10.96.0.10", 80);
    for flow in [
        from_pod("10.96.0.10", 443),
        udp,
        from_pod("10.96.0.11", 80),
        from_pod("10.244.1.10", 8080),
    ] {
        assert_eq!(outcome_of(TWO_ENDPOINTS, &flow), Outcome::Pass, "{flow:?}");
    }
}

#[test]
fn probability_one_always_matches_and_zero_never_does() {
    let payload = r"*nat
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -d 10.96.0.10 -m statistic --mode random --probability 0.0000000000 -j DNAT --to-destination 10.244.1.10:8080
-A KUBE-SERVICES -d 10.96.0.10 -m statistic --mode random --probability 1.0000000000 -j DNAT --to-destination 10.244.2.10:8080
-A KUBE-SERVICES -d 10.96.0.10 -j DNAT --to-destination 10.244.3.10:8080
COMMIT
";
    assert_eq!(
        outcome_of(payload, &from_pod("10.96.0.10", 80)),
        endpoints(&[("10.244.2.10:8080", false)])
    );
}

#[test]
fn three_way_choice_reaches_every_endpoint() {
    let payload = r"*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-A - [0:0]
-A KUBE-SERVICES -d 10.96.0.10 -j KUBE-SVC-A
-A KUBE-SVC-A -m statistic --mode random --probability 0.3333333333 -j DNAT --to-destination 10.244.1.10:8080
-A KUBE-SVC-A -m statistic --mode random --probability 0.5000000000 -j DNAT --to-destination 10.244.2.10:8080
-A KUBE-SVC-A -j DNAT --to-destination 10.244.3.10:8080
COMMIT
";
    assert_eq!(
        outcome_of(payload, &from_pod("10.96.0.10", 80)),
        endpoints(&[
            ("10.244.1.10:8080", false),
            ("10.244.2.10:8080", false),
            ("10.244.3.10:8080", false),
        ])
    );
}

#[test]
fn branch_falling_through_a_service_chain_is_ambiguous() {
    // The last endpoint rule kept its probability: half the connections are not translated.
    let payload = r"*nat
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -d 10.96.0.10 -m statistic --mode random --probability 0.5000000000 -j DNAT --to-destination 10.244.1.10:8080
COMMIT
";
    let error = trace(payload, &from_pod("10.96.0.10", 80), &NODE_IPS).unwrap_err();
    assert_eq!(
        error,
        TraceError::Ambiguous {
            verdicts: vec![
                Verdict::Endpoint {
                    target: "10.244.1.10:8080".parse().unwrap(),
                    masquerade: false
                },
                Verdict::Pass { masquerade: false },
            ]
        }
    );
    assert_eq!(
        error.to_string(),
        "branches end differently: DNAT 10.244.1.10:8080, pass"
    );
}

#[test]
fn user_chain_return_resumes_the_calling_chain() {
    let payload = r"*nat
:KUBE-SERVICES - [0:0]
:KUBE-CHECK - [0:0]
-A KUBE-SERVICES -j KUBE-CHECK
-A KUBE-SERVICES -d 10.96.0.10 -j DNAT --to-destination 10.244.2.10:8080
-A KUBE-CHECK -s 10.244.0.0/24 -j RETURN
-A KUBE-CHECK -j DNAT --to-destination 10.244.1.10:8080
COMMIT
";
    assert_eq!(
        outcome_of(payload, &from_pod("10.96.0.10", 80)),
        endpoints(&[("10.244.2.10:8080", false)])
    );
    let other_pod = flow(
        Origin::Pod,
        ip("10.244.3.3"),
        Protocol::Tcp,
        "10.96.0.10",
        80,
    );
    assert_eq!(
        outcome_of(payload, &other_pod),
        endpoints(&[("10.244.1.10:8080", false)])
    );
}

#[test]
fn accept_in_nat_ends_the_table_untranslated() {
    let payload = r"*nat
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -s 10.244.0.5 -j ACCEPT
-A KUBE-SERVICES -j DNAT --to-destination 10.244.1.10:8080
COMMIT
";
    assert_eq!(
        outcome_of(payload, &from_pod("10.96.0.10", 80)),
        Outcome::Pass
    );
}

#[test]
fn negated_source_marks_traffic_from_outside_the_pod_range() {
    // kube-proxy's local-traffic detector: masquerade what does not come from a pod.
    let payload = r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
-A KUBE-SERVICES -m comment --comment "default/web: cluster IP" ! -s 10.244.0.0/16 -d 10.96.0.10/32 -m tcp -p tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SERVICES -d 10.96.0.10/32 -m tcp -p tcp --dport 80 -j DNAT --to-destination 10.244.1.10:8080
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MASQUERADE
COMMIT
"#;
    assert_eq!(
        outcome_of(payload, &from_pod("10.96.0.10", 80)),
        endpoints(&[("10.244.1.10:8080", false)])
    );
    assert_eq!(
        outcome_of(payload, &from_outside("10.96.0.10", 80)),
        endpoints(&[("10.244.1.10:8080", true)])
    );
}

#[test]
fn source_type_local_matches_node_traffic_and_node_addresses() {
    let payload = r"*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
-A KUBE-SERVICES -m addrtype --src-type LOCAL -j MARK --or-mark 0x4000
-A KUBE-SERVICES -j DNAT --to-destination 10.244.1.10:8080
-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE
COMMIT
";
    let masqueraded = endpoints(&[("10.244.1.10:8080", true)]);
    let direct = endpoints(&[("10.244.1.10:8080", false)]);
    assert_eq!(
        outcome_of(payload, &from_node("10.96.0.10", 80)),
        masqueraded
    );
    // A process on the node using another source address is still local traffic.
    let node_other_source = flow(
        Origin::Node,
        ip("10.244.0.1"),
        Protocol::Tcp,
        "10.96.0.10",
        80,
    );
    assert_eq!(outcome_of(payload, &node_other_source), masqueraded);
    let spoofed = flow(Origin::External, NODE_IP, Protocol::Tcp, "10.96.0.10", 80);
    assert_eq!(outcome_of(payload, &spoofed), masqueraded);
    assert_eq!(outcome_of(payload, &from_pod("10.96.0.10", 80)), direct);
}

#[test]
fn mark_alone_does_not_masquerade_without_the_postrouting_rules() {
    let payload = r"*nat
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A KUBE-SERVICES -j KUBE-MARK-MASQ
-A KUBE-SERVICES -j DNAT --to-destination 10.244.1.10:8080
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
COMMIT
";
    assert_eq!(
        outcome_of(payload, &from_pod("10.96.0.10", 80)),
        endpoints(&[("10.244.1.10:8080", false)])
    );
}

#[test]
fn rules_in_built_in_chains_run_after_the_hooks() {
    // Pods cross PREROUTING (hook first, then its own rule); the node crosses OUTPUT only.
    let payload = r"*nat
:KUBE-SERVICES - [0:0]
:PREROUTING ACCEPT [0:0]
-A KUBE-SERVICES -d 10.96.0.10 -j DNAT --to-destination 10.244.1.10:8080
-A PREROUTING -j DNAT --to-destination 10.244.2.10:8080
COMMIT
";
    assert_eq!(
        outcome_of(payload, &from_pod("10.96.0.10", 80)),
        endpoints(&[("10.244.1.10:8080", false)])
    );
    assert_eq!(
        outcome_of(payload, &from_pod("10.96.0.11", 80)),
        endpoints(&[("10.244.2.10:8080", false)])
    );
    assert_eq!(
        outcome_of(payload, &from_node("10.96.0.11", 80)),
        Outcome::Pass
    );
}

#[test]
fn dnat_without_a_port_keeps_the_destination_port() {
    let payload = r"*nat
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -d 10.96.0.10 -j DNAT --to-destination 10.244.1.10
COMMIT
";
    assert_eq!(
        outcome_of(payload, &from_pod("10.96.0.10", 80)),
        endpoints(&[("10.244.1.10:80", false)])
    );
}

#[test]
fn same_endpoint_masqueraded_on_one_branch_only_is_ambiguous() {
    let payload = r"*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
-A KUBE-SERVICES -m statistic --mode random --probability 0.5 -j MARK --or-mark 0x4000
-A KUBE-SERVICES -j DNAT --to-destination 10.244.1.10:8080
-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE
COMMIT
";
    assert!(matches!(
        trace(payload, &from_pod("10.96.0.10", 80), &NODE_IPS),
        Err(TraceError::Ambiguous { .. })
    ));
}

#[test]
fn chains_that_loop_are_reported() {
    let payload = r"*nat
:KUBE-SERVICES - [0:0]
:KUBE-A - [0:0]
:KUBE-B - [0:0]
-A KUBE-SERVICES -j KUBE-A
-A KUBE-A -j KUBE-B
-A KUBE-B -j KUBE-A
COMMIT
";
    assert!(matches!(
        trace(payload, &from_pod("10.96.0.10", 80), &NODE_IPS),
        Err(TraceError::TooDeep { .. })
    ));
}

/// [`TWO_ENDPOINTS`]' cluster IP with `sessionAffinity: ClientIP`, as `render_nat` writes it.
const STICKY: &str = r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-WEB - [0:0]
:KUBE-SEP-WEB1 - [0:0]
:KUBE-SEP-WEB2 - [0:0]
-A KUBE-SERVICES -m comment --comment "default/web: cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j KUBE-SVC-WEB
-A KUBE-SVC-WEB -m comment --comment "default/web: -> 10.244.1.10:8080" -m recent --name KUBE-SEP-WEB1 --rcheck --seconds 10800 --reap -j KUBE-SEP-WEB1
-A KUBE-SVC-WEB -m comment --comment "default/web: -> 10.244.2.10:8080" -m recent --name KUBE-SEP-WEB2 --rcheck --seconds 10800 --reap -j KUBE-SEP-WEB2
-A KUBE-SVC-WEB -m comment --comment "default/web: -> 10.244.1.10:8080" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-WEB1
-A KUBE-SVC-WEB -m comment --comment "default/web: -> 10.244.2.10:8080" -j KUBE-SEP-WEB2
-A KUBE-SEP-WEB1 -m comment --comment default/web: -m recent --name KUBE-SEP-WEB1 --set -m tcp -p tcp -j DNAT --to-destination 10.244.1.10:8080
-A KUBE-SEP-WEB2 -m comment --comment default/web: -m recent --name KUBE-SEP-WEB2 --set -m tcp -p tcp -j DNAT --to-destination 10.244.2.10:8080
COMMIT
"#;

#[test]
fn session_affinity_leaves_the_reachable_endpoints_unchanged() {
    assert_eq!(
        outcome_of(STICKY, &from_pod("10.96.0.10", 80)),
        endpoints(&[("10.244.1.10:8080", false), ("10.244.2.10:8080", false)])
    );
}

#[test]
fn recent_check_may_or_may_not_match_and_recent_set_always_does() {
    // A remembered client goes to WEB1; any other client falls through the chain untranslated.
    let payload = r"*nat
:KUBE-SERVICES - [0:0]
:KUBE-SEP-WEB1 - [0:0]
-A KUBE-SERVICES -d 10.96.0.10 -m recent --name KUBE-SEP-WEB1 --rcheck --seconds 10 --reap -j KUBE-SEP-WEB1
-A KUBE-SEP-WEB1 -m recent --name KUBE-SEP-WEB1 --set -j DNAT --to-destination 10.244.1.10:8080
COMMIT
";
    let ruleset = Ruleset::parse(payload).unwrap();
    let flow = from_pod("10.96.0.10", 80);
    assert_eq!(
        ruleset.verdicts(&flow, &NODE_IPS).unwrap(),
        BTreeSet::from([
            Verdict::Endpoint {
                target: "10.244.1.10:8080".parse().unwrap(),
                masquerade: false
            },
            Verdict::Pass { masquerade: false },
        ])
    );
    // `--set` on its own is no condition: the DNAT always happens.
    let set_only = r"*nat
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -m recent --name KUBE-SEP-WEB1 --set -j DNAT --to-destination 10.244.1.10:8080
COMMIT
";
    assert_eq!(
        outcome_of(set_only, &flow),
        endpoints(&[("10.244.1.10:8080", false)])
    );
}

#[test]
fn recent_matches_read_back_by_iptables_save_are_understood() {
    // iptables-save spells out the defaults: the full source mask and `--rsource`.
    let payload = r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-SEP-WEB1 - [0:0]
-A KUBE-SERVICES -d 10.96.0.10/32 -m comment --comment "default/web: -> 10.244.1.10:8080" -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-WEB1 --mask 255.255.255.255 --rsource -j KUBE-SEP-WEB1
-A KUBE-SERVICES -d 10.96.0.10/32 -j KUBE-SEP-WEB1
-A KUBE-SEP-WEB1 -p tcp -m comment --comment "default/web:" -m recent --set --name KUBE-SEP-WEB1 --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.244.1.10:8080
COMMIT
"#;
    assert_eq!(
        outcome_of(payload, &from_pod("10.96.0.10", 80)),
        endpoints(&[("10.244.1.10:8080", false)])
    );
}

#[test]
fn recent_options_the_tracer_cannot_model_are_unsupported() {
    let rule = |rule: &str| format!("*nat\n:KUBE-A - [0:0]\n-A KUBE-A {rule}\nCOMMIT\n");
    for (text, what) in [
        ("-m recent --name A --update -j ACCEPT", "option --update"),
        ("-m recent --name A --remove -j ACCEPT", "option --remove"),
        (
            "-m recent --name A --rcheck --mask 255.255.0.0 -j ACCEPT",
            "recent mask 255.255.0.0",
        ),
        (
            "-m recent --name A --rdest --rcheck -j ACCEPT",
            "option --rdest",
        ),
        ("-m recent --rcheck -j ACCEPT", "recent without --name"),
        (
            "-m recent --name A -j ACCEPT",
            "recent without --set or --rcheck",
        ),
        (
            "-m recent --name A --set --rcheck -j ACCEPT",
            "two recent commands",
        ),
        (
            "-m recent --name A --rcheck --reap -j ACCEPT",
            "recent --reap without --seconds",
        ),
        (
            "-m recent --name A ! --rcheck -j ACCEPT",
            "negated --rcheck",
        ),
        ("--name A --set -j ACCEPT", "--name without -m recent"),
    ] {
        assert_eq!(unsupported_what(&rule(text)), what, "{text}");
    }
}

#[test]
fn mark_operations_follow_the_kernel() {
    assert_eq!(MarkOp::Or(0x4000).apply(0x1), 0x4001);
    assert_eq!(MarkOp::Xor(0x4000).apply(0x4001), 0x1);
    assert_eq!(MarkOp::And(0x4000).apply(0x4001), 0x4000);
    assert_eq!(
        MarkOp::SetXmark {
            value: 0x4000,
            mask: 0x4000
        }
        .apply(0x1),
        0x4001
    );
    assert_eq!(
        MarkOp::Set {
            value: 0x2,
            mask: 0xf
        }
        .apply(0xf1),
        0xf2
    );
}

#[test]
fn cidrs_contain_their_own_family_only() {
    let net = Cidr::parse("10.244.0.0/16").unwrap();
    assert!(net.contains(ip("10.244.255.1")));
    assert!(!net.contains(ip("10.245.0.1")));
    assert!(!net.contains(ip("::ffff:10.244.0.1")));
    assert!(
        Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains(ip("203.0.113.7"))
    );
    assert!(
        Cidr::parse("10.244.1.10")
            .unwrap()
            .contains(ip("10.244.1.10"))
    );
    assert!(
        !Cidr::parse("10.244.1.10")
            .unwrap()
            .contains(ip("10.244.1.11"))
    );
    assert!(Cidr::parse("fd00::/8").unwrap().contains(ip("fd00:10::1")));
    assert_eq!(Cidr::parse("10.0.0.0/33"), None);
}

// ---------------------------------------------------------------------------------------------
// filter

/// A Service without endpoints, as kube-proxy writes it: no nat rules, REJECTs in filter.
const NO_ENDPOINTS: &str = r#"*filter
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
-A KUBE-SERVICES -m comment --comment "default/idle: has no endpoints" -m tcp -p tcp -d 10.96.0.20 --dport 80 -j REJECT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/idle: has no endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30081 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
COMMIT
"#;

#[test]
fn cluster_ip_without_endpoints_is_rejected_for_pods_and_the_node() {
    assert_eq!(
        outcome_of(NO_ENDPOINTS, &from_pod("10.96.0.20", 80)),
        Outcome::Reject
    );
    assert_eq!(
        outcome_of(NO_ENDPOINTS, &from_node("10.96.0.20", 80)),
        Outcome::Reject
    );
    assert_eq!(
        outcome_of(NO_ENDPOINTS, &from_pod("10.96.0.20", 81)),
        Outcome::Pass
    );
}

#[test]
fn node_port_without_endpoints_is_rejected_on_input() {
    assert_eq!(
        outcome_of(NO_ENDPOINTS, &from_outside("198.18.0.11", 30081)),
        Outcome::Reject
    );
    assert_eq!(
        outcome_of(NO_ENDPOINTS, &from_pod("198.18.0.11", 30081)),
        Outcome::Reject
    );
    assert_eq!(
        outcome_of(NO_ENDPOINTS, &from_node("198.18.0.11", 30081)),
        Outcome::Reject
    );
    assert_eq!(
        outcome_of(NO_ENDPOINTS, &from_outside("203.0.113.8", 30081)),
        Outcome::Pass
    );
}

#[test]
fn filter_sees_the_translated_destination() {
    // A REJECT for the cluster IP does not catch what nat already sent to an endpoint.
    let payload = r"*filter
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -d 10.96.0.10 -j REJECT
-A KUBE-SERVICES -d 10.244.9.9 -j DROP
COMMIT
*nat
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -d 10.96.0.10 -j DNAT --to-destination 10.244.1.10:8080
-A KUBE-SERVICES -d 10.96.0.11 -j DNAT --to-destination 10.244.9.9:8080
COMMIT
";
    assert_eq!(
        outcome_of(payload, &from_pod("10.96.0.10", 80)),
        endpoints(&[("10.244.1.10:8080", false)])
    );
    assert_eq!(
        outcome_of(payload, &from_pod("10.96.0.11", 80)),
        Outcome::Drop
    );
}

#[test]
fn first_packets_are_new_connections() {
    let payload = r"*filter
:KUBE-FORWARD - [0:0]
:KUBE-SERVICES - [0:0]
-A KUBE-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j DROP
-A KUBE-FORWARD -m conntrack ! --ctstate NEW -j DROP
-A KUBE-SERVICES -d 10.96.0.30 -m conntrack --ctstate NEW -j DROP
COMMIT
";
    assert_eq!(
        outcome_of(payload, &from_pod("10.96.0.10", 80)),
        Outcome::Pass
    );
    assert_eq!(
        outcome_of(payload, &from_pod("10.96.0.30", 80)),
        Outcome::Drop
    );
}

#[test]
fn forward_hooks_run_kube_forward_before_kube_services() {
    // Marked (masqueraded) traffic is accepted by KUBE-FORWARD and never reaches KUBE-SERVICES.
    let payload = r"*filter
:KUBE-FORWARD - [0:0]
:KUBE-SERVICES - [0:0]
-A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-SERVICES -j REJECT
COMMIT
*nat
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -s 203.0.113.0/24 -j MARK --or-mark 0x4000
COMMIT
";
    assert_eq!(
        outcome_of(payload, &from_outside("10.96.0.10", 80)),
        Outcome::Pass
    );
    assert_eq!(
        outcome_of(payload, &from_pod("10.96.0.10", 80)),
        Outcome::Reject
    );
}

#[test]
fn drop_policy_of_a_built_in_chain_drops_what_falls_through() {
    let payload = r"*filter
:FORWARD DROP [0:0]
:KUBE-FORWARD - [0:0]
-A KUBE-FORWARD -s 10.244.0.0/16 -j ACCEPT
COMMIT
";
    assert_eq!(
        outcome_of(payload, &from_pod("10.244.1.10", 8080)),
        Outcome::Pass
    );
    assert_eq!(
        outcome_of(payload, &from_outside("10.244.1.10", 8080)),
        Outcome::Drop
    );
}

#[test]
fn hooks_are_assumed_only_for_declared_chains() {
    let ruleset = Ruleset::parse(NO_ENDPOINTS).unwrap();
    let jumps = |table: &str, chain: &str| -> Vec<String> {
        ruleset.tables[table]
            .chains
            .get(chain)
            .map_or_else(Vec::new, |chain| {
                chain
                    .rules
                    .iter()
                    .map(|rule| match &rule.target {
                        Target::Jump(target) => target.clone(),
                        other => format!("{other:?}"),
                    })
                    .collect()
            })
    };
    assert_eq!(jumps("nat", "PREROUTING"), ["KUBE-SERVICES"]);
    assert_eq!(jumps("nat", "OUTPUT"), ["KUBE-SERVICES"]);
    assert_eq!(jumps("nat", "POSTROUTING"), Vec::<String>::new());
    assert_eq!(jumps("filter", "INPUT"), ["KUBE-EXTERNAL-SERVICES"]);
    assert_eq!(
        jumps("filter", "FORWARD"),
        ["KUBE-FORWARD", "KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES"]
    );
    assert_eq!(jumps("filter", "OUTPUT"), ["KUBE-SERVICES"]);
}

// ---------------------------------------------------------------------------------------------
// What the tracer refuses

#[test]
fn unknown_match_modules_are_unsupported() {
    let payload = r"*nat
:KUBE-SEP-A - [0:0]
-A KUBE-SEP-A -m string --string x --algo bm -j DNAT --to-destination 10.244.1.10:8080
COMMIT
";
    let error = Ruleset::parse(payload).unwrap_err();
    assert_eq!(
        error,
        TraceError::Unsupported {
            rule: "-A KUBE-SEP-A -m string --string x --algo bm -j DNAT --to-destination 10.244.1.10:8080"
                .to_owned(),
            what: "match module string".to_owned(),
        }
    );
}

#[test]
fn unknown_options_and_values_are_unsupported() {
    let rule = |rule: &str| format!("*nat\n:KUBE-A - [0:0]\n-A KUBE-A {rule}\nCOMMIT\n");
    for (text, what) in [
        ("-i eth0 -j ACCEPT", "option -i"),
        ("-p icmp -j ACCEPT", "protocol icmp"),
        ("-m tcp -p tcp --sport 80 -j ACCEPT", "option --sport"),
        (
            "-m tcp -p tcp --dport 30000:30100 -j ACCEPT",
            "port 30000:30100",
        ),
        (
            "--dport 80 -j ACCEPT",
            "--dport without -p or -m tcp|udp|sctp",
        ),
        (
            "-m addrtype --dst-type UNICAST -j ACCEPT",
            "address type UNICAST",
        ),
        (
            "--dst-type LOCAL -j ACCEPT",
            "--dst-type without -m addrtype",
        ),
        (
            "-m statistic --mode nth --every 2 -j ACCEPT",
            "statistic mode nth",
        ),
        (
            "-m statistic --mode random --probability 1.5 -j ACCEPT",
            "probability 1.5",
        ),
        ("-m comment ! --comment x -j ACCEPT", "negated --comment"),
        ("-g KUBE-A", "option -g"),
    ] {
        assert_eq!(unsupported_what(&rule(text)), what, "{text}");
    }
}

#[test]
fn unknown_targets_and_target_options_are_unsupported() {
    let rule =
        |table: &str, rule: &str| format!("*{table}\n:KUBE-A - [0:0]\n-A KUBE-A {rule}\nCOMMIT\n");
    for (payload, what) in [
        (
            rule("nat", "-j LOG"),
            "target LOG (neither a target the tracer knows nor a chain the nat table declares)",
        ),
        (
            rule("nat", "-j KUBE-MISSING"),
            "target KUBE-MISSING (neither a target the tracer knows nor a chain the nat table declares)",
        ),
        (
            rule("nat", "-j PREROUTING"),
            "target PREROUTING (neither a target the tracer knows nor a chain the nat table declares)",
        ),
        (
            rule("nat", "-j SNAT --to-source 198.18.0.11"),
            "SNAT options --to-source 198.18.0.11",
        ),
        (
            rule("nat", "-j DNAT --to-destination 10.244.1.10:80-90"),
            "DNAT destination 10.244.1.10:80-90",
        ),
        (
            rule("nat", "-j DNAT --to-destination 10.244.1.10:80 --random"),
            "DNAT options --to-destination 10.244.1.10:80 --random",
        ),
        (rule("nat", "-j REJECT"), "REJECT in the nat table"),
        (
            rule("filter", "-j DNAT --to-destination 10.244.1.10:80"),
            "DNAT in the filter table",
        ),
        (
            rule("filter", "-j MASQUERADE"),
            "MASQUERADE in the filter table",
        ),
        (rule("nat", "-j MARK --set-mark nope"), "MARK value nope"),
        (rule("nat", "-j ACCEPT --now"), "ACCEPT options --now"),
        (rule("mangle", "-j ACCEPT"), "table mangle"),
    ] {
        assert_eq!(unsupported_what(&payload), what, "{payload}");
    }
}

#[test]
fn targets_reached_from_the_wrong_hook_are_unsupported() {
    // A DNAT jumped to from POSTROUTING: iptables itself refuses it.
    let payload = r"*nat
:KUBE-POSTROUTING - [0:0]
-A KUBE-POSTROUTING -j DNAT --to-destination 10.244.1.10:8080
COMMIT
";
    assert!(matches!(
        trace(payload, &from_pod("10.96.0.10", 80), &NODE_IPS),
        Err(TraceError::Unsupported { what, .. }) if what == "target reached from nat POSTROUTING"
    ));
}

#[test]
fn malformed_payloads_are_parse_errors() {
    for (payload, line, reason) in [
        ("-A KUBE-A -j ACCEPT\n", 1, "line outside a table"),
        ("*nat\n:KUBE-A - [0:0]\n", 2, "table without COMMIT"),
        (
            "*nat\n*filter\n",
            2,
            "table starts before the previous one's COMMIT",
        ),
        ("*nat\nCOMMIT\n*nat\nCOMMIT\n", 3, "table appears twice"),
        (
            "*nat\n-A KUBE-A -j ACCEPT\nCOMMIT\n",
            2,
            "rule for a chain the payload does not declare",
        ),
        (
            "*nat\n:KUBE-A - [0:0]\n-I KUBE-A -j ACCEPT\nCOMMIT\n",
            3,
            "not a chain declaration, -A or -X",
        ),
        (
            "*nat\n:KUBE-A ACCEPT [0:0]\nCOMMIT\n",
            2,
            "chain declaration with an invalid policy",
        ),
        (
            "*nat\n-X PREROUTING\nCOMMIT\n",
            2,
            "deletes a built-in chain",
        ),
        (
            "*nat\n:KUBE-A - [0:0]\n-A KUBE-A -m comment --comment \"x -j ACCEPT\nCOMMIT\n",
            3,
            "unbalanced quotes",
        ),
    ] {
        match Ruleset::parse(payload) {
            Err(TraceError::Parse {
                line: at,
                reason: why,
                ..
            }) => assert_eq!((at, why), (line, reason), "{payload}"),
            other => panic!("{payload}: expected a parse error, got {other:?}"),
        }
    }
}

#[test]
fn deleted_chains_are_gone() {
    let payload = r"*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-OLD - [0:0]
-X KUBE-SVC-OLD
COMMIT
";
    let ruleset = Ruleset::parse(payload).unwrap();
    assert!(!ruleset.tables["nat"].chains.contains_key("KUBE-SVC-OLD"));
    let dangling = r"*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-OLD - [0:0]
-A KUBE-SERVICES -j KUBE-SVC-OLD
-X KUBE-SVC-OLD
COMMIT
";
    assert!(matches!(
        Ruleset::parse(dangling),
        Err(TraceError::Unsupported { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// The shared flow table against the rendered rules

/// What the `family` iptables executor restores for `state` in one transaction (as
/// `FamilyExecutor::sync`).
fn rendered(family: IpFamily, state: &crate::ProxyState, options: &NodeOptions) -> String {
    let filter = render_filter_for(family, state);
    let nat = render_nat_for(family, state, options, &Default::default());
    format!("{}{}", filter.payload, nat.payload)
}

#[test]
fn every_flow_table_row_traces_to_its_expected_outcome() {
    let mut failures = Vec::new();
    for scenario in flow_table::scenarios() {
        let options = scenario.node_options();
        // One ruleset per family, as the two executors program them; each flow goes through its
        // own family's tables, as a packet does.
        let mut rulesets = BTreeMap::new();
        for family in IpFamily::ALL {
            let payload = rendered(family, &scenario.state, &options);
            match Ruleset::parse(&payload) {
                Ok(ruleset) => rulesets.insert(family, (ruleset, payload)),
                Err(error) => panic!("{}: {error}\n{payload}", scenario.name),
            };
        }
        let mut failed_families = BTreeSet::new();
        for case in &scenario.cases {
            let family = if case.flow.destination.is_ipv4() {
                IpFamily::V4
            } else {
                IpFamily::V6
            };
            let (ruleset, _) = &rulesets[&family];
            let traced = ruleset.trace(&case.flow, &scenario.node_ips);
            let passes = matches!(&traced, Ok(outcome) if *outcome == case.expected);
            if let Some(reason) = case.pending {
                let now = if passes {
                    "now passes: clear its `pending`"
                } else {
                    "still fails"
                };
                println!(
                    "pending: {} / {} ({reason}); {now}",
                    scenario.name, case.flow.name
                );
                continue;
            }
            if !passes {
                failed_families.insert(family);
                failures.push(format!(
                    "{} / {}:\n  flow:     {:?}\n  expected: {:?}\n  traced:   {:?}",
                    scenario.name, case.flow.name, case.flow, case.expected, traced
                ));
            }
        }
        for family in failed_families {
            let (_, payload) = &rulesets[&family];
            failures.push(format!(
                "{} rules of {}:\n{payload}",
                family.name(),
                scenario.name
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
