//! Latency summaries: nearest-rank percentiles over the measured samples.

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
}
