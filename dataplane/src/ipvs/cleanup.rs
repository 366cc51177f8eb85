//! The IPVS mode's virtual servers removed, as kube-proxy's `--cleanup` and its switch to the
//! nftables mode flush IPVS: every virtual server goes, except those inside
//! `--ipvs-exclude-cidrs`, the flag that already tells which ones belong to other programs.
//!
//! A kernel that has not loaded `ip_vs` holds no virtual servers; the client is not opened then,
//! since opening it would load the module just to find the table empty.

use super::{Ipvs, ServiceId, VirtualServer, client};
use crate::Cidr;
use std::path::Path;

/// Where the kernel lists IPVS virtual servers; absent until `ip_vs` is loaded.
const IPVS_TABLE: &str = "/proc/net/ip_vs";

/// Deletes every virtual server of this network namespace outside `exclude`, with its real
/// servers, and returns them. Blocks on netlink: call it from `spawn_blocking` in async code.
///
/// # Errors
///
/// If the client cannot open, the kernel refuses a deletion or its listing is unreadable; the
/// virtual servers deleted before stay deleted.
pub fn remove_virtual_servers(exclude: &[Cidr]) -> client::Result<Vec<ServiceId>> {
    if !Path::new(IPVS_TABLE).exists() {
        return Ok(Vec::new());
    }
    let mut ipvs = Ipvs::connect()?;
    let doomed = outside(&ipvs.services()?, exclude);
    for &id in &doomed {
        ipvs.delete_service(id)?;
    }
    Ok(doomed)
}

/// The virtual servers among `servers` whose address no CIDR of `exclude` holds.
fn outside(servers: &[VirtualServer], exclude: &[Cidr]) -> Vec<ServiceId> {
    servers
        .iter()
        .map(|server| server.id)
        .filter(|id| !exclude.iter().any(|cidr| cidr.contains(id.address)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Protocol;

    fn server(address: &str, port: u16) -> VirtualServer {
        VirtualServer {
            id: ServiceId {
                protocol: Protocol::Tcp,
                address: address.parse().expect("test address"),
                port,
            },
            scheduler: "rr".to_owned(),
            flags: 0,
            timeout: 0,
        }
    }

    #[test]
    fn every_virtual_server_goes_but_those_inside_the_excluded_cidrs() {
        let servers = [
            server("10.96.0.10", 80),
            server("192.0.2.1", 443),
            server("fd00:96::10", 53),
            server("192.0.2.200", 80),
        ];
        let exclude: Vec<Cidr> = ["192.0.2.0/25", "fd00:1::/64"]
            .iter()
            .map(|cidr| cidr.parse().expect("test CIDR"))
            .collect();
        let doomed: Vec<String> = outside(&servers, &exclude)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            doomed,
            [
                "tcp 10.96.0.10:80",
                "tcp [fd00:96::10]:53",
                "tcp 192.0.2.200:80"
            ]
        );
        assert_eq!(outside(&servers, &[]).len(), 4);
    }
}
