//! What every iptables render must satisfy, checked by both fuzz targets, and a dataplane model
//! built from fuzzer bytes.

use arbitrary::{Result, Unstructured};
use splitproxy_dataplane::NodeOptions;
use splitproxy_dataplane::{
    Cidr, Endpoint, IpFamily, Protocol, ProxyState, Service, ServiceKey, ServicePort,
    TrafficPolicy,
    iptables::{render_filter_for, render_nat_for, save},
    testing::tracer::Ruleset,
};
use splitproxy_proto::names::is_dns_label;
use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

/// iptables' longest chain name.
const MAX_CHAIN_NAME: usize = 28;
/// iptables' longest `--comment` (`XT_MAX_COMMENT_LEN`, 256 with the terminating NUL).
const MAX_COMMENT: usize = 255;

/// Renders `state` for both families over a kernel holding `previous`'s chains, and panics,
/// showing the payload, when the render breaks an invariant: every table parses as
/// `iptables-restore` input (every jump's chain declared, quotes balanced, `COMMIT` closing
/// it), no chain is declared twice, chain names fit iptables' 28 characters, comments its 255,
/// and the rule count is the number of `-A` lines.
pub fn check_render(previous: &ProxyState, state: &ProxyState, options: &NodeOptions) {
    for family in IpFamily::ALL {
        let before = render_nat_for(family, previous, options, &BTreeSet::new());
        let existing = save::chains(&before.payload, "nat");
        let nat = render_nat_for(family, state, options, &existing);
        let filter = render_filter_for(family, state);
        check_table(&nat.payload, nat.rule_count);
        check_table(&filter.payload, filter.rule_count);
        let payload = format!("{}{}", filter.payload, nat.payload);
        if let Err(err) = Ruleset::parse(&payload) {
            panic!("{family:?} render is not valid restore input: {err}\n{payload}");
        }
    }
}

fn check_table(payload: &str, rule_count: u32) {
    let mut declared = BTreeSet::new();
    let mut rules = 0;
    for line in payload.lines() {
        if let Some(declaration) = line.strip_prefix(':') {
            let chain = declaration.split(' ').next().unwrap_or_default();
            assert!(
                chain.len() <= MAX_CHAIN_NAME,
                "chain name {chain} too long:\n{payload}"
            );
            assert!(
                declared.insert(chain),
                "chain {chain} declared twice:\n{payload}"
            );
        }
        if line.starts_with("-A ") {
            rules += 1;
        }
        if let Some(comment) = comment_of(line) {
            assert!(
                comment.len() <= MAX_COMMENT,
                "comment of {} bytes:\n{line}",
                comment.len()
            );
        }
    }
    assert_eq!(rules, rule_count, "rule count:\n{payload}");
}

/// The argument of a rule's `--comment`, without its quotes.
fn comment_of(line: &str) -> Option<&str> {
    let rest = &line[line.find("--comment ")? + "--comment ".len()..];
    Some(match rest.strip_prefix('"') {
        Some(quoted) => quoted.split('"').next().unwrap_or_default(),
        None => rest.split(' ').next().unwrap_or_default(),
    })
}

/// A model as the agent's conversion guarantees it (see `splitproxy_dataplane::model`): names
/// are DNS labels, port names unique in their Service, endpoints unique and sorted per port.
/// Addresses come from a small pool half of the time, so Services and endpoints share them.
///
/// # Errors
///
/// When the bytes run out.
pub fn proxy_state(u: &mut Unstructured) -> Result<ProxyState> {
    let mut state = ProxyState::default();
    for _ in 0..u.int_in_range(0..=6)? {
        let service = service(u)?;
        state.insert(service);
    }
    Ok(state)
}

/// Node options: cluster CIDRs, `--masquerade-all`, node port addresses, node IPs.
///
/// # Errors
///
/// When the bytes run out.
pub fn node_options(u: &mut Unstructured) -> Result<NodeOptions> {
    Ok(NodeOptions::default()
        .with_cluster_cidrs(list(u, 2, cidr)?)
        .with_masquerade_all(u.arbitrary()?)
        .with_node_ips(list(u, 2, ip)?)
        .with_node_port_addresses(if u.arbitrary()? {
            Some(list(u, 3, ip)?)
        } else {
            None
        }))
}

fn service(u: &mut Unstructured) -> Result<Service> {
    let key = ServiceKey::new(label(u)?, label(u)?);
    let mut names = BTreeSet::new();
    let mut ports = Vec::new();
    for _ in 0..u.int_in_range(0..=4)? {
        let port = service_port(u)?;
        if names.insert(port.name.clone()) {
            ports.push(port);
        }
    }
    let policy = |u: &mut Unstructured| -> Result<TrafficPolicy> {
        Ok(if u.arbitrary()? {
            TrafficPolicy::Local
        } else {
            TrafficPolicy::Cluster
        })
    };
    Ok(Service {
        key,
        cluster_ips: list(u, 2, ip)?,
        ports,
        external_ips: list(u, 2, ip)?,
        load_balancer_ips: list(u, 2, ip)?,
        load_balancer_source_ranges: list(u, 3, cidr)?,
        session_affinity: if u.arbitrary()? {
            Some(Duration::from_secs(u.int_in_range(1..=86_400)?))
        } else {
            None
        },
        external_traffic_policy: policy(u)?,
        internal_traffic_policy: policy(u)?,
        health_check_node_port: port_option(u)?,
    })
}

fn service_port(u: &mut Unstructured) -> Result<ServicePort> {
    let name = match u.int_in_range(0..=3)? {
        0 => String::new(),
        1 => "http".to_owned(),
        _ => label(u)?,
    };
    let protocol = *u.choose(&[Protocol::Tcp, Protocol::Udp, Protocol::Sctp])?;
    let mut endpoints = Vec::new();
    for _ in 0..u.int_in_range(0..=8)? {
        endpoints.push(Endpoint {
            ip: ip(u)?,
            port: port(u)?,
            ready: u.arbitrary()?,
            serving: u.arbitrary()?,
            terminating: u.arbitrary()?,
            is_local: u.arbitrary()?,
            topology_excluded: u.arbitrary()?,
        });
    }
    endpoints.sort_by_key(|e| (e.ip, e.port));
    endpoints.dedup_by_key(|e| (e.ip, e.port));
    Ok(ServicePort::new(
        name,
        protocol,
        port(u)?,
        port_option(u)?,
        endpoints,
    ))
}

/// A DNS label: up to 63 characters, from an alphabet small enough for names to collide.
fn label(u: &mut Unstructured) -> Result<String> {
    let length = u.int_in_range(1..=63)?;
    let mut text = String::with_capacity(length);
    for _ in 0..length {
        text.push(*u.choose(&['a', 'b', 'z', '0', '9', '-'])?);
    }
    Ok(if is_dns_label(&text) {
        text
    } else {
        "x".into()
    })
}

fn port(u: &mut Unstructured) -> Result<u16> {
    u.int_in_range(1..=u16::MAX)
}

fn port_option(u: &mut Unstructured) -> Result<Option<u16>> {
    Ok(if u.arbitrary()? { Some(port(u)?) } else { None })
}

fn ip(u: &mut Unstructured) -> Result<IpAddr> {
    Ok(match u.int_in_range(0..=3)? {
        0 => IpAddr::V4(Ipv4Addr::new(10, 0, 0, u.int_in_range(0..=7)?)),
        1 => IpAddr::V6(Ipv6Addr::new(
            0xfd00,
            0,
            0,
            0,
            0,
            0,
            0,
            u.int_in_range(0..=7)?,
        )),
        2 => IpAddr::V4(u.arbitrary()?),
        _ => IpAddr::V6(u.arbitrary()?),
    })
}

fn cidr(u: &mut Unstructured) -> Result<Cidr> {
    let address = ip(u)?;
    let max = if address.is_ipv4() { 32 } else { 128 };
    Ok(Cidr {
        address,
        prefix: u.int_in_range(0..=max)?,
    })
}

fn list<T>(
    u: &mut Unstructured,
    most: usize,
    item: fn(&mut Unstructured) -> Result<T>,
) -> Result<Vec<T>> {
    (0..u.int_in_range(0..=most)?).map(|_| item(u)).collect()
}
