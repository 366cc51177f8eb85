//! kube-proxy's per-service chain names, hashed exactly as upstream so operators' tooling matches.
//!
//! Upstream (`pkg/proxy/iptables/proxier.go`) names a Service port's chains with the first 16
//! characters of `base32(sha256(servicePortName + protocol))`, and an endpoint's chain with
//! `base32(sha256(servicePortName + protocol + "ip:port"))`. With the 9-character prefix that gives
//! 25 characters, inside iptables' 28-character limit.

use crate::Protocol;
use data_encoding::BASE32;
use sha2::{Digest, Sha256};

/// Prefix of the chains that pick an endpoint for cluster-policy traffic.
pub const SVC_PREFIX: &str = "KUBE-SVC-";
/// Prefix of the chains that pick a node-local endpoint (local traffic policy).
pub const SVL_PREFIX: &str = "KUBE-SVL-";
/// Prefix of the chains that handle traffic to a Service's external destinations.
pub const EXT_PREFIX: &str = "KUBE-EXT-";
/// Prefix of the chains that filter load-balancer source ranges.
pub const FW_PREFIX: &str = "KUBE-FW-";
/// Prefix of the chains that DNAT to one endpoint.
pub const SEP_PREFIX: &str = "KUBE-SEP-";

/// The prefixes of every per-service chain splitproxy owns; a chain with one of these prefixes that a
/// sync does not write is stale and gets deleted.
pub const OWNED_PREFIXES: [&str; 5] = [SVC_PREFIX, SVL_PREFIX, EXT_PREFIX, FW_PREFIX, SEP_PREFIX];

/// The `KUBE-SVC-…` chain of a Service port, given its `ns/name:port` name.
#[must_use]
pub fn service_chain(port_name: &str, protocol: Protocol) -> String {
    format!("{SVC_PREFIX}{}", port_proto_hash(port_name, protocol))
}

/// The `KUBE-SVL-…` chain of a Service port (its node-local endpoints), given its `ns/name:port`
/// name.
#[must_use]
pub fn local_service_chain(port_name: &str, protocol: Protocol) -> String {
    format!("{SVL_PREFIX}{}", port_proto_hash(port_name, protocol))
}

/// The `KUBE-FW-…` chain of a Service port (its load-balancer source ranges), given its
/// `ns/name:port` name.
#[must_use]
pub fn firewall_chain(port_name: &str, protocol: Protocol) -> String {
    format!("{FW_PREFIX}{}", port_proto_hash(port_name, protocol))
}

/// The `KUBE-EXT-…` chain of a Service port, given its `ns/name:port` name.
#[must_use]
pub fn external_chain(port_name: &str, protocol: Protocol) -> String {
    format!("{EXT_PREFIX}{}", port_proto_hash(port_name, protocol))
}

/// The `KUBE-SEP-…` chain of one endpoint of a Service port; `endpoint` is `ip:port`
/// (`[v6]:port` for IPv6).
#[must_use]
pub fn endpoint_chain(port_name: &str, protocol: Protocol, endpoint: &str) -> String {
    format!(
        "{SEP_PREFIX}{}",
        hash16(&[port_name, protocol.as_str(), endpoint])
    )
}

/// Whether `chain` is a per-service chain splitproxy (like kube-proxy) creates and deletes.
#[must_use]
pub fn is_owned(chain: &str) -> bool {
    OWNED_PREFIXES
        .iter()
        .any(|prefix| chain.starts_with(prefix))
}

/// Upstream's `portProtoHash`: the 16-character hash behind the SVC, SVL, EXT and FW chains.
fn port_proto_hash(port_name: &str, protocol: Protocol) -> String {
    hash16(&[port_name, protocol.as_str()])
}

/// The first 16 characters of the base32 SHA-256 of the concatenated `parts`.
fn hash16(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
    }
    let mut encoded = BASE32.encode(&hasher.finalize());
    // A 32-byte digest encodes to 56 characters, so there are always 16 to keep.
    encoded.truncate(16);
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_chain_matches_upstream_example() {
        assert_eq!(
            service_chain("ns1/svc1:p80", Protocol::Tcp),
            "KUBE-SVC-XPGD46QRK7WJZT7O"
        );
    }

    #[test]
    fn external_chain_shares_the_service_hash() {
        assert_eq!(
            external_chain("ns2/svc2:p80", Protocol::Tcp),
            "KUBE-EXT-GNZBNJ2PO5MGZ6GT"
        );
        assert_eq!(
            service_chain("ns2/svc2:p80", Protocol::Tcp),
            "KUBE-SVC-GNZBNJ2PO5MGZ6GT"
        );
    }

    #[test]
    fn local_and_firewall_chains_share_the_service_hash() {
        assert_eq!(
            local_service_chain("ns2/svc2:p80", Protocol::Tcp),
            "KUBE-SVL-GNZBNJ2PO5MGZ6GT"
        );
        assert_eq!(
            firewall_chain("ns2/svc2:p80", Protocol::Tcp),
            "KUBE-FW-GNZBNJ2PO5MGZ6GT"
        );
    }

    #[test]
    fn endpoint_chain_matches_upstream_example() {
        assert_eq!(
            endpoint_chain("ns1/svc1:p80", Protocol::Tcp, "10.180.0.1:80"),
            "KUBE-SEP-SXIVWICOYRO3J4NJ"
        );
    }

    #[test]
    fn protocol_changes_the_hash() {
        assert_ne!(
            service_chain("ns1/svc1:p80", Protocol::Tcp),
            service_chain("ns1/svc1:p80", Protocol::Udp)
        );
    }

    #[test]
    fn chain_names_fit_the_iptables_limit() {
        let name = endpoint_chain(
            "ns/a-very-long-service-name:https",
            Protocol::Sctp,
            "[fd00::1]:443",
        );
        assert!(name.len() <= 28, "{name} is {} characters", name.len());
    }

    #[test]
    fn only_per_service_chains_are_owned() {
        for owned in [
            "KUBE-SVC-X",
            "KUBE-SVL-X",
            "KUBE-EXT-X",
            "KUBE-FW-X",
            "KUBE-SEP-X",
        ] {
            assert!(is_owned(owned), "{owned}");
        }
        for other in [
            "KUBE-SERVICES",
            "KUBE-NODEPORTS",
            "KUBE-MARK-MASQ",
            "PREROUTING",
            "CNI-X",
        ] {
            assert!(!is_owned(other), "{other}");
        }
    }
}
