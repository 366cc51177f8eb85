//! `--nodeport-addresses`: which of the node's addresses accept node-port traffic.
//!
//! As kube-proxy, per IP family: unset means every local address (`-m addrtype --dst-type
//! LOCAL`); a list of CIDRs means the node's interface addresses inside them; `primary` means the
//! node's primary IP. A family the list says nothing of, or a CIDR matching all of a family
//! (`0.0.0.0/0`, `::/0`), means every local address of that family: the selection then holds the
//! family's unspecified address, which the dataplane reads that way. Loopback addresses are
//! never selected by CIDR.

use splitproxy_dataplane::Cidr;
use std::{
    net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket},
    str::FromStr,
};

/// One `--nodeport-addresses` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodePortAddress {
    /// The node's primary IP (`primary`).
    Primary,
    /// Interface addresses inside this CIDR.
    Cidr(Cidr),
}

/// Why a `--nodeport-addresses` value does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected a CIDR (e.g. 10.0.0.0/8) or `primary`")]
pub struct InvalidNodePortAddress;

impl FromStr for NodePortAddress {
    type Err = InvalidNodePortAddress;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == "primary" {
            return Ok(Self::Primary);
        }
        text.parse()
            .map(Self::Cidr)
            .map_err(|_| InvalidNodePortAddress)
    }
}

/// A `--nodeport-addresses` selection with what it needs to be matched against the node's
/// addresses, which kube-proxy does again at each sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePortSelection {
    /// The values given.
    pub selection: Vec<NodePortAddress>,
    /// The node's IPs (one per family), for `primary`.
    pub node_ips: Vec<IpAddr>,
}

impl NodePortSelection {
    /// The addresses that take node ports now; `None` for every local address.
    ///
    /// # Errors
    ///
    /// If the kernel cannot list the node's addresses.
    pub fn resolve(&self) -> std::io::Result<Option<Vec<IpAddr>>> {
        if self.selection.is_empty() {
            return Ok(None);
        }
        Ok(select(
            &self.selection,
            &interface_addresses()?,
            &self.node_ips,
        ))
    }
}

/// The addresses that take node ports, or `None` for every local address of both families. A
/// family's unspecified address (`0.0.0.0`, `::`) stands for every local address of the family.
///
/// `interfaces` are the node's interface addresses; `node_ips` its IPs (one per family), which
/// `primary` in the selection stands for.
#[must_use]
pub fn select(
    selection: &[NodePortAddress],
    interfaces: &[IpAddr],
    node_ips: &[IpAddr],
) -> Option<Vec<IpAddr>> {
    let mut chosen = Vec::new();
    let mut every_address = true;
    for unspecified in [
        IpAddr::from(std::net::Ipv4Addr::UNSPECIFIED),
        IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED),
    ] {
        let family = |ip: &IpAddr| ip.is_ipv4() == unspecified.is_ipv4();
        let primary_selected = selection.contains(&NodePortAddress::Primary);
        let primary = node_ips
            .iter()
            .copied()
            .find(|ip| primary_selected && family(ip));
        let of_family: Vec<Cidr> = selection
            .iter()
            .filter_map(|value| match value {
                NodePortAddress::Primary => None,
                NodePortAddress::Cidr(cidr) => Some(*cidr),
            })
            .filter(|cidr| family(&cidr.address))
            .chain(primary.map(Cidr::host))
            .collect();
        if of_family.is_empty() || of_family.iter().any(|cidr| cidr.prefix == 0) {
            chosen.push(unspecified);
            continue;
        }
        every_address = false;
        // The primary IP as given; CIDRs pick from the interfaces' addresses.
        chosen.extend(
            interfaces
                .iter()
                .copied()
                .filter(|ip| of_family.iter().any(|cidr| cidr.contains(*ip)))
                .chain(primary)
                .filter(|ip| family(ip) && !ip.is_loopback()),
        );
    }
    if every_address {
        return None;
    }
    chosen.sort_unstable();
    chosen.dedup();
    Some(chosen)
}

/// Whether `selection` takes every IPv4 address, loopback included (no IPv4 CIDR, or one
/// matching everything): only then are node ports served on 127.0.0.1. `node_ips` are the
/// node's IPs, which `primary` in the selection stands for. Upstream also serves them for a
/// CIDR holding 127.0.0.1, but the agent never selects loopback addresses by CIDR.
#[must_use]
pub fn includes_ipv4_loopback(selection: &[NodePortAddress], node_ips: &[IpAddr]) -> bool {
    let has_ipv4_node_ip = node_ips.iter().any(IpAddr::is_ipv4);
    let ipv4: Vec<u8> = selection
        .iter()
        .filter_map(|value| match value {
            NodePortAddress::Primary => has_ipv4_node_ip.then_some(32),
            NodePortAddress::Cidr(cidr) => cidr.address.is_ipv4().then_some(cidr.prefix),
        })
        .collect();
    ipv4.is_empty() || ipv4.contains(&0)
}

/// Whether `selection` needs the node's primary IP.
#[must_use]
pub fn needs_primary(selection: &[NodePortAddress]) -> bool {
    selection.contains(&NodePortAddress::Primary)
}

/// The node's interface addresses.
///
/// # Errors
///
/// If the kernel cannot list them.
pub fn interface_addresses() -> std::io::Result<Vec<IpAddr>> {
    Ok(if_addrs::get_if_addrs()?
        .into_iter()
        .map(|interface| interface.ip())
        .collect())
}

/// The node's primary IP when no `--bind-address` names it: the source address the kernel picks
/// toward `controller` (an `http://host:port` URL), the address the node is reached at by the
/// control plane. No packet is sent.
///
/// # Errors
///
/// If the URL has no host and port, the host does not resolve, or no route leads to it.
pub fn primary_toward(controller: &str) -> std::io::Result<IpAddr> {
    let authority = controller
        .split_once("://")
        .map_or(controller, |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap_or_default();
    let target: SocketAddr = authority.to_socket_addrs()?.next().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{authority} resolves to no address"),
        )
    })?;
    let unspecified: SocketAddr = if target.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(unspecified)?;
    socket.connect(target)?;
    Ok(socket.local_addr()?.ip())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ips(texts: &[&str]) -> Vec<IpAddr> {
        texts.iter().map(|ip| ip.parse().unwrap()).collect()
    }

    fn values(texts: &[&str]) -> Vec<NodePortAddress> {
        texts.iter().map(|text| text.parse().unwrap()).collect()
    }

    const INTERFACES: [&str; 5] = [
        "127.0.0.1",
        "198.18.0.11",
        "10.244.1.1",
        "::1",
        "fd00:198:18::11",
    ];

    #[test]
    fn unset_or_a_catch_all_cidr_means_every_local_address() {
        let interfaces = ips(&INTERFACES);
        assert_eq!(select(&[], &interfaces, &[]), None);
        assert_eq!(select(&values(&["0.0.0.0/0"]), &interfaces, &[]), None);
        assert_eq!(
            select(&values(&["0.0.0.0/0", "::/0"]), &interfaces, &[]),
            None
        );
    }

    #[test]
    fn a_family_the_selection_leaves_out_takes_every_local_address_of_its_own() {
        let interfaces = ips(&INTERFACES);
        // As upstream: a family without CIDRs of its own gets the catch-all CIDR.
        assert_eq!(
            select(&values(&["10.0.0.0/8", "::/0"]), &interfaces, &[]),
            Some(ips(&["10.244.1.1", "::"]))
        );
        assert_eq!(
            select(&values(&["198.18.0.0/24"]), &interfaces, &[]),
            Some(ips(&["198.18.0.11", "::"]))
        );
        assert_eq!(
            select(&values(&["fd00::/8"]), &interfaces, &[]),
            Some(ips(&["0.0.0.0", "fd00:198:18::11"]))
        );
        // `primary` on a node with an IPv4 primary IP alone.
        assert_eq!(
            select(&values(&["primary"]), &interfaces, &ips(&["198.18.0.11"])),
            Some(ips(&["198.18.0.11", "::"]))
        );
    }

    #[test]
    fn loopback_is_included_only_when_every_ipv4_address_is() {
        let v4 = &ips(&["198.18.0.11"]);
        assert!(includes_ipv4_loopback(&[], v4));
        assert!(!includes_ipv4_loopback(&values(&["127.0.0.0/8"]), v4));
        assert!(includes_ipv4_loopback(&values(&["0.0.0.0/0"]), v4));
        assert!(!includes_ipv4_loopback(
            &values(&["198.18.0.0/24", "::/0"]),
            v4
        ));
        assert!(includes_ipv4_loopback(&values(&["fd00::/8"]), v4));
        assert!(!includes_ipv4_loopback(&values(&["primary"]), v4));
        assert!(includes_ipv4_loopback(
            &values(&["primary"]),
            &ips(&["fd00::1"])
        ));
    }

    #[test]
    fn cidrs_pick_the_interface_addresses_inside_them_without_loopback() {
        let interfaces = ips(&INTERFACES);
        assert_eq!(
            select(&values(&["198.18.0.0/24"]), &interfaces, &[]),
            Some(ips(&["198.18.0.11", "::"]))
        );
        assert_eq!(
            select(
                &values(&["127.0.0.0/8", "10.244.0.0/16", "fd00::/8"]),
                &interfaces,
                &[]
            ),
            Some(ips(&["10.244.1.1", "fd00:198:18::11"]))
        );
        assert_eq!(
            select(
                &values(&["192.0.2.0/24", "2001:db8::/32"]),
                &interfaces,
                &[]
            ),
            Some(Vec::new())
        );
    }

    #[test]
    fn primary_is_the_primary_ip_alone() {
        let selection = values(&["primary"]);
        assert!(needs_primary(&selection));
        assert!(!needs_primary(&values(&["10.0.0.0/8"])));
        assert_eq!(
            select(&selection, &ips(&INTERFACES), &ips(&["198.18.0.11"])),
            Some(ips(&["198.18.0.11", "::"]))
        );
    }

    #[test]
    fn values_are_cidrs_or_primary() {
        assert_eq!(
            "primary".parse::<NodePortAddress>(),
            Ok(NodePortAddress::Primary)
        );
        assert!("10.0.0.0/8".parse::<NodePortAddress>().is_ok());
        assert_eq!(
            "10.0.0.1".parse::<NodePortAddress>(),
            Err(InvalidNodePortAddress)
        );
        assert!("Primary".parse::<NodePortAddress>().is_err());
    }

    #[test]
    fn the_primary_ip_is_the_source_toward_the_controller() {
        let ip = primary_toward("http://127.0.0.1:10660").unwrap();
        assert_eq!(ip, "127.0.0.1".parse::<IpAddr>().unwrap());
        assert!(primary_toward("http://no-port").is_err());
    }
}
