//! kube-proxy's per-Service health-check servers: one HTTP server per `healthCheckNodePort` of an
//! `externalTrafficPolicy: Local` Service, telling load balancers whether this node has a local
//! endpoint for it.
//!
//! Upstream: `pkg/proxy/healthcheck/service_health.go`. Every path answers
//! `{"service":{"namespace":…,"name":…},"localEndpoints":n,"serviceProxyHealthy":b}`, with 200 when
//! `n > 0` and the proxy is healthy, 503 otherwise. [`wanted`] decides which ports serve what (pure);
//! [`HealthChecks`] is the thin shell that binds, serves and stops the servers, reconciled by the
//! sync loop after every successful sync.

use crate::status::Status;
use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
};
use splitproxy_dataplane::{IpFamily, ProxyState, ServiceKey, TrafficPolicy, endpoints};
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    time::Duration,
};
use tokio::sync::{oneshot, watch};

/// What one health-check server reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceHealth {
    /// The Service the port belongs to.
    pub service: ServiceKey,
    /// Distinct local ready endpoint addresses of the Service, over all its ports.
    pub local_endpoints: usize,
}

/// The health-check node ports `state` asks for, with what each reports.
///
/// Only `externalTrafficPolicy: Local` Services with a `healthCheckNodePort` get one. As upstream
/// (`LocalReadyEndpoints`), `localEndpoints` counts the distinct addresses of the local endpoints
/// that are *ready*: a node left with only serving-but-terminating local endpoints answers 503, so
/// load balancers drain it even though the dataplane still sends it the connections that arrive.
/// Only endpoints of the Service's primary IP family (that of its first cluster IP; IPv4 without
/// one) count: upstream's per-family proxiers each count their own family, and a dual-stack pod's
/// two addresses are one endpoint, not two. Should two Services claim one port (the API server
/// prevents it), the first in key order keeps it.
#[must_use]
pub fn wanted(state: &ProxyState) -> BTreeMap<u16, ServiceHealth> {
    let mut ports: BTreeMap<u16, ServiceHealth> = BTreeMap::new();
    for service in state.services.values() {
        if service.external_traffic_policy != TrafficPolicy::Local {
            continue;
        }
        let Some(port) = service.health_check_node_port else {
            continue;
        };
        let family = match service.cluster_ips.first() {
            Some(ip) if ip.is_ipv6() => IpFamily::V6,
            _ => IpFamily::V4,
        };
        let mut local = BTreeSet::new();
        for service_port in &service.ports {
            let sets = endpoints::categorize(
                service_port
                    .endpoints
                    .iter()
                    .filter(|endpoint| family.contains(&endpoint.ip)),
            );
            if !sets.local_is_terminating_fallback {
                local.extend(sets.local.iter().map(|endpoint| endpoint.ip));
            }
        }
        let health = ServiceHealth {
            service: service.key.clone(),
            local_endpoints: local.len(),
        };
        if let Some(kept) = ports.get(&port) {
            tracing::warn!(
                port,
                service = %format!("{}/{}", service.key.namespace, service.key.name),
                kept = %format!("{}/{}", kept.service.namespace, kept.service.name),
                "health check node port claimed twice"
            );
            continue;
        }
        ports.insert(port, health);
    }
    ports
}

/// One health-check node port's servers, one per address it listens on.
struct Server {
    /// What the servers report; updated in place.
    health: watch::Sender<ServiceHealth>,
    /// Dropping them shuts the servers down.
    _shutdown: Vec<oneshot::Sender<()>>,
    addresses: Vec<SocketAddr>,
}

/// Where health-check node ports listen, as kube-proxy: on the node-port addresses when
/// `nodePortAddresses` selects some (a family's unspecified address standing for all of the
/// family's, left out where the host has no IPv6), else on every address of each family served,
/// which `[::]` is where the host has IPv6 (Linux's bindv6only is off by default).
#[must_use]
pub fn bind_addresses(node_port_addresses: Option<Vec<IpAddr>>) -> Vec<IpAddr> {
    let ipv6 = IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED);
    let host_has_ipv6 = || std::net::TcpListener::bind((ipv6, 0)).is_ok();
    match node_port_addresses {
        Some(addresses) => addresses
            .into_iter()
            .filter(|ip| *ip != ipv6 || host_has_ipv6())
            .collect(),
        None if host_has_ipv6() => vec![ipv6],
        None => vec![std::net::Ipv4Addr::UNSPECIFIED.into()],
    }
}

/// A listener on `ip`:`port`. `[::]` beside other addresses takes IPv6 alone, as upstream's
/// per-family servers: IPv4 connections belong to the IPv4 addresses listed.
fn listen(ip: IpAddr, port: u16, beside_others: bool) -> std::io::Result<std::net::TcpListener> {
    let address = SocketAddr::new(ip, port);
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(address),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    if ip.is_ipv6() && ip.is_unspecified() {
        socket.set_only_v6(beside_others)?;
    }
    // As std's listeners: a restarted agent binds again while old connections linger.
    socket.set_reuse_address(true)?;
    socket.bind(&address.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// The health-check servers of one node, reconciled with each applied state.
pub struct HealthChecks {
    bind_ips: Vec<IpAddr>,
    status: Status,
    timeout: Duration,
    servers: BTreeMap<u16, Server>,
}

impl std::fmt::Debug for HealthChecks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthChecks")
            .field("bind_ips", &self.bind_ips)
            .field("ports", &self.servers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl HealthChecks {
    /// Servers bound to each of `bind_ips` (kube-proxy: every address, `0.0.0.0`, or the
    /// node-port addresses when `nodePortAddresses` selects some), reporting
    /// `serviceProxyHealthy` from `status` as `/livez` does: unhealthy once a revision has waited
    /// longer than `timeout`.
    #[must_use]
    pub fn new(bind_ips: Vec<IpAddr>, status: Status, timeout: Duration) -> Self {
        Self {
            bind_ips,
            status,
            timeout,
            servers: BTreeMap::new(),
        }
    }

    /// Listens on `bind_ips` from the next [`reconcile`](Self::reconcile) on: the servers now
    /// running stop.
    pub fn rebind(&mut self, bind_ips: Vec<IpAddr>) {
        if bind_ips != self.bind_ips {
            self.bind_ips = bind_ips;
            self.servers.clear();
        }
    }

    /// Makes the servers match `state`: starts one for each new port, stops those whose port is
    /// gone, and updates the others' counts in place. A port that cannot be bound is logged and
    /// tried again on the next call. Must run inside a tokio runtime.
    pub fn reconcile(&mut self, state: &ProxyState) {
        let mut wanted = wanted(state);
        self.servers.retain(|port, server| {
            let keep = wanted.contains_key(port);
            if !keep {
                tracing::info!(port, addresses = ?server.addresses, "stopped health check server");
            }
            keep
        });
        for (port, server) in &self.servers {
            if let Some(health) = wanted.remove(port) {
                server.health.send_if_modified(|current| {
                    let changed = *current != health;
                    *current = health;
                    changed
                });
            }
        }
        for (port, health) in wanted {
            match self.start(port, health) {
                Ok(server) => {
                    tracing::info!(port, addresses = ?server.addresses, "started health check server");
                    self.servers.insert(port, server);
                }
                Err(err) => {
                    tracing::warn!(port, %err, "cannot serve health check node port, retrying on the next sync");
                }
            }
        }
    }

    /// The addresses each health-check node port listens on.
    #[must_use]
    pub fn addresses(&self) -> BTreeMap<u16, Vec<SocketAddr>> {
        self.servers
            .iter()
            .map(|(port, server)| (*port, server.addresses.clone()))
            .collect()
    }

    /// Listens on `port` of every bind address, or, as upstream, on none when one fails.
    fn start(&self, port: u16, health: ServiceHealth) -> std::io::Result<Server> {
        let listeners = self
            .bind_ips
            .iter()
            .map(|ip| listen(*ip, port, self.bind_ips.len() > 1))
            .collect::<std::io::Result<Vec<_>>>()?;
        let (health, reported) = watch::channel(health);
        let (mut shutdowns, mut addresses) = (Vec::new(), Vec::new());
        for listener in listeners {
            listener.set_nonblocking(true)?;
            let listener = tokio::net::TcpListener::from_std(listener)?;
            let address = listener.local_addr()?;
            let (shutdown, stopped) = oneshot::channel::<()>();
            let router = router(reported.clone(), self.status.clone(), self.timeout);
            tokio::spawn(async move {
                let served = axum::serve(listener, router)
                    // The sender is dropped, never used: either way the server stops.
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await;
                if let Err(err) = served {
                    tracing::warn!(%address, %err, "health check server failed");
                }
            });
            shutdowns.push(shutdown);
            addresses.push(address);
        }
        Ok(Server {
            health,
            _shutdown: shutdowns,
            addresses,
        })
    }
}

/// State of one health-check server.
#[derive(Clone)]
struct HealthCheckState {
    health: watch::Receiver<ServiceHealth>,
    status: Status,
    timeout: Duration,
}

/// The router of one health-check server: every path, every method, kube-proxy's answer.
fn router(health: watch::Receiver<ServiceHealth>, status: Status, timeout: Duration) -> Router {
    Router::new().fallback(answer).with_state(HealthCheckState {
        health,
        status,
        timeout,
    })
}

async fn answer(State(state): State<HealthCheckState>) -> impl IntoResponse {
    let health = state.health.borrow().clone();
    let healthy = state.status.snapshot().proxy_healthy(state.timeout);
    let body = serde_json::json!({
        "service": {
            "namespace": health.service.namespace,
            "name": health.service.name,
        },
        "localEndpoints": health.local_endpoints,
        "serviceProxyHealthy": healthy,
    });
    let code = if health.local_endpoints > 0 && healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
            (
                header::HeaderName::from_static("x-load-balancing-endpoint-weight"),
                health.local_endpoints.to_string(),
            ),
        ],
        body.to_string(),
    )
}

#[cfg(test)]
mod tests;
