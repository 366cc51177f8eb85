//! The one address block every end-to-end test uses, so addresses in tests and logs read the same.
//!
//! | What                         | Addresses                          |
//! |------------------------------|------------------------------------|
//! | node LAN (one bridge)        | `198.18.0.0/24` (RFC 2544 benchmarking block) |
//! | control-plane host           | `198.18.0.2`                       |
//! | external client              | `198.18.0.3`                       |
//! | node `n` (1, 2, …)           | `198.18.0.(10 + n)`: `.11`, `.12`, … |
//! | pods on node `n`             | `10.244.n.0/24`                    |
//! | all pods                     | `10.244.0.0/16`                    |
//! | Services (ClusterIPs)        | `10.96.0.0/16`                     |
//! | pods' gateway (Calico style) | `169.254.1.1`                      |
//!
//! Every address has an IPv6 twin in unique-local space, written with the same digits so the
//! two read alike (`198.18.0.11` ↔ `fd00:198:18::11`, `10.244.1.10` ↔ `fd00:10:244:1::10`):
//!
//! | What                         | IPv6                               |
//! |------------------------------|------------------------------------|
//! | node LAN                     | `fd00:198:18::/64`; host `198.18.0.x` is `fd00:198:18::x` |
//! | pods on node `n`             | `fd00:10:244:n::/64`; pod `10.244.n.h` is `fd00:10:244:n::h` |
//! | all pods                     | `fd00:10:244::/48`                 |
//! | Services (ClusterIPs)        | `fd00:10:96::/112`                 |
//! | pods' gateway (Calico style) | `fe80::ecee:eeff:feee:eeee` (the link-local address of MAC `ee:ee:ee:ee:ee:ee`) |
//!
//! None of these blocks is routed on the internet, and the lab never connects them to the host's
//! network: every address a test targets lives inside namespaces the [`Lab`](crate::lab::Lab) made.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// The node LAN: every host and node has one address in it, on one bridge.
pub const LAN: Ipv4Net = Ipv4Net::new(Ipv4Addr::new(198, 18, 0, 0), 24);

/// The host that runs the control plane (API server, controller).
pub const CONTROL_PLANE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

/// A client outside the cluster (no routes to pods), for NodePort and external-IP traffic.
pub const EXTERNAL_CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 3);

/// Every pod address in the cluster; each node gets one `/24` of it.
pub const CLUSTER_POD_CIDR: Ipv4Net = Ipv4Net::new(Ipv4Addr::new(10, 244, 0, 0), 16);

/// The Service (ClusterIP) range.
pub const SERVICE_CIDR: Ipv4Net = Ipv4Net::new(Ipv4Addr::new(10, 96, 0, 0), 16);

/// The link-local gateway every pod routes through, answered by its node (as Calico does).
pub const POD_GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// The LAN address of node `n` (counting from 1): `198.18.0.(10 + n)`.
///
/// # Panics
///
/// If `n` is 0 or above 200 (the address would leave the node range).
#[must_use]
pub const fn node_ip(n: u8) -> Ipv4Addr {
    assert!(n >= 1 && n <= 200, "nodes are numbered 1..=200");
    Ipv4Addr::new(198, 18, 0, 10 + n)
}

/// The pod CIDR of node `n`: `10.244.n.0/24`.
#[must_use]
pub const fn pod_cidr(n: u8) -> Ipv4Net {
    Ipv4Net::new(Ipv4Addr::new(10, 244, n, 0), 24)
}

/// Pod address `host` on node `n`: `10.244.n.host`.
#[must_use]
pub const fn pod_ip(n: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, n, host)
}

/// The prefix length of the IPv6 node LAN, `fd00:198:18::/64`.
pub const LAN6_PREFIX: u8 = 64;

/// Every IPv6 pod address in the cluster; each node gets one `/64` of it.
pub const CLUSTER_POD_CIDR6: Ipv6Net = Ipv6Net {
    addr: Ipv6Addr::new(0xfd00, 0x10, 0x244, 0, 0, 0, 0, 0),
    prefix: 48,
};

/// The IPv6 Service (ClusterIP) range.
pub const SERVICE_CIDR6: Ipv6Net = Ipv6Net {
    addr: Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0),
    prefix: 112,
};

/// The link-local gateway every pod routes IPv6 through: the address the MAC every node-side pod
/// veth carries (`ee:ee:ee:ee:ee:ee`) derives, as Calico uses.
pub const POD_GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0xecee, 0xeeff, 0xfeee, 0xeeee);

/// The IPv6 twin of a LAN address: `198.18.0.x` is `fd00:198:18::x`.
///
/// # Panics
///
/// If `lan_ip` is outside [`LAN`].
#[must_use]
pub fn lan_ip6(lan_ip: Ipv4Addr) -> Ipv6Addr {
    assert!(LAN.contains(lan_ip), "{lan_ip} is outside the LAN {LAN}");
    Ipv6Addr::new(
        0xfd00,
        0x198,
        0x18,
        0,
        0,
        0,
        0,
        same_digits(lan_ip.octets()[3]),
    )
}

/// The IPv6 pod CIDR of node `n`: `fd00:10:244:n::/64`.
#[must_use]
pub fn pod_cidr6(n: u8) -> Ipv6Net {
    Ipv6Net {
        addr: Ipv6Addr::new(0xfd00, 0x10, 0x244, same_digits(n), 0, 0, 0, 0),
        prefix: 64,
    }
}

/// The IPv6 twin of a pod address: `10.244.n.h` is `fd00:10:244:n::h`.
///
/// # Panics
///
/// If `pod_ip` is outside [`CLUSTER_POD_CIDR`].
#[must_use]
pub fn pod_ip6(pod_ip: Ipv4Addr) -> Ipv6Addr {
    assert!(
        CLUSTER_POD_CIDR.contains(pod_ip),
        "{pod_ip} is outside the pods' {CLUSTER_POD_CIDR}"
    );
    let [_, _, n, host] = pod_ip.octets();
    Ipv6Addr::new(
        0xfd00,
        0x10,
        0x244,
        same_digits(n),
        0,
        0,
        0,
        same_digits(host),
    )
}

/// The IPv6 group written with the same digits as `n` in decimal (`11` → `0x11`), so twins read
/// alike.
fn same_digits(n: u8) -> u16 {
    let (hundreds, tens, ones) = (
        u16::from(n / 100),
        u16::from(n / 10 % 10),
        u16::from(n % 10),
    );
    hundreds << 8 | tens << 4 | ones
}

/// An IPv6 network: an address and a prefix length, such as `fd00:10:244:1::/64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv6Net {
    addr: Ipv6Addr,
    prefix: u8,
}

impl Ipv6Net {
    /// The network address (host bits zero).
    #[must_use]
    pub const fn addr(&self) -> Ipv6Addr {
        self.addr
    }

    /// The prefix length.
    #[must_use]
    pub const fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is inside this network.
    #[must_use]
    pub fn contains(&self, ip: Ipv6Addr) -> bool {
        let mask = u128::MAX
            .checked_shl(128 - u32::from(self.prefix))
            .unwrap_or(0);
        ip.to_bits() & mask == self.addr.to_bits()
    }
}

impl fmt::Display for Ipv6Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// An IPv4 network: an address and a prefix length, such as `10.244.1.0/24`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv4Net {
    addr: Ipv4Addr,
    prefix: u8,
}

impl Ipv4Net {
    /// The network `addr/prefix`; host bits of `addr` are cleared.
    ///
    /// # Panics
    ///
    /// If `prefix` is above 32.
    #[must_use]
    pub const fn new(addr: Ipv4Addr, prefix: u8) -> Self {
        assert!(prefix <= 32, "an IPv4 prefix is at most 32 bits");
        let bits = addr.to_bits() & mask(prefix);
        Self {
            addr: Ipv4Addr::from_bits(bits),
            prefix,
        }
    }

    /// The network address (host bits zero).
    #[must_use]
    pub const fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// The prefix length.
    #[must_use]
    pub const fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is inside this network.
    #[must_use]
    pub const fn contains(&self, ip: Ipv4Addr) -> bool {
        ip.to_bits() & mask(self.prefix) == self.addr.to_bits()
    }

    /// Whether all of `other` is inside this network.
    #[must_use]
    pub const fn contains_net(&self, other: &Ipv4Net) -> bool {
        other.prefix >= self.prefix && self.contains(other.addr)
    }
}

/// The netmask of a prefix length, as bits.
const fn mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    }
}

impl fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Why a string is not an `a.b.c.d/len` network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidIpv4Net(String);

impl fmt::Display for InvalidIpv4Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid IPv4 network {:?}: expected a.b.c.d/len", self.0)
    }
}

impl std::error::Error for InvalidIpv4Net {}

impl FromStr for Ipv4Net {
    type Err = InvalidIpv4Net;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidIpv4Net(s.to_owned());
        let (addr, prefix) = s.split_once('/').ok_or_else(invalid)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| invalid())?;
        let prefix: u8 = prefix.parse().map_err(|_| invalid())?;
        if prefix > 32 || Ipv4Net::new(addr, prefix).addr != addr {
            return Err(invalid());
        }
        Ok(Ipv4Net::new(addr, prefix))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn documented_addresses_fall_in_their_blocks() {
        assert!(LAN.contains(CONTROL_PLANE));
        assert!(LAN.contains(EXTERNAL_CLIENT));
        assert!(LAN.contains(node_ip(1)));
        assert_eq!(node_ip(2), Ipv4Addr::new(198, 18, 0, 12));
        assert!(CLUSTER_POD_CIDR.contains_net(&pod_cidr(3)));
        assert!(pod_cidr(3).contains(pod_ip(3, 7)));
        assert!(!pod_cidr(3).contains(pod_ip(4, 7)));
        assert!(!SERVICE_CIDR.contains(pod_ip(1, 1)));
    }

    #[test]
    fn ipv6_twins_read_like_their_ipv4_addresses_and_fall_in_their_blocks() {
        assert_eq!(lan_ip6(node_ip(1)).to_string(), "fd00:198:18::11");
        assert_eq!(lan_ip6(EXTERNAL_CLIENT).to_string(), "fd00:198:18::3");
        assert_eq!(pod_ip6(pod_ip(2, 10)).to_string(), "fd00:10:244:2::10");
        assert_eq!(pod_ip6(pod_ip(1, 255)).to_string(), "fd00:10:244:1::255");
        assert_eq!(pod_cidr6(3).to_string(), "fd00:10:244:3::/64");
        assert!(pod_cidr6(3).contains(pod_ip6(pod_ip(3, 7))));
        assert!(!pod_cidr6(3).contains(pod_ip6(pod_ip(4, 7))));
        assert!(CLUSTER_POD_CIDR6.contains(pod_ip6(pod_ip(200, 200))));
        assert!(!SERVICE_CIDR6.contains(pod_ip6(pod_ip(1, 1))));
        assert_eq!(SERVICE_CIDR6.to_string(), "fd00:10:96::/112");
    }

    #[test]
    fn networks_parse_and_print_the_same() {
        let net: Ipv4Net = "10.244.1.0/24".parse().unwrap();
        assert_eq!(net, pod_cidr(1));
        assert_eq!(net.to_string(), "10.244.1.0/24");
    }

    #[test]
    fn networks_with_host_bits_or_bad_prefixes_are_rejected() {
        assert!("10.244.1.5/24".parse::<Ipv4Net>().is_err());
        assert!("10.244.1.0/33".parse::<Ipv4Net>().is_err());
        assert!("10.244.1.0".parse::<Ipv4Net>().is_err());
    }
}
