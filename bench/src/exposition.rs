//! Reading a proxy's `/metrics` (Prometheus text exposition): a histogram's running sum and count,
//! and single samples, so one run can take deltas between two scrapes.

use serde::Serialize;

/// A histogram's `_sum` and `_count` at one scrape, over all its label sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Histogram {
    /// The sum of every observation (seconds, for the sync histograms).
    pub sum: f64,
    /// How many observations.
    pub count: f64,
}

impl Histogram {
    /// Histogram `name` in `text`; zero while it has no series yet (a histogram before its
    /// first observation may be left out).
    #[must_use]
    pub fn parse(text: &str, name: &str) -> Self {
        Self {
            sum: total(text, &format!("{name}_sum")),
            count: total(text, &format!("{name}_count")),
        }
    }

    /// How many observations were made since `earlier`.
    #[must_use]
    pub fn count_since(&self, earlier: &Self) -> f64 {
        self.count - earlier.count
    }

    /// The mean of the observations made since `earlier`; `None` when there were none.
    #[must_use]
    pub fn mean_since(&self, earlier: &Self) -> Option<f64> {
        let count = self.count_since(earlier);
        (count > 0.0).then(|| (self.sum - earlier.sum) / count)
    }
}

/// The value of series `series` (`name`, or `name{labels}` exactly as exposed); `None` when
/// absent or not a number.
#[must_use]
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// The sum of every series of metric `name` (with or without labels).
fn total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let value = if rest.starts_with('{') {
                rest.rsplit_once("} ")?.1
            } else {
                rest.strip_prefix(' ')?
            };
            value.trim().parse::<f64>().ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As kube-proxy v1.36 exposes it (buckets trimmed), with a longer name sharing the prefix.
    const BEFORE: &str = "\
# HELP kubeproxy_sync_proxy_rules_duration_seconds [ALPHA] SyncProxyRules latency in seconds
# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.001\"} 0
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} 1
kubeproxy_sync_proxy_rules_duration_seconds_sum 2.5
kubeproxy_sync_proxy_rules_duration_seconds_count 1
kubeproxy_sync_proxy_rules_duration_seconds_total_sum 99
kubeproxy_sync_proxy_rules_endpoint_changes_pending 3
";

    const AFTER: &str = "\
kubeproxy_sync_proxy_rules_duration_seconds_sum 2.8
kubeproxy_sync_proxy_rules_duration_seconds_count 3
kubeproxy_sync_proxy_rules_endpoint_changes_pending 0
";

    #[test]
    fn the_mean_since_a_scrape_covers_only_the_new_observations() {
        let name = "kubeproxy_sync_proxy_rules_duration_seconds";
        let before = Histogram::parse(BEFORE, name);
        assert_eq!(
            before,
            Histogram {
                sum: 2.5,
                count: 1.0
            }
        );
        let after = Histogram::parse(AFTER, name);
        assert_eq!(after.count_since(&before), 2.0);
        let mean = after.mean_since(&before).expect("two new observations");
        assert!((mean - 0.15).abs() < 1e-9, "{mean}");
        assert_eq!(after.mean_since(&after), None);
    }

    #[test]
    fn labelled_series_add_up_and_a_missing_histogram_is_empty() {
        let text =
            "x_sum{table=\"nat\"} 1.5\nx_sum{table=\"filter\"} 0.5\nx_count{table=\"nat\"} 2\n";
        assert_eq!(
            Histogram::parse(text, "x"),
            Histogram {
                sum: 2.0,
                count: 2.0
            }
        );
        assert_eq!(Histogram::parse(text, "y"), Histogram::default());
    }

    #[test]
    fn a_sample_is_found_by_its_exact_series() {
        let pending = "kubeproxy_sync_proxy_rules_endpoint_changes_pending";
        assert_eq!(sample(BEFORE, pending), Some(3.0));
        assert_eq!(sample(AFTER, pending), Some(0.0));
        assert_eq!(sample(BEFORE, "kubeproxy_sync_proxy_rules"), None);
    }
}
