//! The B4 sweep plot: latency, controller memory and restart time against the number of nodes,
//! from the `b4.json` of several runs, one line per kind of run (min-sync period, hints).

use crate::svg::{self, Series};
use serde_json::Value;
use std::collections::BTreeMap;

/// The plot of `runs` (each a parsed `b4.json`).
#[must_use]
pub fn plot(runs: &[Value]) -> String {
    svg::side_by_side(&[
        svg::lines(
            "B4: network programming latency",
            "nodes",
            "seconds",
            &[
                lines(runs, "p50", |run| ms_as_s(&run["p50_ms"])),
                lines(runs, "p99", |run| ms_as_s(&run["p99_ms"])),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>(),
        ),
        svg::lines(
            "B4: controller memory",
            "nodes",
            "GiB",
            &[
                lines(runs, "after churn", |run| {
                    bytes_as_gib(&run["controller_rss_bytes"])
                }),
                lines(runs, "restart peak", |run| {
                    bytes_as_gib(&run["restart_peak_rss_bytes"])
                }),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>(),
        ),
        svg::lines(
            "B4: controller restart, SIGKILL to every node resumed",
            "nodes",
            "seconds",
            &lines(runs, "restart", |run| run["restart_seconds"].as_f64()),
        ),
    ])
}

/// One series per kind of run, named `what` and the kind, with `value` against nodes; runs
/// without the value are left out.
fn lines(runs: &[Value], what: &str, value: impl Fn(&Value) -> Option<f64>) -> Vec<Series> {
    let mut kinds: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for run in runs {
        let params = &run["params"];
        let (Some(nodes), Some(y)) = (params["nodes"].as_f64(), value(run)) else {
            continue;
        };
        let min_sync = params["min_sync_period_ms"].as_f64().unwrap_or(f64::NAN) / 1000.0;
        let hints = if params["hints"].as_bool() == Some(true) {
            ", hints"
        } else {
            ""
        };
        let kind = format!("{what}, min-sync {min_sync} s{hints}");
        kinds.entry(kind).or_default().push((nodes, y));
    }
    kinds
        .into_iter()
        .map(|(name, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series { name, points }
        })
        .collect()
}

fn ms_as_s(value: &Value) -> Option<f64> {
    value.as_f64().map(|ms| ms / 1000.0)
}

fn bytes_as_gib(value: &Value) -> Option<f64> {
    value.as_f64().map(|bytes| bytes / f64::from(1 << 30))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_a_kind_make_one_line_in_node_order_and_runs_without_the_value_are_left_out() {
        let run = |nodes: u32, hints: bool, p99: Option<f64>| {
            serde_json::json!({
                "params": {"nodes": nodes, "min_sync_period_ms": 1000, "hints": hints},
                "p99_ms": p99,
            })
        };
        let runs = [
            run(5000, false, Some(3000.0)),
            run(1000, false, Some(2000.0)),
            run(1000, true, Some(2500.0)),
            run(2000, false, None),
        ];
        let series = lines(&runs, "p99", |run| ms_as_s(&run["p99_ms"]));
        let found: Vec<_> = series.iter().map(|s| (&*s.name, &*s.points)).collect();
        assert_eq!(
            found,
            [
                ("p99, min-sync 1 s", &[(1000.0, 2.0), (5000.0, 3.0)][..]),
                ("p99, min-sync 1 s, hints", &[(1000.0, 2.5)][..]),
            ]
        );
    }
}
