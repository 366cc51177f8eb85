#![allow(clippy::unwrap_used)]

use super::*;
use crate::ipvs::plan::{PlanOptions, plan};
use crate::{Endpoint, IpFamily, Protocol, ProxyState, Service, ServiceKey, ServicePort};
use std::net::IpAddr;

/// A virtual server's real servers, by address and port.
type RealServers = BTreeMap<(IpAddr, u16), RealServer>;

/// An IPVS table in memory that refuses the scheduler `bogus`, as the kernel refuses one
/// without a module.
#[derive(Default)]
struct FakeTable {
    servers: BTreeMap<ServiceId, (VirtualServer, RealServers)>,
    calls: usize,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct FakeError(&'static str);

impl IpvsTable for FakeTable {
    type Error = FakeError;

    fn services(&mut self) -> Result<Vec<VirtualServer>, FakeError> {
        Ok(self.servers.values().map(|(s, _)| s.clone()).collect())
    }

    fn real_servers(&mut self, id: ServiceId) -> Result<Vec<ListedRealServer>, FakeError> {
        let (_, reals) = self.servers.get(&id).ok_or(FakeError("ENOENT"))?;
        let listed = |real: &RealServer| ListedRealServer {
            server: *real,
            active_connections: 0,
            inactive_connections: 0,
        };
        Ok(reals.values().map(listed).collect())
    }

    fn add_service(&mut self, server: &VirtualServer) -> Result<(), FakeError> {
        self.calls += 1;
        if server.scheduler == "bogus" {
            return Err(FakeError("ENOENT: no such scheduler"));
        }
        self.servers
            .insert(server.id, (server.clone(), BTreeMap::new()));
        Ok(())
    }

    fn update_service(&mut self, server: &VirtualServer) -> Result<(), FakeError> {
        self.calls += 1;
        self.servers
            .get_mut(&server.id)
            .ok_or(FakeError("ENOENT"))?
            .0 = server.clone();
        Ok(())
    }

    fn delete_service(&mut self, id: ServiceId) -> Result<(), FakeError> {
        self.calls += 1;
        self.servers
            .remove(&id)
            .map(drop)
            .ok_or(FakeError("ENOENT"))
    }

    fn add_real_server(&mut self, id: ServiceId, real: RealServer) -> Result<(), FakeError> {
        self.update_real_server(id, real)
    }

    fn update_real_server(&mut self, id: ServiceId, real: RealServer) -> Result<(), FakeError> {
        self.calls += 1;
        let (_, reals) = self.servers.get_mut(&id).ok_or(FakeError("ENOENT"))?;
        reals.insert((real.address, real.port), real);
        Ok(())
    }

    fn delete_real_server(&mut self, id: ServiceId, real: RealServer) -> Result<(), FakeError> {
        self.calls += 1;
        let (_, reals) = self.servers.get_mut(&id).ok_or(FakeError("ENOENT"))?;
        reals
            .remove(&(real.address, real.port))
            .map(drop)
            .ok_or(FakeError("ENOENT"))
    }
}

fn web(index: u8, endpoints: &[&str]) -> Service {
    let endpoints = endpoints
        .iter()
        .map(|ip| Endpoint::ready(std::net::SocketAddr::new(ip.parse().unwrap(), 8080)))
        .collect();
    let port = ServicePort::new("http", Protocol::Tcp, 80, None, endpoints);
    Service::new(
        ServiceKey::new("ns", format!("web{index}")),
        vec![format!("172.30.0.{index}").parse().unwrap()],
        vec![port],
    )
}

fn options(scheduler: &str) -> PlanOptions {
    PlanOptions {
        family: IpFamily::V4,
        scheduler: scheduler.to_owned(),
        node_port_addresses: Vec::new(),
        local_addresses: std::collections::BTreeSet::new(),
    }
}

/// What the table holds, in the plan's shape.
fn held(table: &FakeTable) -> Vec<(VirtualServer, Vec<RealServer>)> {
    table
        .servers
        .values()
        .map(|(server, reals)| (server.clone(), reals.values().copied().collect()))
        .collect()
}

fn planned(plan: &Plan) -> Vec<(VirtualServer, Vec<RealServer>)> {
    plan.servers
        .values()
        .map(|p| (p.server.clone(), p.real_servers.iter().copied().collect()))
        .collect()
}

#[test]
fn a_sync_makes_the_table_the_plan_and_a_second_one_changes_nothing() {
    let state: ProxyState = [web(1, &["10.180.0.1", "10.180.0.2"]), web(2, &[])]
        .into_iter()
        .collect();
    let plan = plan(&state, &options("rr"));
    let mut table = FakeTable::default();

    let first = apply(&mut table, &plan, |_| true).unwrap();
    assert!(first.refused.is_empty(), "{:?}", first.refused);
    assert_eq!(held(&table), planned(&plan));

    let calls = table.calls;
    let second = apply(&mut table, &plan, |_| true).unwrap();
    assert!(second.made.is_empty(), "{:?}", second.made);
    assert_eq!(table.calls, calls);
}

#[test]
fn a_server_the_kernel_refuses_leaves_the_others_programmed() {
    let state: ProxyState = [web(1, &["10.180.0.1"])].into_iter().collect();
    let good = plan(&state, &options("rr"));
    let mut bad = plan(
        &[web(2, &["10.180.0.2"])].into_iter().collect(),
        &options("bogus"),
    );
    bad.servers.extend(good.servers.clone());
    let mut table = FakeTable::default();

    let applied = apply(&mut table, &bad, |_| true).unwrap();

    assert_eq!(held(&table), planned(&good));
    // The refused server's real server was not even tried.
    let refused: Vec<String> = applied
        .refused
        .iter()
        .map(|r| format!("{r}: {}", r.error))
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].contains("no such scheduler"), "{refused:?}");
}

#[test]
fn only_owned_servers_outside_the_plan_are_deleted() {
    let mut table = FakeTable::default();
    let theirs = plan(
        &[web(9, &["10.180.0.9"])].into_iter().collect(),
        &options("wlc"),
    );
    apply(&mut table, &theirs, |_| true).unwrap();
    let ours = plan(
        &[web(1, &["10.180.0.1"])].into_iter().collect(),
        &options("rr"),
    );

    apply(&mut table, &ours, |id| {
        id.address.to_string().starts_with("172.30.0.1")
    })
    .unwrap();

    let mut expected = planned(&theirs);
    expected.extend(planned(&ours));
    expected.sort_by_key(|(server, _)| server.id);
    assert_eq!(held(&table), expected);
}
