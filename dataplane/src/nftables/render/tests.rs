//! Tests of the render: the rules a full transaction writes for representative states, in both
//! families.
//!
//! Test addresses: the unit tests' plan ([`crate::testing::fixtures`]).
#![allow(clippy::unwrap_used)]

use super::*;
use crate::NodeOptions;
use crate::local_traffic::PodInterfaces;
use crate::nftables::transaction::{Leftovers, transaction};
use crate::testing::fixtures::{ip, local, ready, service, state};
use crate::testing::nftables::{assert_numbers_apart, draining, options_v4, options_v6, tcp};
use crate::testing::rules::assert_rules_eq;
use crate::{Endpoint, Protocol, ServicePort, TrafficPolicy};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Fixtures

/// The full transaction for `state`.
fn full_script(state: &ProxyState, options: &Options) -> String {
    transaction(None, &Rendered::new(state, options), &Leftovers::default()).script
}

/// What the Services of `state` add to a full transaction, after the fixed part.
fn services_part(state: &ProxyState, options: &Options) -> String {
    let fixed = full_script(&ProxyState::default(), options);
    let script = full_script(state, options);
    script
        .strip_prefix(&fixed)
        .unwrap_or_else(|| panic!("the fixed part comes first:\n{script}"))
        .to_owned()
}

// ---------------------------------------------------------------------------------------------
// The fixed part

#[test]
fn the_fixed_part_resets_the_table_to_upstreams_layout() {
    assert_rules_eq(
        &full_script(&ProxyState::default(), &options_v4()),
        r#"add table ip kube-proxy { comment "rules for kube-proxy" ; }
flush table ip kube-proxy
add chain ip kube-proxy filter-prerouting-pre-dnat
delete chain ip kube-proxy filter-prerouting-pre-dnat
add chain ip kube-proxy filter-output-pre-dnat
delete chain ip kube-proxy filter-output-pre-dnat
add chain ip kube-proxy filter-input
delete chain ip kube-proxy filter-input
add chain ip kube-proxy filter-forward
delete chain ip kube-proxy filter-forward
add chain ip kube-proxy filter-output
delete chain ip kube-proxy filter-output
add chain ip kube-proxy nat-prerouting
delete chain ip kube-proxy nat-prerouting
add chain ip kube-proxy nat-output
delete chain ip kube-proxy nat-output
add chain ip kube-proxy nat-postrouting
delete chain ip kube-proxy nat-postrouting
add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }
add chain ip kube-proxy filter-output-pre-dnat { type filter hook output priority -110 ; }
add chain ip kube-proxy filter-input { type filter hook input priority 0 ; }
add chain ip kube-proxy filter-forward { type filter hook forward priority 0 ; }
add chain ip kube-proxy filter-output { type filter hook output priority 0 ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip kube-proxy nodeport-endpoints-check
add chain ip kube-proxy service-endpoints-check
add chain ip kube-proxy firewall-check
add chain ip kube-proxy services
add chain ip kube-proxy masquerading
add chain ip kube-proxy cluster-ips-check
add chain ip kube-proxy reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }
add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }
flush set ip kube-proxy cluster-ips
add set ip kube-proxy nodeport-ips { type ipv4_addr ; comment "IPs that accept NodePort traffic" ; }
flush set ip kube-proxy nodeport-ips
add set ip kube-proxy hairpin-connections { type ipv4_addr . ipv4_addr . inet_proto . inet_service ; comment "service hairpin connections" ; }
flush set ip kube-proxy hairpin-connections
add map ip kube-proxy firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }
flush map ip kube-proxy firewall-ips
add map ip kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }
flush map ip kube-proxy no-endpoint-nodeports
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }
flush map ip kube-proxy no-endpoint-services
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
flush map ip kube-proxy service-ips
add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }
flush map ip kube-proxy service-nodeports
add rule ip kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule ip kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-prerouting-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-output-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip kube-proxy filter-output ct state new jump cluster-ips-check
add rule ip kube-proxy services ip daddr @cluster-ips ip saddr != 10.0.0.0/8 mark set mark or 0x4000 comment "masquerade clusterIP traffic from outside cluster"
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services
add rule ip kube-proxy nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports
add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips
add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"
add rule ip kube-proxy masquerading mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random
add rule ip kube-proxy masquerading ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random
add rule ip kube-proxy reject-chain reject
add element ip kube-proxy nodeport-ips { 192.168.0.2 }
"#,
    );
}

#[test]
fn without_node_port_addresses_every_local_address_but_loopback_takes_node_ports() {
    let options = Options::new(
        IpFamily::V6,
        &NodeOptions::default().with_masquerade_all(true),
    );
    let script = full_script(&ProxyState::default(), &options);

    let relevant: Vec<&str> = script
        .lines()
        .filter(|line| {
            line.contains("nodeport-ips")
                || line.contains("kube-proxy services ")
                || line.contains("kube-proxy nodeport-endpoints-check ")
                || line.contains("kube-proxy cluster-ips-check ")
        })
        .collect();
    assert_rules_eq(
        &relevant.join("\n"),
        r#"add set ip6 kube-proxy nodeport-ips { type ipv6_addr ; comment "IPs that accept NodePort traffic" ; }
delete set ip6 kube-proxy nodeport-ips
add rule ip6 kube-proxy services ip6 daddr @cluster-ips mark set mark or 0x4000 comment "masquerade all clusterIP traffic"
add rule ip6 kube-proxy services ip6 daddr . meta l4proto . th dport vmap @service-ips
add rule ip6 kube-proxy services fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @service-nodeports
add rule ip6 kube-proxy nodeport-endpoints-check ip6 daddr != ::1 meta l4proto . th dport vmap @no-endpoint-nodeports
add rule ip6 kube-proxy cluster-ips-check ip6 daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs""#,
    );
}

#[test]
fn without_a_cluster_cidr_cluster_ip_traffic_is_not_masqueraded() {
    let options = Options::new(IpFamily::V4, &NodeOptions::default());
    let script = full_script(&ProxyState::default(), &options);
    assert!(!script.contains("mark set mark or"), "{script}");
}

#[test]
fn loopback_node_port_addresses_are_left_out() {
    let options = Options::new(
        IpFamily::V4,
        &NodeOptions::default()
            .with_node_port_addresses(Some(vec![ip("127.0.0.1"), ip("192.168.0.2")])),
    );
    let script = full_script(&ProxyState::default(), &options);
    let elements: Vec<&str> = script
        .lines()
        .filter(|line| line.starts_with("add element"))
        .collect();
    assert_eq!(
        elements,
        ["add element ip kube-proxy nodeport-ips { 192.168.0.2 }"]
    );
}

// ---------------------------------------------------------------------------------------------
// Services

/// Upstream's `TestOverallNFTablesRules` state: a ClusterIP Service, an eTP Local load balancer
/// whose only endpoint is elsewhere, a NodePort, an external IP, a load balancer with source
/// ranges and session affinity, and a Service without endpoints.
fn upstreams_overall_example() -> ProxyState {
    let mut svc2 = service(
        "ns2",
        "svc2",
        &["172.30.0.42"],
        vec![tcp("p80", 80, Some(3001), vec![ready("10.180.0.2", 80)])],
    );
    svc2.external_traffic_policy = TrafficPolicy::Local;
    svc2.load_balancer_ips = vec![ip("1.2.3.4")];
    svc2.external_ips = vec![ip("192.168.99.22")];
    svc2.health_check_node_port = Some(30000);
    let mut svc4 = service(
        "ns4",
        "svc4",
        &["172.30.0.44"],
        vec![tcp(
            "p80",
            80,
            None,
            vec![ready("10.180.0.4", 80), local("10.180.0.5", 80)],
        )],
    );
    svc4.external_ips = vec![ip("192.168.99.33")];
    let mut svc5 = service(
        "ns5",
        "svc5",
        &["172.30.0.45"],
        vec![tcp("p80", 80, Some(3002), vec![local("10.180.0.3", 80)])],
    );
    svc5.load_balancer_ips = vec![ip("5.6.7.8")];
    svc5.load_balancer_source_ranges = vec!["203.0.113.0/25".parse().unwrap()];
    svc5.session_affinity = Some(Duration::from_secs(10800));
    state(vec![
        service(
            "ns1",
            "svc1",
            &["172.30.0.41"],
            vec![tcp("p80", 80, None, vec![local("10.180.0.1", 80)])],
        ),
        svc2,
        service(
            "ns3",
            "svc3",
            &["172.30.0.43"],
            vec![tcp("p80", 80, Some(3003), vec![local("10.180.0.3", 80)])],
        ),
        svc4,
        svc5,
        service(
            "ns6",
            "svc6",
            &["172.30.0.46"],
            vec![tcp("p80", 80, None, vec![])],
        ),
    ])
}

#[test]
fn upstreams_overall_example_renders_to_upstreams_rules() {
    // Every rule and element of upstream's expected table for this state is here but its
    // endpoint choices, which pick from the endpoint maps (the maps' elements are upstream's
    // inline ones); the order differs (chains per Service, then one command per set or map), and
    // the endpoint 10.180.0.3 that svc3 and svc5 share is hairpinned once.
    assert_rules_eq(
        &services_part(&upstreams_overall_example(), &options_v4()),
        r#"add map ip kube-proxy endpoints-tcp-42 { typeof numgen random mod 1 : ip daddr . tcp dport ; comment "endpoints of the tcp Service ports picking from endpoints-tcp-42" ; }
flush map ip kube-proxy endpoints-tcp-42
add map ip kube-proxy endpoints-tcp-4A { typeof numgen random mod 1 : ip daddr . tcp dport ; comment "endpoints of the tcp Service ports picking from endpoints-tcp-4A" ; }
flush map ip kube-proxy endpoints-tcp-4A
add map ip kube-proxy endpoints-tcp-LA { typeof numgen random mod 1 : ip daddr . tcp dport ; comment "endpoints of the tcp Service ports picking from endpoints-tcp-LA" ; }
flush map ip kube-proxy endpoints-tcp-LA
add map ip kube-proxy endpoints-tcp-UL { typeof numgen random mod 1 : ip daddr . tcp dport ; comment "endpoints of the tcp Service ports picking from endpoints-tcp-UL" ; }
flush map ip kube-proxy endpoints-tcp-UL
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat ip addr . port to numgen random mod 1 offset 0 map @endpoints-tcp-UL
add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 meta l4proto tcp dnat ip addr . port to numgen random mod 1 offset 0 map @endpoints-tcp-42
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local mark set mark or 0x4000 comment "masquerade local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
add chain ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80
add chain ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 meta l4proto tcp dnat ip addr . port to numgen random mod 1 offset 0 map @endpoints-tcp-4A
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 mark set mark or 0x4000 comment "masquerade"
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 goto service-4AT6LBPK-ns3/svc3/tcp/p80
add chain ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80
add chain ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80
add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 meta l4proto tcp dnat ip addr . port to numgen random mod 2 offset 0 map @endpoints-tcp-LA
add rule ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80 mark set mark or 0x4000 comment "masquerade"
add rule ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80 goto service-LAUZTJTB-ns4/svc4/tcp/p80
add set ip kube-proxy affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }
add chain ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80
add chain ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80
add chain ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80
add chain ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 }
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 mark set mark or 0x4000 comment "masquerade"
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 goto service-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr != { 203.0.113.0/25 } drop
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 update @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ip saddr }
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80
add element ip kube-proxy cluster-ips { 172.30.0.41 , 172.30.0.42 , 172.30.0.43 , 172.30.0.44 , 172.30.0.45 , 172.30.0.46 }
add element ip kube-proxy hairpin-connections { 10.180.0.1 . 10.180.0.1 . tcp . 80 , 10.180.0.3 . 10.180.0.3 . tcp . 80 , 10.180.0.5 . 10.180.0.5 . tcp . 80 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 , 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 , 192.168.99.22 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 , 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 , 172.30.0.43 . tcp . 80 : goto service-4AT6LBPK-ns3/svc3/tcp/p80 , 172.30.0.44 . tcp . 80 : goto service-LAUZTJTB-ns4/svc4/tcp/p80 , 192.168.99.33 . tcp . 80 : goto external-LAUZTJTB-ns4/svc4/tcp/p80 , 172.30.0.45 . tcp . 80 : goto service-HVFWP5L3-ns5/svc5/tcp/p80 , 5.6.7.8 . tcp . 80 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 , tcp . 3003 : goto external-4AT6LBPK-ns3/svc3/tcp/p80 , tcp . 3002 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy no-endpoint-services { 192.168.99.22 . tcp . 80 comment "ns2/svc2:p80" : drop , 1.2.3.4 . tcp . 80 comment "ns2/svc2:p80" : drop , 172.30.0.46 . tcp . 80 comment "ns6/svc6:p80" : goto reject-chain }
add element ip kube-proxy no-endpoint-nodeports { tcp . 3001 comment "ns2/svc2:p80" : drop }
add element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy endpoints-tcp-42 { 0 : 10.180.0.2 . 80 }
add element ip kube-proxy endpoints-tcp-4A { 0 : 10.180.0.3 . 80 }
add element ip kube-proxy endpoints-tcp-LA { 0 : 10.180.0.4 . 80 , 1 : 10.180.0.5 . 80 }
add element ip kube-proxy endpoints-tcp-UL { 0 : 10.180.0.1 . 80 }
"#,
    );
}

#[test]
fn a_port_without_usable_endpoints_is_rejected_and_gets_no_chains() {
    let starting = Endpoint {
        ready: false,
        serving: false,
        ..ready("10.180.0.1", 80)
    };
    let state = state(vec![service(
        "ns1",
        "svc1",
        &["172.30.0.41"],
        vec![tcp("p80", 80, Some(3001), vec![starting])],
    )]);

    assert_rules_eq(
        &services_part(&state, &options_v4()),
        r#"add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy no-endpoint-services { 172.30.0.41 . tcp . 80 comment "ns1/svc1:p80" : goto reject-chain }
add element ip kube-proxy no-endpoint-nodeports { tcp . 3001 comment "ns1/svc1:p80" : goto reject-chain }
"#,
    );
}

#[test]
fn terminating_endpoints_serve_when_none_is_ready() {
    let state = state(vec![service(
        "ns1",
        "svc1",
        &["172.30.0.41"],
        vec![tcp(
            "p80",
            80,
            None,
            vec![
                draining("10.180.0.1", 80, true),
                draining("10.180.2.1", 80, false),
            ],
        )],
    )]);

    assert_rules_eq(
        &services_part(&state, &options_v4()),
        r#"add map ip kube-proxy endpoints-tcp-UL { typeof numgen random mod 1 : ip daddr . tcp dport ; comment "endpoints of the tcp Service ports picking from endpoints-tcp-UL" ; }
flush map ip kube-proxy endpoints-tcp-UL
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat ip addr . port to numgen random mod 2 offset 0 map @endpoints-tcp-UL
add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy hairpin-connections { 10.180.0.1 . 10.180.0.1 . tcp . 80 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip kube-proxy endpoints-tcp-UL { 0 : 10.180.0.1 . 80 , 1 : 10.180.2.1 . 80 }
"#,
    );
}

#[test]
fn internal_traffic_policy_local_uses_local_endpoints_and_drops_without_one() {
    let mut remote_only = service(
        "ns1",
        "itp",
        &["172.30.0.41"],
        vec![tcp("p80", 80, None, vec![ready("10.180.2.1", 80)])],
    );
    remote_only.internal_traffic_policy = TrafficPolicy::Local;
    let mut with_local = service(
        "ns2",
        "itp",
        &["172.30.0.42"],
        vec![tcp(
            "p80",
            80,
            None,
            vec![ready("10.180.2.1", 80), local("10.180.0.1", 80)],
        )],
    );
    with_local.internal_traffic_policy = TrafficPolicy::Local;

    assert_rules_eq(
        &services_part(&state(vec![remote_only, with_local]), &options_v4()),
        r#"add map ip kube-proxy endpoints-tcp-VE { typeof numgen random mod 1 : ip daddr . tcp dport ; comment "endpoints of the tcp Service ports picking from endpoints-tcp-VE" ; }
flush map ip kube-proxy endpoints-tcp-VE
add chain ip kube-proxy local-VEXBCBXN-ns2/itp/tcp/p80
add rule ip kube-proxy local-VEXBCBXN-ns2/itp/tcp/p80 meta l4proto tcp dnat ip addr . port to numgen random mod 1 offset 0 map @endpoints-tcp-VE
add element ip kube-proxy cluster-ips { 172.30.0.41 , 172.30.0.42 }
add element ip kube-proxy hairpin-connections { 10.180.0.1 . 10.180.0.1 . tcp . 80 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto local-VEXBCBXN-ns2/itp/tcp/p80 }
add element ip kube-proxy no-endpoint-services { 172.30.0.41 . tcp . 80 comment "ns1/itp:p80" : drop }
add element ip kube-proxy endpoints-tcp-VE { 0 : 10.180.0.1 . 80 }
"#,
    );
}

fn external_local_service() -> Service {
    let mut service = service(
        "ns1",
        "etp",
        &["172.30.0.41"],
        vec![tcp(
            "p80",
            80,
            Some(3001),
            vec![ready("10.180.2.1", 80), local("10.180.0.1", 80)],
        )],
    );
    service.external_traffic_policy = TrafficPolicy::Local;
    service.load_balancer_ips = vec![ip("1.2.3.4")];
    service
}

#[test]
fn external_traffic_policy_local_keeps_outside_clients_on_local_endpoints() {
    assert_rules_eq(
        &services_part(&state(vec![external_local_service()]), &options_v4()),
        r#"add map ip kube-proxy endpoints-tcp-O4 { typeof numgen random mod 1 : ip daddr . tcp dport ; comment "endpoints of the tcp Service ports picking from endpoints-tcp-O4" ; }
flush map ip kube-proxy endpoints-tcp-O4
add chain ip kube-proxy service-O4B5ELNJ-ns1/etp/tcp/p80
add chain ip kube-proxy local-O4B5ELNJ-ns1/etp/tcp/p80
add chain ip kube-proxy external-O4B5ELNJ-ns1/etp/tcp/p80
add rule ip kube-proxy service-O4B5ELNJ-ns1/etp/tcp/p80 meta l4proto tcp dnat ip addr . port to numgen random mod 2 offset 0 map @endpoints-tcp-O4
add rule ip kube-proxy local-O4B5ELNJ-ns1/etp/tcp/p80 meta l4proto tcp dnat ip addr . port to numgen random mod 1 offset 2 map @endpoints-tcp-O4
add rule ip kube-proxy external-O4B5ELNJ-ns1/etp/tcp/p80 ip saddr 10.0.0.0/8 goto service-O4B5ELNJ-ns1/etp/tcp/p80 comment "short-circuit pod traffic"
add rule ip kube-proxy external-O4B5ELNJ-ns1/etp/tcp/p80 fib saddr type local mark set mark or 0x4000 comment "masquerade local traffic"
add rule ip kube-proxy external-O4B5ELNJ-ns1/etp/tcp/p80 fib saddr type local goto service-O4B5ELNJ-ns1/etp/tcp/p80 comment "short-circuit local traffic"
add rule ip kube-proxy external-O4B5ELNJ-ns1/etp/tcp/p80 goto local-O4B5ELNJ-ns1/etp/tcp/p80
add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy hairpin-connections { 10.180.0.1 . 10.180.0.1 . tcp . 80 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-O4B5ELNJ-ns1/etp/tcp/p80 , 1.2.3.4 . tcp . 80 : goto external-O4B5ELNJ-ns1/etp/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-O4B5ELNJ-ns1/etp/tcp/p80 }
add element ip kube-proxy endpoints-tcp-O4 { 0 : 10.180.2.1 . 80 , 1 : 10.180.0.1 . 80 , 2 : 10.180.0.1 . 80 }
"#,
    );
}

#[test]
fn without_a_cluster_cidr_pod_traffic_follows_the_local_policy_like_any_client() {
    let options = Options::new(IpFamily::V4, &NodeOptions::default());
    let script = services_part(&state(vec![external_local_service()]), &options);
    assert!(!script.contains("short-circuit pod traffic"), "{script}");
    assert!(script.contains("short-circuit local traffic"), "{script}");
}

#[test]
fn load_balancer_source_ranges_apply_even_without_endpoints() {
    let mut service = service(
        "ns1",
        "lb",
        &["172.30.0.41"],
        vec![tcp("p80", 80, Some(3001), vec![])],
    );
    service.load_balancer_ips = vec![ip("1.2.3.4"), ip("5.6.7.8")];
    // The second range holds the node's IP, so the load-balancer IPs are allowed as sources.
    service.load_balancer_source_ranges = vec![
        "203.0.113.0/25".parse().unwrap(),
        "192.168.0.0/24".parse().unwrap(),
        "2001:db8:203::/48".parse().unwrap(),
    ];

    assert_rules_eq(
        &services_part(&state(vec![service]), &options_v4()),
        r#"add chain ip kube-proxy firewall-FCBKHWL6-ns1/lb/tcp/p80
add rule ip kube-proxy firewall-FCBKHWL6-ns1/lb/tcp/p80 ip saddr != { 203.0.113.0/25 , 192.168.0.0/24 , 1.2.3.4 , 5.6.7.8 } drop
add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy no-endpoint-services { 172.30.0.41 . tcp . 80 comment "ns1/lb:p80" : goto reject-chain , 1.2.3.4 . tcp . 80 comment "ns1/lb:p80" : goto reject-chain , 5.6.7.8 . tcp . 80 comment "ns1/lb:p80" : goto reject-chain }
add element ip kube-proxy no-endpoint-nodeports { tcp . 3001 comment "ns1/lb:p80" : goto reject-chain }
add element ip kube-proxy firewall-ips { 1.2.3.4 . tcp . 80 : goto firewall-FCBKHWL6-ns1/lb/tcp/p80 , 5.6.7.8 . tcp . 80 : goto firewall-FCBKHWL6-ns1/lb/tcp/p80 }
"#,
    );
}

#[test]
fn ipv6_session_affinity_goes_through_endpoint_chains_and_affinity_sets() {
    let mut service = service(
        "ns1",
        "svc1",
        &["fd00:172:30::41"],
        vec![tcp(
            "p80",
            80,
            None,
            vec![local("fd00:10:180::1", 80), ready("fd00:10:180:2::1", 80)],
        )],
    );
    service.session_affinity = Some(Duration::from_secs(10800));

    assert_rules_eq(
        &services_part(&state(vec![service]), &options_v6()),
        r#"add set ip6 kube-proxy affinity-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 { type ipv6_addr ; flags dynamic,timeout ; timeout 10800s ; }
add set ip6 kube-proxy affinity-PIHD7EGB-ns1/svc1/tcp/p80__fd00.10.180.2..1/80 { type ipv6_addr ; flags dynamic,timeout ; timeout 10800s ; }
add chain ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip6 kube-proxy endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80
add chain ip6 kube-proxy endpoint-PIHD7EGB-ns1/svc1/tcp/p80__fd00.10.180.2..1/80
add rule ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip6 saddr @affinity-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 goto endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80
add rule ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip6 saddr @affinity-PIHD7EGB-ns1/svc1/tcp/p80__fd00.10.180.2..1/80 goto endpoint-PIHD7EGB-ns1/svc1/tcp/p80__fd00.10.180.2..1/80
add rule ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 , 1 : goto endpoint-PIHD7EGB-ns1/svc1/tcp/p80__fd00.10.180.2..1/80 }
add rule ip6 kube-proxy endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 update @affinity-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 { ip6 saddr }
add rule ip6 kube-proxy endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 meta l4proto tcp dnat to [fd00:10:180::1]:80
add rule ip6 kube-proxy endpoint-PIHD7EGB-ns1/svc1/tcp/p80__fd00.10.180.2..1/80 update @affinity-PIHD7EGB-ns1/svc1/tcp/p80__fd00.10.180.2..1/80 { ip6 saddr }
add rule ip6 kube-proxy endpoint-PIHD7EGB-ns1/svc1/tcp/p80__fd00.10.180.2..1/80 meta l4proto tcp dnat to [fd00:10:180:2::1]:80
add element ip6 kube-proxy cluster-ips { fd00:172:30::41 }
add element ip6 kube-proxy hairpin-connections { fd00:10:180::1 . fd00:10:180::1 . tcp . 80 }
add element ip6 kube-proxy service-ips { fd00:172:30::41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
"#,
    );
}

#[test]
fn each_family_renders_only_its_own_addresses_of_a_dual_stack_service() {
    let mut dual = service(
        "ns1",
        "dual",
        &["172.30.0.41", "fd00:172:30::41"],
        vec![ServicePort::new(
            "dns",
            Protocol::Udp,
            53,
            None,
            vec![ready("10.180.2.1", 53), ready("fd00:10:180:2::1", 53)],
        )],
    );
    dual.external_ips = vec![ip("192.168.99.11"), ip("2001:db8:99::11")];
    let state = state(vec![dual]);

    assert_rules_eq(
        &services_part(&state, &options_v4()),
        r#"add map ip kube-proxy endpoints-udp-BN { typeof numgen random mod 1 : ip daddr . udp dport ; comment "endpoints of the udp Service ports picking from endpoints-udp-BN" ; }
flush map ip kube-proxy endpoints-udp-BN
add chain ip kube-proxy service-BNWQTOD7-ns1/dual/udp/dns
add chain ip kube-proxy external-BNWQTOD7-ns1/dual/udp/dns
add rule ip kube-proxy service-BNWQTOD7-ns1/dual/udp/dns meta l4proto udp dnat ip addr . port to numgen random mod 1 offset 0 map @endpoints-udp-BN
add rule ip kube-proxy external-BNWQTOD7-ns1/dual/udp/dns mark set mark or 0x4000 comment "masquerade"
add rule ip kube-proxy external-BNWQTOD7-ns1/dual/udp/dns goto service-BNWQTOD7-ns1/dual/udp/dns
add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy service-ips { 172.30.0.41 . udp . 53 : goto service-BNWQTOD7-ns1/dual/udp/dns , 192.168.99.11 . udp . 53 : goto external-BNWQTOD7-ns1/dual/udp/dns }
add element ip kube-proxy endpoints-udp-BN { 0 : 10.180.2.1 . 53 }
"#,
    );
    assert_rules_eq(
        &services_part(&state, &options_v6()),
        r#"add map ip6 kube-proxy endpoints-udp-BN { typeof numgen random mod 1 : ip6 daddr . udp dport ; comment "endpoints of the udp Service ports picking from endpoints-udp-BN" ; }
flush map ip6 kube-proxy endpoints-udp-BN
add chain ip6 kube-proxy service-BNWQTOD7-ns1/dual/udp/dns
add chain ip6 kube-proxy external-BNWQTOD7-ns1/dual/udp/dns
add rule ip6 kube-proxy service-BNWQTOD7-ns1/dual/udp/dns meta l4proto udp dnat ip6 addr . port to numgen random mod 1 offset 0 map @endpoints-udp-BN
add rule ip6 kube-proxy external-BNWQTOD7-ns1/dual/udp/dns mark set mark or 0x4000 comment "masquerade"
add rule ip6 kube-proxy external-BNWQTOD7-ns1/dual/udp/dns goto service-BNWQTOD7-ns1/dual/udp/dns
add element ip6 kube-proxy cluster-ips { fd00:172:30::41 }
add element ip6 kube-proxy service-ips { fd00:172:30::41 . udp . 53 : goto service-BNWQTOD7-ns1/dual/udp/dns , 2001:db8:99::11 . udp . 53 : goto external-BNWQTOD7-ns1/dual/udp/dns }
add element ip6 kube-proxy endpoints-udp-BN { 0 : fd00:10:180:2::1 . 53 }
"#,
    );
}

#[test]
fn a_service_without_a_cluster_ip_of_the_family_renders_nothing() {
    let state = state(vec![service(
        "ns1",
        "v6only",
        &["fd00:172:30::41"],
        vec![tcp(
            "p80",
            80,
            Some(3001),
            vec![ready("fd00:10:180:2::1", 80)],
        )],
    )]);
    assert_eq!(services_part(&state, &options_v4()), "");
}

#[test]
fn topology_excluded_endpoints_leave_the_cluster_chain_but_not_the_local_one() {
    let elsewhere = Endpoint {
        topology_excluded: true,
        ..local("10.180.0.1", 80)
    };
    let mut service = service(
        "ns1",
        "topo",
        &["172.30.0.41"],
        vec![tcp(
            "p80",
            80,
            None,
            vec![elsewhere, ready("10.180.2.1", 80)],
        )],
    );
    service.internal_traffic_policy = TrafficPolicy::Local;
    service.external_ips = vec![ip("192.168.99.11")];

    let script = services_part(&state(vec![service]), &options_v4());
    assert_eq!(picked(&script, "service"), ["10.180.2.1 . 80"], "{script}");
    assert_eq!(picked(&script, "local"), ["10.180.0.1 . 80"], "{script}");
}

#[test]
fn ports_sharing_an_endpoint_map_never_share_a_number() {
    // 3,000 ports over 1,024 maps: most maps serve several, each with its own numbers.
    let services = (0..3000u16).map(|i| {
        let endpoints = (0..1 + i % 3)
            .map(|e| ready(&format!("10.180.{}.{}", i / 200, i % 200 + 1), 8000 + e))
            .collect();
        let cluster_ip = format!("172.30.{}.{}", i / 250, i % 250 + 1);
        service(
            "ns",
            &format!("svc{i}"),
            &[&cluster_ip],
            vec![tcp("p80", 80, None, endpoints)],
        )
    });
    let rendered = Rendered::new(&state(services.collect()), &options_v4());

    assert_numbers_apart(&rendered);
    let shared = rendered
        .service_rules()
        .filter(|(_, rules)| rules.slots.iter().any(|slot| slot.offset > 0));
    assert!(shared.count() > 1000, "most maps serve several ports");
}

/// The endpoints the first `{prefix}-…` chain of `script` picks from, in its endpoint map's
/// elements added by `script`.
fn picked(script: &str, prefix: &str) -> Vec<String> {
    let rule = script
        .lines()
        .find(|line| line.starts_with(&format!("add rule ip kube-proxy {prefix}-")))
        .unwrap_or_else(|| panic!("no {prefix} chain in\n{script}"));
    let (pick, map) = rule.split_once(" map @").unwrap();
    let (count, offset) = pick
        .split_once("numgen random mod ")
        .and_then(|(_, numbers)| numbers.split_once(" offset "))
        .unwrap();
    let (count, offset): (u32, u32) = (count.parse().unwrap(), offset.parse().unwrap());
    let command = format!("add element ip kube-proxy {map} {{ ");
    let elements: Vec<&str> = script
        .lines()
        .filter_map(|line| line.strip_prefix(&command)?.strip_suffix(" }"))
        .flat_map(|elements| elements.split(" , "))
        .collect();
    (offset..offset + count)
        .map(|number| {
            let key = format!("{number} : ");
            let element = elements
                .iter()
                .find_map(|element| element.strip_prefix(&key));
            element
                .unwrap_or_else(|| panic!("no element {number} in {map}:\n{script}"))
                .to_owned()
        })
        .collect()
}

#[test]
fn services_sharing_an_element_leave_the_kernels_copy_to_the_first_in_key_order() {
    let mut first = service(
        "ns1",
        "a",
        &["172.30.0.41"],
        vec![tcp("p80", 80, None, vec![local("10.180.0.1", 80)])],
    );
    first.external_ips = vec![ip("192.168.99.11")];
    let mut second = service(
        "ns1",
        "b",
        &["172.30.0.42"],
        vec![tcp("p80", 80, None, vec![local("10.180.0.1", 80)])],
    );
    second.external_ips = vec![ip("192.168.99.11")];

    let script = services_part(&state(vec![second, first]), &options_v4());
    let elements: Vec<String> = script
        .lines()
        .filter_map(|line| line.strip_prefix("add element ip kube-proxy "))
        .flat_map(|command| {
            let (container, list) = command.split_once(" { ").unwrap();
            let list = list.strip_suffix(" }").unwrap();
            list.split(" , ")
                .map(move |element| format!("{container} {element}"))
        })
        .filter(|element| element.contains("192.168.99.11") || element.starts_with("hairpin"))
        .collect();
    assert_eq!(
        elements,
        [
            "hairpin-connections 10.180.0.1 . 10.180.0.1 . tcp . 80",
            "service-ips 192.168.99.11 . tcp . 80 : goto external-VZNH3DV3-ns1/a/tcp/p80",
        ]
    );
}

#[test]
fn an_update_renders_again_only_the_services_that_changed() {
    let before = upstreams_overall_example();
    let rendered = Rendered::new(&before, &options_v4());
    let mut after = before.clone();
    after.insert(service(
        "ns6",
        "svc6",
        &["172.30.0.46"],
        vec![tcp("p80", 80, None, vec![ready("10.180.2.6", 80)])],
    ));

    let updated = rendered.update(&after, &options_v4());

    for key in before.services.keys() {
        let same = std::ptr::eq(
            rendered.service(key).unwrap(),
            updated.service(key).unwrap(),
        );
        assert_eq!(same, key.name != "svc6", "{key}");
    }
    assert_eq!(
        updated.rule_count(),
        Rendered::new(&after, &options_v4()).rule_count()
    );
    assert_eq!(
        updated.element_count(),
        Rendered::new(&after, &options_v4()).element_count()
    );
}

#[test]
fn rendering_ten_thousand_services_takes_linear_time() {
    // Timings belong in benchmarks; this only prints them (`--nocapture`), for a rough idea.
    let services = |count: u32| -> ProxyState {
        (0..count)
            .map(|i| {
                let [_, _, high, low] = i.to_be_bytes();
                let mut service = service(
                    &format!("ns{}", i % 100),
                    &format!("svc{i}"),
                    &[&format!("172.30.{high}.{low}")],
                    vec![tcp(
                        "http",
                        80,
                        Some(30000 + u16::try_from(i % 2000).unwrap()),
                        vec![
                            ready(&format!("10.180.{high}.{low}"), 8080),
                            local(&format!("10.181.{high}.{low}"), 8080),
                        ],
                    )],
                );
                if i % 10 == 0 {
                    service.session_affinity = Some(Duration::from_secs(10800));
                }
                service
            })
            .collect()
    };
    for count in [1_000, 10_000] {
        let state = services(count);
        let start = Instant::now();
        let rendered = Rendered::new(&state, &options_v4());
        let render = start.elapsed();
        let start = Instant::now();
        let full = transaction(None, &rendered, &Leftovers::default());
        let script = start.elapsed();
        let mut changed = state.clone();
        changed.insert(service(
            "ns0",
            "svc0",
            &["172.30.0.0"],
            vec![tcp(
                "http",
                80,
                Some(30000),
                vec![ready("10.180.9.9", 8080)],
            )],
        ));
        let start = Instant::now();
        let updated = rendered.update(&changed, &options_v4());
        let incremental = transaction(Some(&rendered), &updated, &Leftovers::default());
        let one_change = start.elapsed();
        println!(
            "{count} Services: render {render:?}, full script {script:?} ({} bytes, {} rules, {} elements); one Service changed: render and script {one_change:?} ({} bytes)",
            full.script.len(),
            rendered.rule_count(),
            rendered.element_count(),
            incremental.script.len(),
        );
        assert_eq!(
            rendered.chain_count(),
            15 + 2 * usize::try_from(count).unwrap() + usize::try_from(count / 10).unwrap() * 2
        );
    }
}

#[test]
fn pod_interfaces_replace_the_cluster_cidr_as_the_local_traffic_detector() {
    for (interfaces, matched) in [
        (PodInterfaces::Bridge("cni0".to_owned()), "\"cni0\""),
        (PodInterfaces::Prefix("veth".to_owned()), "\"veth*\""),
    ] {
        let options = Options::new(
            IpFamily::V4,
            &NodeOptions::default()
                .with_cluster_cidrs(["10.0.0.0/8".parse().unwrap()])
                .with_pod_interfaces(Some(interfaces)),
        );
        let skeleton = full_script(&ProxyState::default(), &options);
        assert!(
            skeleton.contains(&format!(
                "ip daddr @cluster-ips iifname != {matched} mark set mark or 0x4000 comment \"masquerade clusterIP traffic from outside cluster\""
            )),
            "{skeleton}"
        );
        let services = services_part(&state(vec![external_local_service()]), &options);
        assert!(
            services.contains(&format!("iifname {matched} goto ")),
            "{services}"
        );
        assert!(!services.contains("saddr 10.0.0.0/8"), "{services}");
    }
}

#[test]
fn the_masquerade_bit_sets_every_mark() {
    let options = Options::new(
        IpFamily::V4,
        &NodeOptions::default()
            .with_masquerade_all(true)
            .with_masquerade_bit(0),
    );
    let skeleton = full_script(&ProxyState::default(), &options);
    assert!(
        skeleton.contains("mark set mark or 0x1 comment"),
        "{skeleton}"
    );
    assert!(
        skeleton.contains("mark and 0x1 != 0 mark set mark xor 0x1 masquerade fully-random"),
        "{skeleton}"
    );
    assert!(!skeleton.contains("0x4000"), "{skeleton}");
}
