#![allow(clippy::unwrap_used)]

use super::*;
use crate::ipvs::plan::PlannedServer;
use std::net::IpAddr;

fn id(protocol: Protocol, address: &str) -> ServiceId {
    ServiceId {
        protocol,
        address: address.parse().unwrap(),
        port: 80,
    }
}

fn server(id: ServiceId) -> VirtualServer {
    VirtualServer {
        id,
        scheduler: "rr".to_owned(),
        flags: 0,
        timeout: 0,
    }
}

fn real(address: &str, weight: u32) -> RealServer {
    RealServer {
        address: address.parse::<IpAddr>().unwrap(),
        port: 8080,
        weight,
    }
}

fn listed(real: RealServer, connections: u32) -> ListedRealServer {
    ListedRealServer {
        server: real,
        active_connections: connections,
        inactive_connections: 0,
    }
}

fn plan_of(servers: &[(ServiceId, &[RealServer])]) -> Plan {
    Plan {
        servers: servers
            .iter()
            .map(|(id, reals)| {
                let planned = PlannedServer {
                    server: server(*id),
                    real_servers: reals.iter().copied().collect(),
                };
                (*id, planned)
            })
            .collect(),
        ..Plan::default()
    }
}

fn kernel_of(
    servers: &[(VirtualServer, Vec<ListedRealServer>)],
) -> BTreeMap<ServiceId, ListedServer> {
    servers
        .iter()
        .map(|(server, reals)| {
            let listed = ListedServer {
                server: server.clone(),
                real_servers: reals.clone(),
            };
            (server.id, listed)
        })
        .collect()
}

#[test]
fn an_empty_kernel_gets_every_server_then_its_real_servers() {
    let web = id(Protocol::Tcp, "172.30.0.1");
    let plan = plan_of(&[(web, &[real("10.180.0.1", 1)])]);

    let changes = changes(&BTreeMap::new(), &plan, |_| true);

    assert_eq!(
        changes,
        [
            Change::AddServer(server(web)),
            Change::AddRealServer(web, real("10.180.0.1", 1)),
        ]
    );
}

#[test]
fn a_kernel_that_matches_the_plan_needs_no_change() {
    let web = id(Protocol::Tcp, "172.30.0.1");
    let plan = plan_of(&[(web, &[real("10.180.0.1", 1)])]);
    // The kernel lists connection counts; they do not make a difference.
    let kernel = kernel_of(&[(server(web), vec![listed(real("10.180.0.1", 1), 7)])]);

    assert_eq!(changes(&kernel, &plan, |_| true), []);
}

#[test]
fn servers_outside_the_plan_are_deleted_only_when_owned() {
    let ours = id(Protocol::Tcp, "172.30.0.1");
    let theirs = id(Protocol::Tcp, "192.0.2.1");
    let kernel = kernel_of(&[(server(ours), vec![]), (server(theirs), vec![])]);

    let changes = changes(&kernel, &Plan::default(), |id| *id == ours);

    assert_eq!(changes, [Change::DeleteServer(ours)]);
}

#[test]
fn a_changed_scheduler_or_persistence_updates_the_server_in_place() {
    let web = id(Protocol::Tcp, "172.30.0.1");
    let plan = plan_of(&[(web, &[])]);
    let mut old = server(web);
    old.scheduler = "wlc".to_owned();
    old.flags = crate::ipvs::service_flags::PERSISTENT;
    old.timeout = 60;

    let changes = changes(&kernel_of(&[(old, vec![])]), &plan, |_| true);

    assert_eq!(changes, [Change::UpdateServer(server(web))]);
}

#[test]
fn a_tcp_real_server_with_connections_drains_before_it_is_deleted() {
    let web = id(Protocol::Tcp, "172.30.0.1");
    let plan = plan_of(&[(web, &[real("10.180.0.2", 1)])]);
    let old = real("10.180.0.1", 1);
    let kernel = |weight, connections| {
        kernel_of(&[(
            server(web),
            vec![
                listed(RealServer { weight, ..old }, connections),
                listed(real("10.180.0.2", 1), 0),
            ],
        )])
    };

    // Connections open: weight 0, once.
    assert_eq!(
        changes(&kernel(1, 3), &plan, |_| true),
        [Change::UpdateRealServer(web, real("10.180.0.1", 0))]
    );
    assert_eq!(changes(&kernel(0, 3), &plan, |_| true), []);
    // Drained: deleted.
    assert_eq!(
        changes(&kernel(0, 0), &plan, |_| true),
        [Change::DeleteRealServer(web, real("10.180.0.1", 0))]
    );
}

#[test]
fn udp_real_servers_go_at_once_and_a_draining_one_that_returns_gets_its_weight_back() {
    let dns = id(Protocol::Udp, "172.30.0.10");
    let web = id(Protocol::Tcp, "172.30.0.1");
    let plan = plan_of(&[(dns, &[]), (web, &[real("10.180.0.1", 1)])]);
    let kernel = kernel_of(&[
        (server(dns), vec![listed(real("10.180.0.53", 1), 4)]),
        (server(web), vec![listed(real("10.180.0.1", 0), 2)]),
    ]);

    assert_eq!(
        changes(&kernel, &plan, |_| true),
        // In identity order: TCP before UDP.
        [
            Change::UpdateRealServer(web, real("10.180.0.1", 1)),
            Change::DeleteRealServer(dns, real("10.180.0.53", 1)),
        ]
    );
}
