//! The health-check servers over real sockets on 127.0.0.1, on ports the kernel picks.
//!
//! Test addresses: endpoints `10.244.0.x` are on this node, `10.244.1.x` on another; IPv6
//! endpoints `fd00:10:244::x`.

use super::*;
use splitproxy_dataplane::{Endpoint, Protocol, Service, ServicePort};
use std::net::Ipv4Addr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TIMEOUT: Duration = Duration::from_secs(60);

fn endpoint(ip: &str, ready: bool, terminating: bool, local: bool) -> Endpoint {
    Endpoint {
        ip: ip.parse().expect("a valid IP"),
        port: 8080,
        ready,
        serving: ready || terminating,
        terminating,
        is_local: local,
        topology_excluded: false,
    }
}

fn ready(ip: &str, local: bool) -> Endpoint {
    endpoint(ip, true, false, local)
}

/// An `externalTrafficPolicy: Local` Service `demo/<name>` with one port per endpoint list.
fn service(name: &str, health_check_node_port: u16, ports: Vec<Vec<Endpoint>>) -> Service {
    Service {
        key: key(name),
        ports: ports
            .into_iter()
            .enumerate()
            .map(|(i, endpoints)| ServicePort {
                name: format!("p{i}"),
                protocol: Protocol::Tcp,
                port: 80 + u16::try_from(i).expect("few ports"),
                node_port: None,
                endpoints,
            })
            .collect(),
        external_traffic_policy: TrafficPolicy::Local,
        health_check_node_port: Some(health_check_node_port),
        ..Default::default()
    }
}

fn key(name: &str) -> ServiceKey {
    ServiceKey {
        namespace: "demo".to_owned(),
        name: name.to_owned(),
    }
}

fn state(services: Vec<Service>) -> ProxyState {
    ProxyState {
        services: services.into_iter().map(|s| (s.key.clone(), s)).collect(),
    }
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bound");
    listener.local_addr().expect("an address").port()
}

fn checks(status: &Status) -> HealthChecks {
    HealthChecks::new(vec![Ipv4Addr::LOCALHOST.into()], status.clone(), TIMEOUT)
}

/// One answer: status code, lowercase header lines, body.
#[derive(Debug)]
struct Answer {
    code: u16,
    headers: Vec<String>,
    body: serde_json::Value,
}

async fn get(port: u16, path: &str) -> std::io::Result<Answer> {
    let mut stream = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await?;
    let (head, body) = raw.split_once("\r\n\r\n").expect("a complete response");
    let mut lines = head.lines();
    let code = lines
        .next()
        .and_then(|status| status.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    Ok(Answer {
        code,
        headers: lines.map(str::to_ascii_lowercase).collect(),
        body: serde_json::from_str(body).expect("a JSON body"),
    })
}

#[test]
fn only_local_policy_services_with_a_port_are_wanted() {
    let cluster = Service {
        external_traffic_policy: TrafficPolicy::Cluster,
        ..service("cluster", 30001, vec![vec![ready("10.244.0.1", true)]])
    };
    let no_port = Service {
        health_check_node_port: None,
        ..service("no-port", 30002, vec![vec![ready("10.244.0.2", true)]])
    };
    let local = service("local", 30003, vec![vec![ready("10.244.0.3", true)]]);

    let wanted = wanted(&state(vec![cluster, no_port, local]));

    assert_eq!(
        wanted,
        BTreeMap::from([(
            30003,
            ServiceHealth {
                service: key("local"),
                local_endpoints: 1
            }
        )])
    );
}

#[test]
fn local_endpoints_counts_distinct_local_ready_ipv4_addresses_over_all_ports() {
    let web = service(
        "web",
        30000,
        vec![
            vec![
                ready("10.244.0.1", true),
                ready("10.244.0.2", true),
                ready("10.244.1.1", false),
                endpoint("10.244.0.3", false, false, true),
                ready("fd00:10:244::1", true),
            ],
            // The same pods behind a second port count once.
            vec![ready("10.244.0.1", true), ready("10.244.0.2", true)],
        ],
    );

    assert_eq!(wanted(&state(vec![web]))[&30000].local_endpoints, 2);
}

#[test]
fn local_endpoints_count_in_the_services_primary_ip_family_only() {
    let pods = || {
        vec![vec![
            ready("10.244.0.1", true),
            ready("fd00:10:244::1", true),
            ready("fd00:10:244::2", true),
        ]]
    };
    let mut dual = service("dual", 30000, pods());
    dual.cluster_ips = vec![
        "10.96.0.30".parse().expect("literal"),
        "fd00:10:96::30".parse().expect("literal"),
    ];
    let mut six = service("six", 30001, pods());
    six.cluster_ips = vec!["fd00:10:96::31".parse().expect("literal")];

    let wanted = wanted(&state(vec![dual, six]));

    assert_eq!(wanted[&30000].local_endpoints, 1);
    assert_eq!(wanted[&30001].local_endpoints, 2);
}

#[test]
fn serving_terminating_local_endpoints_do_not_count() {
    // The dataplane still uses the draining endpoint, but load balancers must stop sending.
    let web = service(
        "web",
        30000,
        vec![vec![
            endpoint("10.244.0.1", false, true, true),
            ready("10.244.1.1", false),
        ]],
    );

    assert_eq!(wanted(&state(vec![web]))[&30000].local_endpoints, 0);
}

#[tokio::test]
async fn any_path_answers_200_with_kube_proxys_body_when_a_local_endpoint_is_ready() {
    let status = Status::default();
    let mut checks = checks(&status);
    let port = free_port();
    checks.reconcile(&state(vec![service(
        "web",
        port,
        vec![vec![ready("10.244.0.1", true), ready("10.244.1.1", false)]],
    )]));

    for path in ["/", "/healthz", "/anything/else"] {
        let answer = get(port, path).await.expect("served");
        assert_eq!(answer.code, 200, "{path}");
        assert_eq!(
            answer.body,
            serde_json::json!({
                "service": {"namespace": "demo", "name": "web"},
                "localEndpoints": 1,
                "serviceProxyHealthy": true,
            })
        );
        assert!(
            answer
                .headers
                .contains(&"content-type: application/json".to_owned())
        );
        assert!(
            answer
                .headers
                .contains(&"x-content-type-options: nosniff".to_owned())
        );
        assert!(
            answer
                .headers
                .contains(&"x-load-balancing-endpoint-weight: 1".to_owned())
        );
    }
}

#[tokio::test]
async fn no_local_endpoint_answers_503() {
    let status = Status::default();
    let mut checks = checks(&status);
    let port = free_port();
    checks.reconcile(&state(vec![service(
        "web",
        port,
        vec![vec![ready("10.244.1.1", false)]],
    )]));

    let answer = get(port, "/").await.expect("served");

    assert_eq!(answer.code, 503);
    assert_eq!(answer.body["localEndpoints"], 0);
    assert_eq!(answer.body["serviceProxyHealthy"], true);
}

#[tokio::test(start_paused = true)]
async fn unhealthy_proxy_answers_503_despite_local_endpoints() {
    let status = Status::default();
    let mut checks = checks(&status);
    let port = free_port();
    checks.reconcile(&state(vec![service(
        "web",
        port,
        vec![vec![ready("10.244.0.1", true)]],
    )]));
    status.update(|s| s.queued_since = Some(tokio::time::Instant::now()));
    tokio::time::advance(TIMEOUT + Duration::from_secs(1)).await;

    let answer = get(port, "/").await.expect("served");

    assert_eq!(answer.code, 503);
    assert_eq!(answer.body["localEndpoints"], 1);
    assert_eq!(answer.body["serviceProxyHealthy"], false);
}

#[tokio::test]
async fn reconcile_updates_counts_in_place_and_stops_removed_ports() {
    let status = Status::default();
    let mut checks = checks(&status);
    let (web_port, api_port) = (free_port(), free_port());
    checks.reconcile(&state(vec![
        service("web", web_port, vec![vec![ready("10.244.0.1", true)]]),
        service("api", api_port, vec![vec![ready("10.244.0.9", true)]]),
    ]));
    let started = checks.addresses();
    assert_eq!(
        started.keys().copied().collect::<BTreeSet<_>>(),
        BTreeSet::from([web_port, api_port])
    );
    // A connection kept open across the update shows the same server answers.
    let mut kept = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, web_port))
        .await
        .expect("connected");

    checks.reconcile(&state(vec![service(
        "web",
        web_port,
        vec![vec![ready("10.244.1.1", false)]],
    )]));

    assert_eq!(
        checks.addresses(),
        BTreeMap::from([(web_port, started[&web_port].clone())])
    );
    kept.write_all(b"GET / HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")
        .await
        .expect("sent");
    let mut raw = String::new();
    kept.read_to_string(&mut raw).await.expect("read");
    assert!(raw.starts_with("HTTP/1.1 503"), "{raw}");
    assert!(raw.contains(r#""localEndpoints":0"#), "{raw}");
    // The removed port stops listening (shutdown is asynchronous, so allow it a moment).
    let mut refused = false;
    for _ in 0..100 {
        if get(api_port, "/").await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "the api server still answers");
}

#[tokio::test]
async fn a_port_that_cannot_be_bound_is_retried_on_the_next_reconcile() {
    let status = Status::default();
    let mut checks = checks(&status);
    let taken = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bound");
    let port = taken.local_addr().expect("an address").port();
    let web = state(vec![service(
        "web",
        port,
        vec![vec![ready("10.244.0.1", true)]],
    )]);

    checks.reconcile(&web);
    assert!(checks.addresses().is_empty());

    drop(taken);
    checks.reconcile(&web);

    assert_eq!(
        checks.addresses().keys().copied().collect::<Vec<_>>(),
        [port]
    );
    assert_eq!(get(port, "/").await.expect("served").code, 200);
}

/// A reset revision holding `demo/web` (`externalTrafficPolicy: Local`, health-check node port
/// `port`) with one ready endpoint, local to this node or not.
fn web_revision(number: u64, port: u16, local: bool) -> crate::node_state::Revision {
    use splitproxy_proto::v1alpha1 as pb;
    let key = pb::ObjectKey {
        namespace: "demo".into(),
        name: "web".into(),
    };
    crate::node_state::Revision {
        epoch: "epoch-1".into(),
        number,
        reset: true,
        on_presented_state: false,
        parts: vec![pb::SyncResponse {
            controller_epoch: "epoch-1".into(),
            revision: number,
            reset: true,
            complete: true,
            upserted_services: vec![pb::Service {
                key: Some(key.clone()),
                cluster_ips: vec!["10.96.0.10".into()],
                ports: vec![pb::ServicePort {
                    name: "http".into(),
                    protocol: pb::Protocol::Tcp as i32,
                    port: 80,
                    node_port: 30080,
                }],
                external_traffic_policy_local: true,
                health_check_node_port: u32::from(port),
                ..Default::default()
            }],
            upserted_endpoints: vec![pb::ServiceEndpoints {
                key: Some(key),
                ports: vec![pb::PortEndpoints {
                    port_name: "http".into(),
                    protocol: pb::Protocol::Tcp as i32,
                    endpoints: vec![pb::Endpoint {
                        address: "10.244.0.1".into(),
                        port: 8080,
                        conditions: Some(pb::EndpointConditions {
                            ready: true,
                            serving: true,
                            terminating: false,
                        }),
                        is_local: local,
                        ..pb::Endpoint::default()
                    }],
                }],
                ..pb::ServiceEndpoints::default()
            }],
            ..Default::default()
        }],
    }
}

#[tokio::test]
async fn the_applier_reconciles_the_servers_after_each_applied_revision() {
    let status = Status::default();
    let dataplane = splitproxy_dataplane::testing::recording::RecordingDataplane::default();
    let mut applier = crate::sync::Applier::new(
        "node-1",
        dataplane,
        status.clone(),
        crate::metrics::Metrics::new(&mut Default::default()),
    )
    .with_health_checks(checks(&status));
    let port = free_port();

    applier
        .apply(&web_revision(1, port, true))
        .await
        .expect("applied");
    let answer = get(port, "/").await.expect("served");
    assert_eq!(
        (answer.code, &answer.body["localEndpoints"]),
        (200, &1.into())
    );

    applier
        .apply(&web_revision(2, port, false))
        .await
        .expect("applied");
    let answer = get(port, "/").await.expect("served");
    assert_eq!(
        (answer.code, &answer.body["localEndpoints"]),
        (503, &0.into())
    );
}

#[tokio::test]
async fn every_bind_address_listens_or_none_does() {
    let status = Status::default();
    let (first, second): (IpAddr, IpAddr) = (
        Ipv4Addr::LOCALHOST.into(),
        Ipv4Addr::new(127, 0, 0, 2).into(),
    );
    let mut checks = HealthChecks::new(vec![first, second], status.clone(), TIMEOUT);
    let port = free_port();
    let web = state(vec![service(
        "web",
        port,
        vec![vec![ready("10.244.0.1", true)]],
    )]);
    // The second address's port taken: the first is not kept listening alone.
    let taken = std::net::TcpListener::bind((second, port)).expect("bound");
    checks.reconcile(&web);
    assert!(checks.addresses().is_empty());
    assert!(
        tokio::net::TcpStream::connect((first, port)).await.is_err(),
        "the first address listens alone"
    );
    drop(taken);
    checks.reconcile(&web);
    assert_eq!(
        checks.addresses(),
        BTreeMap::from([(
            port,
            vec![SocketAddr::new(first, port), SocketAddr::new(second, port)]
        )])
    );
    for ip in [first, second] {
        tokio::net::TcpStream::connect((ip, port))
            .await
            .expect("listening");
    }
}

#[tokio::test]
async fn rebinding_moves_the_servers_at_the_next_reconcile() {
    let status = Status::default();
    let (first, second): (IpAddr, IpAddr) = (
        Ipv4Addr::LOCALHOST.into(),
        Ipv4Addr::new(127, 0, 0, 3).into(),
    );
    let mut checks = HealthChecks::new(vec![first], status.clone(), TIMEOUT);
    let port = free_port();
    let web = state(vec![service(
        "web",
        port,
        vec![vec![ready("10.244.0.1", true)]],
    )]);
    checks.reconcile(&web);
    checks.rebind(vec![second]);
    checks.reconcile(&web);
    assert_eq!(
        checks.addresses(),
        BTreeMap::from([(port, vec![SocketAddr::new(second, port)])])
    );
}
