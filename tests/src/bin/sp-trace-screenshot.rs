//! `sp-trace-screenshot UI_ASSETS OUT.png`: the demo cluster exporting its traces to Jaeger (with
//! the web UI served from `UI_ASSETS`), one Service added, and a headless-Chromium screenshot of
//! that change's trace in the Jaeger UI written to `OUT.png`. Needs root and `chromium`; run it
//! through `scripts/trace-screenshot.sh`, which provides both.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::jaeger::TracedDemo;
use std::{path::PathBuf, process::ExitCode};

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

    let demo = TracedDemo::start("shot", Some(&assets))?;
    let trace = demo.add_a_service()?;
    let url = format!("{}/trace/{}", demo.jaeger.url(), trace.trace_id);
    eprintln!(
        "trace {} with {} spans: {url}",
        trace.trace_id,
        trace.spans.len()
    );

    // Root needs --no-sandbox; the virtual time budget lets the page fetch and draw the trace.
    let screenshot = format!("--screenshot={}", out.display());
    let output = demo.cluster.lab.exec(
        &demo.cluster.control_plane,
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
