//! `sp-trace-screenshot UI_ASSETS OUT.png`: the demo cluster exporting its traces to Jaeger (with
//! the web UI served from `UI_ASSETS`), one Service added, and a headless-Chromium screenshot of
//! that change's trace in the Jaeger UI written to `OUT.png`. Needs root and `chromium`; run it
//! through `scripts/trace-screenshot.sh`, which provides both.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    addresses::CONTROL_PLANE,
    demo_cluster::{CONVERGE, Conditions, DemoCluster},
    eventually,
    jaeger::{self, Jaeger},
};
use std::{path::PathBuf, process::ExitCode, time::Duration, time::SystemTime};

/// The longest wait for the trace to be complete in Jaeger.
const TRACE_ARRIVES: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("trace screenshot failed: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let mut args = std::env::args_os().skip(1);
    let (Some(assets), Some(out)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: sp-trace-screenshot UI_ASSETS OUT.png");
    };
    let (assets, out) = (PathBuf::from(assets), PathBuf::from(out));
    let out = std::path::absolute(&out).context("resolving the output path")?;

    let env = jaeger::otlp_env(CONTROL_PLANE);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut cluster = DemoCluster::start_with_env("shot", &[], &env)?;
    let control_plane = cluster.control_plane.clone();
    let jaeger = Jaeger::start_with_ui(&mut cluster.lab, &control_plane, &assets)?;
    eventually("traffic reaches the ready web pods", CONVERGE, || {
        cluster.check_traffic(20).map(drop)
    })
    .with_context(|| cluster.logs())?;

    let changed_at = jaeger::micros_since_epoch(SystemTime::now())?;
    cluster.write_web_service(
        "traced",
        "  clusterIP: 10.96.0.20",
        "",
        &[("web-a", Conditions::ready(true))],
    )?;
    let trace = jaeger.change_trace(
        &cluster.lab,
        changed_at,
        &["node-1", "node-2"],
        TRACE_ARRIVES,
    )?;
    let url = format!("{}/trace/{}", jaeger.url(), trace.trace_id);
    eprintln!(
        "trace {} with {} spans: {url}",
        trace.trace_id,
        trace.spans.len()
    );

    // Root needs --no-sandbox; the virtual time budget lets the page fetch and draw the trace.
    let screenshot = format!("--screenshot={}", out.display());
    let output = cluster.lab.exec(
        &control_plane,
        "chromium",
        &[
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1400,520",
            "--virtual-time-budget=15000",
            &screenshot,
            &url,
        ],
    )?;
    ensure!(
        out.is_file(),
        "chromium wrote no screenshot: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("wrote {}", out.display());
    Ok(())
}
