#![allow(clippy::unwrap_used)]

use super::*;
use splitproxy_dataplane::testing::flow_table::{self, Flow};

fn row(scenario: &Scenario, name: &str) -> FlowCase {
    scenario
        .cases
        .iter()
        .find(|case| case.flow.name == name)
        .unwrap()
        .clone()
}

/// The scenario whose name starts with `prefix`.
fn scenario(prefix: &str) -> Scenario {
    flow_table::scenarios()
        .into_iter()
        .find(|scenario| scenario.name.starts_with(prefix))
        .unwrap()
}

fn report(answers: &[(&str, u32)], failures: u32, errors: &[&str]) -> HitReport {
    HitReport {
        answers: answers.iter().map(|(a, n)| ((*a).to_owned(), *n)).collect(),
        failures,
        errors: errors.iter().map(|e| (*e).to_owned()).collect(),
    }
}

fn flow_from(source: &str) -> FlowCase {
    FlowCase {
        flow: Flow {
            name: "a row",
            source: source.parse().unwrap(),
            destination: "10.96.0.10".parse().unwrap(),
            protocol: Protocol::Tcp,
            port: 80,
            origin: Origin::Pod,
        },
        expected: Expected::Reject,
        pending: None,
    }
}

#[test]
fn answers_name_the_server_and_whether_the_client_was_masqueraded() {
    let case = flow_from("10.244.0.5");
    let observed = observe(
        &case,
        &report(
            &[
                ("10.244.1.10:8080 10.244.0.5", 2),
                ("10.244.2.10:8080 198.18.0.11", 2),
            ],
            0,
            &[],
        ),
    );
    assert_eq!(
        observed,
        Observed::Answered(BTreeMap::from([
            ("10.244.1.10:8080".parse().unwrap(), false),
            ("10.244.2.10:8080".parse().unwrap(), true),
        ]))
    );
}

#[test]
fn refusals_and_timeouts_are_told_apart_and_anything_else_is_mixed() {
    let case = flow_from("10.244.0.5");
    let refused = "connect 10.96.0.10:80: Connection refused (os error 111)";
    let timed_out = "connect 10.96.0.10:80: connection timed out";
    assert_eq!(
        observe(&case, &report(&[], 2, &[refused])),
        Observed::Refused
    );
    assert_eq!(
        observe(&case, &report(&[], 2, &[timed_out])),
        Observed::TimedOut
    );
    assert!(matches!(
        observe(&case, &report(&[], 2, &[refused, timed_out])),
        Observed::Mixed(_)
    ));
    assert!(matches!(
        observe(
            &case,
            &report(&[("10.244.1.10:8080 10.244.0.5", 1)], 1, &[refused])
        ),
        Observed::Mixed(_)
    ));
    assert!(matches!(
        observe(&case, &report(&[("server-pod", 2)], 0, &[])),
        Observed::Mixed(_)
    ));
}

#[test]
fn a_connection_its_own_kernel_forbids_is_neither_refused_nor_dropped() {
    let case = flow_from("10.244.0.5");
    let forbidden = "connect 10.96.0.73:80: Operation not permitted (os error 1)";
    let refused = "connect 10.96.0.10:80: Connection refused (os error 111)";
    let observed = observe(&case, &report(&[], 2, &[forbidden]));
    assert_eq!(observed, Observed::Forbidden);
    assert!(fulfils(&case, &Expected::Forbidden, &observed, false));
    assert!(!fulfils(&case, &Expected::Drop, &observed, false));
    assert!(!fulfils(&case, &Expected::Reject, &observed, false));
    assert!(matches!(
        observe(&case, &report(&[], 2, &[forbidden, refused])),
        Observed::Mixed(_)
    ));
}

#[test]
fn endpoints_must_all_answer_unless_the_service_is_sticky() {
    let case = flow_from("10.244.0.5");
    let web_1: SocketAddr = "10.244.1.10:8080".parse().unwrap();
    let web_2: SocketAddr = "10.244.2.10:8080".parse().unwrap();
    let expected = Expected::endpoints([(web_1, false), (web_2, false)]);
    let one = Observed::Answered(BTreeMap::from([(web_1, false)]));
    let both = Observed::Answered(BTreeMap::from([(web_1, false), (web_2, false)]));
    let masqueraded = Observed::Answered(BTreeMap::from([(web_1, true)]));
    assert!(fulfils(&case, &expected, &both, false));
    assert!(!fulfils(&case, &expected, &one, false));
    assert!(fulfils(&case, &expected, &one, true));
    assert!(!fulfils(&case, &expected, &masqueraded, true));
    assert!(!fulfils(&case, &expected, &Observed::Refused, false));
}

#[test]
fn a_passed_connection_reaches_its_destination_unchanged() {
    let mut case = flow_from("10.244.0.5");
    case.flow.destination = "10.244.1.10".parse().unwrap();
    case.flow.port = 8080;
    let itself = Observed::Answered(BTreeMap::from([(
        "10.244.1.10:8080".parse().unwrap(),
        false,
    )]));
    assert!(fulfils(&case, &Expected::Pass, &itself, false));
    assert!(!fulfils(&case, &Expected::Pass, &Observed::TimedOut, false));
}

#[test]
fn ipvs_rejects_where_iptables_drops_for_want_of_a_local_endpoint() {
    let scenario = scenario("node with edge, elsewhere");
    let case = row(
        &scenario,
        "external client to node port without a local endpoint is dropped",
    );
    let (expected, why) = ipvs_expected(&scenario, &case);
    assert_eq!(expected, Expected::Reject);
    assert!(why.unwrap().contains("port unreachable"));
}

#[test]
fn ipvs_rejects_unknown_ports_of_its_service_addresses_and_passes_the_rest() {
    let scenario = scenario("node with web (NodePort), idle");
    let unknown_port = row(
        &scenario,
        "pod to cluster IP on a port the service lacks passes",
    );
    assert_eq!(ipvs_expected(&scenario, &unknown_port).0, Expected::Reject);
    let pod_ip = row(&scenario, "pod to another pod's IP passes");
    assert_eq!(ipvs_expected(&scenario, &pod_ip), (Expected::Pass, None));
    let served = row(
        &scenario,
        "pod to cluster IP reaches the ready endpoints unmasqueraded",
    );
    assert_eq!(
        ipvs_expected(&scenario, &served),
        (served.expected.clone(), None)
    );
}

#[test]
fn every_endpoint_and_passed_destination_has_a_server_and_every_source_a_home() {
    let scenario = scenario("node with web (NodePort), idle");
    let topology = Topology::of(&scenario, "h-");
    let client: IpAddr = "10.244.0.5".parse().unwrap();
    assert!(topology.hosts.contains(&client));
    assert!(
        topology
            .servers
            .contains(&("10.244.1.10:8080".parse().unwrap(), Protocol::Tcp))
    );
    assert!(
        topology
            .servers
            .contains(&("10.244.1.53:53".parse().unwrap(), Protocol::Udp))
    );
    // The node's own port 22 answers the row that passes it.
    assert!(
        topology
            .servers
            .contains(&("198.18.0.11:22".parse().unwrap(), Protocol::Tcp))
    );
    let script = topology.setup_script();
    assert!(script.contains("ip netns add h-10-244-0-5\n"));
    assert!(script.contains("ip route add 10.244.0.5/32 dev veth"));
}

#[test]
fn node_rows_send_from_the_node_address_and_pod_rows_from_their_namespace() {
    let scenario = scenario("node with web (NodePort), idle");
    let node = row(
        &scenario,
        "node to cluster IP reaches the ready endpoints unmasqueraded",
    );
    let topology = Topology::of(&scenario, "h-");
    let words = topology.hit_command(&node, 4, 3000);
    assert_eq!(words[0], "sp-testpod");
    assert!(words.ends_with(&["--source".to_owned(), "198.18.0.11".to_owned()]));
    let udp = row(&scenario, "pod to UDP cluster IP reaches the DNS endpoints");
    let words = topology.hit_command(&udp, 4, 3000);
    assert_eq!(words[..4], ["ip", "netns", "exec", "h-10-244-0-5"]);
    assert!(words.contains(&"udp://10.96.0.53:53/source".to_owned()));
}

#[test]
fn ebpf_forbids_where_iptables_drops_and_knows_pods_without_a_cluster_cidr() {
    let scenario = scenario("node with edge, elsewhere");
    let itp = row(
        &scenario,
        "pod to internalTrafficPolicy Local cluster IP without a local endpoint is dropped",
    );
    assert_eq!(ebpf::expected(&scenario, &itp).0, Expected::Forbidden);
    let pod = row(
        &scenario,
        "pod to externalTrafficPolicy Local node port follows the Local policy without a cluster CIDR",
    );
    let (expected, why) = ebpf::expected(&scenario, &pod);
    assert_eq!(
        expected,
        Expected::endpoints([
            ("10.244.0.70:8080".parse().unwrap(), false),
            ("10.244.1.70:8080".parse().unwrap(), false),
        ])
    );
    assert!(why.is_some());
    let outside = row(
        &scenario,
        "external client to node port with a local endpoint reaches only it, client IP kept",
    );
    assert_eq!(
        ebpf::expected(&scenario, &outside),
        (outside.expected.clone(), None)
    );
}
