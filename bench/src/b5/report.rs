//! B5's results as people read them: Markdown tables and the plot, written beside the JSON.

use super::{
    SUBJECTS,
    results::{Cell, Results},
};
use crate::{stats::Interval, svg};
use anyhow::Result;
use std::{fmt::Write as _, path::Path};

/// Writes `b5.json`, `b5.md` (the tables) and `b5.svg`.
pub(super) fn write(results: &Results, output: &Path) -> Result<()> {
    let json = serde_json::to_string_pretty(results)?;
    std::fs::write(output.join("b5.json"), format!("{json}\n"))?;
    std::fs::write(output.join("b5.md"), table(results))?;
    std::fs::write(output.join("b5.svg"), plot(results))?;
    Ok(())
}

/// The results as Markdown: a summary (a row per subject, a column per size), then one table
/// per scenario with a row per subject and size.
pub(super) fn table(results: &Results) -> String {
    let mut md = summary(results);
    let scenarios = &results.params.scenarios;
    for &scenario in scenarios {
        let _ = writeln!(
            md,
            "\n#### {}\n\n| Services | implementation | valid | connect p50 / p99 / p999 µs | exchange p50 / p99 µs | exchanges/s (interval) | CPU µs each | × kube-proxy same mode | × kube-proxy best | × no proxy | × no proxy, conntrack | × own at smallest |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            scenario.name()
        );
        for size in &results.sizes {
            for cell in size.cells.iter().filter(|c| c.scenario == scenario) {
                let connect = cell.connect_us.map_or_else(
                    || "–".to_owned(),
                    |p| format!("{:.0} / {:.0} / {:.0}", p.p50, p.p99, p.p999),
                );
                let exchange = cell.exchange_us.map_or_else(
                    || "–".to_owned(),
                    |p| format!("{:.0} / {:.0}", p.p50, p.p99),
                );
                let rate = cell.per_second.map_or_else(
                    || "–".to_owned(),
                    |i| format!("{:.0} ({:.0}–{:.0})", i.median, i.low, i.high),
                );
                let ratio = |r: Option<Interval>| {
                    r.map_or_else(|| "–".to_owned(), |i| format!("{:.2}", i.median))
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {connect} | {exchange} | {rate} | {} | {} | {} | {} | {} | {} |",
                    size.services,
                    cell.subject,
                    if cell.valid { "yes" } else { "**no**" },
                    cell.cpu_us_per_exchange
                        .map_or_else(|| "–".to_owned(), |c| format!("{c:.0}")),
                    ratio(cell.ratios.kube_proxy_same_mode),
                    ratio(cell.ratios.kube_proxy_best),
                    ratio(cell.ratios.no_proxy),
                    ratio(cell.ratios.no_proxy_conntrack),
                    cell.ratios
                        .smallest_size
                        .map_or_else(|| "–".to_owned(), |r| format!("{r:.2}")),
                );
            }
        }
    }
    let _ = writeln!(
        md,
        "\n#### Programming (first sync on the populated cluster)\n\n| Services | proxy | full sync s | syncs | rules | syncs while measured | peak RSS MiB |\n| --- | --- | --- | --- | --- | --- | --- |"
    );
    for size in &results.sizes {
        for p in &size.programming {
            let _ = writeln!(
                md,
                "| {} | {} | {:.2} | {} | {} | {} | {} |",
                size.services,
                p.subject,
                p.full_sync_s,
                p.syncs,
                p.rules,
                p.syncs_while_measured,
                p.memory
                    .map_or_else(|| "–".to_owned(), |m| format!("{:.1}", m.peak_rss_mib))
            );
        }
    }
    if !results.slopes.is_empty() {
        let _ = writeln!(
            md,
            "\n#### Cost of 1,000 more Services (least-squares slope over the sizes)\n\n| scenario | implementation | connect p50 µs | exchange p50 µs | CPU µs per exchange |\n| --- | --- | --- | --- | --- |"
        );
        let number = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| format!("{v:.2}"));
        for slope in &results.slopes {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                slope.scenario.name(),
                slope.subject,
                number(slope.connect_p50_us),
                number(slope.exchange_p50_us),
                number(slope.cpu_us_per_exchange),
            );
        }
    }
    let _ = writeln!(md, "\nIPVS: {}", results.ipvs);
    md
}

/// Per scenario, a row per subject and a column per size: exchanges per second and connect p99
/// (the whole exchange's p99 where there is no connect), `*` marking an invalid cell.
fn summary(results: &Results) -> String {
    let mut md = String::new();
    let sizes: Vec<String> = results
        .sizes
        .iter()
        .map(|s| format!("{} Services", s.services))
        .collect();
    for &scenario in &results.params.scenarios {
        let _ = writeln!(
            md,
            "\n#### {}: exchanges per second · p99 µs\n\n| implementation | {} |\n| --- |{}",
            scenario.name(),
            sizes.join(" | "),
            " --- |".repeat(sizes.len())
        );
        for subject in SUBJECTS {
            let name = subject.name();
            let row: Vec<String> = results
                .sizes
                .iter()
                .map(|size| {
                    size.cells
                        .iter()
                        .find(|c| c.scenario == scenario && c.subject == name)
                        .map_or_else(
                            || "–".to_owned(),
                            |cell| {
                                let p99 = cell.connect_us.or(cell.exchange_us).map(|p| p.p99);
                                format!(
                                    "{:.0} · {:.0}{}",
                                    cell.per_second.map_or(0.0, |i| i.median),
                                    p99.unwrap_or(0.0),
                                    if cell.valid { "" } else { " *" }
                                )
                            },
                        )
                })
                .collect();
            if row.iter().any(|v| v != "–") {
                let _ = writeln!(md, "| {name} | {} |", row.join(" | "));
            }
        }
    }
    md
}

/// Exchanges per second and connect p99 against the number of Services (log scale), a line per
/// subject, for the first scenario of the run.
fn plot(results: &Results) -> String {
    let Some(&scenario) = results.params.scenarios.first() else {
        return String::new();
    };
    #[allow(clippy::cast_precision_loss)] // sizes far below 2^52
    let x = |services: usize| (services as f64).log10();
    let series = |value: fn(&Cell) -> Option<f64>| -> Vec<svg::Series> {
        SUBJECTS
            .iter()
            .map(|subject| svg::Series {
                name: subject.name(),
                points: results
                    .sizes
                    .iter()
                    .filter_map(|size| {
                        let cell = size
                            .cells
                            .iter()
                            .find(|c| c.scenario == scenario && c.subject == subject.name())?;
                        Some((x(size.services), value(cell)?))
                    })
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect()
    };
    let rate = svg::lines(
        &format!("B5 {}: exchanges per second", scenario.name()),
        "log10(Services)",
        "new connections per second",
        &series(|c| c.per_second.map(|i| i.median)),
    );
    let p99 = svg::lines(
        &format!("B5 {}: connect p99", scenario.name()),
        "log10(Services)",
        "connect p99 (µs)",
        &series(|c| c.connect_us.map(|p| p.p99)),
    );
    svg::side_by_side(&[rate, p99])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::b5::{
        IptablesBackend, Params, Profile, Scenario, Subject,
        load::Trial,
        results::{Round, Size, cell},
    };
    use crate::proxied::ProxyMode;
    use std::collections::BTreeMap;

    fn round(completed: u64, invalid_because: &[&str]) -> Round {
        let trial = Trial {
            completed,
            elapsed_s: 1.0,
            connect_us: vec![40.0; 10],
            exchange_us: vec![90.0; 10],
            machine_busy_us: 1e6,
            ..Trial::default()
        };
        Round {
            latency: trial.clone(),
            rate: trial,
            counters: BTreeMap::new(),
            invalid_because: invalid_because.iter().map(|&s| s.to_owned()).collect(),
        }
    }

    #[test]
    fn the_summary_has_a_row_per_subject_measured_and_marks_invalid_cells() {
        let scenario = Scenario::ClusterIp;
        let results = Results {
            params: Params {
                profile: Profile::Quick,
                services: vec![1],
                scenarios: vec![scenario],
                rounds: 1,
                latency_count: 10,
                rate_seconds: 1.0,
                concurrency: 1,
                measured: 1,
                iptables_backend: IptablesBackend::Legacy,
                timeout_s: 1,
            },
            kernel: "6.1".to_owned(),
            load_average_at_start: vec![0.0; 3],
            ipvs: "unavailable".to_owned(),
            sizes: vec![Size {
                services: 1,
                measured: 1,
                populate_s: 0.1,
                programming: Vec::new(),
                cells: vec![
                    cell(scenario, Subject::NoProxy, &[round(20_000, &[])]),
                    cell(
                        scenario,
                        Subject::Splitproxy(ProxyMode::Nftables),
                        &[round(19_000, &["client Tcp.RetransSegs +1"])],
                    ),
                ],
            }],
            slopes: Vec::new(),
        };
        let md = table(&results);
        assert!(
            md.contains("| limit: no proxy, no conntrack | 20000 · 40 |"),
            "{md}"
        );
        assert!(
            md.contains("| splitproxy nftables | 19000 · 40 * |"),
            "{md}"
        );
        assert!(
            !md.contains("| kube-proxy iptables |"),
            "no row without cells: {md}"
        );
        assert!(md.contains("| 1 | splitproxy nftables | **no** |"), "{md}");
    }
}
