//! Just enough SCTP (RFC 9260) to open an association's first half over raw IP sockets: an INIT
//! from the client, an INIT-ACK from the server whose state cookie carries the server's name.
//!
//! Why raw sockets: the test kernel is built without SCTP sockets (`socket(AF_INET, SOCK_STREAM,
//! IPPROTO_SCTP)` fails with `EPROTONOSUPPORT`), but its netfilter tracks and translates SCTP
//! (conntrack, NAT and the `sctp` match are built in), and netfilter is the dataplane under test.
//! A real INIT and INIT-ACK (correct common header, CRC32c checksum, verification tags) are what
//! conntrack needs to see a new association and its reply, so the exchange proves an SCTP
//! Service's DNAT, endpoint choice and reverse translation as a real SCTP stack would.
//!
//! The packets are built and read here, with no I/O, so they are tested as plain data; the
//! `sp-testpod sctp-serve` and `sctp-hit` commands send and receive them.

use std::net::Ipv4Addr;

/// The IP protocol number of SCTP.
pub const IPPROTO_SCTP: i32 = 132;

/// The SCTP common header's length: ports, verification tag, checksum.
const COMMON_HEADER: usize = 12;
/// Chunk types.
const INIT: u8 = 1;
const INIT_ACK: u8 = 2;
/// The State Cookie parameter of an INIT-ACK.
const STATE_COOKIE: u16 = 7;
/// The receiver window and stream counts every packet here advertises; any valid values do.
const WINDOW: u32 = 65_536;
const STREAMS: u16 = 1;

/// CRC32c (Castagnoli, reflected polynomial `0x82F63B78`), the SCTP checksum.
#[must_use]
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = u32::MAX;
    for byte in data {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            let carry = crc & 1;
            crc >>= 1;
            if carry == 1 {
                crc ^= 0x82F6_3B78;
            }
        }
    }
    !crc
}

/// The fields of an INIT or INIT-ACK this module reads and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// The sender's port.
    pub source_port: u16,
    /// The receiver's port.
    pub destination_port: u16,
    /// The common header's verification tag: zero on an INIT, the peer's initiate tag after.
    pub verification_tag: u32,
    /// The first chunk.
    pub chunk: Chunk,
}

/// The first chunk of a [`Packet`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Opens an association; the peer must answer with `initiate_tag` as its verification tag.
    Init {
        /// The tag the sender wants on every packet sent to it.
        initiate_tag: u32,
    },
    /// Answers an INIT.
    InitAck {
        /// The tag the answering side wants on every packet sent to it.
        initiate_tag: u32,
        /// The State Cookie parameter: here, the answering server's name.
        cookie: Vec<u8>,
    },
    /// Any other chunk type.
    Other(u8),
}

impl Packet {
    /// The packet as SCTP bytes (what follows the IP header), with its checksum.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(64);
        bytes.extend(self.source_port.to_be_bytes());
        bytes.extend(self.destination_port.to_be_bytes());
        bytes.extend(self.verification_tag.to_be_bytes());
        bytes.extend([0; 4]);
        let (kind, initiate_tag, parameters) = match &self.chunk {
            Chunk::Init { initiate_tag } => (INIT, *initiate_tag, Vec::new()),
            Chunk::InitAck {
                initiate_tag,
                cookie,
            } => {
                let mut parameter = Vec::new();
                parameter.extend(STATE_COOKIE.to_be_bytes());
                parameter.extend(length(4 + cookie.len()).to_be_bytes());
                parameter.extend(cookie);
                (INIT_ACK, *initiate_tag, parameter)
            }
            Chunk::Other(kind) => (*kind, 0, Vec::new()),
        };
        bytes.push(kind);
        bytes.push(0);
        // An INIT or INIT-ACK's fixed part is 20 bytes; the length leaves out the final padding.
        bytes.extend(length(20 + parameters.len()).to_be_bytes());
        bytes.extend(initiate_tag.to_be_bytes());
        bytes.extend(WINDOW.to_be_bytes());
        bytes.extend(STREAMS.to_be_bytes());
        bytes.extend(STREAMS.to_be_bytes());
        // The initial TSN: any value; the tag is as good as any.
        bytes.extend(initiate_tag.to_be_bytes());
        bytes.extend(parameters);
        while bytes.len() % 4 != 0 {
            bytes.push(0);
        }
        // Stored as the little-endian bytes of the CRC, as Linux writes it.
        let checksum = crc32c(&bytes);
        bytes[8..COMMON_HEADER].copy_from_slice(&checksum.to_le_bytes());
        bytes
    }

    /// Reads an SCTP packet (what follows the IP header); `None` if it is too short, its
    /// checksum is wrong, or its first chunk is truncated.
    #[must_use]
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let header = bytes.get(..COMMON_HEADER)?;
        let mut zeroed = bytes.to_vec();
        zeroed[8..COMMON_HEADER].fill(0);
        if crc32c(&zeroed).to_le_bytes() != header[8..COMMON_HEADER] {
            return None;
        }
        let kind = *bytes.get(COMMON_HEADER)?;
        let chunk_length = usize::from(be16(bytes, COMMON_HEADER + 2)?);
        let chunk = bytes.get(COMMON_HEADER..COMMON_HEADER + chunk_length)?;
        let chunk = match kind {
            INIT => Chunk::Init {
                initiate_tag: be32(chunk, 4)?,
            },
            INIT_ACK => Chunk::InitAck {
                initiate_tag: be32(chunk, 4)?,
                cookie: cookie(chunk.get(20..)?)?,
            },
            other => Chunk::Other(other),
        };
        Some(Self {
            source_port: be16(header, 0)?,
            destination_port: be16(header, 2)?,
            verification_tag: be32(header, 4)?,
            chunk,
        })
    }
}

/// An SCTP packet as a raw IPv4 socket receives it: with the IP header in front.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// The IP source address.
    pub source: Ipv4Addr,
    /// The IP destination address.
    pub destination: Ipv4Addr,
    /// The SCTP packet.
    pub packet: Packet,
}

impl Datagram {
    /// Reads an IPv4 datagram carrying SCTP; `None` for anything else or anything malformed.
    #[must_use]
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let first = *bytes.first()?;
        let header_length = usize::from(first & 0x0f) * 4;
        if first >> 4 != 4 || header_length < 20 || i32::from(*bytes.get(9)?) != IPPROTO_SCTP {
            return None;
        }
        let address = |at: usize| -> Option<Ipv4Addr> {
            let octets: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
            Some(Ipv4Addr::from(octets))
        };
        let total = usize::from(be16(bytes, 2)?).min(bytes.len());
        Some(Self {
            source: address(12)?,
            destination: address(16)?,
            packet: Packet::decode(bytes.get(header_length..total)?)?,
        })
    }
}

/// The State Cookie among INIT-ACK parameters.
fn cookie(mut parameters: &[u8]) -> Option<Vec<u8>> {
    while parameters.len() >= 4 {
        let kind = be16(parameters, 0)?;
        let length = usize::from(be16(parameters, 2)?);
        let value = parameters.get(4..length)?;
        if kind == STATE_COOKIE {
            return Some(value.to_vec());
        }
        // Parameters are padded to four bytes.
        parameters = parameters.get(length.next_multiple_of(4)..)?;
    }
    None
}

/// The ICMP type and code of "port unreachable", which a proxy sends for a Service port without
/// endpoints (iptables' REJECT, IPVS's empty virtual server).
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_PORT_UNREACH: u8 = 3;

/// Whether `bytes`, an IPv4 datagram as a raw ICMP socket receives it, is a port unreachable
/// about an SCTP packet sent from port `source_port` to `destination`: the ICMP message quotes
/// the refused packet's IP header and first 8 bytes (here the SCTP ports and tag).
#[must_use]
pub fn refuses(bytes: &[u8], source_port: u16, destination: std::net::SocketAddrV4) -> bool {
    let refused = || -> Option<bool> {
        let ip_header = usize::from(bytes.first()? & 0x0f) * 4;
        let icmp = bytes.get(ip_header..)?;
        if (*icmp.first()?, *icmp.get(1)?) != (ICMP_DEST_UNREACH, ICMP_PORT_UNREACH) {
            return Some(false);
        }
        let quoted = icmp.get(8..)?;
        let quoted_header = usize::from(quoted.first()? & 0x0f) * 4;
        let to: [u8; 4] = quoted.get(16..20)?.try_into().ok()?;
        Some(
            i32::from(*quoted.get(9)?) == IPPROTO_SCTP
                && Ipv4Addr::from(to) == *destination.ip()
                && be16(quoted, quoted_header)? == source_port
                && be16(quoted, quoted_header + 2)? == destination.port(),
        )
    };
    refused().unwrap_or(false)
}

/// A chunk or parameter length; everything here is far below 64 KiB.
fn length(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn be32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn crc32c_matches_the_published_check_value() {
        // The CRC-32C check value of "123456789" (RFC 3720 and every CRC catalogue).
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn init_has_the_rfc_layout_and_a_zero_verification_tag() {
        let init = Packet {
            source_port: 40_000,
            destination_port: 7777,
            verification_tag: 0,
            chunk: Chunk::Init {
                initiate_tag: 0x0102_0304,
            },
        };
        let bytes = init.encode();
        assert_eq!(bytes.len(), 32);
        assert_eq!(&bytes[..8], &[0x9c, 0x40, 0x1e, 0x61, 0, 0, 0, 0]);
        // Chunk type 1, flags 0, length 20, then the initiate tag.
        assert_eq!(&bytes[12..20], &[1, 0, 0, 20, 1, 2, 3, 4]);
        assert_eq!(Packet::decode(&bytes), Some(init));
    }

    #[test]
    fn init_ack_carries_the_cookie_padded_and_round_trips() {
        let ack = Packet {
            source_port: 9999,
            destination_port: 40_000,
            verification_tag: 0x0102_0304,
            chunk: Chunk::InitAck {
                initiate_tag: 7,
                cookie: b"web-a".to_vec(),
            },
        };
        let bytes = ack.encode();
        assert_eq!(bytes.len() % 4, 0);
        // Fixed part 20 + cookie parameter 4 + 5; the padding is not counted.
        assert_eq!(&bytes[14..16], &[0, 29]);
        assert_eq!(Packet::decode(&bytes), Some(ack));
    }

    #[test]
    fn packets_with_a_wrong_checksum_are_not_read() {
        let mut bytes = Packet {
            source_port: 1,
            destination_port: 2,
            verification_tag: 0,
            chunk: Chunk::Init { initiate_tag: 9 },
        }
        .encode();
        bytes[20] ^= 1;
        assert_eq!(Packet::decode(&bytes), None);
    }

    #[test]
    fn datagrams_are_read_past_the_ip_header() {
        let packet = Packet {
            source_port: 9999,
            destination_port: 40_000,
            verification_tag: 5,
            chunk: Chunk::InitAck {
                initiate_tag: 6,
                cookie: b"web-c".to_vec(),
            },
        };
        let sctp = packet.encode();
        let total = u16::try_from(20 + sctp.len()).unwrap().to_be_bytes();
        let mut ip = vec![0x45, 0, total[0], total[1], 0, 0, 0, 0, 64, 132, 0, 0];
        ip.extend([10, 96, 0, 40, 10, 244, 1, 10]);
        ip.extend(&sctp);
        let datagram = Datagram::decode(&ip).unwrap();
        assert_eq!(datagram.source, Ipv4Addr::new(10, 96, 0, 40));
        assert_eq!(datagram.destination, Ipv4Addr::new(10, 244, 1, 10));
        assert_eq!(datagram.packet, packet);
        ip[9] = 6;
        assert_eq!(Datagram::decode(&ip), None);
    }

    /// An ICMP datagram of `kind`/`code` from 10.96.0.41 quoting an INIT from port 40000 to
    /// 10.96.0.41:7777.
    fn icmp_about_init(kind: u8, code: u8) -> Vec<u8> {
        let init = Packet {
            source_port: 40_000,
            destination_port: 7777,
            verification_tag: 0,
            chunk: Chunk::Init { initiate_tag: 1 },
        }
        .encode();
        let mut quoted = vec![0x45, 0, 0, 52, 0, 0, 0, 0, 64, 132, 0, 0];
        quoted.extend([10, 244, 0, 2, 10, 96, 0, 41]);
        quoted.extend(&init[..8]);
        let mut datagram = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0];
        datagram.extend([10, 96, 0, 41, 10, 244, 0, 2]);
        datagram.extend([kind, code, 0, 0, 0, 0, 0, 0]);
        datagram.extend(quoted);
        datagram
    }

    #[test]
    fn a_port_unreachable_quoting_the_init_refuses_it() {
        let to = "10.96.0.41:7777".parse().unwrap();
        assert!(refuses(&icmp_about_init(3, 3), 40_000, to));
        assert!(
            !refuses(&icmp_about_init(3, 3), 40_001, to),
            "another INIT's"
        );
        assert!(
            !refuses(&icmp_about_init(3, 1), 40_000, to),
            "host unreachable"
        );
        assert!(!refuses(
            &icmp_about_init(3, 3),
            40_000,
            "10.96.0.42:7777".parse().unwrap()
        ));
        assert!(
            !refuses(&icmp_about_init(3, 3)[..30], 40_000, to),
            "cut short"
        );
    }
}
