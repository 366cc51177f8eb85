//! The names of a Service port's own chains and sets, built and hashed as kube-proxy's nftables
//! mode builds them, so `nft list table ip kube-proxy` reads the same under splitproxy.
//!
//! A port's name base is `HASH-namespace/name/protocol/port`, where `HASH` is the first eight
//! base32 characters of the SHA-256 of the part after the dash (`ULMVA6XW-ns1/svc1/tcp/p80`). An
//! endpoint's base adds `__ip/port`, with the colons of an IPv6 address turned into dots, since
//! chain names cannot hold colons (`5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80`). Each object's name
//! is a prefix (`service-`, `local-`, `external-`, `firewall-`, `endpoint-`, `affinity-`) and a
//! base. A base longer than 240 bytes (possible only with an IPv6 endpoint and names near their
//! 63-character limits) is cut to 237 bytes and ends in `...`; the hash still tells such names
//! apart.
//!
//! Every per-Service name holds a `/`, which no fixed chain, set or map name does.
//!
//! One kind of name is splitproxy's own: the maps a port's endpoints are picked from are shared
//! by every port of one protocol whose hash starts with the same two characters, and named after
//! them (`endpoints-tcp-UL` for `service-ULMVA6XW-ns1/svc1/tcp/p80`), so the map a chain picks
//! from is read off its name.

use crate::{Protocol, ServiceKey};
use data_encoding::BASE32;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::net::IpAddr;

/// Prefix of the chain spreading cluster-policy traffic over a port's endpoints.
pub const SERVICE_PREFIX: &str = "service-";
/// Prefix of the chain spreading local-policy traffic over a port's endpoints on this node.
pub const LOCAL_PREFIX: &str = "local-";
/// Prefix of the chain every external destination (node port, external IP, load-balancer IP) of
/// a port goes through.
pub const EXTERNAL_PREFIX: &str = "external-";
/// Prefix of the chain dropping load-balancer traffic from outside `loadBalancerSourceRanges`.
pub const FIREWALL_PREFIX: &str = "firewall-";
/// Prefix of the chain that records a client's affinity and DNATs to one endpoint.
pub const ENDPOINT_PREFIX: &str = "endpoint-";
/// Prefix of the set remembering the clients stuck to one endpoint (session affinity).
pub const AFFINITY_PREFIX: &str = "affinity-";

/// Prefix of the maps Service ports pick their endpoints from, shared by the ports of one
/// protocol whose hash starts with the same two characters.
pub const ENDPOINTS_PREFIX: &str = "endpoints-";

/// The longest base a name may have: nftables names hold 256 bytes, less room for the longest
/// prefix upstream allows for.
const BASE_MAX: usize = 256 - 16;

/// The name base of one Service port: `HASH-namespace/name/protocol/port`.
#[must_use]
pub fn port_base(service: &ServiceKey, protocol: Protocol, port_name: &str) -> String {
    let mut name =
        String::with_capacity(service.namespace.len() + service.name.len() + port_name.len() + 8);
    push_port_part(&mut name, service, protocol, port_name);
    hash_and_truncate(&name)
}

/// The name base of one endpoint of a Service port: `HASH-namespace/name/protocol/port__ip/port`,
/// the IP's colons turned into dots.
#[must_use]
pub fn endpoint_base(
    service: &ServiceKey,
    protocol: Protocol,
    port_name: &str,
    ip: IpAddr,
    port: u16,
) -> String {
    let mut name =
        String::with_capacity(service.namespace.len() + service.name.len() + port_name.len() + 56);
    push_port_part(&mut name, service, protocol, port_name);
    name.push_str("__");
    let start = name.len();
    // Writing to a String cannot fail.
    let _ = write!(name, "{ip}");
    if ip.is_ipv6() {
        let dotted = name[start..].replace(':', ".");
        name.truncate(start);
        name.push_str(&dotted);
    }
    let _ = write!(name, "/{port}");
    hash_and_truncate(&name)
}

/// The endpoint map of the `protocol` port whose name base is `base`: the one named after the
/// protocol and the base's first two characters, the start of its hash.
#[must_use]
pub fn endpoint_map(protocol: Protocol, base: &str) -> EndpointMap {
    let mut hash = [b'A'; 2];
    for (to, from) in hash.iter_mut().zip(base.bytes()) {
        *to = from;
    }
    EndpointMap { protocol, hash }
}

/// One of the maps Service ports pick their endpoints from (`endpoints-tcp-UL`): a port picks
/// `numgen random mod N offset K` and finds its endpoint under that number, in the range of
/// numbers it was given in the map.
///
/// A map serves one protocol because its type names the port's header (`tcp dport`): nft (1.0.6
/// at least) refuses a rule matching `meta l4proto tcp` against a map it reads back from the
/// kernel typed with the protocol-neutral `th dport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointMap {
    protocol: Protocol,
    hash: [u8; 2],
}

impl EndpointMap {
    /// The map's name in the table.
    #[must_use]
    pub fn name(self) -> String {
        self.to_string()
    }

    /// The protocol of the ports picking from it.
    #[must_use]
    pub fn protocol(self) -> Protocol {
        self.protocol
    }

    /// The map `name` names (`endpoints-tcp-UL`), if it is one.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        let (protocol, hash) = name.strip_prefix(ENDPOINTS_PREFIX)?.split_once('-')?;
        let protocol = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
            .into_iter()
            .find(|known| known.as_str() == protocol)?;
        match *hash.as_bytes() {
            [first, second] if hash.bytes().all(|byte| byte.is_ascii_alphanumeric()) => {
                Some(Self {
                    protocol,
                    hash: [first, second],
                })
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for EndpointMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{ENDPOINTS_PREFIX}{}-", self.protocol)?;
        // Both bytes come from a base32 hash, or from `from_name`'s alphanumeric check.
        for &byte in &self.hash {
            std::fmt::Write::write_char(f, char::from(byte))?;
        }
        Ok(())
    }
}

/// `namespace/name/protocol/port`.
fn push_port_part(name: &mut String, service: &ServiceKey, protocol: Protocol, port_name: &str) {
    name.push_str(&service.namespace);
    name.push('/');
    name.push_str(&service.name);
    name.push('/');
    name.push_str(protocol.as_str());
    name.push('/');
    name.push_str(port_name);
}

/// `name` behind the first eight base32 characters of its SHA-256 and a dash, cut to
/// [`BASE_MAX`] bytes (ending in `...`) if longer.
fn hash_and_truncate(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    // Five bytes are exactly eight base32 characters, the same eight the whole digest's encoding
    // starts with.
    let mut base = BASE32.encode(&digest[..5]);
    base.push('-');
    base.push_str(name);
    if base.len() > BASE_MAX {
        let mut end = BASE_MAX - 3;
        // Names are ASCII; should one not be, cut at a character boundary rather than panic.
        while !base.is_char_boundary(end) {
            end -= 1;
        }
        base.truncate(end);
        base.push_str("...");
    }
    base
}

#[cfg(test)]
mod tests {
    //! Expected names are upstream's own test cases (`proxier_test.go`, v1.36.3).
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn key(namespace: &str, name: &str) -> ServiceKey {
        ServiceKey::new(namespace, name)
    }

    const LONG_NAMESPACE: &str = "very-long-namespace-name-abcdefghijklmnopqrstuvwxyz0123456789xx";
    const LONG_NAME: &str = "very-long-service-name-why-would-you-even-do-this-i-mean-really";
    const LONG_PORT: &str = "port-443-providing-the-hypertext-transmission-protocol-with-tls";

    #[test]
    fn port_bases_match_upstreams_examples() {
        assert_eq!(
            port_base(&key("ns1", "svc1"), Protocol::Tcp, "p80"),
            "ULMVA6XW-ns1/svc1/tcp/p80"
        );
        assert_eq!(
            port_base(&key("testing", "service"), Protocol::Tcp, "http"),
            "P4ZYZVCF-testing/service/tcp/http"
        );
        assert_eq!(
            port_base(&key("testing", "service"), Protocol::Tcp, "https"),
            "LZBRENCP-testing/service/tcp/https"
        );
    }

    #[test]
    fn the_longest_port_names_are_not_truncated() {
        assert_eq!(
            port_base(&key(LONG_NAMESPACE, LONG_NAME), Protocol::Sctp, LONG_PORT),
            format!("KR6NACJP-{LONG_NAMESPACE}/{LONG_NAME}/sctp/{LONG_PORT}")
        );
    }

    #[test]
    fn endpoint_bases_match_upstreams_examples() {
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        let svc1 = key("ns1", "svc1");
        assert_eq!(
            endpoint_base(&svc1, Protocol::Tcp, "p80", ip("10.180.0.1"), 80),
            "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
        let testing = key("testing", "service");
        assert_eq!(
            endpoint_base(&testing, Protocol::Tcp, "http", ip("10.180.0.1"), 80),
            "JO2XBXZR-testing/service/tcp/http__10.180.0.1/80"
        );
        assert_eq!(
            endpoint_base(&testing, Protocol::Tcp, "http", ip("10.180.0.2"), 80),
            "5S6H3H22-testing/service/tcp/http__10.180.0.2/80"
        );
        assert_eq!(
            endpoint_base(&svc1, Protocol::Tcp, "p80", ip("fd00:10:180::1"), 80),
            "ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80"
        );
        assert_eq!(
            endpoint_base(&svc1, Protocol::Tcp, "p80", ip("fd00:10:180::2:1"), 80),
            "2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80"
        );
    }

    #[test]
    fn ipv6_endpoints_are_named_by_their_canonical_text() {
        // Upstream's endpoints carry the address as Go prints it, which (like Rust, RFC 5952)
        // writes one zero group as `0`, never `::`.
        let address: IpAddr = "fd80:abcd:12::a1b2:c3d4:e5f6:9999".parse().unwrap();
        let base = endpoint_base(
            &key("testing", "service"),
            Protocol::Tcp,
            "http",
            address,
            80,
        );
        assert!(
            base.ends_with("-testing/service/tcp/http__fd80.abcd.12.0.a1b2.c3d4.e5f6.9999/80"),
            "{base}"
        );
        // Upstream's own examples spell such an address with `::`; hashed as spelled they
        // give upstream's names.
        assert_eq!(
            hash_and_truncate("testing/service/tcp/http__fd80.abcd.12..a1b2.c3d4.e5f6.9999/80"),
            "U7E2ET36-testing/service/tcp/http__fd80.abcd.12..a1b2.c3d4.e5f6.9999/80"
        );
    }

    #[test]
    fn bases_longer_than_the_limit_are_cut_and_keep_their_distinct_hashes() {
        let port = format!("{LONG_NAMESPACE}/{LONG_NAME}/sctp/{LONG_PORT}");
        assert_eq!(
            hash_and_truncate(&format!("{port}__1234.5678.9abc.def0..abc.1234/443")),
            format!("5YS7AFEA-{port}__1234.5678.9abc.def0..abc.1234/443")
        );
        let cut = format!("{port}__1234.5678.9abc.def0..abcd.1234...");
        let first = hash_and_truncate(&format!("{port}__1234.5678.9abc.def0..abcd.1234.5678/443"));
        let second = hash_and_truncate(&format!("{port}__1234.5678.9abc.def0..abcd.1234.8765/443"));
        assert_eq!(first, format!("CI6C53Q3-{cut}"));
        assert_eq!(second, format!("2FLXFK6X-{cut}"));
        assert_eq!(first.len(), BASE_MAX);
    }

    #[test]
    fn a_port_picks_from_the_endpoint_map_named_after_its_hash() {
        let base = port_base(&key("ns1", "svc1"), Protocol::Tcp, "p80");
        let map = endpoint_map(Protocol::Tcp, &base);
        assert_eq!(map.name(), "endpoints-tcp-UL");
        assert_eq!(EndpointMap::from_name("endpoints-tcp-UL"), Some(map));
        let udp = EndpointMap::from_name("endpoints-udp-UL").unwrap();
        assert_eq!(
            (udp.protocol(), udp.name().as_str()),
            (Protocol::Udp, "endpoints-udp-UL")
        );
        for other in [
            "endpoints-tcp-U",
            "endpoints-tcp-ULM",
            "endpoints-tcp-U/",
            "endpoints-icmp-UL",
            "endpoints-UL",
            "service-ips",
        ] {
            assert_eq!(EndpointMap::from_name(other), None, "{other}");
        }
    }
}
