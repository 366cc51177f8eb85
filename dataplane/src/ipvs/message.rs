//! The IPVS generic netlink messages: the commands and attributes of `include/uapi/linux/ip_vs.h`
//! (which no crate has, so they are written here), framed by netlink-packet-core and
//! netlink-packet-generic. Requests for virtual and real servers are built, the kernel's listings
//! decoded back; and the `nlctrl` lookup of the `IPVS` family's id, netlink-packet-generic's.

use super::connection::DecodeError;
use super::{ListedRealServer, RealServer, ServiceId, Timeouts, VirtualServer, service_flags};
use crate::Protocol;
use netlink_packet_core::{
    DefaultNla, Emitable, NLA_F_NESTED, NLM_F_ACK, NLM_F_DUMP, NetlinkMessage, Nla, NlaBuffer,
    NlasIterator, Parseable, ParseableParametrized,
};
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};
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

impl TryFrom<u8> for Command {
    type Error = netlink_packet_core::DecodeError;

    fn try_from(number: u8) -> Result<Self, Self::Error> {
        Ok(match number {
            1 => Self::NewService,
            2 => Self::SetService,
            3 => Self::DeleteService,
            4 => Self::GetService,
            5 => Self::NewDest,
            6 => Self::SetDest,
            7 => Self::DeleteDest,
            8 => Self::GetDest,
            12 => Self::SetConfig,
            other => return Err(format!("unknown IPVS command {other}").into()),
        })
    }
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

/// An IPVS message: the command (in the `genlmsghdr`) and its attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsMessage {
    /// What the message asks or answers.
    pub command: Command,
    /// The `IPVS_CMD_ATTR_*` attributes.
    pub attributes: Vec<CommandAttribute>,
}

impl GenlFamily for IpvsMessage {
    fn family_name() -> &'static str {
        FAMILY_NAME
    }

    fn command(&self) -> u8 {
        self.command as u8
    }

    fn version(&self) -> u8 {
        VERSION
    }
}

impl Emitable for IpvsMessage {
    fn buffer_len(&self) -> usize {
        self.attributes.as_slice().buffer_len()
    }

    fn emit(&self, buffer: &mut [u8]) {
        self.attributes.as_slice().emit(buffer);
    }
}

impl ParseableParametrized<[u8], GenlHeader> for IpvsMessage {
    fn parse_with_param(
        buffer: &[u8],
        header: GenlHeader,
    ) -> Result<Self, netlink_packet_core::DecodeError> {
        Ok(Self {
            command: Command::try_from(header.cmd)?,
            attributes: parse_attributes(buffer)?,
        })
    }
}

/// The attributes that follow each other in `buffer`.
fn parse_attributes<A>(buffer: &[u8]) -> Result<Vec<A>, netlink_packet_core::DecodeError>
where
    A: for<'a> Parseable<NlaBuffer<&'a [u8]>>,
{
    NlasIterator::new(buffer)
        .map(|nla| nla.and_then(|nla| A::parse(&nla)))
        .collect()
}

/// A fixed-size attribute value, or an error naming the attribute.
fn fixed<const N: usize>(
    value: &[u8],
    name: &str,
) -> Result<[u8; N], netlink_packet_core::DecodeError> {
    value.try_into().map_err(|_| {
        format!(
            "attribute {name} is invalid: {} bytes, expected {N}",
            value.len()
        )
        .into()
    })
}

/// A `u16` value in host byte order.
fn u16_value(value: &[u8], name: &str) -> Result<u16, netlink_packet_core::DecodeError> {
    fixed(value, name).map(u16::from_ne_bytes)
}

/// A `u32` value in host byte order.
fn u32_value(value: &[u8], name: &str) -> Result<u32, netlink_packet_core::DecodeError> {
    fixed(value, name).map(u32::from_ne_bytes)
}

/// A port, in network byte order.
fn port_value(value: &[u8], name: &str) -> Result<u16, netlink_packet_core::DecodeError> {
    fixed(value, name).map(u16::from_be_bytes)
}

/// A top-level attribute (`IPVS_CMD_ATTR_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandAttribute {
    /// `IPVS_CMD_ATTR_SERVICE`: a virtual server, or its identity.
    Service(Vec<ServiceAttribute>),
    /// `IPVS_CMD_ATTR_DEST`: a real server.
    Destination(Vec<DestinationAttribute>),
    /// `IPVS_CMD_ATTR_TIMEOUT_TCP`, seconds.
    TimeoutTcp(u32),
    /// `IPVS_CMD_ATTR_TIMEOUT_TCP_FIN`, seconds.
    TimeoutTcpFin(u32),
    /// `IPVS_CMD_ATTR_TIMEOUT_UDP`, seconds.
    TimeoutUdp(u32),
    /// One this client does not read (the daemon's).
    Other(DefaultNla),
}

impl Nla for CommandAttribute {
    fn value_len(&self) -> usize {
        match self {
            Self::Service(nested) => nested.as_slice().buffer_len(),
            Self::Destination(nested) => nested.as_slice().buffer_len(),
            Self::TimeoutTcp(_) | Self::TimeoutTcpFin(_) | Self::TimeoutUdp(_) => 4,
            Self::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Self::Service(_) => CMD_ATTR_SERVICE | NLA_F_NESTED,
            Self::Destination(_) => CMD_ATTR_DEST | NLA_F_NESTED,
            Self::TimeoutTcp(_) => CMD_ATTR_TIMEOUT_TCP,
            Self::TimeoutTcpFin(_) => CMD_ATTR_TIMEOUT_TCP_FIN,
            Self::TimeoutUdp(_) => CMD_ATTR_TIMEOUT_UDP,
            Self::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Self::Service(nested) => nested.as_slice().emit(buffer),
            Self::Destination(nested) => nested.as_slice().emit(buffer),
            Self::TimeoutTcp(seconds)
            | Self::TimeoutTcpFin(seconds)
            | Self::TimeoutUdp(seconds) => {
                buffer.copy_from_slice(&seconds.to_ne_bytes());
            }
            Self::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for CommandAttribute {
    fn parse(buffer: &NlaBuffer<&'a T>) -> Result<Self, netlink_packet_core::DecodeError> {
        let value = buffer.value();
        Ok(match buffer.kind() {
            CMD_ATTR_SERVICE => Self::Service(parse_attributes(value)?),
            CMD_ATTR_DEST => Self::Destination(parse_attributes(value)?),
            CMD_ATTR_TIMEOUT_TCP => {
                Self::TimeoutTcp(u32_value(value, "IPVS_CMD_ATTR_TIMEOUT_TCP")?)
            }
            CMD_ATTR_TIMEOUT_TCP_FIN => {
                Self::TimeoutTcpFin(u32_value(value, "IPVS_CMD_ATTR_TIMEOUT_TCP_FIN")?)
            }
            CMD_ATTR_TIMEOUT_UDP => {
                Self::TimeoutUdp(u32_value(value, "IPVS_CMD_ATTR_TIMEOUT_UDP")?)
            }
            _ => Self::Other(DefaultNla::parse(buffer)?),
        })
    }
}

/// A virtual server's attribute (`IPVS_SVC_ATTR_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceAttribute {
    /// `IPVS_SVC_ATTR_AF`: `AF_INET` or `AF_INET6`.
    Family(u16),
    /// `IPVS_SVC_ATTR_PROTOCOL`: the `IPPROTO_*` number.
    Protocol(u16),
    /// `IPVS_SVC_ATTR_ADDR`: `union nf_inet_addr`, read by the family.
    Address(Vec<u8>),
    /// `IPVS_SVC_ATTR_PORT`.
    Port(u16),
    /// `IPVS_SVC_ATTR_FWMARK`: a firewall-mark service's mark.
    FirewallMark(u32),
    /// `IPVS_SVC_ATTR_SCHED_NAME`.
    Scheduler(String),
    /// `IPVS_SVC_ATTR_FLAGS`: `struct ip_vs_flags { flags, mask }`.
    Flags {
        /// [`service_flags`].
        flags: u32,
        /// Which flags to change; the mask means nothing in a listing.
        mask: u32,
    },
    /// `IPVS_SVC_ATTR_TIMEOUT`: the persistence timeout, seconds.
    Timeout(u32),
    /// `IPVS_SVC_ATTR_NETMASK`: the persistence granularity.
    Netmask(u32),
    /// One this client does not read (statistics, persistence engine).
    Other(DefaultNla),
}

impl Nla for ServiceAttribute {
    fn value_len(&self) -> usize {
        match self {
            Self::Family(_) | Self::Protocol(_) | Self::Port(_) => 2,
            Self::Address(bytes) => bytes.len(),
            Self::FirewallMark(_) | Self::Timeout(_) | Self::Netmask(_) => 4,
            Self::Scheduler(name) => name.len() + 1,
            Self::Flags { .. } => 8,
            Self::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Self::Family(_) => SVC_AF,
            Self::Protocol(_) => SVC_PROTOCOL,
            Self::Address(_) => SVC_ADDR,
            Self::Port(_) => SVC_PORT,
            Self::FirewallMark(_) => SVC_FWMARK,
            Self::Scheduler(_) => SVC_SCHED_NAME,
            Self::Flags { .. } => SVC_FLAGS,
            Self::Timeout(_) => SVC_TIMEOUT,
            Self::Netmask(_) => SVC_NETMASK,
            Self::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Self::Family(value) | Self::Protocol(value) => {
                buffer.copy_from_slice(&value.to_ne_bytes());
            }
            Self::Address(bytes) => buffer.copy_from_slice(bytes),
            Self::Port(port) => buffer.copy_from_slice(&port.to_be_bytes()),
            Self::FirewallMark(value) | Self::Timeout(value) | Self::Netmask(value) => {
                buffer.copy_from_slice(&value.to_ne_bytes());
            }
            Self::Scheduler(name) => {
                let (text, nul) = buffer.split_at_mut(name.len());
                text.copy_from_slice(name.as_bytes());
                nul.fill(0);
            }
            Self::Flags { flags, mask } => {
                let (flags_bytes, mask_bytes) = buffer.split_at_mut(4);
                flags_bytes.copy_from_slice(&flags.to_ne_bytes());
                mask_bytes.copy_from_slice(&mask.to_ne_bytes());
            }
            Self::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for ServiceAttribute {
    fn parse(buffer: &NlaBuffer<&'a T>) -> Result<Self, netlink_packet_core::DecodeError> {
        let value = buffer.value();
        Ok(match buffer.kind() {
            SVC_AF => Self::Family(u16_value(value, "IPVS_SVC_ATTR_AF")?),
            SVC_PROTOCOL => Self::Protocol(u16_value(value, "IPVS_SVC_ATTR_PROTOCOL")?),
            SVC_ADDR => Self::Address(value.to_vec()),
            SVC_PORT => Self::Port(port_value(value, "IPVS_SVC_ATTR_PORT")?),
            SVC_FWMARK => Self::FirewallMark(u32_value(value, "IPVS_SVC_ATTR_FWMARK")?),
            SVC_SCHED_NAME => {
                // NUL-terminated (the NUL optional).
                let text = value.split(|&b| b == 0).next().unwrap_or_default();
                Self::Scheduler(
                    String::from_utf8(text.to_vec()).map_err(|e| {
                        format!("attribute IPVS_SVC_ATTR_SCHED_NAME is invalid: {e}")
                    })?,
                )
            }
            SVC_FLAGS => {
                let bytes: [u8; 8] = fixed(value, "IPVS_SVC_ATTR_FLAGS")?;
                let (flags, mask) = bytes.split_at(4);
                Self::Flags {
                    flags: u32_value(flags, "IPVS_SVC_ATTR_FLAGS")?,
                    mask: u32_value(mask, "IPVS_SVC_ATTR_FLAGS")?,
                }
            }
            SVC_TIMEOUT => Self::Timeout(u32_value(value, "IPVS_SVC_ATTR_TIMEOUT")?),
            SVC_NETMASK => Self::Netmask(u32_value(value, "IPVS_SVC_ATTR_NETMASK")?),
            _ => Self::Other(DefaultNla::parse(buffer)?),
        })
    }
}

/// A real server's attribute (`IPVS_DEST_ATTR_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestinationAttribute {
    /// `IPVS_DEST_ATTR_ADDR`: `union nf_inet_addr`, read by the family.
    Address(Vec<u8>),
    /// `IPVS_DEST_ATTR_PORT`.
    Port(u16),
    /// `IPVS_DEST_ATTR_FWD_METHOD`: `IP_VS_CONN_F_*`.
    ForwardMethod(u32),
    /// `IPVS_DEST_ATTR_WEIGHT`.
    Weight(u32),
    /// `IPVS_DEST_ATTR_U_THRESH`: the connection limit, 0 for none.
    UpperThreshold(u32),
    /// `IPVS_DEST_ATTR_L_THRESH`: where an overloaded server takes connections again.
    LowerThreshold(u32),
    /// `IPVS_DEST_ATTR_ACTIVE_CONNS`, in listings.
    ActiveConnections(u32),
    /// `IPVS_DEST_ATTR_INACT_CONNS`, in listings.
    InactiveConnections(u32),
    /// `IPVS_DEST_ATTR_ADDR_FAMILY` (kernels from 4.1).
    Family(u16),
    /// One this client does not read (statistics, tunnels).
    Other(DefaultNla),
}

impl Nla for DestinationAttribute {
    fn value_len(&self) -> usize {
        match self {
            Self::Address(bytes) => bytes.len(),
            Self::Port(_) | Self::Family(_) => 2,
            Self::ForwardMethod(_)
            | Self::Weight(_)
            | Self::UpperThreshold(_)
            | Self::LowerThreshold(_)
            | Self::ActiveConnections(_)
            | Self::InactiveConnections(_) => 4,
            Self::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Self::Address(_) => DEST_ADDR,
            Self::Port(_) => DEST_PORT,
            Self::ForwardMethod(_) => DEST_FWD_METHOD,
            Self::Weight(_) => DEST_WEIGHT,
            Self::UpperThreshold(_) => DEST_U_THRESH,
            Self::LowerThreshold(_) => DEST_L_THRESH,
            Self::ActiveConnections(_) => DEST_ACTIVE_CONNS,
            Self::InactiveConnections(_) => DEST_INACT_CONNS,
            Self::Family(_) => DEST_ADDR_FAMILY,
            Self::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Self::Address(bytes) => buffer.copy_from_slice(bytes),
            Self::Port(port) => buffer.copy_from_slice(&port.to_be_bytes()),
            Self::Family(family) => buffer.copy_from_slice(&family.to_ne_bytes()),
            Self::ForwardMethod(value)
            | Self::Weight(value)
            | Self::UpperThreshold(value)
            | Self::LowerThreshold(value)
            | Self::ActiveConnections(value)
            | Self::InactiveConnections(value) => buffer.copy_from_slice(&value.to_ne_bytes()),
            Self::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for DestinationAttribute {
    fn parse(buffer: &NlaBuffer<&'a T>) -> Result<Self, netlink_packet_core::DecodeError> {
        let value = buffer.value();
        let number = |name| u32_value(value, name);
        Ok(match buffer.kind() {
            DEST_ADDR => Self::Address(value.to_vec()),
            DEST_PORT => Self::Port(port_value(value, "IPVS_DEST_ATTR_PORT")?),
            DEST_FWD_METHOD => Self::ForwardMethod(number("IPVS_DEST_ATTR_FWD_METHOD")?),
            DEST_WEIGHT => Self::Weight(number("IPVS_DEST_ATTR_WEIGHT")?),
            DEST_U_THRESH => Self::UpperThreshold(number("IPVS_DEST_ATTR_U_THRESH")?),
            DEST_L_THRESH => Self::LowerThreshold(number("IPVS_DEST_ATTR_L_THRESH")?),
            DEST_ACTIVE_CONNS => Self::ActiveConnections(number("IPVS_DEST_ATTR_ACTIVE_CONNS")?),
            DEST_INACT_CONNS => Self::InactiveConnections(number("IPVS_DEST_ATTR_INACT_CONNS")?),
            DEST_ADDR_FAMILY => Self::Family(u16_value(value, "IPVS_DEST_ATTR_ADDR_FAMILY")?),
            _ => Self::Other(DefaultNla::parse(buffer)?),
        })
    }
}

/// A request to the `IPVS` family, as netlink-packet-core frames it.
pub type Request = NetlinkMessage<GenlMessage<IpvsMessage>>;

/// A request to the `IPVS` family (id `family`), with `flags` besides `NLM_F_REQUEST`.
fn request(
    family: u16,
    flags: u16,
    command: Command,
    attributes: Vec<CommandAttribute>,
) -> Request {
    let mut message = GenlMessage::from_payload(IpvsMessage {
        command,
        attributes,
    });
    message.set_resolved_family_id(family);
    let mut request = NetlinkMessage::from(message);
    request.header.flags = flags;
    request
}

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
pub fn service_request(family: u16, command: Command, server: &VirtualServer) -> Request {
    let mut service = service_id(server.id);
    service.extend([
        ServiceAttribute::Scheduler(server.scheduler.clone()),
        // A full mask replaces every flag.
        ServiceAttribute::Flags {
            flags: server.flags,
            mask: u32::MAX,
        },
        ServiceAttribute::Timeout(server.timeout),
        ServiceAttribute::Netmask(netmask(server.id.address)),
    ]);
    request(
        family,
        NLM_F_ACK,
        command,
        vec![CommandAttribute::Service(service)],
    )
}

/// `DeleteService` for `id`, asking for an acknowledgement.
#[must_use]
pub fn delete_service_request(family: u16, id: ServiceId) -> Request {
    request(
        family,
        NLM_F_ACK,
        Command::DeleteService,
        vec![CommandAttribute::Service(service_id(id))],
    )
}

/// `SetConfig` with the timeouts that are set (the kernel keeps the others), asking for an
/// acknowledgement.
#[must_use]
pub fn timeouts_request(family: u16, timeouts: &Timeouts) -> Request {
    let attributes = [
        timeouts.tcp.map(CommandAttribute::TimeoutTcp),
        timeouts.tcp_fin.map(CommandAttribute::TimeoutTcpFin),
        timeouts.udp.map(CommandAttribute::TimeoutUdp),
    ];
    request(
        family,
        NLM_F_ACK,
        Command::SetConfig,
        attributes.into_iter().flatten().collect(),
    )
}

/// The dump of every virtual server.
#[must_use]
pub fn list_services_request(family: u16) -> Request {
    request(family, NLM_F_DUMP, Command::GetService, Vec::new())
}

/// `NewDest` or `SetDest` for `server` behind `service`, masquerading, asking for an
/// acknowledgement.
#[must_use]
pub fn real_server_request(
    family: u16,
    command: Command,
    service: ServiceId,
    server: RealServer,
) -> Request {
    let mut destination = destination(server.address, server.port);
    destination.extend([
        DestinationAttribute::ForwardMethod(FWD_MASQ),
        DestinationAttribute::Weight(server.weight),
        // No connection limits, as kube-proxy sets none.
        DestinationAttribute::UpperThreshold(0),
        DestinationAttribute::LowerThreshold(0),
        DestinationAttribute::Family(address_family(server.address)),
    ]);
    request(
        family,
        NLM_F_ACK,
        command,
        vec![
            CommandAttribute::Service(service_id(service)),
            CommandAttribute::Destination(destination),
        ],
    )
}

/// `DeleteDest` for the real server `address`:`port` behind `service`, asking for an
/// acknowledgement.
#[must_use]
pub fn delete_real_server_request(
    family: u16,
    service: ServiceId,
    address: IpAddr,
    port: u16,
) -> Request {
    request(
        family,
        NLM_F_ACK,
        Command::DeleteDest,
        vec![
            CommandAttribute::Service(service_id(service)),
            CommandAttribute::Destination(destination(address, port)),
        ],
    )
}

/// The dump of `service`'s real servers.
#[must_use]
pub fn list_real_servers_request(family: u16, service: ServiceId) -> Request {
    request(
        family,
        NLM_F_DUMP,
        Command::GetDest,
        vec![CommandAttribute::Service(service_id(service))],
    )
}

/// The virtual server in one message of the services dump; `None` for a firewall-mark service
/// (`ipvsadm -f`), which has no address and port and which kube-proxy never creates.
///
/// # Errors
///
/// If an attribute the kernel always sends is missing or invalid.
pub fn decode_service(message: IpvsMessage) -> Result<Option<VirtualServer>, DecodeError> {
    let service = message
        .attributes
        .into_iter()
        .find_map(|attribute| match attribute {
            CommandAttribute::Service(service) => Some(service),
            _ => None,
        })
        .ok_or(DecodeError::Missing {
            name: "IPVS_CMD_ATTR_SERVICE",
        })?;
    // The first of each, as the kernel sends one.
    let (mut family, mut protocol, mut address, mut port, mut mark) =
        (None, None, None, None, None);
    let (mut scheduler, mut flags, mut timeout) = (None, None, None);
    for attribute in service.into_iter().rev() {
        match attribute {
            ServiceAttribute::Family(value) => family = Some(value),
            ServiceAttribute::Protocol(value) => protocol = Some(value),
            ServiceAttribute::Address(value) => address = Some(value),
            ServiceAttribute::Port(value) => port = Some(value),
            ServiceAttribute::FirewallMark(value) => mark = Some(value),
            ServiceAttribute::Scheduler(value) => scheduler = Some(value),
            ServiceAttribute::Flags { flags: value, .. } => flags = Some(value),
            ServiceAttribute::Timeout(value) => timeout = Some(value),
            ServiceAttribute::Netmask(_) | ServiceAttribute::Other(_) => {}
        }
    }
    if mark.is_some() && address.is_none() {
        return Ok(None);
    }
    let missing = |name| DecodeError::Missing { name };
    let family = family.ok_or_else(|| missing("IPVS_SVC_ATTR_AF"))?;
    let protocol = protocol.ok_or_else(|| missing("IPVS_SVC_ATTR_PROTOCOL"))?;
    let flags = flags.ok_or_else(|| missing("IPVS_SVC_ATTR_FLAGS"))?;
    Ok(Some(VirtualServer {
        id: ServiceId {
            protocol: decode_protocol(protocol)?,
            address: decode_address(
                family,
                &address.ok_or_else(|| missing("IPVS_SVC_ATTR_ADDR"))?,
            )?,
            port: port.ok_or_else(|| missing("IPVS_SVC_ATTR_PORT"))?,
        },
        scheduler: scheduler.ok_or_else(|| missing("IPVS_SVC_ATTR_SCHED_NAME"))?,
        flags: flags & !service_flags::HASHED,
        timeout: timeout.ok_or_else(|| missing("IPVS_SVC_ATTR_TIMEOUT"))?,
    }))
}

/// The real server in one message of a real servers dump of `service`.
///
/// # Errors
///
/// If an attribute the kernel always sends is missing or invalid.
pub fn decode_real_server(
    message: IpvsMessage,
    service: ServiceId,
) -> Result<ListedRealServer, DecodeError> {
    let destination = message
        .attributes
        .into_iter()
        .find_map(|attribute| match attribute {
            CommandAttribute::Destination(destination) => Some(destination),
            _ => None,
        })
        .ok_or(DecodeError::Missing {
            name: "IPVS_CMD_ATTR_DEST",
        })?;
    // The first of each, as the kernel sends one.
    let (mut family, mut address, mut port) = (None, None, None);
    let (mut weight, mut active, mut inactive) = (None, None, None);
    for attribute in destination.into_iter().rev() {
        match attribute {
            DestinationAttribute::Family(value) => family = Some(value),
            DestinationAttribute::Address(value) => address = Some(value),
            DestinationAttribute::Port(value) => port = Some(value),
            DestinationAttribute::Weight(value) => weight = Some(value),
            DestinationAttribute::ActiveConnections(value) => active = Some(value),
            DestinationAttribute::InactiveConnections(value) => inactive = Some(value),
            _ => {}
        }
    }
    let missing = |name| DecodeError::Missing { name };
    // Kernels before 4.1 send no family: the real server's is then the virtual server's.
    let family = family.unwrap_or_else(|| address_family(service.address));
    Ok(ListedRealServer {
        server: RealServer {
            address: decode_address(
                family,
                &address.ok_or_else(|| missing("IPVS_DEST_ATTR_ADDR"))?,
            )?,
            port: port.ok_or_else(|| missing("IPVS_DEST_ATTR_PORT"))?,
            weight: weight.ok_or_else(|| missing("IPVS_DEST_ATTR_WEIGHT"))?,
        },
        active_connections: active.ok_or_else(|| missing("IPVS_DEST_ATTR_ACTIVE_CONNS"))?,
        inactive_connections: inactive.ok_or_else(|| missing("IPVS_DEST_ATTR_INACT_CONNS"))?,
    })
}

/// A virtual server's identity, as the commands on it and its real servers carry it.
fn service_id(id: ServiceId) -> Vec<ServiceAttribute> {
    vec![
        ServiceAttribute::Family(address_family(id.address)),
        ServiceAttribute::Protocol(protocol_number(id.protocol)),
        ServiceAttribute::Address(address_payload(id.address).to_vec()),
        ServiceAttribute::Port(id.port),
    ]
}

/// A real server's identity.
fn destination(address: IpAddr, port: u16) -> Vec<DestinationAttribute> {
    vec![
        DestinationAttribute::Address(address_payload(address).to_vec()),
        DestinationAttribute::Port(port),
    ]
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
        AF_INET6 => {
            let bytes: [u8; 16] = payload.try_into().map_err(|_| DecodeError::Invalid {
                name,
                reason: format!("{} bytes, expected 16", payload.len()),
            })?;
            Ok(IpAddr::V6(Ipv6Addr::from(bytes)))
        }
        other => Err(DecodeError::Invalid {
            name: "IPVS_*_ATTR_AF",
            reason: format!("unknown address family {other}"),
        }),
    }
}

#[cfg(test)]
mod tests;
