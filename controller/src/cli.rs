//! The controller's command line: its flags, their variables and defaults, and the checks clap
//! runs on each value.

use clap::Parser;
use std::{net::SocketAddr, path::PathBuf};

/// Streams each node's Services and endpoints to its splitproxy agent.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    /// Directory of YAML manifests (Services, EndpointSlices, Nodes as `kubectl get -o yaml`
    /// prints them) to serve instead of a cluster; changes are picked up while running.
    #[arg(long, env = "SPLITPROXY_MANIFESTS", conflicts_with = "kubeconfig")]
    pub manifests: Option<PathBuf>,
    /// Kubeconfig for the API server; without it (and without --manifests) `KUBECONFIG`, then
    /// the in-cluster service account, then `~/.kube/config` are used.
    #[arg(long, env = "SPLITPROXY_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The API server's real address (`https://HOST:PORT`), overriding the kubeconfig's or the
    /// in-cluster one, as kube-proxy's flag of the same name. In a Pod, the in-cluster address
    /// is the `kubernetes` Service's cluster IP, which only the agents program: set this so the
    /// controller can start on a node without Service rules (a new cluster, or every node
    /// rebooted).
    #[arg(long, env = "SPLITPROXY_MASTER", conflicts_with = "manifests", value_parser = parse_master)]
    pub master: Option<http::Uri>,
    /// Program only Services labelled `service.kubernetes.io/service-proxy-name=NAME`; without
    /// it, only Services without that label (as default kube-proxy).
    #[arg(long, env = "SPLITPROXY_SERVICE_PROXY_NAME")]
    pub service_proxy_name: Option<String>,
    /// The controllers' own Service (NAMESPACE/NAME), as agents' --controller-service names it:
    /// its ready endpoints are the replicas sharing the nodes. Each replica then keeps at most
    /// its share of the nodes plus a fifth, and sheds its oldest agents, 50 a second, to the
    /// other replicas when it holds more (as when a replica is added). The Service must be one
    /// this controller reads (without --service-proxy-name's label unless it is ours).
    #[arg(long, env = "SPLITPROXY_CONTROLLER_SERVICE", value_parser = parse_namespaced_name)]
    pub controller_service: Option<(String, String)>,
    /// Address the gRPC server for agents listens on.
    #[arg(long, env = "SPLITPROXY_LISTEN", default_value = "0.0.0.0:10660")]
    pub listen: SocketAddr,
    /// Address of `/metrics` (Prometheus); loopback unless configured.
    #[arg(
        long,
        env = "SPLITPROXY_METRICS_BIND_ADDRESS",
        default_value = "127.0.0.1:10662"
    )]
    pub metrics_bind_address: SocketAddr,
    /// Address of the controller's inspection (gRPC with reflection: `ListNodes`,
    /// `GetClusterState`); loopback unless configured. Not the agent's 10661, as both run on
    /// control-plane nodes.
    #[arg(
        long,
        env = "SPLITPROXY_INSPECTION_BIND_ADDRESS",
        default_value = "127.0.0.1:10663"
    )]
    pub inspection_bind_address: SocketAddr,
    /// PEM certificate (chain) the node view port serves TLS with; plaintext without it. Read
    /// again whenever it changes (new connections get the new one); `deploy/`'s certificate
    /// sidecar writes it.
    #[arg(
        long,
        env = "SPLITPROXY_TLS_CERT_FILE",
        requires = "tls_private_key_file"
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `--tls-cert-file`.
    #[arg(
        long,
        env = "SPLITPROXY_TLS_PRIVATE_KEY_FILE",
        requires = "tls_cert_file"
    )]
    pub tls_private_key_file: Option<PathBuf>,
    /// With --manifests: a file of `token,node` lines; an agent must present one of these
    /// tokens and receives only that node's view. Without it, the manifests source lets any
    /// agent subscribe as any node. (With the Kubernetes source, agents' ServiceAccount tokens
    /// are always reviewed by the API server instead.)
    #[arg(long, env = "SPLITPROXY_AGENT_TOKENS_FILE", requires = "manifests")]
    pub agent_tokens_file: Option<PathBuf>,
    /// The ServiceAccount (NAMESPACE/NAME) whose Pod-bound tokens identify agents.
    #[arg(
        long,
        env = "SPLITPROXY_AGENT_SERVICE_ACCOUNT",
        default_value = "splitproxy-system/splitproxy-agent",
        value_parser = parse_namespaced_name
    )]
    pub agent_service_account: (String, String),
    /// The audience agents' tokens must be issued for.
    #[arg(
        long,
        env = "SPLITPROXY_AGENT_TOKEN_AUDIENCE",
        default_value = "splitproxy"
    )]
    pub agent_token_audience: String,
    /// Seconds an agent may leave a revision unanswered (or unread) before its stream is ended;
    /// it comes back and resumes from what it holds (Calico Typha's `MaxFallBehindSecs`).
    #[arg(
        long,
        env = "SPLITPROXY_MAX_FALL_BEHIND_SECONDS",
        default_value_t = crate::fanout::FALL_BEHIND_LIMIT.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub max_fall_behind_seconds: u64,
}

/// Parses `NAMESPACE/NAME`.
///
/// # Errors
///
/// Says why it is not.
pub fn parse_namespaced_name(value: &str) -> Result<(String, String), String> {
    match value.split_once('/') {
        Some((namespace, name))
            if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            Ok((namespace.to_owned(), name.to_owned()))
        }
        _ => Err(format!("{value:?} is not NAMESPACE/NAME")),
    }
}

/// Parses `--master`: an absolute `http(s)://HOST[:PORT]` URL.
///
/// # Errors
///
/// Says why it is not.
pub fn parse_master(value: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = value
        .parse()
        .map_err(|err| format!("{value:?} is not a URL: {err}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("https" | "http"), Some(host)) if !host.is_empty() => Ok(uri),
        _ => Err(format!("{value:?} is not an http(s)://HOST[:PORT] URL")),
    }
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
