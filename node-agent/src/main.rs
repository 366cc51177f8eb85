//! `splitproxy-agent`: parses flags, runs the agent, exits on a fatal error.

use clap::Parser;
use splitproxy_agent::{
    cleanup,
    cli::{Cli, ProxyMode},
    host_setup,
    kube_proxy_config::{self, Settings},
    start::{run_agent, set_up_bpffs, set_up_node},
};
use splitproxy_telemetry::trace::{self, KeyValue};
use std::process::ExitCode;

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
    let configured = kube_proxy_config::configuration(&cli)
        .and_then(|config| Ok((kube_proxy_config::resolve(&config)?, config)));
    let (settings, config) = match configured {
        Ok(configured) => configured,
        Err(err) => {
            eprintln!("{:#}", anyhow::Error::from(err));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if let Some(path) = &cli.write_config_to {
        return match kube_proxy_config::write(&config, path) {
            Ok(()) => {
                eprintln!("wrote the configuration to {}", path.display());
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("{:#}", anyhow::Error::from(err));
                ExitCode::FAILURE
            }
        };
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("starting the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let node_name = match settings
        .hostname_override
        .clone()
        .map_or_else(host_name, Ok)
    {
        Ok(name) if !name.is_empty() => name.to_lowercase(),
        Ok(_) | Err(_) => {
            eprintln!("cannot tell the node name: set --hostname-override");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let logs = trace::Logs {
        verbosity: settings.verbosity,
        json: settings.json_logs,
    };
    // Inside the runtime: the OTLP exporter's connection lives on it.
    let telemetry = match runtime.block_on(async {
        trace::init(
            trace::Identity {
                service_name: "splitproxy-agent",
                attributes: vec![KeyValue::new("k8s.node.name", node_name.clone())],
            },
            logs,
        )
    }) {
        Ok(telemetry) => telemetry,
        Err(err) => {
            eprintln!("setting up tracing: {:#}", anyhow::Error::from(err));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let code = runtime.block_on(start(cli, settings, node_name));
    telemetry.shutdown();
    code
}

/// What follows a valid configuration: `--cleanup`, the node's sysctls, `--init-only`, or the
/// agent itself.
async fn start(cli: Cli, settings: Settings, node_name: String) -> ExitCode {
    if cli.config.is_some() {
        let replaced = cli.replaced_by_config();
        if !replaced.is_empty() {
            tracing::warn!(
                flags = ?replaced,
                "--config replaces these flags, as in kube-proxy; they are ignored"
            );
        }
    }
    if cli.config.is_some() || cli.kubeconfig.is_some() || cli.master.is_some() {
        tracing::info!("{}", kube_proxy_config::MOOT_FIELDS);
    }
    if cli.cleanup() {
        return cleanup::cleanup_all(settings.ipvs.exclude_cidrs, &cli.bpf_root).await;
    }
    if let Err(err) = host_setup::set_oom_score_adj(settings.oom_score_adj) {
        tracing::debug!(error = %err, "could not set the OOM score adjustment");
    }
    if let Err(code) = set_up_node(&settings, cli.init_only()) {
        return code;
    }
    if cli.init_only() {
        if settings.mode == ProxyMode::Ebpf
            && let Err(code) = set_up_bpffs(&cli.bpf_root)
        {
            return code;
        }
        tracing::info!("the node is set up and --init-only was given; exiting");
        return ExitCode::SUCCESS;
    }
    match run_agent(cli, settings, node_name).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "agent stopped");
            ExitCode::FAILURE
        }
    }
}

fn host_name() -> std::io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/hostname")?
        .trim()
        .to_owned())
}
