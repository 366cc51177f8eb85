//! `splitproxy-ca`: the controllers' CA, kept apart from the controller. `keep` (a Job at install)
//! makes the CA and publishes its trust bundle; `rollover` (a Job an operator starts) replaces the
//! CA without dropping an agent; `issue` (each controller Pod's sidecar) keeps the replica's
//! serving certificate. See `splitproxy_controller::serving_ca`.

use anyhow::Context;
use clap::{Parser, Subcommand};
use splitproxy_controller::{
    api_client,
    cli::{parse_master, parse_namespaced_name},
    serving_ca::{self, Step, issuer::Issuer, store::Store},
};
use splitproxy_telemetry::trace;
use std::{path::PathBuf, process::ExitCode, time::Duration};

/// The controllers' CA: made and published, rolled over, and issuing each replica's certificate.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Makes the CA when the Secret holds none, and publishes the CA certificates agents trust
    /// (`ca.crt` in the ConfigMap of the Secret's name).
    Keep(Api),
    /// Replaces the CA: adds a new one to what agents trust, waits, lets it sign, waits, and
    /// drops the old one. A rollover cut short resumes where it stopped.
    Rollover {
        #[command(flatten)]
        api: Api,
        /// Seconds between the steps: long enough for every kubelet to update the agents'
        /// ConfigMap volume and the sidecars' Secret volume (about a minute, by default), and
        /// for the controllers to read their new certificates.
        #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
        step_seconds: u64,
    },
    /// Keeps a serving certificate, issued from the CA in a directory (the mounted Secret), in
    /// the files the controller serves; issues a new one when the CA changes or the certificate
    /// nears its end.
    Issue {
        /// The directory holding the CA's `tls.crt` and `tls.key`.
        #[arg(long)]
        ca_dir: PathBuf,
        /// Where the certificate (then the CA's) is written.
        #[arg(long)]
        cert_file: PathBuf,
        /// Where its private key is written.
        #[arg(long)]
        key_file: PathBuf,
        /// The DNS names and IP addresses the certificate is for (comma-separated or
        /// repeated); agents finding controllers through their Service check
        /// `NAME.NAMESPACE.svc`.
        #[arg(long, value_delimiter = ',', required = true, value_parser = parse_san)]
        san: Vec<String>,
    },
}

/// Where the CA Secret is, and how to reach the API server.
#[derive(Debug, clap::Args)]
struct Api {
    /// The CA Secret (NAMESPACE/NAME); its trust bundle is published in the ConfigMap of the same
    /// name.
    #[arg(long, value_parser = parse_namespaced_name)]
    secret: (String, String),
    /// Kubeconfig for the API server; without it, the in-cluster service account.
    #[arg(long, env = "SPLITPROXY_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The API server's real address (`https://HOST:PORT`), overriding the kubeconfig's: in a
    /// Pod, the in-cluster one is a Service IP, which only the agents program.
    #[arg(long, env = "SPLITPROXY_MASTER", value_parser = parse_master)]
    master: Option<http::Uri>,
}

/// Parses one of `--san`: an IP address or a DNS name.
fn parse_san(value: &str) -> Result<String, String> {
    serving_ca::check_name(value).map(|()| value.to_owned())
}

impl Api {
    async fn store(&self) -> anyhow::Result<Store> {
        let client = api_client::connect(self.kubeconfig.as_deref(), self.master.clone()).await?;
        let (namespace, name) = &self.secret;
        Ok(Store::new(&client, namespace, name))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("starting the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let identity = trace::Identity {
        service_name: "splitproxy-ca",
        attributes: Vec::new(),
    };
    let telemetry = match runtime.block_on(async { trace::init(identity, trace::Logs::default()) })
    {
        Ok(telemetry) => telemetry,
        Err(err) => {
            eprintln!("setting up logging: {:#}", anyhow::Error::from(err));
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "splitproxy-ca stopped");
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown();
    code
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Keep(api) => {
            let store = api.store().await?;
            let kept = store.keep().await?;
            tracing::info!(
                rolling_over = kept.rolling_over(),
                "the CA is kept and its trust bundle published"
            );
        }
        Command::Rollover { api, step_seconds } => {
            let store = api.store().await?;
            let wait = Duration::from_secs(step_seconds);
            // A rollover cut short may have just taken its last step: give it its wait.
            if store.keep().await?.rolling_over() {
                tracing::info!("resuming a CA rollover");
                tokio::time::sleep(wait).await;
            }
            loop {
                let step = store.advance().await?;
                tracing::info!(?step, "CA rollover step taken");
                if step == Step::Finished {
                    break;
                }
                tokio::time::sleep(wait).await;
            }
        }
        Command::Issue {
            ca_dir,
            cert_file,
            key_file,
            san,
        } => {
            Issuer {
                ca_dir,
                cert_file,
                key_file,
                names: san,
            }
            .run()
            .await
            .context("exiting for the kubelet to restart this container with the mounted Secret as it is now")?;
        }
    }
    Ok(())
}
