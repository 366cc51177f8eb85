//! `sp-ipvs`: drives the dataplane's IPVS netlink client from a shell, so tests in the IPVS VM
//! can check each operation with `ipvsadm`.
//!
//! ```text
//! sp-ipvs add-service tcp 10.96.0.10:80 rr --persistent 10800
//! sp-ipvs add-real tcp 10.96.0.10:80 10.244.1.20:8080 1
//! sp-ipvs set-weight tcp 10.96.0.10:80 10.244.1.20:8080 0
//! sp-ipvs list            # JSON, one virtual server per element with its real servers
//! sp-ipvs delete-real tcp 10.96.0.10:80 10.244.1.20:8080
//! sp-ipvs delete-service tcp 10.96.0.10:80
//! ```
//!
//! Exits 1 with the client's error (which names the kernel's errno) on stderr.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};
use splitproxy_dataplane::ipvs::{
    Ipvs, ListedRealServer, RealServer, ServiceId, VirtualServer,
    apply::apply,
    plan::{PlanOptions, plan},
    service_flags,
};
use splitproxy_dataplane::{
    Cidr, Endpoint, IpFamily, Protocol, ProxyState, Service, ServiceKey, ServicePort,
};

/// Reads and changes the kernel's IPVS virtual and real servers over generic netlink.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Action,
}

#[derive(Subcommand, Debug)]
enum Action {
    /// Adds a virtual server.
    AddService(ServiceArgs),
    /// Changes a virtual server's scheduler and persistence.
    SetService(ServiceArgs),
    /// Deletes a virtual server with its real servers.
    DeleteService {
        #[command(flatten)]
        service: ServiceAddress,
    },
    /// Adds a masquerading real server to a virtual server.
    AddReal(RealArgs),
    /// Changes a real server's weight.
    SetWeight(RealArgs),
    /// Deletes a real server.
    DeleteReal {
        #[command(flatten)]
        service: ServiceAddress,
        /// The real server, `ADDRESS:PORT`.
        real: SocketAddr,
    },
    /// Prints every virtual server with its real servers as JSON.
    List,
    /// Programs IPv4 Services through the IPVS mode's planner and sync, as the agent does, and
    /// prints the changes made and refused as JSON.
    Sync {
        /// One Service each: `PROTOCOL:VIP:PORT=ENDPOINT,ENDPOINT…` (ready endpoints), e.g.
        /// `tcp:10.96.0.10:80=10.244.1.20:8080`; nothing after `=` for none.
        services: Vec<String>,
        /// The scheduler.
        #[arg(long, default_value = "rr")]
        scheduler: String,
        /// Virtual servers at addresses in this CIDR are the sync's to delete; the others are
        /// left alone.
        #[arg(long)]
        own: Cidr,
    },
}

/// A virtual server's identity on the command line.
#[derive(clap::Args, Debug)]
struct ServiceAddress {
    /// tcp, udp or sctp.
    protocol: ProtocolArg,
    /// The virtual server, `ADDRESS:PORT` (`[ADDRESS]:PORT` for IPv6).
    service: SocketAddr,
}

impl ServiceAddress {
    fn id(&self) -> ServiceId {
        ServiceId {
            protocol: self.protocol.into(),
            address: self.service.ip(),
            port: self.service.port(),
        }
    }
}

#[derive(clap::Args, Debug)]
struct ServiceArgs {
    #[command(flatten)]
    service: ServiceAddress,
    /// The scheduler (rr, wrr, lc, wlc, sh, dh, mh, …).
    scheduler: String,
    /// Persistence (ClientIP affinity) for this many seconds.
    #[arg(long, value_name = "SECONDS")]
    persistent: Option<u32>,
}

#[derive(clap::Args, Debug)]
struct RealArgs {
    #[command(flatten)]
    service: ServiceAddress,
    /// The real server, `ADDRESS:PORT`.
    real: SocketAddr,
    /// Its weight: 0 takes no new connections.
    weight: u32,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum ProtocolArg {
    Tcp,
    Udp,
    Sctp,
}

impl From<ProtocolArg> for Protocol {
    fn from(protocol: ProtocolArg) -> Self {
        match protocol {
            ProtocolArg::Tcp => Self::Tcp,
            ProtocolArg::Udp => Self::Udp,
            ProtocolArg::Sctp => Self::Sctp,
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sp-ipvs: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(action: Action) -> Result<()> {
    let mut ipvs = Ipvs::connect()?;
    match action {
        Action::AddService(args) => ipvs.add_service(&virtual_server(&args))?,
        Action::SetService(args) => ipvs.update_service(&virtual_server(&args))?,
        Action::DeleteService { service } => ipvs.delete_service(service.id())?,
        Action::AddReal(args) => ipvs.add_real_server(args.service.id(), real_server(&args))?,
        Action::SetWeight(args) => {
            ipvs.update_real_server(args.service.id(), real_server(&args))?;
        }
        Action::DeleteReal { service, real } => {
            ipvs.delete_real_server(service.id(), real.ip(), real.port())?;
        }
        Action::List => println!("{}", listing(&mut ipvs)?),
        Action::Sync {
            services,
            scheduler,
            own,
        } => {
            let state = services
                .iter()
                .enumerate()
                .map(|(index, spec)| service(index, spec))
                .collect::<Result<ProxyState>>()?;
            let options = PlanOptions {
                family: IpFamily::V4,
                scheduler,
                node_port_addresses: Vec::new(),
                local_addresses: std::collections::BTreeSet::new(),
            };
            let applied = apply(&mut ipvs, &plan(&state, &options), |id| {
                own.contains(id.address)
            })?;
            let made: Vec<String> = applied.made.iter().map(ToString::to_string).collect();
            let refused: Vec<String> = applied
                .refused
                .iter()
                .map(|refused| format!("{refused}: {}", refused.error))
                .collect();
            println!("{}", json!({ "made": made, "refused": refused }));
        }
    }
    Ok(())
}

/// Service number `index` from `PROTOCOL:VIP:PORT=ENDPOINT,…`.
fn service(index: usize, spec: &str) -> Result<Service> {
    let (front, endpoints) = spec.split_once('=').context("no `=` in the Service")?;
    let (protocol, vip) = front
        .split_once(':')
        .context("no protocol in the Service")?;
    let vip: SocketAddr = vip.parse().context("the Service's VIP:PORT")?;
    let protocol = match protocol {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        "sctp" => Protocol::Sctp,
        other => anyhow::bail!("unknown protocol {other:?}"),
    };
    let endpoints = endpoints
        .split(',')
        .filter(|text| !text.is_empty())
        .map(|text| {
            let address: SocketAddr = text.parse().context("an endpoint's ADDRESS:PORT")?;
            Ok(Endpoint::ready(address))
        })
        .collect::<Result<Vec<_>>>()?;
    let port = ServicePort::new("p", protocol, vip.port(), None, endpoints);
    Ok(Service::new(
        ServiceKey::new("sp-ipvs", format!("svc{index}")),
        vec![vip.ip()],
        vec![port],
    ))
}

fn virtual_server(args: &ServiceArgs) -> VirtualServer {
    VirtualServer {
        id: args.service.id(),
        scheduler: args.scheduler.clone(),
        flags: if args.persistent.is_some() {
            service_flags::PERSISTENT
        } else {
            0
        },
        timeout: args.persistent.unwrap_or(0),
    }
}

fn real_server(args: &RealArgs) -> RealServer {
    RealServer {
        address: args.real.ip(),
        port: args.real.port(),
        weight: args.weight,
    }
}

/// `[{"service": "tcp 10.96.0.10:80", "scheduler": …, "flags": …, "timeout": …,
/// "real_servers": [{"address": "10.244.1.20:8080", "weight": …, "active": …, "inactive": …}]}]`
fn listing(ipvs: &mut Ipvs) -> Result<Value> {
    let mut services = Vec::new();
    for server in ipvs.services()? {
        let reals: Vec<Value> = ipvs
            .real_servers(server.id)?
            .iter()
            .map(|listed: &ListedRealServer| {
                json!({
                    "address": SocketAddr::new(listed.server.address, listed.server.port),
                    "weight": listed.server.weight,
                    "active": listed.active_connections,
                    "inactive": listed.inactive_connections,
                })
            })
            .collect();
        services.push(json!({
            "service": server.id.to_string(),
            "scheduler": server.scheduler,
            "flags": server.flags,
            "timeout": server.timeout,
            "real_servers": reals,
        }));
    }
    Ok(Value::Array(services))
}
