//! One change followed as one distributed trace: the controller's change span, its revision to
//! each node, each agent's `apply` and the kernel transactions under it, exported over OTLP to a
//! real Jaeger and read back through Jaeger's query API. Needs root and the Jaeger build
//! (`tests/tracing/build-jaeger.sh`, which `scripts/test.sh` runs).
//!
//! Addresses: see `splitproxy_e2e::addresses` (Jaeger and the controller run on the
//! control-plane host 198.18.0.2; the Service added here is 10.96.0.20:80).

use anyhow::{Context, Result};
use splitproxy_e2e::{
    addresses::CONTROL_PLANE,
    demo_cluster::{CONVERGE, Conditions, DemoCluster},
    eventually,
    jaeger::{self, Jaeger},
};
use std::time::{Duration, SystemTime};

/// The longest wait for the trace to be complete in Jaeger; generous because CI machines are
/// slow and shared, and spans arrive in batches from three processes.
const TRACE_ARRIVES: Duration = Duration::from_secs(120);
/// The demo cluster's nodes, each of which must apply the change.
const NODES: &[&str] = &["node-1", "node-2"];

#[test]
fn a_service_change_is_one_trace_from_the_controller_to_both_kernels() -> Result<()> {
    let env = jaeger::otlp_env(CONTROL_PLANE);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut cluster = DemoCluster::start_with_env("trace", &[], &env)?;
    let control_plane = cluster.control_plane.clone();
    let jaeger = Jaeger::start(&mut cluster.lab, &control_plane)?;
    // Both nodes hold the demo state first, so the change below reaches them as a delta of one
    // Service (an agent that connects late gets a reset holding every Service instead).
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

    let trace = jaeger
        .change_trace(&cluster.lab, changed_at, NODES, TRACE_ARRIVES)
        .with_context(|| {
            format!(
                "{}\n--- jaeger\n{}",
                cluster.logs(),
                jaeger.process.log_tail(30)
            )
        })?;
    eprintln!(
        "complete trace {} with {} spans",
        trace.trace_id,
        trace.spans.len()
    );
    Ok(())
}
