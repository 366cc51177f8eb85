//! `deploy/grafana-dashboard.json` stays honest: it is valid dashboard JSON, and every metric it
//! queries is one the agent or the controller registers, found by reading their metrics modules
//! (a renamed metric fails here, not on an operator's empty panel). Needs no root.

#![allow(clippy::unwrap_used)]

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use std::{collections::BTreeSet, path::PathBuf};

/// The workspace root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(root().join(path)).with_context(|| format!("reading {path}"))
}

/// Words of `text` that look like metric names of ours: `kubeproxy_…` or `splitproxy_…`.
fn metric_names(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("kubeproxy_") || word.starts_with("splitproxy_"))
        .map(str::to_owned)
        .collect()
}

/// Every name the agent and controller register, as string literals in their metrics modules.
fn registered() -> Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for module in ["node-agent/src/metrics.rs", "controller/src/metrics.rs"] {
        let source = read(module)?;
        for literal in source.split('"').skip(1).step_by(2) {
            names.extend(
                metric_names(literal)
                    .into_iter()
                    .filter(|name| name == literal),
            );
        }
    }
    Ok(names)
}

/// Whether `queried` is exported under a registered name: the name itself, or a counter's
/// `_total` or a histogram's `_bucket`/`_sum`/`_count` sample of it.
fn is_exported(queried: &str, registered: &BTreeSet<String>) -> bool {
    registered.contains(queried)
        || ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .any(|suffix| {
                queried
                    .strip_suffix(suffix)
                    .is_some_and(|base| registered.contains(base))
            })
}

/// Every `expr` in `value`, however deeply nested (rows may hold panels).
fn expressions(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                match (key.as_str(), inner) {
                    ("expr", Value::String(expr)) => out.push(expr.clone()),
                    _ => expressions(inner, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| expressions(item, out)),
        _ => {}
    }
}

#[test]
fn the_dashboard_is_valid_and_queries_only_metrics_the_code_registers() -> Result<()> {
    let dashboard: Value = serde_json::from_str(&read("deploy/grafana-dashboard.json")?)
        .context("deploy/grafana-dashboard.json is not valid JSON")?;
    ensure!(dashboard["title"].is_string() && dashboard["uid"].is_string());
    let panels = dashboard["panels"].as_array().context("no panels")?;
    let mut ids = BTreeSet::new();
    for panel in panels {
        ensure!(
            ids.insert(panel["id"].as_u64().context("a panel without an id")?),
            "panel id {} used twice",
            panel["id"]
        );
        ensure!(panel["gridPos"]["w"].is_u64(), "no gridPos: {panel}");
        if panel["type"] != "row" {
            let targets = panel["targets"].as_array().context("no targets")?;
            ensure!(!targets.is_empty(), "{} queries nothing", panel["title"]);
        }
    }

    let registered = registered()?;
    ensure!(
        registered.contains("kubeproxy_sync_proxy_rules_duration_seconds")
            && registered.contains("splitproxy_controller_connected_agents"),
        "the metric modules were not read as expected: {registered:?}"
    );
    let mut exprs = Vec::new();
    expressions(&dashboard, &mut exprs);
    let queried: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    let unknown: Vec<&String> = queried
        .iter()
        .filter(|name| !is_exported(name, &registered))
        .collect();
    ensure!(
        unknown.is_empty(),
        "the dashboard queries metrics nobody exports: {unknown:?}"
    );
    // What the dashboard exists for.
    for wanted in [
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
        "kubeproxy_network_programming_duration_seconds_bucket",
        "kubeproxy_sync_proxy_rules_iptables_total",
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
        "kubeproxy_proxy_healthz_total",
        "splitproxy_controller_connected_agents",
        "splitproxy_controller_node_lag_seconds",
        "splitproxy_controller_update_bytes_sent_total",
    ] {
        ensure!(queried.contains(wanted), "the dashboard lacks {wanted}");
    }
    Ok(())
}

#[test]
fn a_misspelled_metric_is_caught() -> Result<()> {
    let registered = registered()?;
    ensure!(is_exported(
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
        &registered
    ));
    ensure!(!is_exported(
        "kubeproxy_sync_proxy_rules_endpoint_change_total",
        &registered
    ));
    Ok(())
}
