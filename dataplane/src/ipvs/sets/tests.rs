//! Test addresses: the unit tests' plan ([`crate::testing::fixtures`]); this node's IP, and its
//! one node-port address, is `192.168.0.2` (`2001:db8::1`).
#![allow(clippy::unwrap_used)]

use super::*;
use crate::ipvs::plan::{PlanOptions, plan};
use crate::testing::fixtures::ip;
use crate::testing::rules::assert_rules_eq;
use crate::{Endpoint, ServiceKey};
use std::fmt::Write as _;

fn cidr(text: &str) -> Cidr {
    text.parse().unwrap()
}

/// A ready endpoint, on this node when its address is in this node's pod block.
fn endpoint(address: &str, port: u16) -> Endpoint {
    let is_local = address.starts_with("10.180.0.") || address.starts_with("fd00:10:180::");
    Endpoint {
        is_local,
        ..Endpoint::ready(std::net::SocketAddr::new(ip(address), port))
    }
}

fn port(
    name: &str,
    protocol: Protocol,
    number: u16,
    node_port: Option<u16>,
    endpoints: &[(&str, u16)],
) -> ServicePort {
    let endpoints = endpoints
        .iter()
        .map(|&(address, port)| endpoint(address, port))
        .collect();
    ServicePort::new(name, protocol, number, node_port, endpoints)
}

fn service(key: &str, cluster_ips: &[&str], ports: Vec<ServicePort>) -> Service {
    let (namespace, name) = key.split_once('/').unwrap();
    Service::new(
        ServiceKey::new(namespace, name),
        cluster_ips.iter().map(|text| ip(text)).collect(),
        ports,
    )
}

/// The IPv4 example the rules' tests share too:
///
/// * `kube-system/dns`: cluster IP only, UDP and TCP 53, one local and one remote endpoint;
/// * `web/shop`: node port 30080 under `externalTrafficPolicy: Local`;
/// * `web/lb`: load balancer 1.2.3.9:443 allowing 203.0.113.0/24 and the node's network;
/// * `web/private`: load balancer 1.2.3.10:443 under eTP Local, with health-check node port
///   32000, allowing only the client 203.0.113.7;
/// * `web/legacy`: external IP 192.168.99.50:80;
/// * `tel/sip`: SCTP node port 30060.
pub(crate) fn example_v4() -> ProxyState {
    let dns_endpoints = [("10.180.0.5", 53), ("10.180.2.5", 53)];
    let dns = service(
        "kube-system/dns",
        &["172.30.0.10"],
        vec![
            port("dns", Protocol::Udp, 53, None, &dns_endpoints),
            port("dns-tcp", Protocol::Tcp, 53, None, &dns_endpoints),
        ],
    );
    let shop = Service {
        external_traffic_policy: TrafficPolicy::Local,
        ..service(
            "web/shop",
            &["172.30.0.20"],
            vec![port(
                "http",
                Protocol::Tcp,
                80,
                Some(30080),
                &[("10.180.0.20", 8080), ("10.180.2.20", 8080)],
            )],
        )
    };
    let lb = Service {
        load_balancer_ips: vec![ip("1.2.3.9")],
        load_balancer_source_ranges: vec![cidr("203.0.113.0/24"), cidr("192.168.0.0/16")],
        ..service(
            "web/lb",
            &["172.30.0.30"],
            vec![port(
                "https",
                Protocol::Tcp,
                443,
                Some(30443),
                &[("10.180.2.30", 8443)],
            )],
        )
    };
    let private = Service {
        load_balancer_ips: vec![ip("1.2.3.10")],
        load_balancer_source_ranges: vec![cidr("203.0.113.7/32")],
        external_traffic_policy: TrafficPolicy::Local,
        health_check_node_port: Some(32000),
        ..service(
            "web/private",
            &["172.30.0.31"],
            vec![port(
                "https",
                Protocol::Tcp,
                443,
                Some(30444),
                &[("10.180.0.31", 8443)],
            )],
        )
    };
    let legacy = Service {
        external_ips: vec![ip("192.168.99.50")],
        ..service(
            "web/legacy",
            &["172.30.0.40"],
            vec![port(
                "http",
                Protocol::Tcp,
                80,
                None,
                &[("10.180.2.40", 80)],
            )],
        )
    };
    let sip = service(
        "tel/sip",
        &["172.30.0.50"],
        vec![port(
            "sip",
            Protocol::Sctp,
            5060,
            Some(30060),
            &[("10.180.2.50", 5060)],
        )],
    );
    [dns, shop, lb, private, legacy, sip].into_iter().collect()
}

/// The IPv6 example the rules' tests share too:
///
/// * `web/shop`, dual-stack: node port 30080 and external IPs under `externalTrafficPolicy:
///   Local`, a local endpoint per family and a remote IPv6 one;
/// * `web/quic`: IPv6 only, UDP load balancer 2001:db8:1b::9:443 (an IPv4 load-balancer IP and
///   source range too, which the IPv6 sets skip) allowing only 2001:db8:203::/48, which leaves
///   the node out;
/// * `web/v4`: IPv4 only, which the IPv6 sets skip.
pub(crate) fn example_v6() -> ProxyState {
    let shop = Service {
        external_traffic_policy: TrafficPolicy::Local,
        external_ips: vec![ip("192.168.99.50"), ip("2001:db8:99::50")],
        ..service(
            "web/shop",
            &["172.30.0.20", "fd00:172:30::20"],
            vec![port(
                "http",
                Protocol::Tcp,
                80,
                Some(30080),
                &[
                    ("10.180.0.20", 8080),
                    ("fd00:10:180::20", 8080),
                    ("fd00:10:180:2::20", 8080),
                ],
            )],
        )
    };
    let quic = Service {
        load_balancer_ips: vec![ip("1.2.3.9"), ip("2001:db8:1b::9")],
        load_balancer_source_ranges: vec![cidr("203.0.113.0/24"), cidr("2001:db8:203::/48")],
        ..service(
            "web/quic",
            &["fd00:172:30::30"],
            vec![port(
                "quic",
                Protocol::Udp,
                443,
                Some(30443),
                &[("fd00:10:180:2::30", 8443)],
            )],
        )
    };
    let v4 = service(
        "web/v4",
        &["172.30.0.40"],
        vec![port(
            "http",
            Protocol::Tcp,
            80,
            Some(30040),
            &[("10.180.0.40", 80)],
        )],
    );
    [shop, quic, v4].into_iter().collect()
}

/// This node: `192.168.0.2` and `2001:db8::1`, its IPs and its node-port addresses.
/// The sets of `state` with the plan they go with, the node holding its node IPs.
pub(crate) fn sets_of(state: &ProxyState, options: &SetOptions) -> IpSets {
    let plan = plan(
        state,
        &PlanOptions {
            family: options.family,
            scheduler: "rr".to_owned(),
            node_port_addresses: options.node_port_addresses.clone(),
            local_addresses: options.node_ips.iter().copied().collect(),
        },
    );
    sets(state, &plan, options)
}

pub(crate) fn options(family: IpFamily) -> SetOptions {
    SetOptions {
        family,
        node_port_addresses: vec![ip("192.168.0.2"), ip("2001:db8::1")],
        node_ips: vec![ip("192.168.0.2"), ip("2001:db8::1")],
    }
}

/// The sets as `ipset list` would show their members: each set's name and type, then one
/// entry per line; the closed load balancers last.
fn listing(sets: &IpSets) -> String {
    let mut out = String::new();
    for set in sets.iter() {
        writeln!(out, "{} {}", set.name, set.set_type).unwrap();
        for entry in &set.entries {
            writeln!(out, "  {entry}").unwrap();
        }
    }
    for id in sets.closed_to_node() {
        writeln!(out, "closed to node: {id}").unwrap();
    }
    out
}

fn state(services: impl IntoIterator<Item = Service>) -> ProxyState {
    services.into_iter().collect()
}

#[test]
fn set_ids_are_held_in_the_order_of_all() {
    let sets = IpSets::empty(IpFamily::V4);
    for (position, id) in SetId::ALL.into_iter().enumerate() {
        assert_eq!(id.index(), position, "{id:?}");
        assert_eq!(sets.get(id).name, id.base_name());
    }
}

#[test]
fn every_set_exists_with_upstreams_name_and_type_even_when_nothing_is_programmed() {
    let sets = sets_of(&ProxyState::default(), &options(IpFamily::V4));

    assert_rules_eq(
        &listing(&sets),
        "\
KUBE-LOOP-BACK hash:ip,port,ip
KUBE-CLUSTER-IP hash:ip,port
KUBE-EXTERNAL-IP hash:ip,port
KUBE-EXTERNAL-IP-LOCAL hash:ip,port
KUBE-LOAD-BALANCER hash:ip,port
KUBE-LOAD-BALANCER-LOCAL hash:ip,port
KUBE-LOAD-BALANCER-FW hash:ip,port
KUBE-LOAD-BALANCER-SOURCE-IP hash:ip,port,ip
KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net
KUBE-NODE-PORT-TCP bitmap:port
KUBE-NODE-PORT-LOCAL-TCP bitmap:port
KUBE-NODE-PORT-UDP bitmap:port
KUBE-NODE-PORT-LOCAL-UDP bitmap:port
KUBE-NODE-PORT-SCTP-HASH hash:ip,port
KUBE-NODE-PORT-LOCAL-SCTP-HASH hash:ip,port
KUBE-HEALTH-CHECK-NODE-PORT bitmap:port
KUBE-IPVS-IPS hash:ip
",
    );
}

#[test]
fn ipv6_sets_take_the_kube_6_prefix_cut_to_ipsets_31_characters() {
    let names: Vec<String> = IpSets::empty(IpFamily::V6)
        .iter()
        .map(|set| set.name.clone())
        .collect();

    assert_eq!(
        names,
        [
            "KUBE-6-LOOP-BACK",
            "KUBE-6-CLUSTER-IP",
            "KUBE-6-EXTERNAL-IP",
            "KUBE-6-EXTERNAL-IP-LOCAL",
            "KUBE-6-LOAD-BALANCER",
            "KUBE-6-LOAD-BALANCER-LOCAL",
            "KUBE-6-LOAD-BALANCER-FW",
            "KUBE-6-LOAD-BALANCER-SOURCE-IP",
            "KUBE-6-LOAD-BALANCER-SOURCE-CID",
            "KUBE-6-NODE-PORT-TCP",
            "KUBE-6-NODE-PORT-LOCAL-TCP",
            "KUBE-6-NODE-PORT-UDP",
            "KUBE-6-NODE-PORT-LOCAL-UDP",
            "KUBE-6-NODE-PORT-SCTP-HASH",
            "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS",
            "KUBE-6-HEALTH-CHECK-NODE-PORT",
            "KUBE-6-IPVS-IPS",
        ]
    );
    assert!(
        IpSets::empty(IpFamily::V6)
            .iter()
            .all(|set| set.family == IpFamily::V6)
    );
}

#[test]
fn the_ipv4_example_fills_each_set_as_upstreams_sync_does() {
    let sets = sets_of(&example_v4(), &options(IpFamily::V4));

    // `web/lb` admits the node's network, so its VIP may reach itself; `web/private` does not,
    // so the node is kept from its VIP. Host ranges read as ipset prints them: bare addresses.
    assert_rules_eq(
        &listing(&sets),
        "\
KUBE-LOOP-BACK hash:ip,port,ip
  10.180.0.20,tcp:8080,10.180.0.20
  10.180.0.31,tcp:8443,10.180.0.31
  10.180.0.5,tcp:53,10.180.0.5
  10.180.0.5,udp:53,10.180.0.5
KUBE-CLUSTER-IP hash:ip,port
  172.30.0.10,tcp:53
  172.30.0.10,udp:53
  172.30.0.20,tcp:80
  172.30.0.30,tcp:443
  172.30.0.31,tcp:443
  172.30.0.40,tcp:80
  172.30.0.50,sctp:5060
KUBE-EXTERNAL-IP hash:ip,port
  192.168.99.50,tcp:80
KUBE-EXTERNAL-IP-LOCAL hash:ip,port
KUBE-LOAD-BALANCER hash:ip,port
  1.2.3.10,tcp:443
  1.2.3.9,tcp:443
KUBE-LOAD-BALANCER-LOCAL hash:ip,port
  1.2.3.10,tcp:443
KUBE-LOAD-BALANCER-FW hash:ip,port
  1.2.3.10,tcp:443
  1.2.3.9,tcp:443
KUBE-LOAD-BALANCER-SOURCE-IP hash:ip,port,ip
  1.2.3.9,tcp:443,1.2.3.9
KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net
  1.2.3.10,tcp:443,203.0.113.7
  1.2.3.9,tcp:443,192.168.0.0/16
  1.2.3.9,tcp:443,203.0.113.0/24
KUBE-NODE-PORT-TCP bitmap:port
  30080
  30443
  30444
KUBE-NODE-PORT-LOCAL-TCP bitmap:port
  30080
  30444
KUBE-NODE-PORT-UDP bitmap:port
KUBE-NODE-PORT-LOCAL-UDP bitmap:port
KUBE-NODE-PORT-SCTP-HASH hash:ip,port
  192.168.0.2,sctp:30060
KUBE-NODE-PORT-LOCAL-SCTP-HASH hash:ip,port
KUBE-HEALTH-CHECK-NODE-PORT bitmap:port
  32000
KUBE-IPVS-IPS hash:ip
  1.2.3.10
  1.2.3.9
  172.30.0.10
  172.30.0.20
  172.30.0.30
  172.30.0.31
  172.30.0.40
  172.30.0.50
  192.168.99.50
closed to node: tcp 1.2.3.10:443
",
    );
}

#[test]
fn the_ipv6_sets_hold_only_ipv6_addresses_of_services_with_an_ipv6_cluster_ip() {
    let sets = sets_of(&example_v6(), &options(IpFamily::V6));

    assert_rules_eq(
        &listing(&sets),
        "\
KUBE-6-LOOP-BACK hash:ip,port,ip
  fd00:10:180::20,tcp:8080,fd00:10:180::20
KUBE-6-CLUSTER-IP hash:ip,port
  fd00:172:30::20,tcp:80
  fd00:172:30::30,udp:443
KUBE-6-EXTERNAL-IP hash:ip,port
KUBE-6-EXTERNAL-IP-LOCAL hash:ip,port
  2001:db8:99::50,tcp:80
KUBE-6-LOAD-BALANCER hash:ip,port
  2001:db8:1b::9,udp:443
KUBE-6-LOAD-BALANCER-LOCAL hash:ip,port
KUBE-6-LOAD-BALANCER-FW hash:ip,port
  2001:db8:1b::9,udp:443
KUBE-6-LOAD-BALANCER-SOURCE-IP hash:ip,port,ip
KUBE-6-LOAD-BALANCER-SOURCE-CID hash:ip,port,net
  2001:db8:1b::9,udp:443,2001:db8:203::/48
KUBE-6-NODE-PORT-TCP bitmap:port
  30080
KUBE-6-NODE-PORT-LOCAL-TCP bitmap:port
  30080
KUBE-6-NODE-PORT-UDP bitmap:port
  30443
KUBE-6-NODE-PORT-LOCAL-UDP bitmap:port
KUBE-6-NODE-PORT-SCTP-HASH hash:ip,port
KUBE-6-NODE-PORT-LOCAL-SCTP-HAS hash:ip,port
KUBE-6-HEALTH-CHECK-NODE-PORT bitmap:port
KUBE-6-IPVS-IPS hash:ip
  2001:db8:1b::9
  2001:db8:99::50
  fd00:172:30::20
  fd00:172:30::30
closed to node: udp [2001:db8:1b::9]:443
",
    );
}

#[test]
fn an_external_ip_the_node_holds_is_matched_but_not_bound_nor_filtered() {
    let mut web = service(
        "web/app",
        &["172.30.0.70"],
        vec![port(
            "http",
            Protocol::Tcp,
            80,
            None,
            &[("10.180.2.7", 8080)],
        )],
    );
    // The node's own address, and one it does not hold.
    web.external_ips = vec![ip("192.168.0.2"), ip("192.0.2.70")];
    let state = state([web]);

    let sets = sets_of(&state, &options(IpFamily::V4));

    assert_eq!(
        sets.get(SetId::ExternalIp).entries,
        ["192.0.2.70,tcp:80", "192.168.0.2,tcp:80"]
            .map(str::to_owned)
            .into(),
        "both are Service addresses, masqueraded and let through"
    );
    assert_eq!(
        sets.get(SetId::IpvsIps).entries,
        ["172.30.0.70", "192.0.2.70"].map(str::to_owned).into(),
        "bound, the node's address would have KUBE-IPVS-FILTER close its other ports"
    );
}

#[test]
fn every_local_endpoint_loops_back_whatever_its_readiness() {
    let mut draining = endpoint("10.180.0.7", 8080);
    draining.ready = false;
    draining.terminating = true;
    let mut unready = endpoint("10.180.0.8", 8080);
    unready.ready = false;
    unready.serving = false;
    let mut web = service(
        "web/app",
        &["172.30.0.70"],
        vec![port(
            "http",
            Protocol::Tcp,
            80,
            None,
            &[("10.180.2.7", 8080)],
        )],
    );
    web.ports[0].endpoints.extend([draining, unready]);

    let sets = sets_of(&state([web]), &options(IpFamily::V4));

    assert_eq!(
        sets.get(SetId::LoopBack).entries,
        BTreeSet::from([
            "10.180.0.7,tcp:8080,10.180.0.7".to_owned(),
            "10.180.0.8,tcp:8080,10.180.0.8".to_owned(),
        ])
    );
}

#[test]
fn a_zero_length_source_range_allows_every_source_so_no_firewall_entry_is_made() {
    let open = Service {
        load_balancer_ips: vec![ip("1.2.3.9")],
        load_balancer_source_ranges: vec![cidr("203.0.113.0/24"), cidr("0.0.0.0/0")],
        ..service(
            "web/open",
            &["172.30.0.60"],
            vec![port("https", Protocol::Tcp, 443, None, &[])],
        )
    };

    let sets = sets_of(&state([open]), &options(IpFamily::V4));

    assert!(sets.get(SetId::LoadBalancerFw).entries.is_empty());
    assert!(sets.get(SetId::LoadBalancerSourceCidr).entries.is_empty());
    assert!(sets.closed_to_node().is_empty());
    assert_eq!(sets.get(SetId::LoadBalancer).entries.len(), 1);
}

#[test]
fn source_ranges_of_the_other_family_leave_a_load_balancer_open() {
    // Only an IPv6 range: the IPv4 VIP has no range of its family, so no firewall.
    let mixed = Service {
        load_balancer_ips: vec![ip("1.2.3.9")],
        load_balancer_source_ranges: vec![cidr("2001:db8:203::/48")],
        ..service(
            "web/mixed",
            &["172.30.0.60"],
            vec![port("https", Protocol::Tcp, 443, None, &[])],
        )
    };

    let sets = sets_of(&state([mixed]), &options(IpFamily::V4));

    assert!(sets.get(SetId::LoadBalancerFw).entries.is_empty());
}

#[test]
fn node_ports_and_their_health_check_get_no_entries_without_a_node_port_address_of_the_family() {
    let lb = Service {
        external_traffic_policy: TrafficPolicy::Local,
        health_check_node_port: Some(32000),
        load_balancer_ips: vec![ip("1.2.3.9")],
        ..service(
            "web/lb",
            &["172.30.0.30"],
            vec![
                port("http", Protocol::Tcp, 80, Some(30080), &[]),
                port("sip", Protocol::Sctp, 5060, Some(30060), &[]),
            ],
        )
    };
    // Without a node port the health-check node port is still opened, as upstream
    // (`allocateLoadBalancerNodePorts: false`).
    let no_node_port = Service {
        health_check_node_port: Some(32001),
        ..service(
            "web/direct",
            &["172.30.0.31"],
            vec![port("http", Protocol::Tcp, 80, None, &[])],
        )
    };
    let options = SetOptions {
        node_port_addresses: vec![ip("2001:db8::1")],
        ..options(IpFamily::V4)
    };

    let sets = sets_of(&state([lb, no_node_port]), &options);

    for id in [
        SetId::NodePortTcp,
        SetId::NodePortLocalTcp,
        SetId::NodePortSctp,
        SetId::NodePortLocalSctp,
    ] {
        assert!(sets.get(id).entries.is_empty(), "{id:?}");
    }
    assert_eq!(
        sets.get(SetId::HealthCheckNodePort).entries,
        BTreeSet::from(["32001".to_owned()])
    );
    // The rest of the port is there.
    assert_eq!(sets.get(SetId::LoadBalancerLocal).entries.len(), 2);
}

#[test]
fn sctp_node_ports_are_matched_on_each_node_port_address_of_the_family() {
    let sip = Service {
        external_traffic_policy: TrafficPolicy::Local,
        ..service(
            "tel/sip",
            &["172.30.0.50"],
            vec![port("sip", Protocol::Sctp, 5060, Some(30060), &[])],
        )
    };
    let options = SetOptions {
        node_port_addresses: vec![ip("192.168.0.2"), ip("192.168.1.2"), ip("2001:db8::1")],
        ..options(IpFamily::V4)
    };

    let sets = sets_of(&state([sip]), &options);

    let expected = BTreeSet::from([
        "192.168.0.2,sctp:30060".to_owned(),
        "192.168.1.2,sctp:30060".to_owned(),
    ]);
    assert_eq!(sets.get(SetId::NodePortSctp).entries, expected);
    assert_eq!(sets.get(SetId::NodePortLocalSctp).entries, expected);
    assert!(sets.get(SetId::NodePortTcp).entries.is_empty());
}

#[test]
fn services_without_a_cluster_ip_of_the_family_get_no_entry_at_all() {
    let sets = sets_of(&example_v4(), &options(IpFamily::V6));

    for set in sets.iter() {
        assert!(set.entries.is_empty(), "{}", set.name);
    }
    assert!(sets.closed_to_node().is_empty());
}

/// `kube-system/dns` alone, its one endpoint elsewhere: only the cluster-IP set and the bound
/// addresses have entries.
fn dns_only() -> IpSets {
    let dns = service(
        "kube-system/dns",
        &["172.30.0.10"],
        vec![port("dns", Protocol::Udp, 53, None, &[("10.180.2.5", 53)])],
    );
    sets_of(&state([dns]), &options(IpFamily::V4))
}

#[test]
fn a_first_sync_creates_every_set_and_swaps_in_the_entries_of_those_not_empty() {
    let script = restore_script(None, &dns_only()).unwrap();

    assert_rules_eq(
        &script,
        "\
create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536 -exist
flush KUBE-LOOP-BACK
create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
create KUBE-TMP-ELZJH7TBY5IDBVPW hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
flush KUBE-TMP-ELZJH7TBY5IDBVPW
add KUBE-TMP-ELZJH7TBY5IDBVPW 172.30.0.10,udp:53
swap KUBE-TMP-ELZJH7TBY5IDBVPW KUBE-CLUSTER-IP
destroy KUBE-TMP-ELZJH7TBY5IDBVPW
create KUBE-EXTERNAL-IP hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
flush KUBE-EXTERNAL-IP
create KUBE-EXTERNAL-IP-LOCAL hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
flush KUBE-EXTERNAL-IP-LOCAL
create KUBE-LOAD-BALANCER hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
flush KUBE-LOAD-BALANCER
create KUBE-LOAD-BALANCER-LOCAL hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
flush KUBE-LOAD-BALANCER-LOCAL
create KUBE-LOAD-BALANCER-FW hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
flush KUBE-LOAD-BALANCER-FW
create KUBE-LOAD-BALANCER-SOURCE-IP hash:ip,port,ip family inet hashsize 1024 maxelem 65536 -exist
flush KUBE-LOAD-BALANCER-SOURCE-IP
create KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net family inet hashsize 1024 maxelem 65536 -exist
flush KUBE-LOAD-BALANCER-SOURCE-CIDR
create KUBE-NODE-PORT-TCP bitmap:port range 0-65535 -exist
flush KUBE-NODE-PORT-TCP
create KUBE-NODE-PORT-LOCAL-TCP bitmap:port range 0-65535 -exist
flush KUBE-NODE-PORT-LOCAL-TCP
create KUBE-NODE-PORT-UDP bitmap:port range 0-65535 -exist
flush KUBE-NODE-PORT-UDP
create KUBE-NODE-PORT-LOCAL-UDP bitmap:port range 0-65535 -exist
flush KUBE-NODE-PORT-LOCAL-UDP
create KUBE-NODE-PORT-SCTP-HASH hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
flush KUBE-NODE-PORT-SCTP-HASH
create KUBE-NODE-PORT-LOCAL-SCTP-HASH hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
flush KUBE-NODE-PORT-LOCAL-SCTP-HASH
create KUBE-HEALTH-CHECK-NODE-PORT bitmap:port range 0-65535 -exist
flush KUBE-HEALTH-CHECK-NODE-PORT
create KUBE-IPVS-IPS hash:ip family inet hashsize 1024 maxelem 65536 -exist
create KUBE-TMP-JLUMM2X2AEHLL5GK hash:ip family inet hashsize 1024 maxelem 65536 -exist
flush KUBE-TMP-JLUMM2X2AEHLL5GK
add KUBE-TMP-JLUMM2X2AEHLL5GK 172.30.0.10
swap KUBE-TMP-JLUMM2X2AEHLL5GK KUBE-IPVS-IPS
destroy KUBE-TMP-JLUMM2X2AEHLL5GK
",
    );
}

#[test]
fn nothing_changed_writes_no_script() {
    let sets = sets_of(&example_v4(), &options(IpFamily::V4));

    assert_eq!(restore_script(Some(&sets), &sets), None);
    assert_eq!(restore_script(Some(&sets), &sets.clone()), None);
}

#[test]
fn only_changed_sets_are_written_an_emptied_one_by_a_flush() {
    let before = dns_only();
    // The Service moves to a new cluster IP over TCP; its UDP port is gone.
    let dns = service(
        "kube-system/dns",
        &["172.30.0.11"],
        vec![port("dns-tcp", Protocol::Tcp, 53, Some(30053), &[])],
    );
    let after = sets_of(&state([dns]), &options(IpFamily::V4));

    let script = restore_script(Some(&before), &after).unwrap();

    assert_rules_eq(
        &script,
        "\
create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
create KUBE-TMP-ELZJH7TBY5IDBVPW hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
flush KUBE-TMP-ELZJH7TBY5IDBVPW
add KUBE-TMP-ELZJH7TBY5IDBVPW 172.30.0.11,tcp:53
swap KUBE-TMP-ELZJH7TBY5IDBVPW KUBE-CLUSTER-IP
destroy KUBE-TMP-ELZJH7TBY5IDBVPW
create KUBE-NODE-PORT-TCP bitmap:port range 0-65535 -exist
create KUBE-TMP-XMEGPKXLJPUWR2HN bitmap:port range 0-65535 -exist
flush KUBE-TMP-XMEGPKXLJPUWR2HN
add KUBE-TMP-XMEGPKXLJPUWR2HN 30053
swap KUBE-TMP-XMEGPKXLJPUWR2HN KUBE-NODE-PORT-TCP
destroy KUBE-TMP-XMEGPKXLJPUWR2HN
create KUBE-IPVS-IPS hash:ip family inet hashsize 1024 maxelem 65536 -exist
create KUBE-TMP-JLUMM2X2AEHLL5GK hash:ip family inet hashsize 1024 maxelem 65536 -exist
flush KUBE-TMP-JLUMM2X2AEHLL5GK
add KUBE-TMP-JLUMM2X2AEHLL5GK 172.30.0.11
swap KUBE-TMP-JLUMM2X2AEHLL5GK KUBE-IPVS-IPS
destroy KUBE-TMP-JLUMM2X2AEHLL5GK
",
    );

    // Back to nothing: the sets that had entries are flushed in place.
    let script = restore_script(Some(&after), &IpSets::empty(IpFamily::V4)).unwrap();
    assert_rules_eq(
        &script,
        "\
create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 -exist
flush KUBE-CLUSTER-IP
create KUBE-NODE-PORT-TCP bitmap:port range 0-65535 -exist
flush KUBE-NODE-PORT-TCP
create KUBE-IPVS-IPS hash:ip family inet hashsize 1024 maxelem 65536 -exist
flush KUBE-IPVS-IPS
",
    );
}

#[test]
fn ipv6_sets_are_created_for_inet6_and_built_in_their_own_temporary_sets() {
    let sets = sets_of(&example_v6(), &options(IpFamily::V6));
    let script = restore_script(None, &sets).unwrap();
    let temporary = temporary_name("KUBE-6-LOAD-BALANCER-SOURCE-CID");

    let expected = format!(
        "\
create KUBE-6-LOAD-BALANCER-SOURCE-CID hash:ip,port,net family inet6 hashsize 1024 maxelem 65536 -exist
create {temporary} hash:ip,port,net family inet6 hashsize 1024 maxelem 65536 -exist
flush {temporary}
add {temporary} 2001:db8:1b::9,udp:443,2001:db8:203::/48
swap {temporary} KUBE-6-LOAD-BALANCER-SOURCE-CID
destroy {temporary}
create KUBE-6-NODE-PORT-TCP bitmap:port range 0-65535 -exist
"
    );
    assert!(script.contains(&expected), "{script}");
    assert_ne!(temporary, temporary_name("KUBE-LOAD-BALANCER-SOURCE-CIDR"));
}

#[test]
fn a_set_of_another_type_under_the_same_name_counts_as_changed() {
    let before = dns_only();
    let mut after = before.clone();
    after.sets[SetId::ClusterIp.index()].set_type = SetType::HashIp;

    let script = restore_script(Some(&before), &after).unwrap();

    assert!(script.starts_with("create KUBE-CLUSTER-IP hash:ip family inet"));
}

#[test]
fn temporary_names_fit_and_clash_with_no_set_nor_each_other() {
    let live: Vec<String> = IpFamily::ALL
        .into_iter()
        .flat_map(|family| SetId::ALL.map(|id| id.name(family)))
        .collect();
    let temporary: BTreeSet<String> = live.iter().map(|name| temporary_name(name)).collect();

    assert_eq!(temporary.len(), live.len());
    for name in &temporary {
        assert!(name.len() <= MAX_NAME_LEN, "{name}");
        assert!(!live.contains(name), "{name}");
    }
    for name in &live {
        assert!(name.len() <= MAX_NAME_LEN, "{name}");
    }
    assert_eq!(
        temporary_name("KUBE-CLUSTER-IP"),
        "KUBE-TMP-ELZJH7TBY5IDBVPW"
    );
}
