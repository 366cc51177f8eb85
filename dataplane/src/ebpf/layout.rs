//! The maps' layout, as `bpf/sock.c` reads them: each key and value as the bytes the kernel
//! holds. Addresses and ports are in network order, counts in the host's; the two files change
//! together, and [`VERSION`] with them, so an agent never reads maps an older layout wrote.

use crate::Protocol;
use std::net::{Ipv4Addr, SocketAddrV4};

/// The layout's version: the maps of each version are pinned apart, so an upgrade that changes
/// the layout fills new maps while the old programs keep serving from the old ones.
pub const VERSION: &str = "v2";

/// The map of Service ports and their endpoint slots.
pub const SERVICES_MAP: &str = "sp_services";

/// A key's length in bytes.
pub const KEY_LEN: usize = 12;

/// A value's length in bytes.
pub const VALUE_LEN: usize = 12;

/// `SP_DROP` in the programs: a header without endpoints drops rather than refuses.
const DROP: u16 = 1;

/// One entry's key: a Service port (address, port, protocol) and a slot, 0 for the port's header,
/// 1..=count for its endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotKey {
    /// The Service address connections are aimed at.
    pub address: Ipv4Addr,
    /// The Service port.
    pub port: u16,
    /// The protocol.
    pub protocol: Protocol,
    /// 0: the header; 1..=count: an endpoint.
    pub slot: u32,
}

/// One entry's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotValue {
    /// Slot 0: how many endpoint slots follow; with none, whether connections are dropped
    /// (`internalTrafficPolicy: Local` and every endpoint elsewhere) or refused (no endpoint at
    /// all); and how long a client keeps its endpoint.
    Header {
        /// The endpoints in slots 1..=count.
        count: u32,
        /// With no endpoints: drop rather than refuse.
        drop: bool,
        /// `sessionAffinity: ClientIP`'s timeout in seconds; 0 without affinity.
        affinity_seconds: u32,
    },
    /// An endpoint slot.
    Endpoint(SocketAddrV4),
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
        bytes[0..4].copy_from_slice(&self.address.octets());
        bytes[4..6].copy_from_slice(&self.port.to_be_bytes());
        bytes[6] = protocol_number(self.protocol);
        bytes[8..12].copy_from_slice(&self.slot.to_ne_bytes());
        bytes
    }

    /// A key the programs hold, or `None` for bytes no agent of this layout writes.
    #[must_use]
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Option<Self> {
        let protocol = protocol_of(bytes[6])?;
        (bytes[7] == 0).then_some(())?;
        Some(Self {
            address: Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]),
            port: u16::from_be_bytes([bytes[4], bytes[5]]),
            protocol,
            slot: u32::from_ne_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]),
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
                affinity_seconds,
            } => {
                bytes[0..4].copy_from_slice(&affinity_seconds.to_ne_bytes());
                bytes[6..8].copy_from_slice(&(if drop { DROP } else { 0 }).to_ne_bytes());
                bytes[8..12].copy_from_slice(&count.to_ne_bytes());
            }
            Self::Endpoint(endpoint) => {
                bytes[0..4].copy_from_slice(&endpoint.ip().octets());
                bytes[4..6].copy_from_slice(&endpoint.port().to_be_bytes());
            }
        }
        bytes
    }

    /// The value of `key`'s slot as the programs hold it.
    #[must_use]
    pub fn from_bytes(key: SlotKey, bytes: [u8; VALUE_LEN]) -> Self {
        if key.slot == 0 {
            Self::Header {
                count: u32::from_ne_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]),
                drop: u16::from_ne_bytes([bytes[6], bytes[7]]) & DROP != 0,
                affinity_seconds: u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            }
        } else {
            Self::Endpoint(SocketAddrV4::new(
                Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]),
                u16::from_be_bytes([bytes[4], bytes[5]]),
            ))
        }
    }
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
        address: Ipv4Addr::new(10, 96, 0, 10),
        port: 53,
        protocol: Protocol::Udp,
        slot: 2,
    };

    #[test]
    fn a_key_is_the_service_address_and_port_in_network_order_then_protocol_and_slot() {
        let bytes = KEY.to_bytes();
        assert_eq!(&bytes[0..8], &[10, 96, 0, 10, 0, 53, 17, 0]);
        assert_eq!(u32::from_ne_bytes(bytes[8..12].try_into().unwrap()), 2);
        assert_eq!(SlotKey::from_bytes(bytes), Some(KEY));
    }

    #[test]
    fn bytes_no_agent_writes_are_not_read_as_a_key() {
        let mut unknown_protocol = KEY.to_bytes();
        unknown_protocol[6] = 1;
        assert_eq!(SlotKey::from_bytes(unknown_protocol), None);
        let mut padded = KEY.to_bytes();
        padded[7] = 1;
        assert_eq!(SlotKey::from_bytes(padded), None);
    }

    #[test]
    fn an_endpoint_slot_holds_the_address_and_port_in_network_order() {
        let value = SlotValue::Endpoint("10.244.1.10:8080".parse().unwrap());
        let bytes = value.to_bytes();
        assert_eq!(&bytes[0..6], &[10, 244, 1, 10, 0x1f, 0x90]);
        assert_eq!(SlotValue::from_bytes(KEY, bytes), value);
    }

    #[test]
    fn a_header_holds_the_count_whether_an_empty_port_drops_and_the_affinity_timeout() {
        for value in [
            SlotValue::Header {
                count: 70_000,
                drop: false,
                affinity_seconds: 86_400,
            },
            SlotValue::Header {
                count: 0,
                drop: true,
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
