//! The table's rows: one [`Scenario`] per kind of node, each a state and the flows through it,
//! with the fixtures that build them. Addresses follow the plan in the parent module.

use super::*;

const WEB_IP: IpAddr = v4(10, 96, 0, 10);
const WEB_NODE_PORT: u16 = 30080;
const WEB_1: SocketAddr = at(v4(10, 244, 1, 10), 8080);
const WEB_2: SocketAddr = at(v4(10, 244, 2, 10), 8080);
const WEB_STARTING: SocketAddr = at(v4(10, 244, 3, 10), 8080);
/// `default/idle`: ClusterIP and NodePort, its only endpoint not ready.
const IDLE_IP: IpAddr = v4(10, 96, 0, 20);
const IDLE_NODE_PORT: u16 = 30081;
const IDLE_STARTING: SocketAddr = at(v4(10, 244, 1, 20), 8080);
/// `kube-system/kube-dns`: UDP only.
const DNS_IP: IpAddr = v4(10, 96, 0, 53);
const DNS_1: SocketAddr = at(v4(10, 244, 1, 53), 53);
const DNS_2: SocketAddr = at(v4(10, 244, 2, 53), 53);
/// `shop/api`: two named ports with target ports that differ from the service ports.
const API_IP: IpAddr = v4(10, 96, 0, 30);
const API_1: IpAddr = v4(10, 244, 1, 30);
const API_2: IpAddr = v4(10, 244, 2, 30);

pub(super) fn node_with_services() -> Scenario {
    let web = service(
        "default",
        "web",
        WEB_IP,
        vec![ServicePort::new(
            "",
            Protocol::Tcp,
            80,
            Some(WEB_NODE_PORT),
            vec![ready(WEB_1), ready(WEB_2), starting(WEB_STARTING)],
        )],
    );
    let idle = service(
        "default",
        "idle",
        IDLE_IP,
        vec![ServicePort::new(
            "",
            Protocol::Tcp,
            80,
            Some(IDLE_NODE_PORT),
            vec![starting(IDLE_STARTING)],
        )],
    );
    let dns = service(
        "kube-system",
        "kube-dns",
        DNS_IP,
        vec![ServicePort::new(
            "dns",
            Protocol::Udp,
            53,
            None,
            vec![ready(DNS_1), ready(DNS_2)],
        )],
    );
    let api = service(
        "shop",
        "api",
        API_IP,
        vec![
            ServicePort::new(
                "http",
                Protocol::Tcp,
                80,
                None,
                vec![ready(at(API_1, 8080)), ready(at(API_2, 8080))],
            ),
            ServicePort::new(
                "metrics",
                Protocol::Tcp,
                9090,
                None,
                vec![ready(at(API_1, 9100)), ready(at(API_2, 9100))],
            ),
        ],
    );

    let web_direct = || Expected::endpoints([(WEB_1, false), (WEB_2, false)]);
    let web_masqueraded = || Expected::endpoints([(WEB_1, true), (WEB_2, true)]);
    use Origin::{External, Node, Pod};
    use Protocol::{Tcp, Udp};
    let cases = vec![
        case(
            "pod to cluster IP reaches the ready endpoints unmasqueraded",
            (Pod, CLIENT_POD),
            (Tcp, WEB_IP, 80),
            web_direct(),
        ),
        case(
            "node to cluster IP reaches the ready endpoints unmasqueraded",
            (Node, NODE_IP),
            (Tcp, WEB_IP, 80),
            web_direct(),
        ),
        case(
            "external client to node port reaches the ready endpoints masqueraded",
            (External, EXTERNAL_CLIENT),
            (Tcp, NODE_IP, WEB_NODE_PORT),
            web_masqueraded(),
        ),
        case(
            "pod to node port reaches the ready endpoints masqueraded",
            (Pod, CLIENT_POD),
            (Tcp, NODE_IP, WEB_NODE_PORT),
            web_masqueraded(),
        ),
        case(
            "node to its own node port reaches the ready endpoints masqueraded",
            (Node, NODE_IP),
            (Tcp, NODE_IP, WEB_NODE_PORT),
            web_masqueraded(),
        ),
        case(
            "endpoint to its own service is masqueraded only when it reaches itself",
            (Pod, WEB_1.ip()),
            (Tcp, WEB_IP, 80),
            Expected::endpoints([(WEB_1, true), (WEB_2, false)]),
        ),
        case(
            "pod to cluster IP on a port the service lacks passes",
            (Pod, CLIENT_POD),
            (Tcp, WEB_IP, 443),
            Expected::Pass,
        ),
        case(
            "pod to another pod's IP passes",
            (Pod, CLIENT_POD),
            (Tcp, WEB_1.ip(), WEB_1.port()),
            Expected::Pass,
        ),
        case(
            "pod to an address outside the cluster passes",
            (Pod, CLIENT_POD),
            (Tcp, EXTERNAL_CLIENT, 443),
            Expected::Pass,
        ),
        case(
            "external client to a node port no service has passes",
            (External, EXTERNAL_CLIENT),
            (Tcp, NODE_IP, 22),
            Expected::Pass,
        ),
        case(
            "pod to cluster IP without ready endpoints is rejected",
            (Pod, CLIENT_POD),
            (Tcp, IDLE_IP, 80),
            Expected::Reject,
        ),
        case(
            "node to cluster IP without ready endpoints is rejected",
            (Node, NODE_IP),
            (Tcp, IDLE_IP, 80),
            Expected::Reject,
        ),
        case(
            "external client to node port without ready endpoints is rejected",
            (External, EXTERNAL_CLIENT),
            (Tcp, NODE_IP, IDLE_NODE_PORT),
            Expected::Reject,
        ),
        case(
            "pod to UDP cluster IP reaches the DNS endpoints",
            (Pod, CLIENT_POD),
            (Udp, DNS_IP, 53),
            Expected::endpoints([(DNS_1, false), (DNS_2, false)]),
        ),
        case(
            "pod to UDP-only cluster IP over TCP passes",
            (Pod, CLIENT_POD),
            (Tcp, DNS_IP, 53),
            Expected::Pass,
        ),
        case(
            "pod to a multi-port service's http port reaches the http target port",
            (Pod, CLIENT_POD),
            (Tcp, API_IP, 80),
            Expected::endpoints([(at(API_1, 8080), false), (at(API_2, 8080), false)]),
        ),
        case(
            "pod to a multi-port service's metrics port reaches the metrics target port",
            (Pod, CLIENT_POD),
            (Tcp, API_IP, 9090),
            Expected::endpoints([(at(API_1, 9100), false), (at(API_2, 9100), false)]),
        ),
    ];

    Scenario {
        name: "node with web (NodePort), idle (no ready endpoints), kube-dns (UDP) and api (two named ports)",
        state: state([web, idle, dns, api]),
        node_ips: vec![NODE_IP],
        cluster_cidrs: Vec::new(),
        masquerade_all: false,
        node_port_addresses: None,
        cases,
    }
}

pub(super) fn node_without_services() -> Scenario {
    use Origin::{External, Pod};
    Scenario {
        name: "node without services",
        state: ProxyState::default(),
        node_ips: vec![NODE_IP],
        cluster_cidrs: Vec::new(),
        masquerade_all: false,
        node_port_addresses: None,
        cases: vec![
            case(
                "pod to an unused cluster IP passes",
                (Pod, CLIENT_POD),
                (Protocol::Tcp, WEB_IP, 80),
                Expected::Pass,
            ),
            case(
                "external client to an unused node port passes",
                (External, EXTERNAL_CLIENT),
                (Protocol::Tcp, NODE_IP, WEB_NODE_PORT),
                Expected::Pass,
            ),
        ],
    }
}

/// `default/draining`: every endpoint terminating, one still serving.
const DRAINING_IP: IpAddr = v4(10, 96, 0, 40);
const DRAINING_SERVING: SocketAddr = at(v4(10, 244, 1, 40), 8080);
const DRAINING_GONE: SocketAddr = at(v4(10, 244, 2, 40), 8080);
/// `default/gone`: ClusterIP and NodePort, its only endpoint terminating and no longer serving.
const GONE_IP: IpAddr = v4(10, 96, 0, 41);
const GONE_NODE_PORT: u16 = 30082;
const GONE_1: SocketAddr = at(v4(10, 244, 1, 41), 8080);
/// `default/rolling`: one ready endpoint and one terminating but still serving.
const ROLLING_IP: IpAddr = v4(10, 96, 0, 42);
const ROLLING_READY: SocketAddr = at(v4(10, 244, 1, 42), 8080);
const ROLLING_DRAINING: SocketAddr = at(v4(10, 244, 2, 42), 8080);

/// Terminating endpoints (KEP-1669): used only while no endpoint is ready, and only if serving.
pub(super) fn node_with_terminating_endpoints() -> Scenario {
    let draining_service = service(
        "default",
        "draining",
        DRAINING_IP,
        vec![ServicePort::new(
            "",
            Protocol::Tcp,
            80,
            None,
            vec![draining(DRAINING_SERVING), gone(DRAINING_GONE)],
        )],
    );
    let gone_service = service(
        "default",
        "gone",
        GONE_IP,
        vec![ServicePort::new(
            "",
            Protocol::Tcp,
            80,
            Some(GONE_NODE_PORT),
            vec![gone(GONE_1)],
        )],
    );
    let rolling = service(
        "default",
        "rolling",
        ROLLING_IP,
        vec![ServicePort::new(
            "",
            Protocol::Tcp,
            80,
            None,
            vec![ready(ROLLING_READY), draining(ROLLING_DRAINING)],
        )],
    );
    use Origin::{External, Pod};
    use Protocol::Tcp;
    Scenario {
        name: "node with draining (only terminating endpoints), gone (none serving) and rolling (ready and terminating)",
        state: state([draining_service, gone_service, rolling]),
        node_ips: vec![NODE_IP],
        cluster_cidrs: Vec::new(),
        masquerade_all: false,
        node_port_addresses: None,
        cases: vec![
            case(
                "pod to cluster IP whose endpoints all terminate reaches the one still serving",
                (Pod, CLIENT_POD),
                (Tcp, DRAINING_IP, 80),
                Expected::endpoints([(DRAINING_SERVING, false)]),
            ),
            case(
                "pod to cluster IP whose only endpoint terminates and no longer serves is rejected",
                (Pod, CLIENT_POD),
                (Tcp, GONE_IP, 80),
                Expected::Reject,
            ),
            case(
                "external client to node port whose only endpoint no longer serves is rejected",
                (External, EXTERNAL_CLIENT),
                (Tcp, NODE_IP, GONE_NODE_PORT),
                Expected::Reject,
            ),
            case(
                "pod to cluster IP with a ready endpoint never reaches the terminating one",
                (Pod, CLIENT_POD),
                (Tcp, ROLLING_IP, 80),
                Expected::endpoints([(ROLLING_READY, false)]),
            ),
        ],
    }
}

/// `shop/front`: ClusterIP, an external IP and a load-balancer IP, two ready endpoints.
const FRONT_IP: IpAddr = v4(10, 96, 0, 50);
const FRONT_EXTERNAL_IP: IpAddr = v4(192, 0, 2, 50);
const FRONT_LB_IP: IpAddr = v4(192, 0, 2, 51);
const FRONT_1: SocketAddr = at(v4(10, 244, 1, 50), 8080);
const FRONT_2: SocketAddr = at(v4(10, 244, 2, 50), 8080);
/// `shop/closed`: an external IP and a load-balancer IP, no usable endpoint.
const CLOSED_IP: IpAddr = v4(10, 96, 0, 51);
const CLOSED_EXTERNAL_IP: IpAddr = v4(192, 0, 2, 52);
const CLOSED_LB_IP: IpAddr = v4(192, 0, 2, 53);
const CLOSED_STARTING: SocketAddr = at(v4(10, 244, 1, 51), 8080);

/// `spec.externalIPs` and load-balancer ingress IPs (`externalTrafficPolicy: Cluster`).
pub(super) fn node_with_external_ips() -> Scenario {
    let front = Service {
        external_ips: vec![FRONT_EXTERNAL_IP],
        load_balancer_ips: vec![FRONT_LB_IP],
        ..service(
            "shop",
            "front",
            FRONT_IP,
            vec![ServicePort::new(
                "http",
                Protocol::Tcp,
                80,
                None,
                vec![ready(FRONT_1), ready(FRONT_2)],
            )],
        )
    };
    let closed = Service {
        external_ips: vec![CLOSED_EXTERNAL_IP],
        load_balancer_ips: vec![CLOSED_LB_IP],
        ..service(
            "shop",
            "closed",
            CLOSED_IP,
            vec![ServicePort::new(
                "http",
                Protocol::Tcp,
                80,
                None,
                vec![starting(CLOSED_STARTING)],
            )],
        )
    };
    let masqueraded = || Expected::endpoints([(FRONT_1, true), (FRONT_2, true)]);
    use Origin::{External, Node, Pod};
    use Protocol::{Tcp, Udp};
    Scenario {
        name: "node with front (external IP and load-balancer IP) and closed (the same, no endpoints)",
        state: state([front, closed]),
        node_ips: vec![NODE_IP],
        cluster_cidrs: Vec::new(),
        masquerade_all: false,
        node_port_addresses: None,
        cases: vec![
            case(
                "external client to external IP reaches the endpoints masqueraded",
                (External, EXTERNAL_CLIENT),
                (Tcp, FRONT_EXTERNAL_IP, 80),
                masqueraded(),
            ),
            case(
                "external client to load-balancer IP reaches the endpoints masqueraded",
                (External, EXTERNAL_CLIENT),
                (Tcp, FRONT_LB_IP, 80),
                masqueraded(),
            ),
            case(
                "pod to external IP reaches the endpoints masqueraded",
                (Pod, CLIENT_POD),
                (Tcp, FRONT_EXTERNAL_IP, 80),
                masqueraded(),
            ),
            case(
                "node to load-balancer IP reaches the endpoints masqueraded",
                (Node, NODE_IP),
                (Tcp, FRONT_LB_IP, 80),
                masqueraded(),
            ),
            case(
                "pod to cluster IP of a service with external IPs stays unmasqueraded",
                (Pod, CLIENT_POD),
                (Tcp, FRONT_IP, 80),
                Expected::endpoints([(FRONT_1, false), (FRONT_2, false)]),
            ),
            case(
                "external client to external IP on a port the service lacks passes",
                (External, EXTERNAL_CLIENT),
                (Tcp, FRONT_EXTERNAL_IP, 443),
                Expected::Pass,
            ),
            case(
                "external client to external IP over another protocol passes",
                (External, EXTERNAL_CLIENT),
                (Udp, FRONT_EXTERNAL_IP, 80),
                Expected::Pass,
            ),
            case(
                "external client to external IP without endpoints is rejected",
                (External, EXTERNAL_CLIENT),
                (Tcp, CLOSED_EXTERNAL_IP, 80),
                Expected::Reject,
            ),
            case(
                "external client to load-balancer IP without endpoints is rejected",
                (External, EXTERNAL_CLIENT),
                (Tcp, CLOSED_LB_IP, 80),
                Expected::Reject,
            ),
            case(
                "pod to external IP without endpoints is rejected",
                (Pod, CLIENT_POD),
                (Tcp, CLOSED_EXTERNAL_IP, 80),
                Expected::Reject,
            ),
        ],
    }
}

/// `default/sticky`: ClusterIP and NodePort with `sessionAffinity: ClientIP`, two endpoints.
const STICKY_IP: IpAddr = v4(10, 96, 0, 60);
const STICKY_NODE_PORT: u16 = 30060;
const STICKY_1: SocketAddr = at(v4(10, 244, 1, 60), 8080);
const STICKY_2: SocketAddr = at(v4(10, 244, 2, 60), 8080);

/// Session affinity: a first connection may reach any endpoint (which one a returning client
/// gets depends on its history, which no row has).
pub(super) fn node_with_session_affinity() -> Scenario {
    let sticky = Service {
        session_affinity: Some(Duration::from_secs(10800)),
        ..service(
            "default",
            "sticky",
            STICKY_IP,
            vec![ServicePort::new(
                "",
                Protocol::Tcp,
                80,
                Some(STICKY_NODE_PORT),
                vec![ready(STICKY_1), ready(STICKY_2)],
            )],
        )
    };
    use Origin::{External, Pod};
    use Protocol::Tcp;
    Scenario {
        name: "node with sticky (session affinity, NodePort)",
        state: state([sticky]),
        node_ips: vec![NODE_IP],
        cluster_cidrs: Vec::new(),
        masquerade_all: false,
        node_port_addresses: None,
        cases: vec![
            case(
                "pod to cluster IP with session affinity reaches exactly its endpoints",
                (Pod, CLIENT_POD),
                (Tcp, STICKY_IP, 80),
                Expected::endpoints([(STICKY_1, false), (STICKY_2, false)]),
            ),
            case(
                "external client to node port with session affinity reaches its endpoints masqueraded",
                (External, EXTERNAL_CLIENT),
                (Tcp, NODE_IP, STICKY_NODE_PORT),
                Expected::endpoints([(STICKY_1, true), (STICKY_2, true)]),
            ),
            case(
                "pod to cluster IP with session affinity on another port passes",
                (Pod, CLIENT_POD),
                (Tcp, STICKY_IP, 81),
                Expected::Pass,
            ),
        ],
    }
}

/// `default/edge`: NodePort, `externalTrafficPolicy: Local`, one endpoint here, one elsewhere.
const EDGE_IP: IpAddr = v4(10, 96, 0, 70);
const EDGE_NODE_PORT: u16 = 30070;
const EDGE_HERE: SocketAddr = at(v4(10, 244, 0, 70), 8080);
const EDGE_THERE: SocketAddr = at(v4(10, 244, 1, 70), 8080);
/// `default/elsewhere`: NodePort and external IP, `externalTrafficPolicy: Local`, endpoints on
/// other nodes only.
const ELSEWHERE_IP: IpAddr = v4(10, 96, 0, 71);
const ELSEWHERE_NODE_PORT: u16 = 30071;
const ELSEWHERE_EXTERNAL_IP: IpAddr = v4(192, 0, 2, 71);
const ELSEWHERE_THERE: SocketAddr = at(v4(10, 244, 1, 71), 8080);
/// `default/edge-draining`: NodePort, `externalTrafficPolicy: Local`, the local endpoint
/// terminating (still serving), a ready one elsewhere.
const EDGE_DRAINING_NODE_PORT: u16 = 30074;
const EDGE_DRAINING_IP: IpAddr = v4(10, 96, 0, 74);
const EDGE_DRAINING_HERE: SocketAddr = at(v4(10, 244, 0, 74), 8080);
const EDGE_DRAINING_THERE: SocketAddr = at(v4(10, 244, 1, 74), 8080);
/// `default/node-cache`: `internalTrafficPolicy: Local`, one endpoint here, one elsewhere.
const CACHE_IP: IpAddr = v4(10, 96, 0, 72);
const CACHE_HERE: SocketAddr = at(v4(10, 244, 0, 72), 8080);
const CACHE_THERE: SocketAddr = at(v4(10, 244, 1, 72), 8080);
/// `default/node-agent`: `internalTrafficPolicy: Local`, endpoints on other nodes only.
const AGENT_IP: IpAddr = v4(10, 96, 0, 73);
const AGENT_THERE: SocketAddr = at(v4(10, 244, 1, 73), 8080);

/// `externalTrafficPolicy: Local` and `internalTrafficPolicy: Local`: only endpoints on this node,
/// the client IP kept for external traffic; DROP where there is none (but some elsewhere).
///
/// No cluster CIDR is configured here, so pod traffic to an external destination is not
/// short-circuited to every endpoint as upstream does with a local-traffic detector: it follows
/// the Local policy like any other external client ([`node_with_cluster_cidr`] has the detector).
pub(super) fn node_with_local_traffic_policies() -> Scenario {
    let external_local = |service: Service| Service {
        external_traffic_policy: TrafficPolicy::Local,
        ..service
    };
    let internal_local = |service: Service| Service {
        internal_traffic_policy: TrafficPolicy::Local,
        ..service
    };
    let edge = external_local(service(
        "default",
        "edge",
        EDGE_IP,
        one_port(
            Some(EDGE_NODE_PORT),
            vec![local(EDGE_HERE), ready(EDGE_THERE)],
        ),
    ));
    let elsewhere = external_local(Service {
        external_ips: vec![ELSEWHERE_EXTERNAL_IP],
        ..service(
            "default",
            "elsewhere",
            ELSEWHERE_IP,
            one_port(Some(ELSEWHERE_NODE_PORT), vec![ready(ELSEWHERE_THERE)]),
        )
    });
    let edge_draining = external_local(service(
        "default",
        "edge-draining",
        EDGE_DRAINING_IP,
        one_port(
            Some(EDGE_DRAINING_NODE_PORT),
            vec![
                Endpoint {
                    is_local: true,
                    ..draining(EDGE_DRAINING_HERE)
                },
                ready(EDGE_DRAINING_THERE),
            ],
        ),
    ));
    let cache = internal_local(service(
        "default",
        "node-cache",
        CACHE_IP,
        one_port(None, vec![local(CACHE_HERE), ready(CACHE_THERE)]),
    ));
    let agent = internal_local(service(
        "default",
        "node-agent",
        AGENT_IP,
        one_port(None, vec![ready(AGENT_THERE)]),
    ));

    use Origin::{External, Node, Pod};
    use Protocol::Tcp;
    let cases = vec![
        case(
            "external client to node port with a local endpoint reaches only it, client IP kept",
            (External, EXTERNAL_CLIENT),
            (Tcp, NODE_IP, EDGE_NODE_PORT),
            Expected::endpoints([(EDGE_HERE, false)]),
        ),
        case(
            "node to its own externalTrafficPolicy Local node port reaches every endpoint masqueraded",
            (Node, NODE_IP),
            (Tcp, NODE_IP, EDGE_NODE_PORT),
            Expected::endpoints([(EDGE_HERE, true), (EDGE_THERE, true)]),
        ),
        case(
            "pod to externalTrafficPolicy Local node port follows the Local policy without a cluster CIDR",
            (Pod, CLIENT_POD),
            (Tcp, NODE_IP, EDGE_NODE_PORT),
            Expected::endpoints([(EDGE_HERE, false)]),
        ),
        case(
            "pod to cluster IP of an externalTrafficPolicy Local service reaches every endpoint",
            (Pod, CLIENT_POD),
            (Tcp, EDGE_IP, 80),
            Expected::endpoints([(EDGE_HERE, false), (EDGE_THERE, false)]),
        ),
        case(
            "local endpoint to its own service is masqueraded only when it reaches itself",
            (Pod, EDGE_HERE.ip()),
            (Tcp, EDGE_IP, 80),
            Expected::endpoints([(EDGE_HERE, true), (EDGE_THERE, false)]),
        ),
        case(
            "external client to node port without a local endpoint is dropped",
            (External, EXTERNAL_CLIENT),
            (Tcp, NODE_IP, ELSEWHERE_NODE_PORT),
            Expected::Drop,
        ),
        case(
            "external client to external IP without a local endpoint is dropped",
            (External, EXTERNAL_CLIENT),
            (Tcp, ELSEWHERE_EXTERNAL_IP, 80),
            Expected::Drop,
        ),
        case(
            "node to its own node port without a local endpoint reaches the remote one masqueraded",
            (Node, NODE_IP),
            (Tcp, NODE_IP, ELSEWHERE_NODE_PORT),
            Expected::endpoints([(ELSEWHERE_THERE, true)]),
        ),
        case(
            "pod to cluster IP of a service without a local endpoint still reaches the remote one",
            (Pod, CLIENT_POD),
            (Tcp, ELSEWHERE_IP, 80),
            Expected::endpoints([(ELSEWHERE_THERE, false)]),
        ),
        case(
            "external client to node port whose local endpoint terminates reaches it while serving",
            (External, EXTERNAL_CLIENT),
            (Tcp, NODE_IP, EDGE_DRAINING_NODE_PORT),
            Expected::endpoints([(EDGE_DRAINING_HERE, false)]),
        ),
        case(
            "pod to internalTrafficPolicy Local cluster IP reaches only the local endpoint",
            (Pod, CLIENT_POD),
            (Tcp, CACHE_IP, 80),
            Expected::endpoints([(CACHE_HERE, false)]),
        ),
        case(
            "node to internalTrafficPolicy Local cluster IP reaches only the local endpoint",
            (Node, NODE_IP),
            (Tcp, CACHE_IP, 80),
            Expected::endpoints([(CACHE_HERE, false)]),
        ),
        case(
            "pod to internalTrafficPolicy Local cluster IP without a local endpoint is dropped",
            (Pod, CLIENT_POD),
            (Tcp, AGENT_IP, 80),
            Expected::Drop,
        ),
        case(
            "node to internalTrafficPolicy Local cluster IP without a local endpoint is dropped",
            (Node, NODE_IP),
            (Tcp, AGENT_IP, 80),
            Expected::Drop,
        ),
    ];
    Scenario {
        name: "node with edge, elsewhere and edge-draining (externalTrafficPolicy Local), node-cache and node-agent (internalTrafficPolicy Local)",
        state: state([edge, elsewhere, edge_draining, cache, agent]),
        node_ips: vec![NODE_IP],
        cluster_cidrs: Vec::new(),
        masquerade_all: false,
        node_port_addresses: None,
        cases,
    }
}

/// `shop/guarded`: NodePort and a load-balancer IP open to `203.0.113.0/28` only.
const GUARDED_IP: IpAddr = v4(10, 96, 0, 80);
const GUARDED_LB_IP: IpAddr = v4(192, 0, 2, 80);
const GUARDED_NODE_PORT: u16 = 30090;
const GUARDED_1: SocketAddr = at(v4(10, 244, 1, 80), 8080);
const GUARDED_2: SocketAddr = at(v4(10, 244, 2, 80), 8080);

/// `loadBalancerSourceRanges`: only the listed sources reach the load-balancer IP; as upstream,
/// the node port and cluster IP are not filtered.
pub(super) fn node_with_load_balancer_source_ranges() -> Scenario {
    let guarded = Service {
        load_balancer_ips: vec![GUARDED_LB_IP],
        load_balancer_source_ranges: vec![Cidr {
            address: v4(203, 0, 113, 0),
            prefix: 28,
        }],
        ..service(
            "shop",
            "guarded",
            GUARDED_IP,
            vec![ServicePort::new(
                "https",
                Protocol::Tcp,
                443,
                Some(GUARDED_NODE_PORT),
                vec![ready(GUARDED_1), ready(GUARDED_2)],
            )],
        )
    };
    let masqueraded = || Expected::endpoints([(GUARDED_1, true), (GUARDED_2, true)]);
    use Origin::{External, Pod};
    use Protocol::Tcp;
    Scenario {
        name: "node with guarded (load-balancer IP with source ranges, NodePort)",
        state: state([guarded]),
        node_ips: vec![NODE_IP],
        cluster_cidrs: Vec::new(),
        masquerade_all: false,
        node_port_addresses: None,
        cases: vec![
            case(
                "external client inside the source ranges to load-balancer IP reaches the endpoints masqueraded",
                (External, EXTERNAL_CLIENT),
                (Tcp, GUARDED_LB_IP, 443),
                masqueraded(),
            ),
            case(
                "external client outside the source ranges to load-balancer IP is dropped",
                (External, OTHER_EXTERNAL_CLIENT),
                (Tcp, GUARDED_LB_IP, 443),
                Expected::Drop,
            ),
            case(
                "pod outside the source ranges to load-balancer IP is dropped",
                (Pod, CLIENT_POD),
                (Tcp, GUARDED_LB_IP, 443),
                Expected::Drop,
            ),
            case(
                "external client outside the source ranges to node port is not filtered",
                (External, OTHER_EXTERNAL_CLIENT),
                (Tcp, NODE_IP, GUARDED_NODE_PORT),
                masqueraded(),
            ),
            case(
                "pod to cluster IP of a service with source ranges is not filtered",
                (Pod, CLIENT_POD),
                (Tcp, GUARDED_IP, 443),
                Expected::endpoints([(GUARDED_1, false), (GUARDED_2, false)]),
            ),
            case(
                "external client outside the source ranges to load-balancer IP on another port passes",
                (External, OTHER_EXTERNAL_CLIENT),
                (Tcp, GUARDED_LB_IP, 80),
                Expected::Pass,
            ),
        ],
    }
}

/// `shop/held` and `shop/held-closed`: load-balancer IPs the node holds as local addresses (as
/// VIP-style load balancers set them up), the first open to a range holding the node's IP, the
/// second to the external client only.
const HELD_IP: IpAddr = v4(10, 96, 0, 81);
const HELD_LB_IP: IpAddr = v4(192, 0, 2, 81);
const HELD_CLOSED_IP: IpAddr = v4(10, 96, 0, 82);
const HELD_CLOSED_LB_IP: IpAddr = v4(192, 0, 2, 82);
const HELD_1: SocketAddr = at(v4(10, 244, 1, 81), 8080);

/// kube-proxy's allowFromNode: when a source range holds the node's IP, the node reaches a
/// load-balancer IP it holds locally, although its connections then come from that IP.
pub(super) fn node_holding_its_load_balancer_ips() -> Scenario {
    let held = |name: &str, ip, lb_ip, range| Service {
        load_balancer_ips: vec![lb_ip],
        load_balancer_source_ranges: vec![Cidr {
            address: range,
            prefix: 32,
        }],
        ..service(
            "shop",
            name,
            ip,
            vec![ServicePort::new(
                "https",
                Protocol::Tcp,
                443,
                None,
                vec![ready(HELD_1)],
            )],
        )
    };
    use Origin::{External, Node};
    use Protocol::Tcp;
    Scenario {
        name: "node holding the load-balancer IPs of held (source range holds the node IP) and held-closed (it does not)",
        state: state([
            held("held", HELD_IP, HELD_LB_IP, NODE_IP),
            held(
                "held-closed",
                HELD_CLOSED_IP,
                HELD_CLOSED_LB_IP,
                EXTERNAL_CLIENT,
            ),
        ]),
        node_ips: vec![NODE_IP, HELD_LB_IP, HELD_CLOSED_LB_IP],
        cluster_cidrs: Vec::new(),
        masquerade_all: false,
        node_port_addresses: None,
        cases: vec![
            case(
                "node to the load-balancer IP it holds, from that IP, reaches the endpoint masqueraded when its node IP is in the ranges",
                (Node, HELD_LB_IP),
                (Tcp, HELD_LB_IP, 443),
                Expected::endpoints([(HELD_1, true)]),
            ),
            case(
                "external client outside the ranges to a load-balancer IP the node holds is dropped",
                (External, OTHER_EXTERNAL_CLIENT),
                (Tcp, HELD_LB_IP, 443),
                Expected::Drop,
            ),
            case(
                "node to the load-balancer IP it holds, from that IP, is dropped when its node IP is not in the ranges",
                (Node, HELD_CLOSED_LB_IP),
                (Tcp, HELD_CLOSED_LB_IP, 443),
                Expected::Drop,
            ),
        ],
    }
}

/// `telecom/signal`: SCTP only, ClusterIP and NodePort, two ready endpoints and one starting up.
const SIGNAL_IP: IpAddr = v4(10, 96, 0, 40);
const SIGNAL_NODE_PORT: u16 = 30777;
const SIGNAL_1: SocketAddr = at(v4(10, 244, 1, 40), 9999);
const SIGNAL_2: SocketAddr = at(v4(10, 244, 2, 40), 9999);
const SIGNAL_STARTING: SocketAddr = at(v4(10, 244, 3, 40), 9999);
/// `telecom/signal-idle`: SCTP only, no ready endpoint.
const SIGNAL_IDLE_IP: IpAddr = v4(10, 96, 0, 41);

/// SCTP Services get the same treatment as TCP and UDP ones, matched by protocol.
pub(super) fn node_with_sctp_services() -> Scenario {
    let sctp = |name: &str, ip, node_port, endpoints| {
        service(
            "telecom",
            name,
            ip,
            vec![ServicePort::new(
                "sigtran",
                Protocol::Sctp,
                7777,
                node_port,
                endpoints,
            )],
        )
    };
    let signal = sctp(
        "signal",
        SIGNAL_IP,
        Some(SIGNAL_NODE_PORT),
        vec![ready(SIGNAL_1), ready(SIGNAL_2), starting(SIGNAL_STARTING)],
    );
    let idle = sctp("signal-idle", SIGNAL_IDLE_IP, None, vec![]);
    use Origin::{External, Pod};
    use Protocol::{Sctp, Tcp};
    Scenario {
        name: "node with signal (SCTP, NodePort) and signal-idle (SCTP, no endpoints)",
        state: state([signal, idle]),
        node_ips: vec![NODE_IP],
        cluster_cidrs: Vec::new(),
        masquerade_all: false,
        node_port_addresses: None,
        cases: vec![
            case(
                "pod to SCTP cluster IP reaches the ready endpoints unmasqueraded",
                (Pod, CLIENT_POD),
                (Sctp, SIGNAL_IP, 7777),
                Expected::endpoints([(SIGNAL_1, false), (SIGNAL_2, false)]),
            ),
            case(
                "external client to SCTP node port reaches the ready endpoints masqueraded",
                (External, EXTERNAL_CLIENT),
                (Sctp, NODE_IP, SIGNAL_NODE_PORT),
                Expected::endpoints([(SIGNAL_1, true), (SIGNAL_2, true)]),
            ),
            case(
                "pod to SCTP-only cluster IP over TCP passes",
                (Pod, CLIENT_POD),
                (Tcp, SIGNAL_IP, 7777),
                Expected::Pass,
            ),
            case(
                "pod to SCTP cluster IP without endpoints is rejected",
                (Pod, CLIENT_POD),
                (Sctp, SIGNAL_IDLE_IP, 7777),
                Expected::Reject,
            ),
        ],
    }
}

/// The pod network as `--cluster-cidr` names it.
const CLUSTER_CIDR: Cidr = Cidr {
    address: v4(10, 244, 0, 0),
    prefix: 16,
};
/// `default/app`: ClusterIP and NodePort, two endpoints on other nodes.
const APP_IP: IpAddr = v4(10, 96, 0, 90);
const APP_NODE_PORT: u16 = 30095;
const APP_1: SocketAddr = at(v4(10, 244, 1, 90), 8080);
const APP_2: SocketAddr = at(v4(10, 244, 2, 90), 8080);
/// `default/gateway`: NodePort, `externalTrafficPolicy: Local`, one endpoint here, one elsewhere.
const GATEWAY_IP: IpAddr = v4(10, 96, 0, 91);
const GATEWAY_NODE_PORT: u16 = 30096;
const GATEWAY_HERE: SocketAddr = at(v4(10, 244, 0, 91), 8080);
const GATEWAY_THERE: SocketAddr = at(v4(10, 244, 1, 91), 8080);
/// `default/far-gateway`: NodePort, `externalTrafficPolicy: Local`, endpoints elsewhere only.
const FAR_GATEWAY_IP: IpAddr = v4(10, 96, 0, 92);
const FAR_GATEWAY_NODE_PORT: u16 = 30097;
const FAR_GATEWAY_THERE: SocketAddr = at(v4(10, 244, 1, 92), 8080);
/// `default/local-cache`: `internalTrafficPolicy: Local`, one endpoint here, one elsewhere.
const LOCAL_CACHE_IP: IpAddr = v4(10, 96, 0, 93);
const LOCAL_CACHE_HERE: SocketAddr = at(v4(10, 244, 0, 93), 8080);
const LOCAL_CACHE_THERE: SocketAddr = at(v4(10, 244, 1, 93), 8080);

/// The Services of [`node_with_cluster_cidr`] and [`node_with_masquerade_all`].
fn masquerade_services() -> ProxyState {
    let app = service(
        "default",
        "app",
        APP_IP,
        one_port(Some(APP_NODE_PORT), vec![ready(APP_1), ready(APP_2)]),
    );
    let gateway = Service {
        external_traffic_policy: TrafficPolicy::Local,
        ..service(
            "default",
            "gateway",
            GATEWAY_IP,
            one_port(
                Some(GATEWAY_NODE_PORT),
                vec![local(GATEWAY_HERE), ready(GATEWAY_THERE)],
            ),
        )
    };
    let far_gateway = Service {
        external_traffic_policy: TrafficPolicy::Local,
        ..service(
            "default",
            "far-gateway",
            FAR_GATEWAY_IP,
            one_port(Some(FAR_GATEWAY_NODE_PORT), vec![ready(FAR_GATEWAY_THERE)]),
        )
    };
    let local_cache = Service {
        internal_traffic_policy: TrafficPolicy::Local,
        ..service(
            "default",
            "local-cache",
            LOCAL_CACHE_IP,
            one_port(
                None,
                vec![local(LOCAL_CACHE_HERE), ready(LOCAL_CACHE_THERE)],
            ),
        )
    };
    state([app, gateway, far_gateway, local_cache])
}

/// `--cluster-cidr` (kube-proxy's `ClusterCIDR` local-traffic detector): cluster-IP traffic from
/// outside the pod network is masqueraded, pod traffic is not (but for hairpin), and pod traffic
/// to an `externalTrafficPolicy: Local` destination reaches every endpoint.
pub(super) fn node_with_cluster_cidr() -> Scenario {
    let app = |masqueraded| Expected::endpoints([(APP_1, masqueraded), (APP_2, masqueraded)]);
    use Origin::{External, Node, Pod};
    use Protocol::Tcp;
    let cases = vec![
        case(
            "pod to cluster IP reaches the endpoints unmasqueraded",
            (Pod, CLIENT_POD),
            (Tcp, APP_IP, 80),
            app(false),
        ),
        case(
            "node to cluster IP reaches the endpoints masqueraded",
            (Node, NODE_IP),
            (Tcp, APP_IP, 80),
            app(true),
        ),
        case(
            "external client routed to a cluster IP reaches the endpoints masqueraded",
            (External, EXTERNAL_CLIENT),
            (Tcp, APP_IP, 80),
            app(true),
        ),
        case(
            "endpoint to its own service is masqueraded only when it reaches itself",
            (Pod, APP_1.ip()),
            (Tcp, APP_IP, 80),
            Expected::endpoints([(APP_1, true), (APP_2, false)]),
        ),
        case(
            "pod to node port reaches the endpoints masqueraded",
            (Pod, CLIENT_POD),
            (Tcp, NODE_IP, APP_NODE_PORT),
            app(true),
        ),
        case(
            "pod to externalTrafficPolicy Local node port reaches every endpoint unmasqueraded",
            (Pod, CLIENT_POD),
            (Tcp, NODE_IP, GATEWAY_NODE_PORT),
            Expected::endpoints([(GATEWAY_HERE, false), (GATEWAY_THERE, false)]),
        ),
        case(
            "external client to externalTrafficPolicy Local node port reaches only the local endpoint, client IP kept",
            (External, EXTERNAL_CLIENT),
            (Tcp, NODE_IP, GATEWAY_NODE_PORT),
            Expected::endpoints([(GATEWAY_HERE, false)]),
        ),
        case(
            "node to its own externalTrafficPolicy Local node port reaches every endpoint masqueraded",
            (Node, NODE_IP),
            (Tcp, NODE_IP, GATEWAY_NODE_PORT),
            Expected::endpoints([(GATEWAY_HERE, true), (GATEWAY_THERE, true)]),
        ),
        case(
            "pod to externalTrafficPolicy Local node port without a local endpoint reaches the remote one",
            (Pod, CLIENT_POD),
            (Tcp, NODE_IP, FAR_GATEWAY_NODE_PORT),
            Expected::endpoints([(FAR_GATEWAY_THERE, false)]),
        ),
        case(
            "external client to externalTrafficPolicy Local node port without a local endpoint is dropped",
            (External, EXTERNAL_CLIENT),
            (Tcp, NODE_IP, FAR_GATEWAY_NODE_PORT),
            Expected::Drop,
        ),
        case(
            "pod to internalTrafficPolicy Local cluster IP reaches the local endpoint unmasqueraded",
            (Pod, CLIENT_POD),
            (Tcp, LOCAL_CACHE_IP, 80),
            Expected::endpoints([(LOCAL_CACHE_HERE, false)]),
        ),
        case(
            "node to internalTrafficPolicy Local cluster IP reaches the local endpoint masqueraded",
            (Node, NODE_IP),
            (Tcp, LOCAL_CACHE_IP, 80),
            Expected::endpoints([(LOCAL_CACHE_HERE, true)]),
        ),
    ];
    Scenario {
        name: "node with cluster CIDR 10.244.0.0/16: app (NodePort), gateway and far-gateway (externalTrafficPolicy Local), local-cache (internalTrafficPolicy Local)",
        state: masquerade_services(),
        node_ips: vec![NODE_IP],
        cluster_cidrs: vec![CLUSTER_CIDR],
        masquerade_all: false,
        node_port_addresses: None,
        cases,
    }
}

/// `--masquerade-all` (with the cluster CIDR too): every packet to a cluster IP is masqueraded,
/// pod traffic included; as upstream, it changes nothing for external destinations.
pub(super) fn node_with_masquerade_all() -> Scenario {
    let app = || Expected::endpoints([(APP_1, true), (APP_2, true)]);
    use Origin::{External, Node, Pod};
    use Protocol::Tcp;
    let cases = vec![
        case(
            "pod to cluster IP reaches the endpoints masqueraded",
            (Pod, CLIENT_POD),
            (Tcp, APP_IP, 80),
            app(),
        ),
        case(
            "node to cluster IP reaches the endpoints masqueraded",
            (Node, NODE_IP),
            (Tcp, APP_IP, 80),
            app(),
        ),
        case(
            "external client routed to a cluster IP reaches the endpoints masqueraded",
            (External, EXTERNAL_CLIENT),
            (Tcp, APP_IP, 80),
            app(),
        ),
        case(
            "pod to internalTrafficPolicy Local cluster IP reaches the local endpoint masqueraded",
            (Pod, CLIENT_POD),
            (Tcp, LOCAL_CACHE_IP, 80),
            Expected::endpoints([(LOCAL_CACHE_HERE, true)]),
        ),
        case(
            "external client to externalTrafficPolicy Local node port still keeps its client IP",
            (External, EXTERNAL_CLIENT),
            (Tcp, NODE_IP, GATEWAY_NODE_PORT),
            Expected::endpoints([(GATEWAY_HERE, false)]),
        ),
        case(
            "pod to externalTrafficPolicy Local node port reaches every endpoint unmasqueraded, as it is no cluster-IP traffic",
            (Pod, CLIENT_POD),
            (Tcp, NODE_IP, GATEWAY_NODE_PORT),
            Expected::endpoints([(GATEWAY_HERE, false), (GATEWAY_THERE, false)]),
        ),
    ];
    Scenario {
        name: "node with masquerade-all and cluster CIDR 10.244.0.0/16: app (NodePort), gateway (externalTrafficPolicy Local), local-cache (internalTrafficPolicy Local)",
        state: masquerade_services(),
        node_ips: vec![NODE_IP],
        cluster_cidrs: vec![CLUSTER_CIDR],
        masquerade_all: true,
        node_port_addresses: None,
        cases,
    }
}

/// A second node address, on the pod bridge: not among `--nodeport-addresses`.
const BRIDGE_IP: IpAddr = v4(10, 244, 0, 1);

pub(super) fn node_with_node_port_addresses() -> Scenario {
    let web = service(
        "default",
        "web",
        WEB_IP,
        vec![ServicePort::new(
            "http",
            Protocol::Tcp,
            80,
            Some(WEB_NODE_PORT),
            vec![ready(WEB_1), ready(WEB_2)],
        )],
    );
    let web_masqueraded = || Expected::endpoints([(WEB_1, true), (WEB_2, true)]);
    use Origin::{External, Node, Pod};
    use Protocol::Tcp;
    let cases = vec![
        case(
            "external client to node port on a selected address reaches the endpoints masqueraded",
            (External, EXTERNAL_CLIENT),
            (Tcp, NODE_IP, WEB_NODE_PORT),
            web_masqueraded(),
        ),
        case(
            "node to node port on a selected address reaches the endpoints masqueraded",
            (Node, NODE_IP),
            (Tcp, NODE_IP, WEB_NODE_PORT),
            web_masqueraded(),
        ),
        case(
            "pod to node port on an address outside --nodeport-addresses passes",
            (Pod, CLIENT_POD),
            (Tcp, BRIDGE_IP, WEB_NODE_PORT),
            Expected::Pass,
        ),
        case(
            "node to node port on loopback passes",
            (Node, NODE_IP),
            (Tcp, v4(127, 0, 0, 1), WEB_NODE_PORT),
            Expected::Pass,
        ),
        case(
            "pod to cluster IP is unaffected",
            (Pod, CLIENT_POD),
            (Tcp, WEB_IP, 80),
            Expected::endpoints([(WEB_1, false), (WEB_2, false)]),
        ),
    ];
    Scenario {
        name: "node with two addresses and --nodeport-addresses selecting one: web (NodePort)",
        state: state([web]),
        node_ips: vec![NODE_IP, BRIDGE_IP],
        cluster_cidrs: Vec::new(),
        masquerade_all: false,
        node_port_addresses: Some(vec![NODE_IP]),
        cases,
    }
}

/// The IPv6 pods of every node.
const CLUSTER_CIDR6: Cidr = Cidr {
    address: v6(0xfd00, 0x10, 0x244, 0, 0),
    prefix: 48,
};
/// `default/web6`: IPv6-only, ClusterIP and NodePort.
const WEB6_IP: IpAddr = v6(0xfd00, 0x10, 0x96, 0, 0x20);
const WEB6_NODE_PORT: u16 = 30620;
const WEB6_1: SocketAddr = at(v6(0xfd00, 0x10, 0x244, 1, 0x20), 8080);
const WEB6_2: SocketAddr = at(v6(0xfd00, 0x10, 0x244, 2, 0x20), 8080);
/// `default/dual`: dual-stack (IPv4 primary), ClusterIP and NodePort, one endpoint per family on
/// each of two pods.
const DUAL_IP: IpAddr = v4(10, 96, 0, 30);
const DUAL_IP6: IpAddr = v6(0xfd00, 0x10, 0x96, 0, 0x30);
const DUAL_NODE_PORT: u16 = 30630;
const DUAL_1: SocketAddr = at(v4(10, 244, 1, 30), 8080);
const DUAL_2: SocketAddr = at(v4(10, 244, 2, 30), 8080);
const DUAL6_1: SocketAddr = at(v6(0xfd00, 0x10, 0x244, 1, 0x30), 8080);
const DUAL6_2: SocketAddr = at(v6(0xfd00, 0x10, 0x244, 2, 0x30), 8080);
/// `default/idle6`: IPv6-only, its only endpoint not ready.
const IDLE6_IP: IpAddr = v6(0xfd00, 0x10, 0x96, 0, 0x40);
const IDLE6_STARTING: SocketAddr = at(v6(0xfd00, 0x10, 0x244, 1, 0x40), 8080);

/// A dual-stack node (both addresses local, a cluster CIDR per family), as kube-proxy's two
/// proxiers program it: each family reaches only its own endpoints, and an IPv6 client is never
/// sent to an IPv4 endpoint (or the reverse).
pub(super) fn node_with_dual_stack_services() -> Scenario {
    let web6 = service(
        "default",
        "web6",
        WEB6_IP,
        vec![ServicePort::new(
            "",
            Protocol::Tcp,
            80,
            Some(WEB6_NODE_PORT),
            vec![ready(WEB6_1), ready(WEB6_2)],
        )],
    );
    let dual = Service::new(
        ServiceKey::new("default", "dual"),
        vec![DUAL_IP, DUAL_IP6],
        vec![ServicePort::new(
            "",
            Protocol::Tcp,
            80,
            Some(DUAL_NODE_PORT),
            vec![ready(DUAL_1), ready(DUAL_2), ready(DUAL6_1), ready(DUAL6_2)],
        )],
    );
    let idle6 = service(
        "default",
        "idle6",
        IDLE6_IP,
        vec![ServicePort::new(
            "",
            Protocol::Tcp,
            80,
            None,
            vec![starting(IDLE6_STARTING)],
        )],
    );
    let to_web6 = |masquerade| Expected::endpoints([(WEB6_1, masquerade), (WEB6_2, masquerade)]);
    let dual4 = |masquerade| Expected::endpoints([(DUAL_1, masquerade), (DUAL_2, masquerade)]);
    let dual6 = |masquerade| Expected::endpoints([(DUAL6_1, masquerade), (DUAL6_2, masquerade)]);
    use Origin::{External, Node, Pod};
    use Protocol::Tcp;
    let cases = vec![
        case(
            "IPv6 pod to IPv6-only cluster IP reaches its endpoints unmasqueraded",
            (Pod, CLIENT_POD6),
            (Tcp, WEB6_IP, 80),
            to_web6(false),
        ),
        case(
            "node to IPv6-only cluster IP reaches its endpoints masqueraded, from outside the IPv6 cluster CIDR",
            (Node, NODE_IP6),
            (Tcp, WEB6_IP, 80),
            to_web6(true),
        ),
        case(
            "IPv6 external client to IPv6-only node port reaches its endpoints masqueraded",
            (External, EXTERNAL_CLIENT6),
            (Tcp, NODE_IP6, WEB6_NODE_PORT),
            to_web6(true),
        ),
        case(
            "IPv4 external client to IPv6-only node port on the node's IPv4 address passes",
            (External, EXTERNAL_CLIENT),
            (Tcp, NODE_IP, WEB6_NODE_PORT),
            Expected::Pass,
        ),
        case(
            "IPv4 pod to dual-stack IPv4 cluster IP reaches only the IPv4 endpoints",
            (Pod, CLIENT_POD),
            (Tcp, DUAL_IP, 80),
            dual4(false),
        ),
        case(
            "IPv6 pod to dual-stack IPv6 cluster IP reaches only the IPv6 endpoints",
            (Pod, CLIENT_POD6),
            (Tcp, DUAL_IP6, 80),
            dual6(false),
        ),
        case(
            "IPv6 external client to dual-stack node port reaches only the IPv6 endpoints masqueraded",
            (External, EXTERNAL_CLIENT6),
            (Tcp, NODE_IP6, DUAL_NODE_PORT),
            dual6(true),
        ),
        case(
            "IPv4 external client to dual-stack node port reaches only the IPv4 endpoints masqueraded",
            (External, EXTERNAL_CLIENT),
            (Tcp, NODE_IP, DUAL_NODE_PORT),
            dual4(true),
        ),
        case(
            "IPv6 pod to IPv6-only cluster IP without ready endpoints is rejected",
            (Pod, CLIENT_POD6),
            (Tcp, IDLE6_IP, 80),
            Expected::Reject,
        ),
    ];
    Scenario {
        name: "dual-stack node with cluster CIDRs 10.244.0.0/16 and fd00:10:244::/48: web6 (IPv6-only NodePort), dual (dual-stack NodePort), idle6 (IPv6-only, no ready endpoint)",
        state: state([web6, dual, idle6]),
        node_ips: vec![NODE_IP, NODE_IP6],
        cluster_cidrs: vec![CLUSTER_CIDR, CLUSTER_CIDR6],
        masquerade_all: false,
        node_port_addresses: None,
        cases,
    }
}

/// `default/zonal`: NodePort, zone hints keep this node's traffic on the endpoint of its zone.
const ZONAL_IP: IpAddr = v4(10, 96, 0, 100);
const ZONAL_NODE_PORT: u16 = 30100;
const ZONAL_SAME_ZONE: SocketAddr = at(v4(10, 244, 1, 100), 8080);
const ZONAL_OTHER_ZONE: SocketAddr = at(v4(10, 244, 2, 100), 8080);
/// `default/zonal-edge`: NodePort, `externalTrafficPolicy: Local`; the hints lend the local
/// endpoint to another zone (as `topology-mode: Auto` may, to balance zones).
const ZONAL_EDGE_IP: IpAddr = v4(10, 96, 0, 101);
const ZONAL_EDGE_NODE_PORT: u16 = 30101;
const ZONAL_EDGE_HERE: SocketAddr = at(v4(10, 244, 0, 101), 8080);
const ZONAL_EDGE_SAME_ZONE: SocketAddr = at(v4(10, 244, 1, 101), 8080);
/// `default/zonal-cache`: `internalTrafficPolicy: Local`, the local endpoint lent to another zone.
const ZONAL_CACHE_IP: IpAddr = v4(10, 96, 0, 102);
const ZONAL_CACHE_HERE: SocketAddr = at(v4(10, 244, 0, 102), 8080);
const ZONAL_CACHE_SAME_ZONE: SocketAddr = at(v4(10, 244, 1, 102), 8080);

/// Topology hints, as the controller applies them for this node: endpoints marked
/// [`Endpoint::topology_excluded`] leave the cluster-wide set only; the Local policies still use
/// them.
pub(super) fn node_with_topology_hints() -> Scenario {
    let elsewhere = |endpoint: Endpoint| Endpoint {
        topology_excluded: true,
        ..endpoint
    };
    let zonal = service(
        "default",
        "zonal",
        ZONAL_IP,
        one_port(
            Some(ZONAL_NODE_PORT),
            vec![ready(ZONAL_SAME_ZONE), elsewhere(ready(ZONAL_OTHER_ZONE))],
        ),
    );
    let zonal_edge = Service {
        external_traffic_policy: TrafficPolicy::Local,
        ..service(
            "default",
            "zonal-edge",
            ZONAL_EDGE_IP,
            one_port(
                Some(ZONAL_EDGE_NODE_PORT),
                vec![
                    elsewhere(local(ZONAL_EDGE_HERE)),
                    ready(ZONAL_EDGE_SAME_ZONE),
                ],
            ),
        )
    };
    let zonal_cache = Service {
        internal_traffic_policy: TrafficPolicy::Local,
        ..service(
            "default",
            "zonal-cache",
            ZONAL_CACHE_IP,
            one_port(
                None,
                vec![
                    elsewhere(local(ZONAL_CACHE_HERE)),
                    ready(ZONAL_CACHE_SAME_ZONE),
                ],
            ),
        )
    };

    use Origin::{External, Node, Pod};
    use Protocol::Tcp;
    Scenario {
        name: "node with zonal (zone hints), zonal-edge (externalTrafficPolicy Local) and zonal-cache (internalTrafficPolicy Local), local endpoints lent to another zone",
        state: state([zonal, zonal_edge, zonal_cache]),
        node_ips: vec![NODE_IP],
        cluster_cidrs: Vec::new(),
        masquerade_all: false,
        node_port_addresses: None,
        cases: vec![
            case(
                "pod to zone-hinted cluster IP reaches only the endpoint of its zone",
                (Pod, CLIENT_POD),
                (Tcp, ZONAL_IP, 80),
                Expected::endpoints([(ZONAL_SAME_ZONE, false)]),
            ),
            case(
                "node to zone-hinted cluster IP reaches only the endpoint of its zone",
                (Node, NODE_IP),
                (Tcp, ZONAL_IP, 80),
                Expected::endpoints([(ZONAL_SAME_ZONE, false)]),
            ),
            case(
                "external client to zone-hinted node port reaches only the endpoint of this node's zone",
                (External, EXTERNAL_CLIENT),
                (Tcp, NODE_IP, ZONAL_NODE_PORT),
                Expected::endpoints([(ZONAL_SAME_ZONE, true)]),
            ),
            case(
                "external client to externalTrafficPolicy Local node port reaches the local endpoint the hints lend elsewhere",
                (External, EXTERNAL_CLIENT),
                (Tcp, NODE_IP, ZONAL_EDGE_NODE_PORT),
                Expected::endpoints([(ZONAL_EDGE_HERE, false)]),
            ),
            case(
                "pod to cluster IP of a zone-hinted externalTrafficPolicy Local service skips the local endpoint lent elsewhere",
                (Pod, CLIENT_POD),
                (Tcp, ZONAL_EDGE_IP, 80),
                Expected::endpoints([(ZONAL_EDGE_SAME_ZONE, false)]),
            ),
            case(
                "node to its own zone-hinted externalTrafficPolicy Local node port follows the hints masqueraded",
                (Node, NODE_IP),
                (Tcp, NODE_IP, ZONAL_EDGE_NODE_PORT),
                Expected::endpoints([(ZONAL_EDGE_SAME_ZONE, true)]),
            ),
            case(
                "pod to zone-hinted internalTrafficPolicy Local cluster IP reaches the local endpoint lent elsewhere",
                (Pod, CLIENT_POD),
                (Tcp, ZONAL_CACHE_IP, 80),
                Expected::endpoints([(ZONAL_CACHE_HERE, false)]),
            ),
        ],
    }
}

fn case(
    name: &'static str,
    (origin, source): (Origin, IpAddr),
    (protocol, destination, port): (Protocol, IpAddr, u16),
    expected: Expected,
) -> FlowCase {
    FlowCase {
        flow: Flow {
            name,
            source,
            destination,
            protocol,
            port,
            origin,
        },
        expected,
        pending: None,
    }
}

fn state(services: impl IntoIterator<Item = Service>) -> ProxyState {
    services.into_iter().collect()
}

/// One unnamed TCP port 80 with these endpoints.
fn one_port(node_port: Option<u16>, endpoints: Vec<Endpoint>) -> Vec<ServicePort> {
    vec![ServicePort::new(
        "",
        Protocol::Tcp,
        80,
        node_port,
        endpoints,
    )]
}

fn service(namespace: &str, name: &str, cluster_ip: IpAddr, ports: Vec<ServicePort>) -> Service {
    Service::new(ServiceKey::new(namespace, name), vec![cluster_ip], ports)
}

/// A ready endpoint on another node.
fn ready(address: SocketAddr) -> Endpoint {
    Endpoint::ready(address)
}

/// An endpoint on another node that is starting up: neither ready nor serving.
fn starting(address: SocketAddr) -> Endpoint {
    Endpoint {
        ready: false,
        serving: false,
        ..ready(address)
    }
}

/// A ready endpoint on this node.
fn local(address: SocketAddr) -> Endpoint {
    Endpoint {
        is_local: true,
        ..ready(address)
    }
}

/// An endpoint on another node that is terminating but still serving.
fn draining(address: SocketAddr) -> Endpoint {
    Endpoint {
        ready: false,
        terminating: true,
        ..ready(address)
    }
}

/// An endpoint on another node that is terminating and no longer serving.
fn gone(address: SocketAddr) -> Endpoint {
    Endpoint {
        serving: false,
        ..draining(address)
    }
}
