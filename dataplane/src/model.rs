//! The model every backend consumes: Services, their ports, and each port's endpoints.

use std::{collections::BTreeMap, fmt, net::IpAddr};

/// Everything a node must program, keyed by Service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyState {
    /// The Services, sorted by key so rendering is deterministic.
    pub services: BTreeMap<ServiceKey, Service>,
}

/// A Service's namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One Service, with the endpoints of each port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// The Service's key.
    pub key: ServiceKey,
    /// The cluster IPs, primary first.
    pub cluster_ips: Vec<IpAddr>,
    /// The ports, in spec order.
    pub ports: Vec<ServicePort>,
}

/// One port of a Service and the endpoints behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// The port name; empty for a single unnamed port.
    pub name: String,
    /// The transport protocol.
    pub protocol: Protocol,
    /// The port on the cluster IPs.
    pub port: u16,
    /// The node port, if the Service has one.
    pub node_port: Option<u16>,
    /// The endpoints, sorted by address then port, with the target port resolved.
    pub endpoints: Vec<Endpoint>,
}

impl ServicePort {
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
}

impl Endpoint {
    /// The `ip:port` form kube-proxy uses in chain hashes and DNAT targets (`[v6]:port` for IPv6).
    #[must_use]
    pub fn socket_string(&self) -> String {
        std::net::SocketAddr::new(self.ip, self.port).to_string()
    }
}

/// A transport protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP.
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
