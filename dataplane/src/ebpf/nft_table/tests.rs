//! Tests of the table's nft scripts.
#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn the_table_masquerades_the_mark_and_rejects_new_connections_to_refused_services() {
    let script = table_script(0x4000);
    assert!(script.starts_with(
        "table inet splitproxy-ebpf\ndelete table inet splitproxy-ebpf\ntable inet splitproxy-ebpf {\n"
    ));
    assert!(script.contains(
        "meta mark & 0x4000 == 0x4000 meta mark set meta mark ^ 0x4000 masquerade fully-random"
    ));
    assert!(script.contains("type ipv4_addr . inet_proto . inet_service"));
    assert!(script.contains("ip daddr . meta l4proto . th dport @no-endpoints-v4 reject"));
    assert!(script.contains("ip6 daddr . meta l4proto . th dport @no-endpoints-v6 reject"));
    for hook in ["input", "forward"] {
        assert!(script.contains(&format!(
            "chain {hook} {{\n\t\ttype filter hook {hook} priority filter; policy accept;\n\t\tct state new jump refuse\n"
        )));
    }
}

#[test]
fn refusals_replace_each_familys_set_whole() {
    let refused = BTreeSet::from([
        ("203.0.113.50".parse().unwrap(), Protocol::Tcp, 80),
        ("203.0.113.50".parse().unwrap(), Protocol::Udp, 53),
        ("2001:db8::50".parse().unwrap(), Protocol::Tcp, 443),
    ]);
    assert_eq!(
        refusal_script(&refused),
        "flush set inet splitproxy-ebpf no-endpoints-v4\n\
         add element inet splitproxy-ebpf no-endpoints-v4 { 203.0.113.50 . tcp . 80, 203.0.113.50 . udp . 53 }\n\
         flush set inet splitproxy-ebpf no-endpoints-v6\n\
         add element inet splitproxy-ebpf no-endpoints-v6 { 2001:db8::50 . tcp . 443 }\n"
    );
    assert_eq!(
        refusal_script(&BTreeSet::new()),
        "flush set inet splitproxy-ebpf no-endpoints-v4\nflush set inet splitproxy-ebpf no-endpoints-v6\n"
    );
}
