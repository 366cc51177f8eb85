//! `splitproxy-controller`: parses flags, runs the controller, exits on a fatal error.

use clap::Parser;
use prometheus_client::registry::Registry;
use splitproxy_controller::{
    api_client,
    auth::{AgentAuth, StaticTokens, TokenReviewer},
    cli::Cli,
    cluster::ServiceSelector,
    kubernetes::KubernetesSource,
    manifests::ManifestsDir,
    metrics::Metrics,
    serving_tls::{CertificateFiles, ServingCertificate},
    wiring,
};
use splitproxy_telemetry::trace;
use std::{path::PathBuf, process::ExitCode, sync::Arc};

/// jemalloc, which hands the memory of a burst (every agent's first revision at once) back to the
/// system; the system allocator kept most of it as fragments.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Exit code for bad configuration (EX_USAGE).
const EXIT_USAGE: u8 = 64;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if let Some(dir) = cli.manifests.as_ref().filter(|dir| !dir.is_dir()) {
        eprintln!("--manifests {}: not a directory", dir.display());
        return ExitCode::from(EXIT_USAGE);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("starting the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    // Inside the runtime: the OTLP exporter's connection lives on it.
    let telemetry = match runtime.block_on(async {
        trace::init(
            trace::Identity {
                service_name: "splitproxy-controller",
                attributes: Vec::new(),
            },
            trace::Logs::default(),
        )
    }) {
        Ok(telemetry) => telemetry,
        Err(err) => {
            eprintln!("setting up tracing: {:#}", anyhow::Error::from(err));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "controller stopped");
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown();
    code
}

/// Where the controller reads Services, EndpointSlices and Nodes from.
enum Input {
    Manifests(PathBuf),
    Cluster(kube::Client),
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let tls = serving_certificate(&cli).await?;
    let selector = ServiceSelector {
        service_proxy_name: cli.service_proxy_name,
    };
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let agents = metrics.agents.clone();
    splitproxy_telemetry::process::ProcessCollector::register(&mut registry);
    let input = match cli.manifests {
        Some(dir) => Input::Manifests(dir),
        None => Input::Cluster(api_client::connect(cli.kubeconfig.as_deref(), cli.master).await?),
    };
    if tls.is_none() {
        tracing::warn!("serving node views without TLS: agents' tokens travel in clear text");
    }
    let serving = async {
        let mut serving = wiring::Serving {
            selector: selector.clone(),
            metrics,
            auth: AgentAuth::Open,
            tls,
            controller_service: cli.controller_service.clone(),
            fall_behind_limit: std::time::Duration::from_secs(cli.max_fall_behind_seconds),
        };
        let (listen, inspection) = (cli.listen, cli.inspection_bind_address);
        match input {
            Input::Manifests(dir) => {
                serving.auth = match &cli.agent_tokens_file {
                    Some(file) => {
                        let tokens = StaticTokens::read(file)?;
                        tracing::info!(
                            tokens = tokens.len(),
                            "agents authenticate with static tokens"
                        );
                        AgentAuth::Static(Arc::new(tokens))
                    }
                    None => {
                        tracing::warn!(
                            "no --agent-tokens-file: any agent may receive any node's view"
                        );
                        AgentAuth::Open
                    }
                };
                wiring::run(listen, inspection, ManifestsDir::new(dir), serving).await
            }
            Input::Cluster(client) => {
                let (namespace, name) = &cli.agent_service_account;
                serving.auth = AgentAuth::Review(Arc::new(TokenReviewer::new(
                    client.clone(),
                    &cli.agent_token_audience,
                    namespace,
                    name,
                )));
                let source = KubernetesSource::new(client, selector);
                wiring::run(listen, inspection, source, serving).await
            }
        }
        .map_err(anyhow::Error::from)
    };
    let metrics_server =
        splitproxy_controller::metrics::serve(cli.metrics_bind_address, Arc::new(registry));
    tokio::select! {
        result = serving => result,
        result = metrics_server => result.map_err(|err| {
            anyhow::Error::from(err).context(format!("metrics server on {}", cli.metrics_bind_address))
        }),
        () = shutdown(agents) => Ok(()),
    }
}

/// The longest a replica told to stop waits for its agents to move to another replica.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Completes once the process is told to stop (SIGTERM, as the kubelet does, or SIGINT) and its
/// agents moved to other replicas, or [`DRAIN_TIMEOUT`] passed: each stream ends telling its
/// agent to subscribe elsewhere at once (protocol rule 13), so a rolling update of the
/// controllers moves agents without a broken stream and they resume where they were.
async fn shutdown(agents: splitproxy_controller::agents::Agents) {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::warn!(%err, "cannot watch for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = terminate => tracing::info!("told to stop"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted"),
    }
    let told = agents.drain();
    tracing::info!(
        streams = told,
        "sending every agent to another replica before stopping"
    );
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while agents.open() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    match drained {
        Ok(()) => tracing::info!("every agent moved; stopping"),
        Err(_) => tracing::warn!(left = agents.open(), "stopping with agents still connected"),
    }
}

/// The certificate of the node view port, if configured by files: read once they are there,
/// and again whenever they change.
async fn serving_certificate(cli: &Cli) -> anyhow::Result<Option<Arc<ServingCertificate>>> {
    let (Some(cert), Some(key)) = (&cli.tls_cert_file, &cli.tls_private_key_file) else {
        return Ok(None);
    };
    let files = CertificateFiles {
        cert: cert.clone(),
        key: key.clone(),
    };
    let certificate = ServingCertificate::wait_for(&files).await?;
    tokio::spawn(Arc::clone(&certificate).follow(files));
    Ok(Some(certificate))
}
