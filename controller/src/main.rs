//! `splitproxy-controller`: parses flags, runs the controller, exits on a fatal error.

use clap::Parser;
use splitproxy_controller::server;
use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

/// Streams each node's Services and endpoints to its splitproxy agent.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Directory of YAML manifests (Services, EndpointSlices, Nodes as `kubectl get -o yaml`
    /// prints them) to serve; changes are picked up while running.
    #[arg(long, env = "SPLITPROXY_MANIFESTS")]
    manifests: PathBuf,
    /// Address the gRPC server for agents listens on.
    #[arg(long, env = "SPLITPROXY_LISTEN", default_value = "0.0.0.0:10660")]
    listen: SocketAddr,
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    if !cli.manifests.is_dir() {
        eprintln!("--manifests {}: not a directory", cli.manifests.display());
        return ExitCode::from(EXIT_USAGE);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("starting the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let config = server::Config {
        manifests: cli.manifests,
        listen: cli.listen,
    };
    match runtime.block_on(run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "controller stopped");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: server::Config) -> anyhow::Result<()> {
    tokio::select! {
        result = server::run(config) => Ok(result?),
        _ = tokio::signal::ctrl_c() => {
            tracing::info!("interrupted; stopping");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_flag_is_required() {
        assert!(Cli::try_parse_from(["splitproxy-controller"]).is_err());
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
