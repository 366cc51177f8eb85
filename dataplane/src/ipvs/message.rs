//! The IPVS generic netlink messages, pure: requests for virtual and real servers encoded as
//! `include/uapi/linux/ip_vs.h` lays them out, the kernel's listings decoded back, and the
//! `nlctrl` lookup of the `IPVS` family's id.

use super::netlink::{
    Attributes, DecodeError, NLM_F_ACK, NLM_F_DUMP, Request, fixed, read_str, read_u16, read_u32,
};
use super::{ListedRealServer, RealServer, ServiceId, Timeouts, VirtualServer, service_flags};
use crate::Protocol;
use netlink_packet_core::NetlinkMessage;
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::{GenlHeader, GenlMessage};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The generic netlink family's name (`IPVS_GENL_NAME`).
pub const FAMILY_NAME: &str = "IPVS";
/// `IPVS_GENL_VERSION`.
const VERSION: u8 = 1;

/// The `nlctrl` version asked for: 1, as libnl (and so ipvsadm) sends it. netlink-packet-generic
/// says 2; the kernel takes either.
const CTRL_VERSION: u8 = 1;

/// An IPVS command (`IPVS_CMD_*`); the kernel answers a dump with `NewService` or `NewDest`
/// messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Command {
    /// Adds a virtual server.
    NewService = 1,
    /// Changes a virtual server's scheduler, flags or timeout.
    SetService = 2,
    /// Deletes a virtual server with its real servers.
    DeleteService = 3,
    /// Lists the virtual servers (dump).
    GetService = 4,
    /// Adds a real server to a virtual server.
    NewDest = 5,
    /// Changes a real server's weight or thresholds.
    SetDest = 6,
    /// Deletes a real server.
    DeleteDest = 7,
    /// Lists one virtual server's real servers (dump).
    GetDest = 8,
    /// Sets the connection timeouts.
    SetConfig = 12,
}

// IPVS_CMD_ATTR_*: the top-level attributes, the first two holding nested ones.
const CMD_ATTR_SERVICE: u16 = 1;
const CMD_ATTR_DEST: u16 = 2;
const CMD_ATTR_TIMEOUT_TCP: u16 = 4;
const CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
const CMD_ATTR_TIMEOUT_UDP: u16 = 6;

// IPVS_SVC_ATTR_*.
const SVC_AF: u16 = 1;
const SVC_PROTOCOL: u16 = 2;
const SVC_ADDR: u16 = 3;
const SVC_PORT: u16 = 4;
const SVC_FWMARK: u16 = 5;
const SVC_SCHED_NAME: u16 = 6;
const SVC_FLAGS: u16 = 7;
const SVC_TIMEOUT: u16 = 8;
const SVC_NETMASK: u16 = 9;

// IPVS_DEST_ATTR_*.
const DEST_ADDR: u16 = 1;
const DEST_PORT: u16 = 2;
const DEST_FWD_METHOD: u16 = 3;
const DEST_WEIGHT: u16 = 4;
const DEST_U_THRESH: u16 = 5;
const DEST_L_THRESH: u16 = 6;
const DEST_ACTIVE_CONNS: u16 = 7;
const DEST_INACT_CONNS: u16 = 8;
const DEST_ADDR_FAMILY: u16 = 11;

/// `IP_VS_CONN_F_MASQ`: forwarding by NAT, the only method kube-proxy uses.
const FWD_MASQ: u32 = 0;
/// Address families (`AF_INET`, `AF_INET6`).
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// The request for the id of family [`FAMILY_NAME`] (`CTRL_CMD_GETFAMILY`).
#[must_use]
pub fn family_request() -> NetlinkMessage<GenlMessage<GenlCtrl>> {
    let lookup = GenlCtrl {
        cmd: GenlCtrlCmd::GetFamily,
        nlas: vec![GenlCtrlAttrs::FamilyName(FAMILY_NAME.to_owned())],
    };
    let header = GenlHeader {
        cmd: lookup.cmd.into(),
        version: CTRL_VERSION,
    };
    NetlinkMessage::from(GenlMessage::from_parts(header, lookup))
}

/// The family id in `nlctrl`'s answer to [`family_request`].
///
/// # Errors
///
/// If it lacks `CTRL_ATTR_FAMILY_ID`.
pub fn decode_family_id(reply: GenlMessage<GenlCtrl>) -> Result<u16, DecodeError> {
    reply
        .payload
        .nlas
        .iter()
        .find_map(|attribute| match attribute {
            GenlCtrlAttrs::FamilyId(id) => Some(*id),
            _ => None,
        })
        .ok_or(DecodeError::Missing {
            name: "CTRL_ATTR_FAMILY_ID",
        })
}

/// `NewService` or `SetService` for `server`, asking for an acknowledgement.
#[must_use]
pub fn service_request(family: u16, seq: u32, command: Command, server: &VirtualServer) -> Vec<u8> {
    let mut request = Request::new(family, NLM_F_ACK, seq, command as u8, VERSION);
    request.begin_nested(CMD_ATTR_SERVICE);
    put_service_id(&mut request, server.id);
    request
        .put_str(SVC_SCHED_NAME, &server.scheduler)
        // `struct ip_vs_flags { flags, mask }`: a full mask replaces every flag.
        .put(SVC_FLAGS, &flags_payload(server.flags))
        .put_u32(SVC_TIMEOUT, server.timeout)
        .put_u32(SVC_NETMASK, netmask(server.id.address));
    request.finish()
}

/// `DeleteService` for `id`, asking for an acknowledgement.
#[must_use]
pub fn delete_service_request(family: u16, seq: u32, id: ServiceId) -> Vec<u8> {
    let mut request = Request::new(
        family,
        NLM_F_ACK,
        seq,
        Command::DeleteService as u8,
        VERSION,
    );
    request.begin_nested(CMD_ATTR_SERVICE);
    put_service_id(&mut request, id);
    request.finish()
}

/// `SetConfig` with the timeouts that are set (the kernel keeps the others), asking for an
/// acknowledgement.
#[must_use]
pub fn timeouts_request(family: u16, seq: u32, timeouts: &Timeouts) -> Vec<u8> {
    let mut request = Request::new(family, NLM_F_ACK, seq, Command::SetConfig as u8, VERSION);
    for (kind, seconds) in [
        (CMD_ATTR_TIMEOUT_TCP, timeouts.tcp),
        (CMD_ATTR_TIMEOUT_TCP_FIN, timeouts.tcp_fin),
        (CMD_ATTR_TIMEOUT_UDP, timeouts.udp),
    ] {
        if let Some(seconds) = seconds {
            request.put_u32(kind, seconds);
        }
    }
    request.finish()
}

/// The dump of every virtual server.
#[must_use]
pub fn list_services_request(family: u16, seq: u32) -> Vec<u8> {
    Request::new(family, NLM_F_DUMP, seq, Command::GetService as u8, VERSION).finish()
}

/// `NewDest` or `SetDest` for `server` behind `service`, masquerading, asking for an
/// acknowledgement.
#[must_use]
pub fn real_server_request(
    family: u16,
    seq: u32,
    command: Command,
    service: ServiceId,
    server: RealServer,
) -> Vec<u8> {
    let mut request = service_scoped(family, NLM_F_ACK, seq, command, service);
    request.begin_nested(CMD_ATTR_DEST);
    put_destination(&mut request, server.address, server.port);
    request
        .put_u32(DEST_FWD_METHOD, FWD_MASQ)
        .put_u32(DEST_WEIGHT, server.weight)
        // No connection limits, as kube-proxy sets none.
        .put_u32(DEST_U_THRESH, 0)
        .put_u32(DEST_L_THRESH, 0)
        .put_u16(DEST_ADDR_FAMILY, address_family(server.address));
    request.finish()
}

/// `DeleteDest` for the real server `address`:`port` behind `service`, asking for an
/// acknowledgement.
#[must_use]
pub fn delete_real_server_request(
    family: u16,
    seq: u32,
    service: ServiceId,
    address: IpAddr,
    port: u16,
) -> Vec<u8> {
    let mut request = service_scoped(family, NLM_F_ACK, seq, Command::DeleteDest, service);
    request.begin_nested(CMD_ATTR_DEST);
    put_destination(&mut request, address, port);
    request.finish()
}

/// The dump of `service`'s real servers.
#[must_use]
pub fn list_real_servers_request(family: u16, seq: u32, service: ServiceId) -> Vec<u8> {
    service_scoped(family, NLM_F_DUMP, seq, Command::GetDest, service).finish()
}

/// The virtual server in one message of the services dump; `None` for a firewall-mark service
/// (`ipvsadm -f`), which has no address and port and which kube-proxy never creates.
///
/// # Errors
///
/// If an attribute the kernel always sends is missing or malformed.
pub fn decode_service(message: Attributes<'_>) -> Result<Option<VirtualServer>, DecodeError> {
    let service = Attributes::new(message.require(CMD_ATTR_SERVICE, "IPVS_CMD_ATTR_SERVICE")?);
    if service.find(SVC_FWMARK)?.is_some() && service.find(SVC_ADDR)?.is_none() {
        return Ok(None);
    }
    let family = read_u16(
        service.require(SVC_AF, "IPVS_SVC_ATTR_AF")?,
        "IPVS_SVC_ATTR_AF",
    )?;
    let protocol = read_u16(
        service.require(SVC_PROTOCOL, "IPVS_SVC_ATTR_PROTOCOL")?,
        "IPVS_SVC_ATTR_PROTOCOL",
    )?;
    // `struct ip_vs_flags { flags, mask }`; the mask means nothing in a listing.
    let flags = fixed::<8>(
        service.require(SVC_FLAGS, "IPVS_SVC_ATTR_FLAGS")?,
        "IPVS_SVC_ATTR_FLAGS",
    )?;
    Ok(Some(VirtualServer {
        id: ServiceId {
            protocol: decode_protocol(protocol)?,
            address: decode_address(family, service.require(SVC_ADDR, "IPVS_SVC_ATTR_ADDR")?)?,
            port: decode_port(service.require(SVC_PORT, "IPVS_SVC_ATTR_PORT")?)?,
        },
        scheduler: read_str(
            service.require(SVC_SCHED_NAME, "IPVS_SVC_ATTR_SCHED_NAME")?,
            "IPVS_SVC_ATTR_SCHED_NAME",
        )?
        .to_owned(),
        flags: u32::from_ne_bytes([flags[0], flags[1], flags[2], flags[3]])
            & !service_flags::HASHED,
        timeout: read_u32(
            service.require(SVC_TIMEOUT, "IPVS_SVC_ATTR_TIMEOUT")?,
            "IPVS_SVC_ATTR_TIMEOUT",
        )?,
    }))
}

/// The real server in one message of a real servers dump of `service`.
///
/// # Errors
///
/// If an attribute the kernel always sends is missing or malformed.
pub fn decode_real_server(
    message: Attributes<'_>,
    service: ServiceId,
) -> Result<ListedRealServer, DecodeError> {
    let dest = Attributes::new(message.require(CMD_ATTR_DEST, "IPVS_CMD_ATTR_DEST")?);
    // Kernels before 4.1 send no family: the real server's is then the virtual server's.
    let family = match dest.find(DEST_ADDR_FAMILY)? {
        Some(payload) => read_u16(payload, "IPVS_DEST_ATTR_ADDR_FAMILY")?,
        None => address_family(service.address),
    };
    let u32_attribute = |kind, name| read_u32(dest.require(kind, name)?, name);
    Ok(ListedRealServer {
        server: RealServer {
            address: decode_address(family, dest.require(DEST_ADDR, "IPVS_DEST_ATTR_ADDR")?)?,
            port: decode_port(dest.require(DEST_PORT, "IPVS_DEST_ATTR_PORT")?)?,
            weight: u32_attribute(DEST_WEIGHT, "IPVS_DEST_ATTR_WEIGHT")?,
        },
        active_connections: u32_attribute(DEST_ACTIVE_CONNS, "IPVS_DEST_ATTR_ACTIVE_CONNS")?,
        inactive_connections: u32_attribute(DEST_INACT_CONNS, "IPVS_DEST_ATTR_INACT_CONNS")?,
    })
}

/// A request carrying `service`'s identity in `IPVS_CMD_ATTR_SERVICE`, for the commands on its
/// real servers.
fn service_scoped(
    family: u16,
    flags: u16,
    seq: u32,
    command: Command,
    service: ServiceId,
) -> Request {
    let mut request = Request::new(family, flags, seq, command as u8, VERSION);
    request.begin_nested(CMD_ATTR_SERVICE);
    put_service_id(&mut request, service);
    request.end_nested();
    request
}

fn put_service_id(request: &mut Request, id: ServiceId) {
    request
        .put_u16(SVC_AF, address_family(id.address))
        .put_u16(SVC_PROTOCOL, protocol_number(id.protocol))
        .put(SVC_ADDR, &address_payload(id.address))
        .put(SVC_PORT, &id.port.to_be_bytes());
}

fn put_destination(request: &mut Request, address: IpAddr, port: u16) {
    request
        .put(DEST_ADDR, &address_payload(address))
        .put(DEST_PORT, &port.to_be_bytes());
}

/// `union nf_inet_addr`: 16 bytes, an IPv4 address in the first 4.
fn address_payload(address: IpAddr) -> [u8; 16] {
    match address {
        IpAddr::V4(v4) => {
            let mut bytes = [0; 16];
            bytes[..4].copy_from_slice(&v4.octets());
            bytes
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn flags_payload(flags: u32) -> [u8; 8] {
    let mut payload = [0; 8];
    payload[..4].copy_from_slice(&flags.to_ne_bytes());
    payload[4..].copy_from_slice(&u32::MAX.to_ne_bytes());
    payload
}

/// What ipvsadm sends: a full IPv4 mask, or the IPv6 prefix length (persistence granularity).
fn netmask(address: IpAddr) -> u32 {
    match address {
        IpAddr::V4(_) => u32::MAX,
        IpAddr::V6(_) => 128,
    }
}

fn address_family(address: IpAddr) -> u16 {
    match address {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    }
}

/// The `IPPROTO_*` number.
fn protocol_number(protocol: Protocol) -> u16 {
    match protocol {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

fn decode_protocol(number: u16) -> Result<Protocol, DecodeError> {
    match number {
        6 => Ok(Protocol::Tcp),
        17 => Ok(Protocol::Udp),
        132 => Ok(Protocol::Sctp),
        other => Err(DecodeError::Invalid {
            name: "IPVS_SVC_ATTR_PROTOCOL",
            reason: format!("unknown protocol {other}"),
        }),
    }
}

fn decode_address(family: u16, payload: &[u8]) -> Result<IpAddr, DecodeError> {
    let name = "IPVS_*_ATTR_ADDR";
    match family {
        AF_INET => {
            let bytes: &[u8; 4] = payload
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| DecodeError::Invalid {
                    name,
                    reason: format!("{} bytes for an IPv4 address", payload.len()),
                })?;
            Ok(IpAddr::V4(Ipv4Addr::from(*bytes)))
        }
        AF_INET6 => Ok(IpAddr::V6(Ipv6Addr::from(fixed::<16>(payload, name)?))),
        other => Err(DecodeError::Invalid {
            name: "IPVS_*_ATTR_AF",
            reason: format!("unknown address family {other}"),
        }),
    }
}

/// Ports travel in network byte order.
fn decode_port(payload: &[u8]) -> Result<u16, DecodeError> {
    fixed::<2>(payload, "IPVS_*_ATTR_PORT").map(u16::from_be_bytes)
}

#[cfg(test)]
mod tests;
