//! kube-proxy's local-traffic detectors: how the rules tell traffic from pods apart from
//! traffic from elsewhere (the node itself, clients outside the cluster). Pod traffic to a
//! cluster IP keeps its source address, and pod traffic to an `externalTrafficPolicy: Local`
//! destination may reach every endpoint; everything else is masqueraded or kept local.
//!
//! The detector is the cluster's pod CIDRs (`ClusterCIDR`), the bridge pods hang off
//! (`BridgeInterface`) or the name prefix of their host-side interfaces
//! (`InterfaceNamePrefix`), matched as upstream's `LocalTrafficDetector` writes them.

use crate::{Cidr, IpFamily};

/// Interfaces pod traffic arrives on: a detector that replaces the cluster CIDRs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodInterfaces {
    /// Traffic arriving on this bridge (`--pod-bridge-interface`).
    Bridge(String),
    /// Traffic arriving on any interface whose name starts with this
    /// (`--pod-interface-name-prefix`).
    Prefix(String),
}

/// One IP family's detector, as the renderers write its matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LocalMatch {
    /// Sources inside this CIDR, written as the `-save` tools print it (host bits cleared).
    Source {
        /// The CIDR.
        cidr: String,
        /// nft's address family keyword (`ip`, `ip6`).
        family: &'static str,
    },
    /// Packets arriving on a matching interface: iptables' and nft's spelling of the name.
    Interface {
        /// `br0`, or `veth+` for a prefix.
        iptables: String,
        /// `"br0"`, or `"veth*"` for a prefix.
        nft: String,
    },
}

impl LocalMatch {
    /// The detector for `family`: the interfaces when given, else the first cluster CIDR of the
    /// family; `None` when neither applies (no detector, as upstream without one).
    pub(crate) fn for_family(
        family: IpFamily,
        interfaces: Option<&PodInterfaces>,
        cluster_cidrs: &[Cidr],
    ) -> Option<Self> {
        match interfaces {
            Some(PodInterfaces::Bridge(name)) => Some(Self::Interface {
                iptables: name.clone(),
                nft: format!("\"{name}\""),
            }),
            Some(PodInterfaces::Prefix(prefix)) => Some(Self::Interface {
                iptables: format!("{prefix}+"),
                nft: format!("\"{prefix}*\""),
            }),
            None => cluster_cidrs
                .iter()
                .find(|cidr| family.contains(&cidr.address))
                .map(|cidr| Self::Source {
                    cidr: cidr.network().to_string(),
                    family: match family {
                        IpFamily::V4 => "ip",
                        IpFamily::V6 => "ip6",
                    },
                }),
        }
    }

    /// The iptables match of local traffic (`-s 10.244.0.0/16`, `-i veth+`).
    pub(crate) fn iptables(&self) -> String {
        match self {
            Self::Source { cidr, .. } => format!("-s {cidr}"),
            Self::Interface { iptables, .. } => format!("-i {iptables}"),
        }
    }

    /// The iptables match of other traffic (`! -s 10.244.0.0/16`, `! -i veth+`).
    pub(crate) fn iptables_not(&self) -> String {
        format!("! {}", self.iptables())
    }

    /// The nft match of local traffic (`ip saddr 10.244.0.0/16`, `iifname "veth*"`).
    pub(crate) fn nft(&self) -> String {
        match self {
            Self::Source { cidr, family } => format!("{family} saddr {cidr}"),
            Self::Interface { nft, .. } => format!("iifname {nft}"),
        }
    }

    /// The nft match of other traffic (`ip saddr != 10.244.0.0/16`, `iifname != "veth*"`).
    pub(crate) fn nft_not(&self) -> String {
        match self {
            Self::Source { cidr, family } => format!("{family} saddr != {cidr}"),
            Self::Interface { nft, .. } => format!("iifname != {nft}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detectors_match_as_upstream_writes_them() {
        let cidrs: Vec<Cidr> = ["fd00:10:244::1/48", "10.244.7.1/16"]
            .iter()
            .map(|cidr| cidr.parse().expect("CIDR"))
            .collect();
        let v6 = LocalMatch::for_family(IpFamily::V6, None, &cidrs).expect("a detector");
        assert_eq!(v6.iptables_not(), "! -s fd00:10:244::/48");
        assert_eq!(v6.nft(), "ip6 saddr fd00:10:244::/48");
        let v4 = LocalMatch::for_family(IpFamily::V4, None, &cidrs).expect("a detector");
        assert_eq!(v4.nft_not(), "ip saddr != 10.244.0.0/16");
        let bridge = PodInterfaces::Bridge("cni0".to_owned());
        let bridged = LocalMatch::for_family(IpFamily::V6, Some(&bridge), &cidrs).expect("one");
        assert_eq!(
            (bridged.iptables(), bridged.nft_not()),
            ("-i cni0".to_owned(), "iifname != \"cni0\"".to_owned())
        );
        let prefix = PodInterfaces::Prefix("veth".to_owned());
        let prefixed = LocalMatch::for_family(IpFamily::V4, Some(&prefix), &[]).expect("one");
        assert_eq!(
            (prefixed.iptables_not(), prefixed.nft()),
            ("! -i veth+".to_owned(), "iifname \"veth*\"".to_owned())
        );
        assert_eq!(
            LocalMatch::for_family(IpFamily::V6, None, &cidrs[1..]),
            None
        );
    }
}
