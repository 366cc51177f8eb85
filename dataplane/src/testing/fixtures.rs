//! The builders the backends' unit tests share, and the one address plan they follow.
//!
//! The plan is upstream's `proxier_test.go`, so expected rules read like upstream's own test
//! expectations. (The packet-flow table follows the labs' plan instead, `tests/src/addresses.rs`,
//! because its rows also run as real traffic there.)
//!
//! | thing            | IPv4                                   | IPv6                          |
//! |------------------|----------------------------------------|-------------------------------|
//! | pods             | `10.0.0.0/8`                           | `fd00:10::/48`                |
//! | endpoints        | `10.180.0.x` on this node (`is_local`), `10.180.2.x` elsewhere | `fd00:10:180::x` on this node, `fd00:10:180:2::x` elsewhere |
//! | cluster IPs      | `172.30.0.0/16`                        | `fd00:172:30::/112`           |
//! | node             | `192.168.0.2`                          | `2001:db8::1`                 |
//! | external IPs     | `192.168.99.x`                         | `2001:db8:99::x`              |
//! | LB ingress       | `1.2.3.x`, `5.6.7.8`                   | `2001:db8:1b::x`              |
//! | external clients | `203.0.113.0/24`                       | `2001:db8:203::/48`           |
#![allow(clippy::unwrap_used)]

use crate::{Endpoint, ProxyState, Service, ServiceKey, ServicePort};
use std::net::{IpAddr, SocketAddr};

/// The address `text`.
pub(crate) fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// A ready endpoint on another node.
pub(crate) fn ready(address: &str, port: u16) -> Endpoint {
    Endpoint::ready(SocketAddr::new(ip(address), port))
}

/// A ready endpoint on this node.
pub(crate) fn local(address: &str, port: u16) -> Endpoint {
    Endpoint {
        is_local: true,
        ..ready(address, port)
    }
}

/// The Service `namespace/name` on `cluster_ips`.
pub(crate) fn service(
    namespace: &str,
    name: &str,
    cluster_ips: &[&str],
    ports: Vec<ServicePort>,
) -> Service {
    Service::new(
        ServiceKey::new(namespace, name),
        cluster_ips.iter().map(|address| ip(address)).collect(),
        ports,
    )
}

/// The state of `services`.
pub(crate) fn state(services: Vec<Service>) -> ProxyState {
    services.into_iter().collect()
}
