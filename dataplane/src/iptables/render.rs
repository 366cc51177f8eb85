//! The pure render step: a [`ProxyState`](crate::ProxyState) in, the filter and nat tables' `iptables-restore`
//! payloads out.
//!
//! The layout is kube-proxy's (`pkg/proxy/iptables/proxier.go`), so the troubleshooting operators
//! know (`iptables -t nat -L KUBE-SERVICES`) works unchanged:
//!
//! ```text
//! PREROUTING/OUTPUT → KUBE-SERVICES ─┬─ cluster IP:port ──────→ KUBE-SVC-… (or KUBE-SVL-… for iTP Local)
//!                                    ├─ external IP:port ─────→ KUBE-EXT-…
//!                                    ├─ load-balancer IP:port → KUBE-EXT-… (KUBE-FW-… with source ranges)
//!                                    └─ (last) dst LOCAL → KUBE-NODEPORTS → KUBE-EXT-…
//! KUBE-EXT-… → KUBE-SVC-… (eTP Cluster, masqueraded) or KUBE-SVL-… (eTP Local, client IP kept)
//! KUBE-SVC-…/KUBE-SVL-… → KUBE-SEP-… (DNAT), sticky clients first with session affinity
//! POSTROUTING → KUBE-POSTROUTING (MASQUERADE what KUBE-MARK-MASQ marked)
//! ```
//!
//! Which endpoints a port uses is [`crate::endpoints`]' decision; `plan` turns it into the
//! per-port choices both tables share. Ports without a usable endpoint get no nat rules;
//! [`render_filter`] REJECTs them instead (or DROPs, when only a `Local` traffic policy finds
//! none).
//!
//! Every chain written is declared (`:CHAIN - [0:0]`), which flushes it, so with
//! `iptables-restore --noflush` the payload replaces exactly the chains it names. Stale per-service
//! chains are declared too, then deleted with `-X`.

mod filter;
mod nat;
mod plan;

pub use filter::{FilterRules, render_filter};
pub use nat::{NatRules, render_nat};

use std::net::{IpAddr, Ipv4Addr};

/// The nat chain every Service dispatch starts from (jumped to from PREROUTING and OUTPUT).
pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
/// The nat chain matching node ports; the last rule of [`KUBE_SERVICES`] jumps to it.
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
/// The nat chain that marks a packet for masquerading.
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
/// The nat chain that masquerades marked packets (jumped to from POSTROUTING).
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
/// The masquerade mark: bit 14, kube-proxy's default `--iptables-masquerade-bit`.
pub const MASQUERADE_MARK: &str = "0x4000";
/// The filter chain rejecting cluster IPs without endpoints (jumped to from FORWARD and OUTPUT).
pub const FILTER_KUBE_SERVICES: &str = "KUBE-SERVICES";
/// The filter chain rejecting external IPs, load-balancer IPs and node ports without endpoints
/// (jumped to from INPUT and FORWARD).
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
/// The filter chain accepting forwarded Service traffic (jumped to from FORWARD).
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
/// The filter chain dropping load-balancer traffic from sources outside
/// `loadBalancerSourceRanges` (kube-proxy jumps to it from INPUT, OUTPUT and FORWARD, for new
/// connections).
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";

/// Joins a table's lines with `COMMIT` into a payload; returns it with the rule count.
fn finish(mut lines: Vec<String>, rule_count: usize) -> (String, u32) {
    lines.push("COMMIT".to_owned());
    let mut payload = lines.join("\n");
    payload.push('\n');
    (payload, u32::try_from(rule_count).unwrap_or(u32::MAX))
}

fn ipv4(ip: &IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V4(v4) => Some(*v4),
        IpAddr::V6(_) => None,
    }
}

/// The `--probability` of picking one of `remaining` endpoints, as Go's `%0.10f` prints it.
fn probability(remaining: usize) -> String {
    // Endpoint counts are far below 2^52, so the conversion is exact.
    let remaining = remaining as f64;
    format!("{:.10}", 1.0 / remaining)
}

/// A `--comment` argument as kube-proxy writes it: quoted only when it contains whitespace.
fn comment(text: &str) -> String {
    if text.contains(char::is_whitespace) {
        format!("\"{text}\"")
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probability_is_printed_with_ten_decimals() {
        assert_eq!(probability(3), "0.3333333333");
        assert_eq!(probability(2), "0.5000000000");
        assert_eq!(probability(7), "0.1428571429");
        assert_eq!(probability(1), "1.0000000000");
    }

    #[test]
    fn comments_are_quoted_only_when_they_contain_spaces() {
        assert_eq!(comment("ns1/svc1:p80"), "ns1/svc1:p80");
        assert_eq!(
            comment("ns1/svc1:p80 cluster IP"),
            "\"ns1/svc1:p80 cluster IP\""
        );
    }
}
