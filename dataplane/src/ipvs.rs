//! The IPVS backend (kube-proxy's `--proxy-mode ipvs`): one IPVS virtual server per Service
//! address and port, its endpoints as masquerading real servers, and the addresses bound to the
//! `kube-ipvs0` dummy interface so the kernel accepts traffic for them.
//!
//! The types here are what the kernel's IPVS tables hold, as its generic netlink family `IPVS`
//! (`include/uapi/linux/ip_vs.h`) reads and writes them; they know nothing of Services.
//! [`Ipvs`] (`client`) reads and writes them in the kernel; `message` holds the IPVS messages,
//! framed by the rust-netlink crates. `interface` binds the Service addresses to `kube-ipvs0` over
//! rtnetlink (netlink-packet-route's messages); both speak through a `connection`, a blocking
//! netlink-sys socket.

pub mod apply;
pub mod backend;
pub mod cleanup;
pub mod client;
pub mod connection;
pub mod diff;
pub mod interface;
pub mod message;
pub mod netfilter;
pub mod plan;
pub mod rules;
pub mod sets;
pub mod sysctl;

pub use client::Ipvs;

use crate::Protocol;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// What identifies a virtual server in the kernel: protocol, address and port (`ipvsadm -t|-u|
/// --sctp-service ADDR:PORT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceId {
    /// TCP, UDP or SCTP.
    pub protocol: Protocol,
    /// The virtual address.
    pub address: IpAddr,
    /// The virtual port.
    pub port: u16,
}

impl fmt::Display for ServiceId {
    /// `tcp 10.96.0.10:80`, `udp [fd00::10]:53`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}",
            self.protocol,
            SocketAddr::new(self.address, self.port)
        )
    }
}

/// A virtual server's flags (`IP_VS_SVC_F_*`).
pub mod service_flags {
    /// Connections from one client go to the same real server for [`super::VirtualServer::timeout`]
    /// seconds (`ipvsadm -p`): kube-proxy's session affinity.
    pub const PERSISTENT: u32 = 0x0001;
    /// Hashed into the kernel's table; the kernel sets it on every service it holds, and ignores
    /// it when told.
    pub const HASHED: u32 = 0x0002;
    /// The `sh` and `mh` schedulers fall back to another real server when the hashed one is
    /// unavailable (`IP_VS_SVC_F_SCHED_SH_FALLBACK`).
    pub const SCHED_FALLBACK: u32 = 0x0008;
    /// The `sh` and `mh` schedulers hash the source port too (`IP_VS_SVC_F_SCHED_SH_PORT`).
    pub const SCHED_PORT: u32 = 0x0010;
}

/// A virtual server: its identity and how it spreads connections.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VirtualServer {
    /// Protocol, address and port.
    pub id: ServiceId,
    /// The scheduler's name (`rr`, `wrr`, `lc`, `wlc`, `sh`, `dh`, `mh`, …); its kernel module is
    /// `ip_vs_<name>`.
    pub scheduler: String,
    /// [`service_flags`], without [`service_flags::HASHED`].
    pub flags: u32,
    /// The persistence timeout in seconds, with [`service_flags::PERSISTENT`]; 0 otherwise.
    pub timeout: u32,
}

/// A real server of a virtual server, reached by masquerading (NAT, `ipvsadm -m`), the only
/// forwarding method kube-proxy uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RealServer {
    /// The endpoint's address.
    pub address: IpAddr,
    /// The endpoint's port.
    pub port: u16,
    /// Its share of new connections: 1, or 0 while it drains (graceful termination).
    pub weight: u32,
}

/// IPVS's idle timeouts for the connections it tracks, in seconds (`ipvsadm --set TCP TCPFIN
/// UDP`); `None` leaves the kernel's value as it is (its defaults are 900, 120 and 300).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// Established TCP connections.
    pub tcp: Option<u32>,
    /// TCP connections after a FIN.
    pub tcp_fin: Option<u32>,
    /// UDP flows.
    pub udp: Option<u32>,
}

impl Timeouts {
    /// Whether every timeout is left as it is.
    #[must_use]
    pub fn is_unset(&self) -> bool {
        *self == Self::default()
    }
}

/// A real server as the kernel lists it, with the connections it still holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedRealServer {
    /// The real server.
    pub server: RealServer,
    /// Established connections.
    pub active_connections: u32,
    /// Connections in other states (closing, or UDP flows).
    pub inactive_connections: u32,
}
