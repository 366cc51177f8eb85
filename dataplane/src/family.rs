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

/// The IP families one backend programs: each once, IPv4 first, never empty. Every mode holds
/// its families this way, whatever it keeps per family (an executor, a table, a set of rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Families(Vec<IpFamily>);

impl Families {
    /// The families of `families`, each once and IPv4 first; IPv4 alone when there are none.
    #[must_use]
    pub fn new(families: impl IntoIterator<Item = IpFamily>) -> Self {
        let given: Vec<IpFamily> = families.into_iter().collect();
        let chosen: Vec<IpFamily> = IpFamily::ALL
            .into_iter()
            .filter(|family| given.contains(family))
            .collect();
        if chosen.is_empty() {
            return Self::default();
        }
        Self(chosen)
    }

    /// IPv4, and IPv6 where the kernel has it (`/proc/sys/net/ipv6` exists).
    #[must_use]
    pub fn of_kernel() -> Self {
        let mut families = vec![IpFamily::V4];
        if std::path::Path::new("/proc/sys/net/ipv6").exists() {
            families.push(IpFamily::V6);
        }
        Self(families)
    }
}

impl Default for Families {
    /// IPv4 alone.
    fn default() -> Self {
        Self(vec![IpFamily::V4])
    }
}

impl std::ops::Deref for Families {
    type Target = [IpFamily];
    fn deref(&self) -> &[IpFamily] {
        &self.0
    }
}

impl IntoIterator for Families {
    type Item = IpFamily;
    type IntoIter = std::vec::IntoIter<IpFamily>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a Families {
    type Item = &'a IpFamily;
    type IntoIter = std::slice::Iter<'a, IpFamily>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests;
