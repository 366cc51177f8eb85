#![allow(clippy::unwrap_used)]

use super::*;
use crate::ServiceKey;
use crate::testing::fixtures::ip;
use std::time::Duration;

fn endpoint(address: &str, is_local: bool) -> Endpoint {
    Endpoint {
        is_local,
        ..Endpoint::ready(std::net::SocketAddr::new(ip(address), 8080))
    }
}

fn options(family: IpFamily) -> PlanOptions {
    PlanOptions {
        family,
        scheduler: "rr".to_owned(),
        node_port_addresses: vec![ip("192.168.0.2"), ip("fd00::2")],
        local_addresses: [ip("192.168.0.2"), ip("fd00::2")].into(),
    }
}

/// `ns/web` on cluster IP 172.30.0.1 and fd00:172:30::1, port 80 (node port 30080), over one
/// local and one remote endpoint per family.
fn web() -> Service {
    let endpoints = vec![
        endpoint("10.180.0.1", true),
        endpoint("10.180.2.1", false),
        endpoint("fd00:10:180::1", true),
    ];
    let port = ServicePort::new("http", crate::Protocol::Tcp, 80, Some(30_080), endpoints);
    Service::new(
        ServiceKey::new("ns", "web"),
        vec![ip("172.30.0.1"), ip("fd00:172:30::1")],
        vec![port],
    )
}

fn reals(plan: &Plan, address: &str, port: u16) -> Vec<String> {
    let id = ServiceId {
        protocol: crate::Protocol::Tcp,
        address: ip(address),
        port,
    };
    plan.servers[&id]
        .real_servers
        .iter()
        .map(|real| format!("{}:{}/{}", real.address, real.port, real.weight))
        .collect()
}

#[test]
fn a_port_gets_a_virtual_server_per_address_and_node_address_of_its_family() {
    let mut service = web();
    service.external_ips = vec![ip("192.168.99.1")];
    service.load_balancer_ips = vec![ip("1.2.3.4"), ip("fd00:1:2::4")];
    let state: ProxyState = [service].into_iter().collect();

    let plan = plan(&state, &options(IpFamily::V4));

    let ids: Vec<String> = plan
        .servers
        .keys()
        .map(|id| format!("{}:{}", id.address, id.port))
        .collect();
    assert_eq!(
        ids,
        [
            "1.2.3.4:80",
            "172.30.0.1:80",
            "192.168.0.2:30080",
            "192.168.99.1:80"
        ]
    );
    let both = ["10.180.0.1:8080/1", "10.180.2.1:8080/1"];
    assert_eq!(reals(&plan, "172.30.0.1", 80), both);
    assert_eq!(reals(&plan, "192.168.0.2", 30_080), both);
    let bound: Vec<IpAddr> = plan.bound_addresses.iter().copied().collect();
    assert_eq!(bound, [ip("1.2.3.4"), ip("172.30.0.1"), ip("192.168.99.1")]);
    assert!(
        plan.servers
            .values()
            .all(|s| s.server.scheduler == "rr" && s.server.flags == 0)
    );
}

#[test]
fn the_ipv6_plan_sees_only_ipv6_addresses_and_endpoints() {
    let state: ProxyState = [web()].into_iter().collect();

    let plan = plan(&state, &options(IpFamily::V6));

    assert_eq!(
        reals(&plan, "fd00:172:30::1", 80),
        ["fd00:10:180::1:8080/1"]
    );
    assert_eq!(reals(&plan, "fd00::2", 30_080), ["fd00:10:180::1:8080/1"]);
    assert_eq!(plan.servers.len(), 2);
}

#[test]
fn local_traffic_policies_keep_their_traffic_on_local_endpoints() {
    let mut external_local = web();
    external_local.external_traffic_policy = TrafficPolicy::Local;
    let plan_of = |service: Service| plan(&[service].into_iter().collect(), &options(IpFamily::V4));

    let plan = plan_of(external_local);
    assert_eq!(reals(&plan, "172.30.0.1", 80).len(), 2);
    assert_eq!(reals(&plan, "192.168.0.2", 30_080), ["10.180.0.1:8080/1"]);

    let mut internal_local = web();
    internal_local.internal_traffic_policy = TrafficPolicy::Local;
    let plan = plan_of(internal_local);
    assert_eq!(reals(&plan, "172.30.0.1", 80), ["10.180.0.1:8080/1"]);
    assert_eq!(reals(&plan, "192.168.0.2", 30_080).len(), 2);
}

#[test]
fn an_external_ip_the_node_holds_gets_a_virtual_server_but_is_not_bound() {
    let mut service = web();
    service.external_ips = vec![ip("192.168.0.2"), ip("192.0.2.10")];

    let plan = plan(&[service].into_iter().collect(), &options(IpFamily::V4));

    assert_eq!(reals(&plan, "192.168.0.2", 80).len(), 2);
    assert_eq!(reals(&plan, "192.0.2.10", 80).len(), 2);
    assert_eq!(
        plan.bound_addresses,
        [ip("172.30.0.1"), ip("192.0.2.10")].into()
    );
}

#[test]
fn a_port_without_endpoints_keeps_its_virtual_server_empty() {
    let mut service = web();
    service.ports[0].endpoints.clear();

    let plan = plan(&[service].into_iter().collect(), &options(IpFamily::V4));

    assert!(reals(&plan, "172.30.0.1", 80).is_empty());
    assert!(plan.bound_addresses.contains(&ip("172.30.0.1")));
}

#[test]
fn session_affinity_is_persistence_and_mh_hashes_ports_with_fallback() {
    let mut service = web();
    service.session_affinity = Some(Duration::from_secs(10_800));
    let mut options = options(IpFamily::V4);
    options.scheduler = "mh".to_owned();

    let plan = plan(&[service].into_iter().collect(), &options);

    for planned in plan.servers.values() {
        assert_eq!(planned.server.timeout, 10_800);
        assert_eq!(
            planned.server.flags,
            service_flags::PERSISTENT | service_flags::SCHED_FALLBACK | service_flags::SCHED_PORT
        );
        assert_eq!(planned.server.scheduler, "mh");
    }
}
