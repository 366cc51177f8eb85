//! The services map's layout, as `bpf/sock.c` and `bpf/tc.c` read it: each key and value as the bytes the kernel
//! holds. Addresses and ports are in network order, counts in the host's; the two files change
//! together, and [`VERSION`] with them, so an agent never reads maps an older layout wrote.

use crate::Protocol;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// The layout's version: the maps of each version are pinned apart, so an upgrade that changes
/// the layout fills new maps while the old programs keep serving from the old ones.
pub const VERSION: &str = "v3";

/// The map of Service ports and their endpoint slots.
pub const SERVICES_MAP: &str = "sp_services";

/// A key's length in bytes.
pub const KEY_LEN: usize = 24;

/// A value's length in bytes.
pub const VALUE_LEN: usize = 28;

/// `SP_DROP` in the programs: a header without endpoints drops rather than refuses.
const DROP: u16 = 1;

/// `SP_MASQUERADE` in the programs: an outside connection's client is masqueraded.
const MASQUERADE: u16 = 2;

/// Whose traffic an entry serves (`SP_SCOPE_*` in the programs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// The node's own sockets, pods' and host processes' (`bpf/sock.c`).
    Node,
    /// Packets arriving on the node's devices from outside (`bpf/tc.c`).
    Outside,
}

impl Scope {
    const fn number(self) -> u8 {
        match self {
            Self::Node => 0,
            Self::Outside => 1,
        }
    }

    fn of(number: u8) -> Option<Self> {
        [Self::Node, Self::Outside]
            .into_iter()
            .find(|scope| scope.number() == number)
    }
}

/// One entry's key: a Service port (address, port, protocol), whose traffic it serves and a slot,
/// 0 for the port's header, 1..=count for its endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotKey {
    /// The Service address connections are aimed at.
    pub address: IpAddr,
    /// The Service port.
    pub port: u16,
    /// The protocol.
    pub protocol: Protocol,
    /// Whose traffic the entry serves.
    pub scope: Scope,
    /// 0: the header; 1..=count: an endpoint.
    pub slot: u32,
}

/// One entry's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotValue {
    /// Slot 0: how many endpoint slots follow; with none, whether connections are dropped
    /// (a traffic policy `Local` and every endpoint elsewhere) or refused (no endpoint at
    /// all); whether an outside client is masqueraded; and how long a client keeps its endpoint.
    Header {
        /// The endpoints in slots 1..=count.
        count: u32,
        /// With no endpoints: drop rather than refuse.
        drop: bool,
        /// An outside entry's connections leave with the node's address as their source
        /// (`externalTrafficPolicy: Cluster`).
        masquerade: bool,
        /// `sessionAffinity: ClientIP`'s timeout in seconds; 0 without affinity.
        affinity_seconds: u32,
    },
    /// An endpoint slot, of the key's family.
    Endpoint(SocketAddr),
}

impl SlotKey {
    /// The key of the same Service port's `slot`.
    #[must_use]
    pub fn with_slot(self, slot: u32) -> Self {
        Self { slot, ..self }
    }

    /// The key as the programs read it.
    #[must_use]
    pub fn to_bytes(self) -> [u8; KEY_LEN] {
        let mut bytes = [0; KEY_LEN];
        bytes[0..16].copy_from_slice(&held(self.address));
        bytes[16..18].copy_from_slice(&self.port.to_be_bytes());
        bytes[18] = protocol_number(self.protocol);
        bytes[19] = self.scope.number();
        bytes[20..24].copy_from_slice(&self.slot.to_ne_bytes());
        bytes
    }

    /// A key the programs hold, or `None` for bytes no agent of this layout writes.
    #[must_use]
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Option<Self> {
        let protocol = protocol_of(bytes[18])?;
        let scope = Scope::of(bytes[19])?;
        Some(Self {
            address: address_of(&bytes[0..16]),
            port: u16::from_be_bytes([bytes[16], bytes[17]]),
            protocol,
            scope,
            slot: u32::from_ne_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]),
        })
    }
}

impl SlotValue {
    /// The value as the programs read it.
    #[must_use]
    pub fn to_bytes(self) -> [u8; VALUE_LEN] {
        let mut bytes = [0; VALUE_LEN];
        match self {
            Self::Header {
                count,
                drop,
                masquerade,
                affinity_seconds,
            } => {
                let flags = if drop { DROP } else { 0 } | if masquerade { MASQUERADE } else { 0 };
                bytes[18..20].copy_from_slice(&flags.to_ne_bytes());
                bytes[20..24].copy_from_slice(&count.to_ne_bytes());
                bytes[24..28].copy_from_slice(&affinity_seconds.to_ne_bytes());
            }
            Self::Endpoint(endpoint) => {
                bytes[0..16].copy_from_slice(&held(endpoint.ip()));
                bytes[16..18].copy_from_slice(&endpoint.port().to_be_bytes());
            }
        }
        bytes
    }

    /// The value of `key`'s slot as the programs hold it.
    #[must_use]
    pub fn from_bytes(key: SlotKey, bytes: [u8; VALUE_LEN]) -> Self {
        let word = |at: usize| {
            u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        if key.slot == 0 {
            let flags = u16::from_ne_bytes([bytes[18], bytes[19]]);
            Self::Header {
                count: word(20),
                drop: flags & DROP != 0,
                masquerade: flags & MASQUERADE != 0,
                affinity_seconds: word(24),
            }
        } else {
            Self::Endpoint(SocketAddr::new(
                address_of(&bytes[0..16]),
                u16::from_be_bytes([bytes[16], bytes[17]]),
            ))
        }
    }
}

/// The flows map's key length (`struct tuple` in `bpf/tc.c`): a connection from outside as its
/// packets arrive, the client then the Service address it is aimed at; the replies map's keys
/// have the same layout, the endpoint then the client.
pub const TUPLE_LEN: usize = 40;

/// The flows map's value length (`struct flow_value`): the endpoint the connection goes to.
pub const FLOW_LEN: usize = 20;

/// The replies map's value length (`struct reply_value`): the Service address they come from.
pub const REPLY_LEN: usize = 20;

/// One connection from outside, as the flows map holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    /// The client.
    pub client: SocketAddr,
    /// The Service address and port the client is aimed at.
    pub frontend: SocketAddr,
    /// The protocol; `None` for a number no agent writes.
    pub protocol: Option<Protocol>,
    /// The endpoint the connection goes to.
    pub endpoint: SocketAddr,
}

impl Flow {
    /// The connection a flows map entry holds.
    #[must_use]
    pub fn from_bytes(key: &[u8; TUPLE_LEN], value: &[u8; FLOW_LEN]) -> Self {
        let port = |bytes: &[u8]| u16::from_be_bytes([bytes[0], bytes[1]]);
        Self {
            client: SocketAddr::new(address_of(&key[0..16]), port(&key[32..34])),
            frontend: SocketAddr::new(address_of(&key[16..32]), port(&key[34..36])),
            protocol: protocol_of(key[36]),
            endpoint: SocketAddr::new(address_of(&value[0..16]), port(&value[16..18])),
        }
    }

    /// The key of its replies in the replies map: from the endpoint to the client.
    #[must_use]
    pub fn reply_key(&self, key: &[u8; TUPLE_LEN]) -> [u8; TUPLE_LEN] {
        let mut reply = [0; TUPLE_LEN];
        reply[0..16].copy_from_slice(&held(self.endpoint.ip()));
        reply[16..32].copy_from_slice(&held(self.client.ip()));
        reply[32..34].copy_from_slice(&self.endpoint.port().to_be_bytes());
        reply[34..36].copy_from_slice(&self.client.port().to_be_bytes());
        reply[36] = key[36];
        reply
    }
}

/// An address as the programs hold it: an IPv6 one, an IPv4 one mapped (`::ffff:a.b.c.d`).
fn held(address: IpAddr) -> [u8; 16] {
    match address {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The address the programs hold in `bytes` (16 of them).
fn address_of(bytes: &[u8]) -> IpAddr {
    let mut octets = [0; 16];
    octets.copy_from_slice(bytes);
    let v6 = Ipv6Addr::from(octets);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

/// The IP protocol number the programs compare with the socket's.
fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

fn protocol_of(number: u8) -> Option<Protocol> {
    [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
        .into_iter()
        .find(|protocol| protocol_number(*protocol) == number)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const KEY: SlotKey = SlotKey {
        address: IpAddr::V4(std::net::Ipv4Addr::new(10, 96, 0, 10)),
        port: 53,
        protocol: Protocol::Udp,
        scope: Scope::Node,
        slot: 2,
    };

    #[test]
    fn a_key_is_the_service_address_mapped_and_port_in_network_order_then_protocol_and_slot() {
        let bytes = KEY.to_bytes();
        assert_eq!(
            &bytes[0..20],
            &[
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 96, 0, 10, 0, 53, 17, 0
            ]
        );
        assert_eq!(u32::from_ne_bytes(bytes[20..24].try_into().unwrap()), 2);
        assert_eq!(SlotKey::from_bytes(bytes), Some(KEY));
        let v6 = SlotKey {
            address: "fd00:96::10".parse().unwrap(),
            ..KEY
        };
        let bytes = v6.to_bytes();
        assert_eq!(&bytes[0..4], &[0xfd, 0, 0, 0x96]);
        assert_eq!(SlotKey::from_bytes(bytes), Some(v6));
        let outside = SlotKey {
            scope: Scope::Outside,
            ..KEY
        };
        assert_eq!(outside.to_bytes()[19], 1);
        assert_eq!(SlotKey::from_bytes(outside.to_bytes()), Some(outside));
    }

    #[test]
    fn bytes_no_agent_writes_are_not_read_as_a_key() {
        let mut unknown_protocol = KEY.to_bytes();
        unknown_protocol[18] = 1;
        assert_eq!(SlotKey::from_bytes(unknown_protocol), None);
        let mut unknown_scope = KEY.to_bytes();
        unknown_scope[19] = 2;
        assert_eq!(SlotKey::from_bytes(unknown_scope), None);
    }

    #[test]
    fn an_endpoint_slot_holds_the_address_and_port_in_network_order() {
        let value = SlotValue::Endpoint("10.244.1.10:8080".parse().unwrap());
        let bytes = value.to_bytes();
        assert_eq!(&bytes[10..18], &[0xff, 0xff, 10, 244, 1, 10, 0x1f, 0x90]);
        assert_eq!(SlotValue::from_bytes(KEY, bytes), value);
        let v6 = SlotValue::Endpoint("[fd00:10:244::1]:8080".parse().unwrap());
        assert_eq!(SlotValue::from_bytes(KEY, v6.to_bytes()), v6);
    }

    #[test]
    fn a_flow_is_read_from_the_tuple_of_its_packets_and_its_replies_are_keyed_the_other_way() {
        let client: SocketAddr = "198.51.100.7:40000".parse().unwrap();
        let frontend: SocketAddr = "198.51.100.1:30053".parse().unwrap();
        let endpoint: SocketAddr = "10.244.0.2:5353".parse().unwrap();
        let mut key = [0; TUPLE_LEN];
        key[0..16].copy_from_slice(&held(client.ip()));
        key[16..32].copy_from_slice(&held(frontend.ip()));
        key[32..34].copy_from_slice(&client.port().to_be_bytes());
        key[34..36].copy_from_slice(&frontend.port().to_be_bytes());
        key[36] = 17;
        let mut value = [0; FLOW_LEN];
        value[0..18].copy_from_slice(&SlotValue::Endpoint(endpoint).to_bytes()[0..18]);
        let flow = Flow::from_bytes(&key, &value);
        assert_eq!(
            flow,
            Flow {
                client,
                frontend,
                protocol: Some(Protocol::Udp),
                endpoint
            }
        );
        let reply = flow.reply_key(&key);
        assert_eq!(&reply[10..16], &[0xff, 0xff, 10, 244, 0, 2]);
        assert_eq!(&reply[26..32], &[0xff, 0xff, 198, 51, 100, 7]);
        assert_eq!(&reply[32..37], &[0x14, 0xe9, 0x9c, 0x40, 17]);
    }

    #[test]
    fn a_header_holds_the_count_whether_an_empty_port_drops_whether_clients_are_masqueraded_and_the_affinity_timeout()
     {
        for value in [
            SlotValue::Header {
                count: 70_000,
                drop: false,
                masquerade: true,
                affinity_seconds: 86_400,
            },
            SlotValue::Header {
                count: 0,
                drop: true,
                masquerade: false,
                affinity_seconds: 0,
            },
        ] {
            assert_eq!(
                SlotValue::from_bytes(KEY.with_slot(0), value.to_bytes()),
                value
            );
        }
    }
}
