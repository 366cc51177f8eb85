use super::*;
use crate::node_state::{Eligibility, NodeState};
use axum::{body::Body, http::Request};
use http_body_util::BodyExt;
use tower::ServiceExt;

const TIMEOUT: Duration = Duration::from_secs(60);

/// The answer to one GET: status code, `Content-Type`, body.
struct Answer {
    code: StatusCode,
    content_type: String,
    body: String,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).expect("the body is JSON")
    }
}

async fn get(router: Router, path: &str) -> Answer {
    let response = router
        .oneshot(
            Request::get(path)
                .body(Body::empty())
                .expect("a valid request"),
        )
        .await
        .expect("routers are infallible");
    let code = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("the body is readable")
        .to_bytes();
    Answer {
        code,
        content_type,
        body: String::from_utf8(bytes.to_vec()).expect("the body is UTF-8"),
    }
}

/// The agent's two routers sharing one registry, as `lib::run` wires them, for a dual-stack
/// dataplane.
struct Servers {
    status: Status,
    metrics: Metrics,
    metrics_router: Router,
    health_router: Router,
}

impl Servers {
    /// Sets the node's eligibility as an applied revision would.
    fn set_eligibility(&self, eligibility: Eligibility) {
        self.status.update(|s| {
            s.state = Arc::new(NodeState {
                eligibility,
                ..NodeState::clone(&s.state)
            });
        });
    }
}

/// The servers of a node the controller has said is eligible.
fn servers() -> Servers {
    let servers = servers_before_any_revision();
    servers.set_eligibility(Eligibility::Eligible);
    servers
}

fn servers_before_any_revision() -> Servers {
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let status = Status::default();
    Servers {
        metrics_router: metrics_router(Arc::new(registry), "iptables"),
        health_router: health_router(
            status.clone(),
            metrics.clone(),
            TIMEOUT,
            &[IpFamily::V4, IpFamily::V6],
        ),
        status,
        metrics,
    }
}

fn parses_as_time(value: &serde_json::Value) -> bool {
    value
        .as_str()
        .is_some_and(|t| t.parse::<prost_types::Timestamp>().is_ok())
}

#[tokio::test]
async fn proxy_mode_returns_the_mode_as_plain_text() {
    let answer = get(servers().metrics_router, "/proxyMode").await;
    assert_eq!(answer.code, StatusCode::OK);
    assert!(
        answer.content_type.starts_with("text/plain"),
        "{}",
        answer.content_type
    );
    assert_eq!(answer.body, "iptables");
}

#[tokio::test]
async fn metrics_exports_kube_proxy_sync_duration() {
    let servers = servers();
    let ipv6 = crate::metrics::FamilyLabel { ip_family: "IPv6" };
    let syncs = servers.metrics.sync_duration.get_or_create_owned(&ipv6);
    syncs.observe(0.003);
    let answer = get(servers.metrics_router, "/metrics").await;
    assert_eq!(answer.code, StatusCode::OK);
    assert!(
        answer
            .content_type
            .starts_with("application/openmetrics-text"),
        "{}",
        answer.content_type
    );
    assert!(
        answer.body.contains(
            r#"kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="0.004",ip_family="IPv6"} 1"#
        ),
        "{}",
        answer.body
    );
}

#[tokio::test]
async fn healthz_is_ok_and_node_eligible_when_nothing_is_queued() {
    let servers = servers();
    let answer = get(servers.health_router, "/healthz").await;
    assert_eq!(answer.code, StatusCode::OK);
    assert_eq!(answer.content_type, "application/json");
    let body = answer.json();
    assert!(parses_as_time(&body["lastUpdated"]), "{body}");
    assert!(parses_as_time(&body["currentTime"]), "{body}");
    assert_eq!(body["nodeEligible"], true, "{body}");

    let metrics = get(servers.metrics_router, "/metrics").await.body;
    assert!(
        metrics.contains("kubeproxy_proxy_healthz_total{code=\"200\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn livez_is_ok_without_node_eligibility_when_nothing_is_queued() {
    let answer = get(servers().health_router, "/livez").await;
    assert_eq!(answer.code, StatusCode::OK);
    let body = answer.json();
    assert!(parses_as_time(&body["lastUpdated"]), "{body}");
    assert!(parses_as_time(&body["currentTime"]), "{body}");
    assert!(body.get("nodeEligible").is_none(), "{body}");
}

#[tokio::test(start_paused = true)]
async fn revision_queued_for_less_than_the_timeout_keeps_healthz_ok() {
    let servers = servers();
    servers
        .status
        .update(|s| s.queued_since = Some(tokio::time::Instant::now()));
    tokio::time::advance(TIMEOUT - Duration::from_secs(1)).await;
    assert_eq!(
        get(servers.health_router.clone(), "/healthz").await.code,
        StatusCode::OK
    );
    assert_eq!(
        get(servers.health_router, "/livez").await.code,
        StatusCode::OK
    );
}

#[tokio::test(start_paused = true)]
async fn revision_queued_longer_than_the_timeout_fails_healthz_and_livez() {
    let servers = servers();
    let applied_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
    servers.status.update(|s| {
        s.applied_at = Some(applied_at);
        s.queued_since = Some(tokio::time::Instant::now());
    });
    tokio::time::advance(TIMEOUT + Duration::from_secs(1)).await;

    let healthz = get(servers.health_router.clone(), "/healthz").await;
    assert_eq!(healthz.code, StatusCode::SERVICE_UNAVAILABLE);
    let body = healthz.json();
    // While unhealthy, lastUpdated is when the rules were last applied.
    assert_eq!(
        body["lastUpdated"],
        prost_types::Timestamp::from(applied_at).to_string(),
        "{body}"
    );
    assert!(parses_as_time(&body["currentTime"]), "{body}");
    assert_eq!(body["nodeEligible"], true, "{body}");

    let livez = get(servers.health_router, "/livez").await;
    assert_eq!(livez.code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(livez.json().get("nodeEligible").is_none());

    let metrics = get(servers.metrics_router, "/metrics").await.body;
    assert!(
        metrics.contains("kubeproxy_proxy_healthz_total{code=\"503\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kubeproxy_proxy_livez_total{code=\"503\"} 1"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("kubeproxy_proxy_healthz_total{code=\"200\"}"),
        "{metrics}"
    );
}

#[tokio::test(start_paused = true)]
async fn healthz_recovers_once_the_queued_revision_is_applied() {
    let servers = servers();
    servers
        .status
        .update(|s| s.queued_since = Some(tokio::time::Instant::now()));
    tokio::time::advance(TIMEOUT * 2).await;
    assert_eq!(
        get(servers.health_router.clone(), "/healthz").await.code,
        StatusCode::SERVICE_UNAVAILABLE
    );
    servers.status.update(|s| {
        s.queued_since = None;
        s.applied_at = Some(SystemTime::now());
    });
    assert_eq!(
        get(servers.health_router, "/healthz").await.code,
        StatusCode::OK
    );
}

#[tokio::test]
async fn an_ineligible_node_fails_healthz_but_not_livez() {
    let servers = servers();
    servers.set_eligibility(Eligibility::Ineligible(
        "the Node is tainted ToBeDeletedByClusterAutoscaler".into(),
    ));
    let healthz = get(servers.health_router.clone(), "/healthz").await;
    assert_eq!(healthz.code, StatusCode::SERVICE_UNAVAILABLE);
    let body = healthz.json();
    assert_eq!(body["nodeEligible"], false, "{body}");
    assert_eq!(body["healthy"], true, "the proxy itself is fine: {body}");
    // Still healthy, so lastUpdated follows the compatibility rule: it is now.
    assert_eq!(body["lastUpdated"], body["currentTime"], "{body}");

    let livez = get(servers.health_router, "/livez").await;
    assert_eq!(livez.code, StatusCode::OK);
    assert!(livez.json().get("nodeEligible").is_none());

    let metrics = get(servers.metrics_router, "/metrics").await.body;
    for line in [
        "kubeproxy_proxy_healthz_total{code=\"503\"} 1",
        "kubeproxy_proxy_livez_total{code=\"200\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

#[tokio::test]
async fn the_node_is_not_eligible_until_a_controller_says_so() {
    let servers = servers_before_any_revision();
    let healthz = get(servers.health_router.clone(), "/healthz").await;
    assert_eq!(healthz.code, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(healthz.json()["nodeEligible"], false);
    assert_eq!(
        get(servers.health_router.clone(), "/livez").await.code,
        StatusCode::OK
    );

    servers.set_eligibility(Eligibility::Eligible);
    let healthz = get(servers.health_router, "/healthz").await;
    assert_eq!(healthz.code, StatusCode::OK);
    assert_eq!(healthz.json()["nodeEligible"], true);
}

#[tokio::test(start_paused = true)]
async fn each_programmed_family_reports_its_last_update_and_health() {
    let servers = servers();
    let applied_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
    let applied = prost_types::Timestamp::from(applied_at).to_string();
    servers.status.update(|s| s.applied_at = Some(applied_at));
    let body = get(servers.health_router.clone(), "/healthz").await.json();
    assert_eq!(
        body["status"],
        serde_json::json!({
            "IPv4": {"lastUpdated": applied, "healthy": true},
            "IPv6": {"lastUpdated": applied, "healthy": true},
        })
    );
    assert_eq!(body["healthy"], true);

    servers
        .status
        .update(|s| s.queued_since = Some(tokio::time::Instant::now()));
    tokio::time::advance(TIMEOUT + Duration::from_secs(1)).await;
    for path in ["/healthz", "/livez"] {
        let body = get(servers.health_router.clone(), path).await.json();
        assert_eq!(body["healthy"], false, "{path}: {body}");
        assert_eq!(
            body["status"]["IPv6"],
            serde_json::json!({"lastUpdated": applied, "healthy": false}),
            "{path}: {body}"
        );
    }
}
