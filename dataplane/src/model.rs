//! The model every backend consumes: Services, their ports, and each port's endpoints.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
    sync::Arc,
    time::Duration,
};

/// Everything a node must program, keyed by Service. A persistent map: a copy costs nothing
/// and shares every Service with the original, so a backend keeps the state it last programmed
/// for free, and comparing two states skips what they share.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyState {
    /// The Services, sorted by key so rendering is deterministic.
    pub services: imbl::OrdMap<ServiceKey, Arc<Service>>,
}

impl ProxyState {
    /// Adds `service`, or replaces the Service of its key.
    pub fn insert(&mut self, service: Service) {
        self.services.insert(service.key.clone(), Arc::new(service));
    }

    /// Keys of the Services added, changed or removed between `self` and `other`, in key order;
    /// Services the two share are skipped without a look inside.
    pub fn changed_services<'a>(&'a self, other: &'a Self) -> impl Iterator<Item = &'a ServiceKey> {
        crate::changed_keys(&self.services, &other.services)
    }
}

impl FromIterator<Service> for ProxyState {
    fn from_iter<I: IntoIterator<Item = Service>>(services: I) -> Self {
        let mut state = Self::default();
        for service in services {
            state.insert(service);
        }
        state
    }
}

/// A Service's namespace and name, each a DNS label (what the API server admits), so both go
/// into rule comments as they are: the agent's conversion skips Services with other names.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl ServiceKey {
    /// The key of `namespace/name`.
    #[must_use]
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl Service {
    /// A Service with only cluster IPs and ports; every other field at its default.
    #[must_use]
    pub fn new(key: ServiceKey, cluster_ips: Vec<IpAddr>, ports: Vec<ServicePort>) -> Self {
        Self {
            key,
            cluster_ips,
            ports,
            ..Self::default()
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One Service, with the endpoints of each port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Service {
    /// The Service's key.
    pub key: ServiceKey,
    /// The cluster IPs, primary first.
    pub cluster_ips: Vec<IpAddr>,
    /// The ports, in spec order, each with its own name (ports sharing a name would share their
    /// chains).
    pub ports: Vec<ServicePort>,
    /// `spec.externalIPs`.
    pub external_ips: Vec<IpAddr>,
    /// The load-balancer ingress IPs to program (ipMode VIP).
    pub load_balancer_ips: Vec<IpAddr>,
    /// The sources allowed to use the load-balancer IPs; empty allows every source.
    pub load_balancer_source_ranges: Vec<Cidr>,
    /// How long a client sticks to its endpoint (`sessionAffinity: ClientIP`); `None` without
    /// affinity.
    pub session_affinity: Option<Duration>,
    /// `spec.externalTrafficPolicy`.
    pub external_traffic_policy: TrafficPolicy,
    /// `spec.internalTrafficPolicy`.
    pub internal_traffic_policy: TrafficPolicy,
    /// `spec.healthCheckNodePort`, for `externalTrafficPolicy: Local`.
    pub health_check_node_port: Option<u16>,
}

/// Which endpoints a traffic policy allows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TrafficPolicy {
    /// Every endpoint in the cluster.
    #[default]
    Cluster,
    /// Only endpoints on this node.
    Local,
}

/// An address block, `address/prefix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    /// The address.
    pub address: IpAddr,
    /// The prefix length: at most 32 for IPv4, 128 for IPv6.
    pub prefix: u8,
}

/// Why a text is not a [`Cidr`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR {0:?}")]
pub struct InvalidCidr(pub String);

impl FromStr for Cidr {
    type Err = InvalidCidr;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidCidr(text.to_owned());
        let (address, prefix) = text.split_once('/').ok_or_else(invalid)?;
        let address: IpAddr = address.parse().map_err(|_| invalid())?;
        let prefix: u8 = prefix.parse().map_err(|_| invalid())?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(invalid());
        }
        Ok(Self { address, prefix })
    }
}

impl Cidr {
    /// The block itself: the address with its host bits cleared (`10.244.7.1/16` is
    /// `10.244.0.0/16`), the prefix capped at the family's width.
    #[must_use]
    pub fn network(&self) -> Self {
        // `checked_shl` is `None` for a shift by the full width, the `/0` network.
        let (address, prefix) = match self.address {
            IpAddr::V4(address) => {
                let prefix = self.prefix.min(32);
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                (
                    IpAddr::from(Ipv4Addr::from(u32::from(address) & mask)),
                    prefix,
                )
            }
            IpAddr::V6(address) => {
                let prefix = self.prefix.min(128);
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                (
                    IpAddr::from(Ipv6Addr::from(u128::from(address) & mask)),
                    prefix,
                )
            }
        };
        Self { address, prefix }
    }

    /// The block holding `ip` alone (`/32`, `/128`).
    #[must_use]
    pub fn host(ip: IpAddr) -> Self {
        Self {
            address: ip,
            prefix: if ip.is_ipv4() { 32 } else { 128 },
        }
    }

    /// Whether `ip` is inside this block; never for an address of the other family.
    #[must_use]
    pub fn contains(&self, ip: IpAddr) -> bool {
        let network = self.network();
        let host = Self {
            address: ip,
            prefix: network.prefix,
        };
        ip.is_ipv4() == self.address.is_ipv4() && host.network() == network
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

/// One port of a Service and the endpoints behind it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServicePort {
    /// The port name, a DNS label; empty for a single unnamed port.
    pub name: String,
    /// The transport protocol.
    pub protocol: Protocol,
    /// The port on the cluster IPs.
    pub port: u16,
    /// The node port, if the Service has one.
    pub node_port: Option<u16>,
    /// The endpoints, sorted by address then port and each listed once, with the target port
    /// resolved.
    pub endpoints: Vec<Endpoint>,
}

impl ServicePort {
    /// A port with its endpoints.
    #[must_use]
    pub fn new(
        name: impl Into<String>,
        protocol: Protocol,
        port: u16,
        node_port: Option<u16>,
        endpoints: Vec<Endpoint>,
    ) -> Self {
        Self {
            name: name.into(),
            protocol,
            port,
            node_port,
            endpoints,
        }
    }

    /// kube-proxy's `ServicePortName` string: `namespace/name:portname` (the port name may be
    /// empty, leaving a trailing colon).
    #[must_use]
    pub fn port_name(&self, service: &ServiceKey) -> String {
        format!("{service}:{}", self.name)
    }
}

/// One backend of a Service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The backend's address.
    pub ip: IpAddr,
    /// The backend's port.
    pub port: u16,
    /// Accepts new connections.
    pub ready: bool,
    /// Still serving, possibly while terminating.
    pub serving: bool,
    /// Terminating.
    pub terminating: bool,
    /// Runs on this node.
    pub is_local: bool,
    /// Topology hints send this node's cluster-wide traffic to other endpoints: the `Cluster`
    /// traffic policy skips it here, the `Local` policies still use it (see
    /// [`crate::endpoints::categorize`]).
    pub topology_excluded: bool,
}

impl Endpoint {
    /// A ready endpoint at `address` on another node: what a Service's healthy backend looks like
    /// before topology or locality come into it.
    #[must_use]
    pub fn ready(address: std::net::SocketAddr) -> Self {
        Self {
            ip: address.ip(),
            port: address.port(),
            ready: true,
            serving: true,
            terminating: false,
            is_local: false,
            topology_excluded: false,
        }
    }

    /// The `ip:port` form kube-proxy uses in chain hashes and DNAT targets (`[v6]:port` for IPv6).
    #[must_use]
    pub fn socket_string(&self) -> String {
        std::net::SocketAddr::new(self.ip, self.port).to_string()
    }
}

/// A transport protocol.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP.
    #[default]
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// The lowercase name iptables and kube-proxy's hashes use.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_parse_and_print_and_refuse_impossible_prefixes() {
        let cidr: Cidr = "203.0.113.0/24".parse().expect("valid");
        assert_eq!(cidr.to_string(), "203.0.113.0/24");
        assert!("fd00::/64".parse::<Cidr>().is_ok());
        for bad in [
            "203.0.113.0/33",
            "fd00::/129",
            "203.0.113.0",
            "x/8",
            "10.0.0.0/-1",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn cidrs_contain_the_addresses_of_their_block_and_family_only() {
        let cidr = |text: &str| text.parse::<Cidr>().expect("valid");
        let ip = |text: &str| text.parse::<IpAddr>().expect("valid");
        assert!(cidr("10.244.0.0/16").contains(ip("10.244.255.1")));
        assert!(!cidr("10.244.0.0/16").contains(ip("10.245.0.1")));
        assert!(cidr("10.244.7.1/16").contains(ip("10.244.0.1")));
        assert!(cidr("0.0.0.0/0").contains(ip("203.0.113.9")));
        assert!(cidr("198.18.0.11/32").contains(ip("198.18.0.11")));
        assert!(!cidr("198.18.0.11/32").contains(ip("198.18.0.12")));
        assert!(cidr("fd00::/8").contains(ip("fd00:198:18::11")));
        assert!(cidr("::/0").contains(ip("::1")));
        assert!(!cidr("::/0").contains(ip("10.0.0.1")));
        assert!(!cidr("0.0.0.0/0").contains(ip("::1")));
    }
}
