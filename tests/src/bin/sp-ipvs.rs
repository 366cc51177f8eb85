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

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};
use splitproxy_dataplane::Protocol;
use splitproxy_dataplane::ipvs::{
    Ipvs, ListedRealServer, RealServer, ServiceId, VirtualServer, service_flags,
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
    }
    Ok(())
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
