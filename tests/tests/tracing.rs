//! One change followed as one distributed trace: the controller's change span, its revision to
//! each node, each agent's `apply` and the kernel transactions under it, exported over OTLP to a
//! real Jaeger and read back through Jaeger's query API. Needs root and the Jaeger build
//! (`tests/tracing/build-jaeger.sh`, which `scripts/test.sh` runs).
//!
//! Addresses: see `splitproxy_e2e::addresses` (Jaeger and the controller run on the
//! control-plane host 198.18.0.2; the Service added here is 10.96.0.20:80).

use anyhow::{Context, Result, bail, ensure};
use splitproxy_e2e::{
    addresses::CONTROL_PLANE,
    demo_cluster::{CONVERGE, Conditions, DemoCluster},
    eventually,
    jaeger::{self, Jaeger, Trace},
};
use std::{
    collections::BTreeSet,
    time::{Duration, SystemTime},
};

/// The longest wait for the trace to be complete in Jaeger; generous because CI machines are
/// slow and shared, and spans arrive in batches from three processes.
const TRACE_ARRIVES: Duration = Duration::from_secs(120);

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

    let changed_at = micros_since_epoch(SystemTime::now())?;
    cluster.write_web_service(
        "traced",
        "  clusterIP: 10.96.0.20",
        "",
        &[("web-a", Conditions::ready(true))],
    )?;

    let trace = eventually(
        "one trace holds the change on both nodes",
        TRACE_ARRIVES,
        || {
            let traces = jaeger.traces(&cluster.lab, "splitproxy-controller")?;
            traces
                .iter()
                .find_map(|t| check_trace(t, changed_at).ok())
                .cloned()
                .map_or_else(
                    || {
                        let why = traces
                            .iter()
                            .map(|t| {
                                check_trace(t, changed_at)
                                    .map_or_else(|e| format!("{e:#}"), |_| String::new())
                            })
                            .collect::<Vec<_>>()
                            .join("; ");
                        bail!("no complete trace yet among {}: {why}", traces.len())
                    },
                    Ok,
                )
        },
    )
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

/// The trace of the manifests change made at `changed_at` (µs since the epoch), when it is
/// complete: the controller's change span, an `apply` span from each agent (node-1 and node-2)
/// under a controller span, and successful `iptables sync` spans under each `apply`.
fn check_trace(trace: &Trace, changed_at: u64) -> Result<&Trace> {
    let change = trace
        .named("manifests change")
        .find(|s| s.tag("initial").as_deref() == Some("false") && s.start_time >= changed_at)
        .context("no manifests change span after the write")?;
    ensure!(
        trace.service_of(change) == Some("splitproxy-controller"),
        "the change span comes from {:?}",
        trace.service_of(change)
    );
    let mut nodes = BTreeSet::new();
    for apply in trace.named("apply") {
        ensure!(
            trace.service_of(apply) == Some("splitproxy-agent"),
            "an apply span comes from {:?}",
            trace.service_of(apply)
        );
        let parent = trace
            .parent_of(apply)
            .context("an apply span has no parent")?;
        ensure!(
            trace.service_of(parent) == Some("splitproxy-controller"),
            "an apply span's parent is {:?}",
            parent.operation_name
        );
        ensure!(
            apply.tag("result").as_deref() == Some("applied"),
            "an apply span's result is {:?}",
            apply.tag("result")
        );
        ensure!(
            apply.tag("services_changed").as_deref() == Some("1"),
            "an apply span changed {:?} services",
            apply.tag("services_changed")
        );
        let kernel: Vec<_> = trace
            .named("iptables sync")
            .filter(|s| {
                trace
                    .parent_of(s)
                    .is_some_and(|p| p.span_id == apply.span_id)
            })
            .collect();
        ensure!(
            !kernel.is_empty(),
            "an apply span has no iptables sync child"
        );
        for sync in kernel {
            ensure!(
                sync.tag("result").as_deref() == Some("ok")
                    && sync.tag("ip_family").is_some()
                    && sync.tag("sync").is_some()
                    && sync.tag("rules_written").is_some(),
                "an iptables sync span lacks its attributes: {:?}",
                sync.tags
            );
        }
        nodes.insert(apply.tag("node").context("an apply span has no node")?);
    }
    let expected: BTreeSet<String> = ["node-1", "node-2"].map(str::to_owned).into();
    ensure!(nodes == expected, "apply spans from {nodes:?}");
    Ok(trace)
}

fn micros_since_epoch(time: SystemTime) -> Result<u64> {
    let since = time.duration_since(SystemTime::UNIX_EPOCH)?;
    Ok(u64::try_from(since.as_micros())?)
}
