//! What B5 measured, and how the cells compare: percentiles pooled over the rounds, rates as
//! medians of the rounds, ratios as medians of per-round ratios, slopes over the sizes.

use super::{Params, SUBJECTS, Scenario, Subject, load::Trial};
use crate::{
    process::Memory,
    proxied::ProxyMode,
    stats::{Interval, quantile},
};
use serde::Serialize;
use std::{collections::BTreeMap, time::Duration};

/// What one B5 run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    /// The parameters of the run.
    pub params: Params,
    /// The kernel the run measured.
    pub kernel: String,
    /// The machine's 1, 5 and 15 minute load averages when the run started.
    pub load_average_at_start: Vec<f64>,
    /// IPVS mode: measured or why not.
    pub ipvs: String,
    /// One per number of Services.
    pub sizes: Vec<Size>,
    /// How each scenario's cost grows with the number of Services, per subject (from two sizes
    /// on).
    pub slopes: Vec<Slope>,
}

/// The least-squares slope, over the run's sizes, of one subject's figures in one scenario
/// against the number of Services: what each 1,000 more Services cost.
#[derive(Debug, Clone, Serialize)]
pub struct Slope {
    /// The scenario.
    pub scenario: Scenario,
    /// The subject's name.
    pub subject: String,
    /// Connect p50, µs per 1,000 Services.
    pub connect_p50_us: Option<f64>,
    /// Whole-exchange p50, µs per 1,000 Services.
    pub exchange_p50_us: Option<f64>,
    /// The machine's CPU per exchange, µs per 1,000 Services.
    pub cpu_us_per_exchange: Option<f64>,
}

/// One number of Services.
#[derive(Debug, Clone, Serialize)]
pub struct Size {
    /// Services in the cluster (besides the API server's own).
    pub services: usize,
    /// Of them, the measured ones.
    pub measured: usize,
    /// Seconds taken to create the Services and EndpointSlices.
    pub populate_s: f64,
    /// Each proxy's first sync on the populated cluster.
    pub programming: Vec<Programming>,
    /// One per scenario and subject.
    pub cells: Vec<Cell>,
}

/// How one proxy programmed the populated cluster.
#[derive(Debug, Clone, Serialize)]
pub struct Programming {
    /// The proxy and its mode.
    pub subject: String,
    /// Sync time from its start until its rules held every Service, in seconds.
    pub full_sync_s: f64,
    /// Syncs that took.
    pub syncs: f64,
    /// Rules in its node at the end (as B2 counts them).
    pub rules: usize,
    /// Syncs while the trials ran (0 when it stayed frozen).
    pub syncs_while_measured: f64,
    /// Its memory after the trials.
    pub memory: Option<Memory>,
}

/// Latency percentiles, in µs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    /// Samples.
    pub count: usize,
    /// The median.
    pub p50: f64,
    /// The 90th percentile.
    pub p90: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The 99.9th percentile.
    pub p999: f64,
}

impl Percentiles {
    pub(super) fn of(samples_us: &[f64]) -> Option<Self> {
        let mut sorted: Vec<Duration> = samples_us
            .iter()
            .map(|us| Duration::from_secs_f64(us.max(0.0) / 1e6))
            .collect();
        sorted.sort_unstable();
        let at = |q| quantile(&sorted, q).map(|d| d.as_secs_f64() * 1e6);
        Some(Self {
            count: sorted.len(),
            p50: at(0.5)?,
            p90: at(0.9)?,
            p99: at(0.99)?,
            p999: at(0.999)?,
        })
    }
}

/// One scenario through one subject at one size.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// The scenario.
    pub scenario: Scenario,
    /// The subject's name.
    pub subject: String,
    /// Whether every trial was clean: no error, no counter moved.
    pub valid: bool,
    /// What made a trial invalid.
    pub invalid_because: Vec<String>,
    /// Connect time over every round's latency trial (new TCP connections only).
    pub connect_us: Option<Percentiles>,
    /// Whole exchange (connect, request, reply) over every round's latency trial.
    pub exchange_us: Option<Percentiles>,
    /// Exchanges per second in the rate trials: the median of the rounds, with its interval.
    pub per_second: Option<Interval>,
    /// The whole machine's CPU time per exchange in the rate trials (median of the rounds).
    pub cpu_us_per_exchange: Option<f64>,
    /// CPU stolen by the hypervisor during the rate trials, as a share of the time measured.
    pub steal_share: f64,
    /// Counters summed over the trials (conntrack drops, listen overflows, retransmits).
    pub counters: BTreeMap<String, u64>,
    /// Ratios of this cell's exchanges per second (medians of per-round ratios).
    pub ratios: CellRatios,
    /// Per-round exchanges per second, in round order (for the ratios).
    #[serde(skip)]
    pub(super) rounds: Vec<f64>,
}

/// Ratios of a cell's rate to others', each the median of per-round ratios with its interval
/// (`None` where the other has no such cell).
#[derive(Debug, Clone, Default, Serialize)]
pub struct CellRatios {
    /// To kube-proxy in the same mode (splitproxy's cells).
    pub kube_proxy_same_mode: Option<Interval>,
    /// To kube-proxy's best mode at this size and scenario (by median rate).
    pub kube_proxy_best: Option<Interval>,
    /// To the direct path without conntrack.
    pub no_proxy: Option<Interval>,
    /// To the direct path with conntrack.
    pub no_proxy_conntrack: Option<Interval>,
    /// To the same subject and scenario at the run's smallest size (a ratio of medians: the
    /// sizes run on different control planes).
    pub smallest_size: Option<f64>,
    /// Connect p99 over kube-proxy's best mode's connect p99 (below 1: faster).
    pub connect_p99_to_kube_proxy_best: Option<f64>,
}

/// What one round of one scenario through one subject gave.
pub(super) struct Round {
    pub(super) latency: Trial,
    pub(super) rate: Trial,
    pub(super) counters: BTreeMap<String, u64>,
    pub(super) invalid_because: Vec<String>,
}

/// The cell of `subject`'s `rounds` of `scenario`.
pub(super) fn cell(scenario: Scenario, subject: Subject, rounds: &[Round]) -> Cell {
    let pooled = |pick: fn(&Trial) -> &Vec<f64>| -> Vec<f64> {
        rounds
            .iter()
            .flat_map(|r| pick(&r.latency).iter().copied())
            .collect()
    };
    let per_second: Vec<f64> = rounds.iter().map(|r| per_second(&r.rate)).collect();
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    let cpu: Vec<f64> = rounds
        .iter()
        .filter(|r| r.rate.completed > 0)
        .map(|r| r.rate.machine_busy_us / r.rate.completed as f64)
        .collect();
    let (steal, measured): (f64, f64) = rounds.iter().fold((0.0, 0.0), |(s, m), r| {
        (s + r.rate.machine_steal_us, m + r.rate.elapsed_s * 1e6)
    });
    let mut counters = BTreeMap::new();
    for round in rounds {
        for (name, n) in &round.counters {
            *counters.entry(name.clone()).or_default() += n;
        }
    }
    let invalid_because: Vec<String> = rounds
        .iter()
        .flat_map(|r| r.invalid_because.iter().cloned())
        .collect();
    Cell {
        scenario,
        subject: subject.name(),
        valid: invalid_because.is_empty(),
        invalid_because,
        connect_us: Percentiles::of(&pooled(|t| &t.connect_us)),
        exchange_us: Percentiles::of(&pooled(|t| &t.exchange_us)),
        per_second: Interval::of(&per_second),
        cpu_us_per_exchange: Interval::of(&cpu).map(|i| i.median),
        steal_share: if measured > 0.0 {
            steal / measured
        } else {
            0.0
        },
        counters,
        ratios: CellRatios::default(),
        rounds: per_second,
    }
}

/// A rate trial's exchanges per second.
fn per_second(trial: &Trial) -> f64 {
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    let completed = trial.completed as f64;
    if trial.elapsed_s > 0.0 {
        completed / trial.elapsed_s
    } else {
        0.0
    }
}

/// Fills in the ratios between the cells of one size.
pub(super) fn compare_subjects(cells: &mut [Cell]) {
    let ratios: Vec<CellRatios> = cells.iter().map(|cell| ratios_of(cell, cells)).collect();
    for (cell, ratios) in cells.iter_mut().zip(ratios) {
        cell.ratios = ratios;
    }
}

/// `cell`'s ratios to the other cells of its size (`cells`), but the one to the smallest size.
fn ratios_of(cell: &Cell, cells: &[Cell]) -> CellRatios {
    let find = |subject: Subject| {
        cells
            .iter()
            .find(|c| c.scenario == cell.scenario && c.subject == subject.name())
    };
    let best = [ProxyMode::Iptables, ProxyMode::Nftables]
        .into_iter()
        .filter_map(|mode| find(Subject::KubeProxy(mode)))
        .max_by(|a, b| median(a).total_cmp(&median(b)));
    let same_mode = SUBJECTS.iter().find_map(|&s| match s {
        Subject::Splitproxy(mode) if s.name() == cell.subject => find(Subject::KubeProxy(mode)),
        _ => None,
    });
    CellRatios {
        kube_proxy_same_mode: same_mode.and_then(|other| round_ratios(cell, other)),
        kube_proxy_best: best.and_then(|other| round_ratios(cell, other)),
        no_proxy: find(Subject::NoProxy).and_then(|o| round_ratios(cell, o)),
        no_proxy_conntrack: find(Subject::NoProxyConntrack).and_then(|o| round_ratios(cell, o)),
        smallest_size: None,
        connect_p99_to_kube_proxy_best: best.and_then(|other| {
            Some(cell.connect_us?.p99 / other.connect_us?.p99).filter(|r| r.is_finite())
        }),
    }
}

fn median(cell: &Cell) -> f64 {
    cell.per_second.map_or(0.0, |i| i.median)
}

/// The per-round ratios of `cell`'s rate to `other`'s, as a median with its interval.
fn round_ratios(cell: &Cell, other: &Cell) -> Option<Interval> {
    let ratios: Vec<f64> = cell
        .rounds
        .iter()
        .zip(&other.rounds)
        .filter(|(_, b)| **b > 0.0)
        .map(|(a, b)| a / b)
        .collect();
    Interval::of(&ratios)
}

/// Fills in each cell's ratio to the same subject and scenario at the smallest size.
pub(super) fn compare_sizes(sizes: &mut [Size]) {
    let Some(smallest) = sizes.iter().min_by_key(|s| s.services).cloned() else {
        return;
    };
    for size in sizes.iter_mut() {
        for cell in &mut size.cells {
            cell.ratios.smallest_size = smallest
                .cells
                .iter()
                .find(|c| c.scenario == cell.scenario && c.subject == cell.subject)
                .and_then(|base| Some(cell.per_second?.median / base.per_second?.median))
                .filter(|r| r.is_finite());
        }
    }
}

/// Each scenario's and subject's slopes over the sizes (none from a single size).
pub(super) fn slopes(sizes: &[Size]) -> Vec<Slope> {
    let Some(first) = sizes.first() else {
        return Vec::new();
    };
    if sizes.len() < 2 {
        return Vec::new();
    }
    first
        .cells
        .iter()
        .map(|cell| {
            let points = |value: fn(&Cell) -> Option<f64>| -> Vec<(f64, f64)> {
                sizes
                    .iter()
                    .filter_map(|size| {
                        let same = size
                            .cells
                            .iter()
                            .find(|c| c.scenario == cell.scenario && c.subject == cell.subject)?;
                        #[allow(clippy::cast_precision_loss)] // sizes far below 2^52
                        let thousands = size.services as f64 / 1000.0;
                        Some((thousands, value(same)?))
                    })
                    .collect()
            };
            Slope {
                scenario: cell.scenario,
                subject: cell.subject.clone(),
                connect_p50_us: least_squares(&points(|c| c.connect_us.map(|p| p.p50))),
                exchange_p50_us: least_squares(&points(|c| c.exchange_us.map(|p| p.p50))),
                cpu_us_per_exchange: least_squares(&points(|c| c.cpu_us_per_exchange)),
            }
        })
        .collect()
}

/// The slope of the least-squares line through `points`; `None` for fewer than two distinct x.
fn least_squares(points: &[(f64, f64)]) -> Option<f64> {
    #[allow(clippy::cast_precision_loss)] // a handful of points
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    (points.len() >= 2 && sxx > 0.0).then(|| sxy / sxx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell_with(subject: Subject, rounds: Vec<f64>) -> Cell {
        Cell {
            scenario: Scenario::ClusterIp,
            subject: subject.name(),
            valid: true,
            invalid_because: Vec::new(),
            connect_us: None,
            exchange_us: None,
            per_second: Interval::of(&rounds),
            cpu_us_per_exchange: None,
            steal_share: 0.0,
            counters: BTreeMap::new(),
            ratios: CellRatios::default(),
            rounds,
        }
    }

    #[test]
    fn ratios_pair_rounds_and_pick_kube_proxys_faster_mode() {
        let mut cells = vec![
            cell_with(
                Subject::KubeProxy(ProxyMode::Iptables),
                vec![100.0, 200.0, 100.0],
            ),
            cell_with(
                Subject::KubeProxy(ProxyMode::Nftables),
                vec![150.0, 150.0, 150.0],
            ),
            cell_with(
                Subject::Splitproxy(ProxyMode::Iptables),
                vec![110.0, 220.0, 90.0],
            ),
            cell_with(Subject::NoProxy, vec![300.0, 300.0, 300.0]),
        ];
        compare_subjects(&mut cells);
        let splitproxy = &cells[2].ratios;
        // Round by round: 1.1, 1.1, 0.9 against kube-proxy iptables.
        let same = splitproxy.kube_proxy_same_mode.expect("paired");
        assert!((same.median - 1.1).abs() < 1e-9 && (same.low - 0.9).abs() < 1e-9);
        // nftables (median 150) beats iptables (median 100) for kube-proxy here.
        let best = splitproxy.kube_proxy_best.expect("paired");
        assert!((best.median - 110.0 / 150.0).abs() < 1e-9);
        assert!(splitproxy.no_proxy_conntrack.is_none());
        let limit = splitproxy.no_proxy.expect("paired");
        assert!((limit.median - 110.0 / 300.0).abs() < 1e-9);
        assert!(cells[0].ratios.kube_proxy_same_mode.is_none());
    }

    #[test]
    fn a_trial_with_errors_or_moved_counters_makes_its_cell_invalid() {
        let trial = |errors: &[(&str, u64)]| Trial {
            completed: 10,
            errors: errors.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            elapsed_s: 1.0,
            connect_us: vec![50.0; 10],
            exchange_us: vec![80.0; 10],
            machine_busy_us: 1_000.0,
            machine_steal_us: 0.0,
        };
        let clean = Round {
            latency: trial(&[]),
            rate: trial(&[]),
            counters: BTreeMap::from([("server ListenOverflows".to_owned(), 0)]),
            invalid_because: Vec::new(),
        };
        let good = cell(
            Scenario::ClusterIp,
            Subject::NoProxy,
            std::slice::from_ref(&clean),
        );
        assert!(good.valid);
        assert_eq!(good.per_second.map(|i| i.median), Some(10.0));
        assert_eq!(good.cpu_us_per_exchange, Some(100.0));
        assert_eq!(good.connect_us.map(|p| p.p99), Some(50.0));
        let broken = Round {
            invalid_because: vec!["rate trial: 1 × EADDRNOTAVAIL".to_owned()],
            rate: trial(&[("EADDRNOTAVAIL", 1)]),
            ..clean
        };
        assert!(!cell(Scenario::ClusterIp, Subject::NoProxy, &[broken]).valid);
    }

    #[test]
    fn a_slope_is_the_cost_of_each_thousand_services() {
        // 25 µs more per 1,000 Services, exactly.
        let points = [(0.001, 30.025), (1.0, 55.0), (10.0, 280.0)];
        let slope = least_squares(&points).expect("three sizes");
        assert!((slope - 25.0).abs() < 1e-9, "{slope}");
        assert_eq!(least_squares(&[(1.0, 5.0)]), None);
        assert_eq!(least_squares(&[(1.0, 5.0), (1.0, 7.0)]), None);
    }
}
