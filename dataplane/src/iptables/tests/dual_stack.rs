//! Tests of the per-family render and the dual-stack executor, with the fixtures of the backend's
//! other tests.
//!
//! Test addresses: the unit tests' plan ([`crate::testing::fixtures`]), in both families.

use super::super::{IptablesBackend, render_filter_for, render_nat_for};
use super::{
    Config, Dataplane, JUMPS, Protocol, ProxyState, Scratch, ServicePort, TrafficPolicy, ips,
    local, ready, render_filter, render_nat, service, split_hooks, state,
};
use crate::Families;
use crate::NodeOptions;
use crate::{Cidr, IpFamily};
use std::collections::BTreeSet;

/// `ns1/svc1`: dual-stack NodePort with one endpoint per family, plus an IPv6-only
/// `ns2/svc2` without endpoints and a dual-stack `ns3/svc3` load balancer with source ranges and
/// external IPs in both families.
fn dual_stack_services() -> ProxyState {
    let svc1 = service(
        "ns1",
        "svc1",
        &["172.30.0.41", "fd00:172:30::41"],
        vec![ServicePort::new(
            "p80",
            Protocol::Tcp,
            80,
            Some(30001),
            vec![ready("10.180.0.1", 80), ready("fd00:10:180::1", 80)],
        )],
    );
    let svc2 = service(
        "ns2",
        "svc2",
        &["fd00:172:30::42"],
        vec![ServicePort::new("p80", Protocol::Tcp, 80, None, Vec::new())],
    );
    let mut svc3 = service(
        "ns3",
        "svc3",
        &["172.30.0.43", "fd00:172:30::43"],
        vec![ServicePort::new(
            "p80",
            Protocol::Tcp,
            80,
            None,
            vec![local("10.180.0.3", 80), local("fd00:10:180::3", 80)],
        )],
    );
    svc3.external_ips = ips(&["192.168.99.33", "2001:db8:99::33"]);
    svc3.load_balancer_ips = ips(&["1.2.3.4", "2001:db8:1b::4"]);
    svc3.load_balancer_source_ranges = ["203.0.113.0/25", "2001:db8:203::/64"]
        .iter()
        .map(|range| range.parse::<Cidr>().unwrap())
        .collect();
    svc3.external_traffic_policy = TrafficPolicy::Local;
    state(vec![svc1, svc2, svc3])
}

/// Keeps only the addresses and endpoints of `family`, as the controller would send a
/// single-stack cluster.
fn only(family: IpFamily, state: &ProxyState) -> ProxyState {
    let mut services: Vec<crate::Service> =
        state.services.values().map(|s| (**s).clone()).collect();
    for service in &mut services {
        service.cluster_ips.retain(|ip| family.contains(ip));
        service.external_ips.retain(|ip| family.contains(ip));
        service.load_balancer_ips.retain(|ip| family.contains(ip));
        service
            .load_balancer_source_ranges
            .retain(|range| family.contains(&range.address));
        for port in &mut service.ports {
            port.endpoints.retain(|e| family.contains(&e.ip));
        }
    }
    services.into_iter().collect()
}

fn v6_options() -> NodeOptions {
    NodeOptions::default().with_cluster_cidrs([
        "10.0.0.0/8".parse().unwrap(),
        "fd00:10::1/48".parse().unwrap(),
    ])
}

// ---------------------------------------------------------------------------------------------
// The per-family render

#[test]
fn ipv6_render_holds_only_ipv6_addresses_endpoints_and_cidrs() {
    let state = dual_stack_services();
    let filter = render_filter_for(IpFamily::V6, &state);
    let nat = render_nat_for(IpFamily::V6, &state, &v6_options(), &BTreeSet::new());
    // Same chain names as the IPv4 tables (KUBE-SVC-XPGD46QRK7WJZT7O is ns1/svc1:p80 there too);
    // endpoint chains hash the bracketed `[ip]:port`, as upstream.
    let expected_filter = r#"*filter
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 has no endpoints" -m tcp -p tcp -d fd00:172:30::42 --dport 80 -j REJECT --reject-with icmp6-port-unreachable
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-PROXY-FIREWALL -m comment --comment "ns3/svc3:p80 traffic not accepted by KUBE-FW-X27LE4BHSL4DOUIK" -m tcp -p tcp -d 2001:db8:1b::4 --dport 80 -j DROP
COMMIT
"#;
    let expected_nat = r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
:KUBE-SEP-OGYCNMB4EMRUSJ6N - [0:0]
:KUBE-EXT-XPGD46QRK7WJZT7O - [0:0]
:KUBE-SVC-X27LE4BHSL4DOUIK - [0:0]
:KUBE-SVL-X27LE4BHSL4DOUIK - [0:0]
:KUBE-SEP-CCZHJH42U3MUTGMQ - [0:0]
:KUBE-EXT-X27LE4BHSL4DOUIK - [0:0]
:KUBE-FW-X27LE4BHSL4DOUIK - [0:0]
-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d fd00:172:30::41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d fd00:172:30::43 --dport 80 -j KUBE-SVC-X27LE4BHSL4DOUIK
-A KUBE-SERVICES -m comment --comment "ns3/svc3:p80 external IP" -m tcp -p tcp -d 2001:db8:99::33 --dport 80 -j KUBE-EXT-X27LE4BHSL4DOUIK
-A KUBE-SERVICES -m comment --comment "ns3/svc3:p80 loadbalancer IP" -m tcp -p tcp -d 2001:db8:1b::4 --dport 80 -j KUBE-FW-X27LE4BHSL4DOUIK
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -m tcp -p tcp --dport 30001 -j KUBE-EXT-XPGD46QRK7WJZT7O
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d fd00:172:30::41 --dport 80 ! -s fd00:10::/48 -j KUBE-MARK-MASQ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> [fd00:10:180::1]:80" -j KUBE-SEP-OGYCNMB4EMRUSJ6N
-A KUBE-SEP-OGYCNMB4EMRUSJ6N -m comment --comment ns1/svc1:p80 -s fd00:10:180::1 -j KUBE-MARK-MASQ
-A KUBE-SEP-OGYCNMB4EMRUSJ6N -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination [fd00:10:180::1]:80
-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "masquerade traffic for ns1/svc1:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d fd00:172:30::43 --dport 80 ! -s fd00:10::/48 -j KUBE-MARK-MASQ
-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> [fd00:10:180::3]:80" -j KUBE-SEP-CCZHJH42U3MUTGMQ
-A KUBE-SVL-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> [fd00:10:180::3]:80" -j KUBE-SEP-CCZHJH42U3MUTGMQ
-A KUBE-SEP-CCZHJH42U3MUTGMQ -m comment --comment ns3/svc3:p80 -s fd00:10:180::3 -j KUBE-MARK-MASQ
-A KUBE-SEP-CCZHJH42U3MUTGMQ -m comment --comment ns3/svc3:p80 -m tcp -p tcp -j DNAT --to-destination [fd00:10:180::3]:80
-A KUBE-EXT-X27LE4BHSL4DOUIK -m comment --comment "pod traffic for ns3/svc3:p80 external destinations" -s fd00:10::/48 -j KUBE-SVC-X27LE4BHSL4DOUIK
-A KUBE-EXT-X27LE4BHSL4DOUIK -m comment --comment "masquerade LOCAL traffic for ns3/svc3:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
-A KUBE-EXT-X27LE4BHSL4DOUIK -m comment --comment "route LOCAL traffic for ns3/svc3:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-X27LE4BHSL4DOUIK
-A KUBE-EXT-X27LE4BHSL4DOUIK -j KUBE-SVL-X27LE4BHSL4DOUIK
-A KUBE-FW-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 loadbalancer IP" -s 2001:db8:203::/64 -j KUBE-EXT-X27LE4BHSL4DOUIK
-A KUBE-FW-X27LE4BHSL4DOUIK -m comment --comment "other traffic to ns3/svc3:p80 will be dropped by KUBE-PROXY-FIREWALL"
COMMIT
"#;
    assert_eq!(filter.payload, expected_filter, "\n{}", filter.payload);
    assert_eq!(nat.payload, expected_nat, "\n{}", nat.payload);
    assert_eq!(filter.rule_count, 5);
    assert_eq!(nat.rule_count, 27);
}

#[test]
fn ipv4_render_ignores_every_ipv6_address_and_endpoint() {
    let state = dual_stack_services();
    let ipv4_only = only(IpFamily::V4, &state);
    let options = v6_options();
    assert_eq!(render_filter(&state), render_filter(&ipv4_only));
    assert_eq!(
        render_nat(&state, &options, &BTreeSet::new()),
        render_nat(&ipv4_only, &options, &BTreeSet::new())
    );
    // The IPv6-only Service without endpoints is no IPv4 Service: no REJECT for it.
    assert!(!render_filter(&state).payload.contains("ns2/svc2"));
}

#[test]
fn ipv6_render_of_a_dual_stack_state_equals_the_ipv6_only_render() {
    let state = dual_stack_services();
    let ipv6_only = only(IpFamily::V6, &state);
    let options = v6_options();
    assert_eq!(
        render_filter_for(IpFamily::V6, &state),
        render_filter_for(IpFamily::V6, &ipv6_only)
    );
    assert_eq!(
        render_nat_for(IpFamily::V6, &state, &options, &BTreeSet::new()),
        render_nat_for(IpFamily::V6, &ipv6_only, &options, &BTreeSet::new())
    );
}

#[test]
fn without_an_ipv6_cluster_cidr_ipv6_cluster_ip_traffic_is_not_masqueraded() {
    let options = NodeOptions::default().with_cluster_cidrs(["10.0.0.0/8".parse().unwrap()]);
    let nat = render_nat_for(
        IpFamily::V6,
        &dual_stack_services(),
        &options,
        &BTreeSet::new(),
    );
    assert!(!nat.payload.contains("! -s"), "{}", nat.payload);
    assert!(!nat.payload.contains("pod traffic for"), "{}", nat.payload);
}

// ---------------------------------------------------------------------------------------------
// The executor, against fake tools

/// Makes `tool` fail from now on.
fn fail(scratch: &Scratch, tool: &str) {
    std::fs::write(scratch.0.join(format!("{tool}.fails")), "").unwrap();
}

/// The logged calls of `tool`.
fn calls(scratch: &Scratch, tool: &str) -> Vec<String> {
    scratch
        .read("calls")
        .lines()
        .filter(|line| line.split(' ').next() == Some(tool))
        .map(str::to_owned)
        .collect()
}

/// Fake `iptables*`, `ip6tables*` and `conntrack`: every call is logged, each restore payload
/// kept per tool, and a tool with a `<tool>.fails` file fails.
fn fake_config(scratch: &Scratch) -> Config {
    let script = r#"dir=$0; tool=$1; shift
echo "$tool $*" >> "$dir/calls"
[ -e "$dir/$tool.fails" ] && { echo "$tool: cannot initialize table" >&2; exit 3; }
case "$tool" in
  *-save) printf '*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n' ;;
  *-restore) cat > "$dir/$tool.payload" ;;
  conntrack) echo 'conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.' >&2; exit 1 ;;
esac"#;
    Config::default()
        .with_node_options(v6_options())
        .with_command_prefix([
            "sh".to_owned(),
            "-c".to_owned(),
            script.to_owned(),
            scratch.0.to_string_lossy().into_owned(),
        ])
}

#[tokio::test]
async fn both_families_are_synced_each_with_its_own_tools_and_rules() {
    let scratch = Scratch::new("dual-both");
    let mut dataplane = IptablesBackend::new(
        &fake_config(&scratch),
        &Families::new([IpFamily::V6, IpFamily::V4]),
    );
    assert_eq!(*dataplane.families(), [IpFamily::V4, IpFamily::V6]);
    let state = dual_stack_services();

    let report = dataplane.sync(&state).await.unwrap();

    let v4 = (
        render_filter(&state),
        render_nat(&state, &v6_options(), &BTreeSet::new()),
    );
    let v6 = (
        render_filter_for(IpFamily::V6, &state),
        render_nat_for(IpFamily::V6, &state, &v6_options(), &BTreeSet::new()),
    );
    for (tool, (filter, nat)) in [("iptables", &v4), ("ip6tables", &v6)] {
        let payload = scratch.read(&format!("{tool}-restore.payload"));
        let (rendered, jumps) = split_hooks(&payload);
        assert_eq!(
            rendered,
            format!("{}{}*mangle\nCOMMIT\n", filter.payload, nat.payload)
        );
        // Every jump is installed in both families.
        assert_eq!(jumps.len(), JUMPS.len() + 2, "{tool}: {payload}");
    }
    assert_eq!(
        report.family_rules,
        [
            (IpFamily::V4, "filter".to_owned(), v4.0.rule_count),
            (IpFamily::V4, "nat".to_owned(), v4.1.rule_count),
            (IpFamily::V6, "filter".to_owned(), v6.0.rule_count),
            (IpFamily::V6, "nat".to_owned(), v6.1.rule_count),
        ]
    );
    assert_eq!(
        report.rules_written(),
        [
            ("filter".to_owned(), v4.0.rule_count + v6.0.rule_count),
            ("nat".to_owned(), v4.1.rule_count + v6.1.rule_count),
        ]
    );
}

#[tokio::test]
async fn a_failing_family_fails_the_sync_without_stopping_the_other() {
    let scratch = Scratch::new("dual-one-fails");
    fail(&scratch, "ip6tables-restore");
    let mut dataplane = IptablesBackend::new(&fake_config(&scratch), &Families::new(IpFamily::ALL));

    let error = dataplane.sync(&dual_stack_services()).await.unwrap_err();

    assert_eq!(error.family, IpFamily::V6);
    assert_eq!(error.to_string(), "could not sync the IPv6 rules");
    assert!(
        error.source.to_string().contains("cannot initialize table"),
        "{error:?}"
    );
    assert!(!scratch.read("iptables-restore.payload").is_empty());
}

#[tokio::test]
async fn missing_tools_of_a_family_leave_the_node_single_stack() {
    let scratch = Scratch::new("dual-detect");
    fail(&scratch, "ip6tables-save");
    let config = fake_config(&scratch);
    assert_eq!(
        *IptablesBackend::detect(&config).await.families(),
        [IpFamily::V4]
    );
    std::fs::remove_file(scratch.0.join("ip6tables-save.fails")).unwrap();
    fail(&scratch, "iptables-save");
    let v6_only = IptablesBackend::detect(&config).await;
    assert_eq!(*v6_only.families(), [IpFamily::V6]);
    // What the agent's /healthz lists per family.
    assert_eq!(*v6_only.ip_families(), [IpFamily::V6]);
    fail(&scratch, "ip6tables-save");
    // Neither: IPv4 stays, so its syncs say what is wrong.
    assert_eq!(
        *IptablesBackend::detect(&config).await.families(),
        [IpFamily::V4]
    );
}

#[tokio::test]
async fn stale_udp_flows_are_deleted_per_family() {
    let scratch = Scratch::new("dual-conntrack");
    let mut dataplane = IptablesBackend::new(&fake_config(&scratch), &Families::new(IpFamily::ALL));
    let dns = |endpoints: &[&str]| {
        state(vec![service(
            "kube-system",
            "dns",
            &["172.30.0.10", "fd00:172:30::10"],
            vec![ServicePort::new(
                "dns",
                Protocol::Udp,
                53,
                None,
                endpoints.iter().map(|ip| ready(ip, 80)).collect(),
            )],
        )])
    };
    dataplane
        .sync(&dns(&[
            "10.180.0.1",
            "10.180.0.2",
            "fd00:10:180::1",
            "fd00:10:180::2",
        ]))
        .await
        .unwrap();
    dataplane
        .sync(&dns(&["10.180.0.2", "fd00:10:180::2"]))
        .await
        .unwrap();

    assert_eq!(
        calls(&scratch, "conntrack"),
        [
            "conntrack -D -p udp --orig-dst 172.30.0.10 --dport 53 --reply-src 10.180.0.1",
            "conntrack -D -p udp -f ipv6 --orig-dst fd00:172:30::10 --dport 53 --reply-src fd00:10:180::1",
        ]
    );
}
