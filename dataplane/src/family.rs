//! IP families: which addresses one proxier (one iptables or nftables family, one IPVS
//! table's addresses) programs.

use std::net::IpAddr;

/// An IP family: which addresses one proxier programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl IpFamily {
    /// Both families, IPv4 first.
    pub const ALL: [Self; 2] = [Self::V4, Self::V6];

    /// The name kube-proxy's `ip_family` metric label and Kubernetes' `ipFamilies` use: `IPv4`
    /// or `IPv6`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }

    /// Whether `ip` belongs to this family.
    #[must_use]
    pub fn contains(self, ip: &IpAddr) -> bool {
        match self {
            Self::V4 => ip.is_ipv4(),
            Self::V6 => ip.is_ipv6(),
        }
    }

    /// The addresses of `ips` in this family, in their order.
    #[must_use]
    pub fn select(self, ips: &[IpAddr]) -> Vec<IpAddr> {
        ips.iter().copied().filter(|ip| self.contains(ip)).collect()
    }
}
