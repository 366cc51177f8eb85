//! One change followed as one distributed trace: the controller's change span, its revision to
//! each node, each agent's `apply` and the kernel transactions under it, exported over OTLP to a
//! real Jaeger and read back through Jaeger's query API. Needs root and the Jaeger build
//! (`tests/tracing/build-jaeger.sh`, which `scripts/test.sh` runs).
//!
//! Addresses: see `splitproxy_e2e::addresses` (Jaeger and the controller run on the
//! control-plane host 198.18.0.2; the Service added here is 10.96.0.20:80).

use anyhow::Result;
use splitproxy_e2e::jaeger::TracedDemo;

#[test]
fn a_service_change_is_one_trace_from_the_controller_to_both_kernels() -> Result<()> {
    let demo = TracedDemo::start("trace", None)?;
    let trace = demo.add_a_service()?;
    eprintln!(
        "complete trace {} with {} spans",
        trace.trace_id,
        trace.spans.len()
    );
    Ok(())
}
