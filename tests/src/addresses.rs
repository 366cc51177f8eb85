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
//! None of these blocks is routed on the internet, and the lab never connects them to the host's
//! network: every address a test targets lives inside namespaces the [`Lab`](crate::lab::Lab) made.

use std::fmt;
use std::net::Ipv4Addr;
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
