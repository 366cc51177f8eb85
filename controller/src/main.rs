//! `splitproxy-controller`: parses flags, runs the controller, exits on a fatal error.

use clap::Parser;
use prometheus_client::registry::Registry;
use splitproxy_controller::{
    auth::{AgentAuth, StaticTokens, TokenReviewer},
    cluster::ServiceSelector,
    kubernetes::KubernetesSource,
    manifests::ManifestsDir,
    metrics::Metrics,
    serving_ca, wiring,
};
use splitproxy_telemetry::trace;
use std::{net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc};

/// jemalloc, which hands the memory of a burst (every agent's first revision at once) back to the
/// system; the system allocator kept most of it as fragments.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Streams each node's Services and endpoints to its splitproxy agent.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Directory of YAML manifests (Services, EndpointSlices, Nodes as `kubectl get -o yaml`
    /// prints them) to serve instead of a cluster; changes are picked up while running.
    #[arg(long, env = "SPLITPROXY_MANIFESTS", conflicts_with = "kubeconfig")]
    manifests: Option<PathBuf>,
    /// Kubeconfig for the API server; without it (and without --manifests) `KUBECONFIG`, then
    /// the in-cluster service account, then `~/.kube/config` are used.
    #[arg(long, env = "SPLITPROXY_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The API server's real address (`https://HOST:PORT`), overriding the kubeconfig's or the
    /// in-cluster one, as kube-proxy's flag of the same name. In a Pod, the in-cluster address
    /// is the `kubernetes` Service's cluster IP, which only the agents program: set this so the
    /// controller can start on a node without Service rules (a new cluster, or every node
    /// rebooted).
    #[arg(long, env = "SPLITPROXY_MASTER", conflicts_with = "manifests", value_parser = parse_master)]
    master: Option<http::Uri>,
    /// Program only Services labelled `service.kubernetes.io/service-proxy-name=NAME`; without
    /// it, only Services without that label (as default kube-proxy).
    #[arg(long, env = "SPLITPROXY_SERVICE_PROXY_NAME")]
    service_proxy_name: Option<String>,
    /// The controllers' own Service (NAMESPACE/NAME), as agents' --controller-service names it:
    /// its ready endpoints are the replicas sharing the nodes. Each replica then keeps at most
    /// its share of the nodes plus a fifth, and sheds its oldest agents, 50 a second, to the
    /// other replicas when it holds more (as when a replica is added). The Service must be one
    /// this controller reads (without --service-proxy-name's label unless it is ours).
    #[arg(long, env = "SPLITPROXY_CONTROLLER_SERVICE", value_parser = parse_namespaced_name)]
    controller_service: Option<(String, String)>,
    /// Address the gRPC server for agents listens on.
    #[arg(long, env = "SPLITPROXY_LISTEN", default_value = "0.0.0.0:10660")]
    listen: SocketAddr,
    /// Address of `/metrics` (Prometheus); loopback unless configured.
    #[arg(
        long,
        env = "SPLITPROXY_METRICS_BIND_ADDRESS",
        default_value = "127.0.0.1:10662"
    )]
    metrics_bind_address: SocketAddr,
    /// Address of the controller's inspection (gRPC with reflection: `ListNodes`,
    /// `GetClusterState`); loopback unless configured. Not the agent's 10661, as both run on
    /// control-plane nodes.
    #[arg(
        long,
        env = "SPLITPROXY_INSPECTION_BIND_ADDRESS",
        default_value = "127.0.0.1:10663"
    )]
    inspection_bind_address: SocketAddr,
    /// PEM certificate (chain) the node view port serves TLS with; plaintext without it.
    #[arg(
        long,
        env = "SPLITPROXY_TLS_CERT_FILE",
        requires = "tls_private_key_file"
    )]
    tls_cert_file: Option<PathBuf>,
    /// PEM private key of `--tls-cert-file`.
    #[arg(
        long,
        env = "SPLITPROXY_TLS_PRIVATE_KEY_FILE",
        requires = "tls_cert_file"
    )]
    tls_private_key_file: Option<PathBuf>,
    /// Serve TLS with a certificate issued at start from the CA in this Secret
    /// (NAMESPACE/NAME, type kubernetes.io/tls), which the first replica creates; its
    /// certificate is published as `ca.crt` in the ConfigMap of the same name for agents.
    #[arg(
        long,
        env = "SPLITPROXY_TLS_CA_SECRET",
        conflicts_with_all = ["tls_cert_file", "manifests"],
        requires = "tls_san",
        value_parser = parse_namespaced_name
    )]
    tls_ca_secret: Option<(String, String)>,
    /// The DNS names and IP addresses the certificate issued with --tls-ca-secret is valid for
    /// (comma-separated or repeated); agents finding controllers through their Service check
    /// `NAME.NAMESPACE.svc`.
    #[arg(
        long,
        env = "SPLITPROXY_TLS_SANS",
        value_delimiter = ',',
        requires = "tls_ca_secret",
        value_parser = parse_san
    )]
    tls_san: Vec<String>,
    /// With --manifests: a file of `token,node` lines; an agent must present one of these
    /// tokens and receives only that node's view. Without it, the manifests source lets any
    /// agent subscribe as any node. (With the Kubernetes source, agents' ServiceAccount tokens
    /// are always reviewed by the API server instead.)
    #[arg(long, env = "SPLITPROXY_AGENT_TOKENS_FILE", requires = "manifests")]
    agent_tokens_file: Option<PathBuf>,
    /// The ServiceAccount (NAMESPACE/NAME) whose Pod-bound tokens identify agents.
    #[arg(
        long,
        env = "SPLITPROXY_AGENT_SERVICE_ACCOUNT",
        default_value = "splitproxy-system/splitproxy-agent",
        value_parser = parse_namespaced_name
    )]
    agent_service_account: (String, String),
    /// The audience agents' tokens must be issued for.
    #[arg(
        long,
        env = "SPLITPROXY_AGENT_TOKEN_AUDIENCE",
        default_value = "splitproxy"
    )]
    agent_token_audience: String,
}

/// Parses `NAMESPACE/NAME`.
fn parse_namespaced_name(value: &str) -> Result<(String, String), String> {
    match value.split_once('/') {
        Some((namespace, name))
            if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            Ok((namespace.to_owned(), name.to_owned()))
        }
        _ => Err(format!("{value:?} is not NAMESPACE/NAME")),
    }
}

/// Parses one of `--tls-san`: an IP address or a DNS name.
fn parse_san(value: &str) -> Result<String, String> {
    serving_ca::check_name(value).map(|()| value.to_owned())
}

/// Parses `--master`: an absolute `http(s)://HOST[:PORT]` URL.
fn parse_master(value: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = value
        .parse()
        .map_err(|err| format!("{value:?} is not a URL: {err}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("https" | "http"), Some(host)) if !host.is_empty() => Ok(uri),
        _ => Err(format!("{value:?} is not an http(s)://HOST[:PORT] URL")),
    }
}

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
    let mut tls = tls_identity(&cli)?;
    let selector = ServiceSelector {
        service_proxy_name: cli.service_proxy_name,
    };
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    splitproxy_telemetry::process::ProcessCollector::register(&mut registry);
    let input = match cli.manifests {
        Some(dir) => Input::Manifests(dir),
        None => Input::Cluster(kube_client(cli.kubeconfig.as_deref(), cli.master).await?),
    };
    let mut renewal = None;
    if let (Some((namespace, name)), Input::Cluster(client)) = (&cli.tls_ca_secret, &input) {
        let issued = serving_ca::load_or_create(client, namespace, name)
            .await?
            .issue(&cli.tls_san, time::OffsetDateTime::now_utc())?;
        tracing::info!(
            names = ?cli.tls_san,
            not_after = %issued.not_after,
            "issued the serving certificate from the CA in Secret {namespace}/{name}"
        );
        renewal = Some(serving_ca::renewal_time(
            issued.not_after,
            rand::random::<f64>(),
        ));
        tls = Some(tonic::transport::Identity::from_pem(
            issued.chain_pem,
            issued.key_pem,
        ));
    }
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
        () = renew_at(renewal) => Err(anyhow::anyhow!(
            "the serving certificate is due for renewal; exiting so the restart issues a new one"
        )),
        _ = tokio::signal::ctrl_c() => {
            tracing::info!("interrupted; stopping");
            Ok(())
        }
    }
}

/// Returns at `at`, never without it.
async fn renew_at(at: Option<time::OffsetDateTime>) {
    let Some(at) = at else {
        return std::future::pending().await;
    };
    let wait = at - time::OffsetDateTime::now_utc();
    tokio::time::sleep(wait.try_into().unwrap_or_default()).await;
}

/// The TLS certificate and key of the node view port, if configured.
fn tls_identity(cli: &Cli) -> anyhow::Result<Option<tonic::transport::Identity>> {
    use anyhow::Context;
    let (Some(cert), Some(key)) = (&cli.tls_cert_file, &cli.tls_private_key_file) else {
        return Ok(None);
    };
    let read = |path: &std::path::Path| {
        std::fs::read(path).with_context(|| format!("reading {}", path.display()))
    };
    Ok(Some(tonic::transport::Identity::from_pem(
        read(cert)?,
        read(key)?,
    )))
}

/// A client from `--kubeconfig`, or else from the environment (`KUBECONFIG`, in-cluster, default
/// kubeconfig), sent to `master` when set.
async fn kube_client(
    kubeconfig: Option<&std::path::Path>,
    master: Option<http::Uri>,
) -> anyhow::Result<kube::Client> {
    use anyhow::Context;
    let mut config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .context("loading kubeconfig")?
        }
        None => kube::Config::infer()
            .await
            .context("finding API server credentials (in-cluster or kubeconfig)")?,
    };
    if let Some(master) = master {
        config.cluster_url = master;
    }
    tracing::info!(api_server = %config.cluster_url, "reading the cluster from the API server");
    kube::Client::try_from(config).context("creating the API client")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_and_kubeconfig_exclude_each_other() {
        assert!(Cli::try_parse_from(["splitproxy-controller"]).is_ok());
        assert!(
            Cli::try_parse_from([
                "splitproxy-controller",
                "--manifests",
                "/tmp",
                "--kubeconfig",
                "/k"
            ])
            .is_err()
        );
    }

    #[test]
    fn master_takes_an_absolute_url_only() {
        let cli = Cli::try_parse_from([
            "splitproxy-controller",
            "--master",
            "https://198.19.0.10:6443",
        ])
        .expect("valid flags");
        assert_eq!(
            cli.master.map(|uri| uri.to_string()),
            Some("https://198.19.0.10:6443/".to_owned())
        );
        for bad in ["198.19.0.10:6443", "/api", "ftp://host", "https://"] {
            assert!(
                Cli::try_parse_from(["splitproxy-controller", "--master", bad]).is_err(),
                "{bad} accepted"
            );
        }
    }

    #[test]
    fn listen_defaults_to_all_addresses() {
        let cli = Cli::try_parse_from(["splitproxy-controller", "--manifests", "/tmp"])
            .expect("valid flags");
        assert_eq!(
            cli.listen,
            "0.0.0.0:10660".parse::<SocketAddr>().expect("literal")
        );
    }
}
