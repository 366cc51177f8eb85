//! The node's addresses that take node ports, for the modes that list them one by one (IPVS
//! writes a virtual server per address, eBPF a map entry) where iptables and nftables match
//! `--dst-type LOCAL` or the selected addresses in a rule.

use std::net::IpAddr;

/// The addresses of `interfaces` that take node ports under `selection`
/// ([`NodeOptions::node_port_addresses`](crate::node_options::NodeOptions::node_port_addresses)):
/// the selected ones, a family's unspecified address standing for each of that family's; with
/// no selection, every one. Addresses on `skip` (a mode's own interface) and loopback and IPv6
/// link-local addresses are never among the "every" ones: they are no node's address.
pub(crate) fn select(
    selection: Option<&[IpAddr]>,
    interfaces: &[if_addrs::Interface],
    skip: &str,
) -> Vec<IpAddr> {
    let every = |ipv4: Option<bool>| -> Vec<IpAddr> {
        interfaces
            .iter()
            .filter(|interface| interface.name != skip && !interface.is_loopback())
            .map(if_addrs::Interface::ip)
            .filter(|ip| !is_link_local_v6(ip) && ipv4.is_none_or(|v4| ip.is_ipv4() == v4))
            .collect()
    };
    match selection {
        Some(addresses) => addresses
            .iter()
            .flat_map(|ip| {
                if ip.is_unspecified() {
                    every(Some(ip.is_ipv4()))
                } else {
                    vec![*ip]
                }
            })
            .collect(),
        None => every(None),
    }
}

/// Whether `selection` names every address of a family, or none at all: then the node's
/// interfaces have to be listed to know the addresses.
pub(crate) fn needs_interfaces(selection: Option<&[IpAddr]>) -> bool {
    selection.is_none_or(|addresses| addresses.iter().any(IpAddr::is_unspecified))
}

/// Whether `ip` is an IPv6 link-local address (`fe80::/10`): one per interface, never a
/// node-port address.
fn is_link_local_v6(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}
