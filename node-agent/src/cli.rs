//! Command-line flags, named as kube-proxy names them where the meaning is the same.

use clap::{Parser, ValueEnum};
use std::net::SocketAddr;

/// Programs this node's Services from the splitproxy controller's stream.
#[derive(Debug, Parser)]
#[command(name = "splitproxy-agent", version, about)]
pub struct Cli {
    /// Controller URL (e.g. http://10.0.0.1:10660); repeat to list several, tried in turn.
    #[arg(
        long = "controller",
        env = "SPLITPROXY_CONTROLLERS",
        value_delimiter = ',',
        required = true
    )]
    pub controllers: Vec<String>,
    /// The node name to program; defaults to the host name.
    #[arg(long, env = "NODE_NAME")]
    pub hostname_override: Option<String>,
    /// Which dataplane programs the kernel.
    #[arg(long, value_enum, default_value_t = ProxyMode::Iptables)]
    pub proxy_mode: ProxyMode,
    /// Address of `/metrics` and `/proxyMode`.
    #[arg(
        long,
        env = "SPLITPROXY_METRICS_BIND_ADDRESS",
        default_value = "127.0.0.1:10249"
    )]
    pub metrics_bind_address: SocketAddr,
    /// Address of `/healthz` and `/livez`.
    #[arg(
        long,
        env = "SPLITPROXY_HEALTHZ_BIND_ADDRESS",
        default_value = "0.0.0.0:10256"
    )]
    pub healthz_bind_address: SocketAddr,
    /// Address of the gRPC inspection server (with reflection, for grpcurl).
    #[arg(
        long,
        env = "SPLITPROXY_INSPECTION_BIND_ADDRESS",
        default_value = "127.0.0.1:10661"
    )]
    pub inspection_bind_address: SocketAddr,
}

/// The dataplane backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProxyMode {
    /// iptables, programmed with iptables-restore.
    Iptables,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_kube_proxy() {
        let cli = Cli::try_parse_from(["splitproxy-agent", "--controller", "http://c:1"])
            .expect("valid flags");
        assert_eq!(cli.metrics_bind_address.to_string(), "127.0.0.1:10249");
        assert_eq!(cli.healthz_bind_address.to_string(), "0.0.0.0:10256");
        assert_eq!(cli.inspection_bind_address.to_string(), "127.0.0.1:10661");
        assert_eq!(cli.proxy_mode, ProxyMode::Iptables);
    }

    #[test]
    fn controller_flag_repeats() {
        let cli = Cli::try_parse_from([
            "splitproxy-agent",
            "--controller",
            "http://a:1",
            "--controller",
            "http://b:1",
            "--hostname-override",
            "node-1",
        ])
        .expect("valid flags");
        assert_eq!(cli.controllers, ["http://a:1", "http://b:1"]);
        assert_eq!(cli.hostname_override.as_deref(), Some("node-1"));
    }

    #[test]
    fn a_controller_is_required_and_unknown_modes_are_refused() {
        assert!(Cli::try_parse_from(["splitproxy-agent"]).is_err());
        assert!(
            Cli::try_parse_from([
                "splitproxy-agent",
                "--controller",
                "http://a:1",
                "--proxy-mode",
                "userspace"
            ])
            .is_err()
        );
    }
}
