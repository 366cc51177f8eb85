//! Latency summaries: nearest-rank percentiles over the measured samples; medians of a few
//! rounds with a distribution-free confidence interval.

use serde::Serialize;
use std::time::Duration;

/// p50, p99 and max of a set of latencies, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// How many samples.
    pub count: usize,
    /// The median.
    pub p50_ms: f64,
    /// The 99th percentile.
    pub p99_ms: f64,
    /// The largest.
    pub max_ms: f64,
}

/// The nearest-rank `q` quantile (0 < q <= 1) of `sorted`, which must be sorted ascending;
/// `None` when it is empty.
#[must_use]
pub fn quantile(sorted: &[Duration], q: f64) -> Option<Duration> {
    // The rank is at most len, so the float conversion round-trips.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied()
}

impl Summary {
    /// The summary of `samples` (any order); `None` when there are none.
    #[must_use]
    pub fn of(samples: &[Duration]) -> Option<Self> {
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        Some(Self {
            count: sorted.len(),
            p50_ms: ms(quantile(&sorted, 0.5)?),
            p99_ms: ms(quantile(&sorted, 0.99)?),
            max_ms: ms(*sorted.last()?),
        })
    }
}

/// The median of a few values (one per round) and a confidence interval for it from order
/// statistics, which assumes nothing of the values' distribution.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    /// The median (the mean of the middle two for an even count).
    pub median: f64,
    /// The interval's lower end.
    pub low: f64,
    /// Its upper end.
    pub high: f64,
    /// The probability that the interval holds the true median: at least 0.9 when the count
    /// allows (5 or more values), else the most that [min, max] gives (0.75 for 3 values).
    pub confidence: f64,
}

/// How sure an interval must be, when there are values enough.
const CONFIDENCE: f64 = 0.9;

impl Interval {
    /// The interval of `values` (any order, finite); `None` when there are none.
    #[must_use]
    pub fn of(values: &[f64]) -> Option<Self> {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = match n {
            0 => return None,
            n if n % 2 == 1 => sorted[n / 2],
            n => f64::midpoint(sorted[n / 2 - 1], sorted[n / 2]),
        };
        // [x(k), x(n+1-k)] holds the median with probability 1 - 2 P(Binomial(n, 1/2) < k):
        // the widest k (narrowest interval) still sure enough, or k = 1.
        let tail = |k: usize| -> f64 { (0..k).map(|i| binomial_half(n, i)).sum() };
        let k = (1..=n.div_ceil(2))
            .take_while(|&k| 1.0 - 2.0 * tail(k) >= CONFIDENCE)
            .last()
            .unwrap_or(1);
        Some(Self {
            median,
            low: sorted[k - 1],
            high: sorted[n - k],
            confidence: (1.0 - 2.0 * tail(k)).max(0.0),
        })
    }
}

/// P(Binomial(n, 1/2) = i).
fn binomial_half(n: usize, i: usize) -> f64 {
    // n is a round count (a few dozen at most): the product stays exact enough.
    #[allow(clippy::cast_precision_loss)]
    let choose = (0..i).fold(1.0, |c, j| c * (n - j) as f64 / (j + 1) as f64);
    #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
    let scale = 0.5_f64.powi(n as i32);
    choose * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: impl IntoIterator<Item = u64>) -> Vec<Duration> {
        values.into_iter().map(Duration::from_millis).collect()
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let samples = ms((1..=100).rev());
        let summary = Summary::of(&samples).expect("samples");
        assert_eq!(
            summary,
            Summary {
                count: 100,
                p50_ms: 50.0,
                p99_ms: 99.0,
                max_ms: 100.0
            }
        );
    }

    #[test]
    fn one_sample_is_every_percentile() {
        let summary = Summary::of(&ms([7])).expect("a sample");
        assert_eq!((summary.p50_ms, summary.p99_ms), (7.0, 7.0));
    }

    #[test]
    fn no_samples_have_no_summary() {
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn a_median_interval_is_as_sure_as_its_count_allows() {
        let three = Interval::of(&[3.0, 1.0, 2.0]).expect("values");
        assert_eq!((three.median, three.low, three.high), (2.0, 1.0, 3.0));
        assert!((three.confidence - 0.75).abs() < 1e-9);
        let five = Interval::of(&[5.0, 1.0, 4.0, 2.0, 3.0]).expect("values");
        assert_eq!((five.low, five.high), (1.0, 5.0));
        assert!((five.confidence - 0.9375).abs() < 1e-9);
        // Eleven values: [x(3), x(9)] holds the median with probability 0.935.
        let eleven: Vec<f64> = (1..=11).map(f64::from).collect();
        let interval = Interval::of(&eleven).expect("values");
        assert_eq!(
            (interval.median, interval.low, interval.high),
            (6.0, 3.0, 9.0)
        );
        assert!(interval.confidence >= CONFIDENCE);
        assert_eq!(Interval::of(&[1.0, 2.0]).map(|i| i.median), Some(1.5));
        assert_eq!(Interval::of(&[]), None);
    }
}
