//! The splitproxy node agent: receives its node's view from a controller, programs it through a
//! dataplane backend, and serves what kube-proxy serves.

pub mod cleanup;
pub mod cli;
pub mod client;
pub mod config_watch;
pub mod credentials;
pub mod discovery;
pub mod duration;
pub mod fold;
pub mod health_check;
pub mod host_setup;
pub mod http;
pub mod inspection;
pub mod kube_proxy_config;
pub mod metrics;
pub mod node_port_addresses;
pub mod node_state;
pub mod start;
pub mod status;
pub mod sync;
pub mod sync_timer;

use prometheus_client::registry::Registry;
use splitproxy_dataplane::Dataplane;
use splitproxy_proto::v1alpha1::{
    self as pb, node_inspection_service_server::NodeInspectionServiceServer,
};
use std::{net::SocketAddr, sync::Arc};
use tokio::net::TcpListener;

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No controller URL was given.
    #[error("no controller to connect to")]
    NoControllers,
    /// A listener could not be bound.
    #[error("binding {0}")]
    Bind(SocketAddr, #[source] std::io::Error),
    /// An HTTP server failed.
    #[error("serving HTTP")]
    Http(#[source] std::io::Error),
    /// The inspection server failed.
    #[error("serving gRPC inspection")]
    Grpc(#[source] tonic::transport::Error),
    /// Reflection could not be built.
    #[error("building gRPC reflection")]
    Reflection(#[source] tonic_reflection::server::Error),
}

/// What the agent runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The stream client's settings.
    pub client: client::ClientConfig,
    /// How often the kernel is synced; `/healthz` fails after 2 × the sync period.
    pub sync_periods: sync_timer::SyncPeriods,
    /// Address of `/metrics` and `/proxyMode`; `None` serves neither.
    pub metrics_bind_address: Option<SocketAddr>,
    /// Address of `/healthz` and `/livez`; `None` serves neither.
    pub healthz_bind_address: Option<SocketAddr>,
    /// Whether a metrics or health address that cannot be bound stops the agent; otherwise
    /// binding is retried every 5 s, as kube-proxy does.
    pub bind_address_hard_fail: bool,
    /// Address of the gRPC inspection server.
    pub inspection_bind_address: SocketAddr,
    /// Whether pod traffic is told by the Node's pod CIDRs (kube-proxy's `NodeCIDR` detector).
    pub node_cidr_detector: bool,
    /// The addresses that take node ports and health-check node ports at start, when
    /// `nodePortAddresses` selects some; `None`: every address.
    pub node_port_addresses: Option<Vec<std::net::IpAddr>>,
    /// The `nodePortAddresses` selection, matched against the node's addresses again at each
    /// sync; its node IPs are those known at start.
    pub node_port_selection: node_port_addresses::NodePortSelection,
    /// kube-proxy's `bindAddress` when it names an address: the node IP of its family, whatever
    /// the Node object says.
    pub bind_address: Option<std::net::IpAddr>,
}

/// Binds every listener, then runs the stream client and the servers until a server fails;
/// runs `after_first_sync` once the node's rules are first in the kernel.
///
/// # Errors
///
/// Returns [`Error::NoControllers`] when no controller is configured, otherwise the first
/// listener or server error.
pub async fn run<D: Dataplane>(
    config: Config,
    dataplane: D,
    after_first_sync: impl Future<Output = ()>,
) -> Result<(), Error> {
    if config.client.controllers.is_empty() {
        return Err(Error::NoControllers);
    }
    let bind = |address: SocketAddr| async move {
        TcpListener::bind(address)
            .await
            .map_err(|e| Error::Bind(address, e))
    };
    let inspection_listener = bind(config.inspection_bind_address).await?;

    let mut registry = Registry::default();
    let metrics = metrics::Metrics::new(&mut registry);
    splitproxy_telemetry::process::ProcessCollector::register(&mut registry);
    let status = status::Status::default();
    let mode = dataplane.mode();
    let families = dataplane.ip_families();

    let metrics_server = serve_http(
        config.metrics_bind_address,
        config.bind_address_hard_fail,
        http::metrics_router(Arc::new(registry), mode),
    );
    let health_server = serve_http(
        config.healthz_bind_address,
        config.bind_address_hard_fail,
        http::health_router(
            status.clone(),
            metrics.clone(),
            config.sync_periods.health_timeout(),
            &families,
        ),
    );
    let inspection_server = inspection_server(
        inspection_listener,
        inspection::Inspection::new(
            config.client.node_name.clone(),
            config.client.proxy_mode,
            status.clone(),
        ),
    );
    let health_checks = health_check::HealthChecks::new(
        health_check::bind_addresses(config.node_port_addresses.clone()),
        status.clone(),
        config.sync_periods.health_timeout(),
    );
    let mut applier = sync::Applier::new(
        &config.client.node_name,
        dataplane,
        status.clone(),
        metrics.clone(),
    )
    .with_sync_periods(config.sync_periods)
    .with_health_checks(health_checks)
    .with_node_ips(config.bind_address, config.node_port_selection.node_ips)
    .with_node_port_selection(
        config.node_port_selection.selection,
        config.node_port_addresses,
    );
    if config.node_cidr_detector {
        applier = applier.with_node_cidr_detector();
    }
    let first_sync = {
        let status = status.clone();
        async move {
            status.applied().await;
            after_first_sync.await;
            std::future::pending::<()>().await;
        }
    };
    let client = client::run(config.client, applier, status, metrics);
    tokio::select! {
        () = client => Ok(()),
        () = first_sync => Ok(()),
        result = metrics_server => result,
        result = health_server => result,
        result = inspection_server => result,
    }
}

/// Serves `router` on `address` until it fails; never returns when there is no address. A
/// failure to bind is fatal with `hard_fail`, and retried every 5 s without it, as kube-proxy
/// does.
async fn serve_http(
    address: Option<SocketAddr>,
    hard_fail: bool,
    router: axum::Router,
) -> Result<(), Error> {
    let Some(address) = address else {
        return std::future::pending().await;
    };
    loop {
        match TcpListener::bind(address).await {
            Ok(listener) => return axum::serve(listener, router).await.map_err(Error::Http),
            Err(err) if hard_fail => return Err(Error::Bind(address, err)),
            Err(err) => {
                tracing::error!(%address, error = %err, "cannot bind; retrying in 5s");
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
        }
    }
}

async fn inspection_server(
    listener: TcpListener,
    inspection: inspection::Inspection,
) -> Result<(), Error> {
    let (reflection_v1, reflection_v1alpha) =
        splitproxy_proto::reflection_services().map_err(Error::Reflection)?;
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<NodeInspectionServiceServer<inspection::Inspection>>()
        .await;
    tonic::transport::Server::builder()
        .add_service(NodeInspectionServiceServer::new(inspection))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
        .await
        .map_err(Error::Grpc)
}

/// The wire name of a proxy mode.
#[must_use]
pub fn wire_mode(mode: cli::ProxyMode) -> pb::ProxyMode {
    match mode {
        cli::ProxyMode::Iptables => pb::ProxyMode::Iptables,
        cli::ProxyMode::Ipvs => pb::ProxyMode::Ipvs,
        cli::ProxyMode::Nftables => pb::ProxyMode::Nftables,
        cli::ProxyMode::Ebpf => pb::ProxyMode::Ebpf,
    }
}
