//! Reading Prometheus text exposition (the API server's, the controller's and the proxies'
//! `/metrics`): sums of the series of one metric that carry given labels, totals per value of
//! one label, and a histogram's running sum and count, so one run can take deltas between two
//! scrapes.

use serde::Serialize;
use std::collections::BTreeMap;

/// One sample line split up: metric name, its labels as written, and the value.
struct Sample<'a> {
    name: &'a str,
    labels: &'a str,
    value: f64,
}

/// The sample on `line`; `None` for comments, blank lines and values that do not parse.
fn sample(line: &str) -> Option<Sample<'_>> {
    if line.starts_with('#') {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value = value.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((name, rest)) => (name, rest.strip_suffix('}')?),
        None => (series, ""),
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// The value of label `key` in `labels` (`a="x",b="y"`), if present. Label values of the
/// metrics read here hold no quotes or commas.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split(',').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"'))
    })
}

/// The samples of metric `name` whose labels include every (key, value) of `wanted`.
fn matching<'a>(
    text: &'a str,
    name: &'a str,
    wanted: &'a [(&str, &str)],
) -> impl Iterator<Item = Sample<'a>> {
    text.lines().filter_map(sample).filter(move |s| {
        s.name == name
            && wanted
                .iter()
                .all(|(key, value)| label(s.labels, key) == Some(*value))
    })
}

/// The sum of metric `name` over its series with all the `wanted` labels; zero when none.
#[must_use]
pub fn sum(text: &str, name: &str, wanted: &[(&str, &str)]) -> f64 {
    matching(text, name, wanted).map(|s| s.value).sum()
}

/// Metric `name` over its series with all the `wanted` labels, summed per value of label `by`
/// (series without it are left out).
#[must_use]
pub fn sum_by(text: &str, name: &str, wanted: &[(&str, &str)], by: &str) -> BTreeMap<String, f64> {
    let mut totals = BTreeMap::new();
    for s in matching(text, name, wanted) {
        if let Some(key) = label(s.labels, by) {
            *totals.entry(key.to_owned()).or_insert(0.0) += s.value;
        }
    }
    totals
}

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
        Self::parse_series(text, name, &[])
    }

    /// [`Histogram::parse`] over the series with every `wanted` label alone.
    #[must_use]
    pub fn parse_series(text: &str, name: &str, wanted: &[(&str, &str)]) -> Self {
        Self {
            sum: sum(text, &format!("{name}_sum"), wanted),
            count: sum(text, &format!("{name}_count"), wanted),
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

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP apiserver_longrunning_requests [STABLE] Gauge of all active long-running apiserver requests
# TYPE apiserver_longrunning_requests gauge
apiserver_longrunning_requests{component="apiserver",group="",resource="services",scope="cluster",subresource="",verb="WATCH",version="v1"} 3
apiserver_longrunning_requests{component="apiserver",group="discovery.k8s.io",resource="endpointslices",scope="cluster",subresource="",verb="WATCH",version="v1"} 4
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="namespace",subresource="log",verb="CONNECT",version="v1"} 1
apiserver_watch_events_sizes_sum{group="discovery.k8s.io",resource="endpointslices",version="v1"} 1.5e+06
apiserver_watch_events_sizes_sum{group="",resource="services",version="v1"} 250
process_cpu_seconds_total 12.5
"#;

    #[test]
    fn sums_only_the_series_with_every_wanted_label() {
        let watches = sum(TEXT, "apiserver_longrunning_requests", &[("verb", "WATCH")]);
        assert!((watches - 7.0).abs() < f64::EPSILON, "{watches}");
        let slices = sum(
            TEXT,
            "apiserver_longrunning_requests",
            &[("verb", "WATCH"), ("resource", "endpointslices")],
        );
        assert!((slices - 4.0).abs() < f64::EPSILON, "{slices}");
    }

    #[test]
    fn reads_unlabelled_series_and_exponents() {
        assert!((sum(TEXT, "process_cpu_seconds_total", &[]) - 12.5).abs() < f64::EPSILON);
        let bytes = sum_by(TEXT, "apiserver_watch_events_sizes_sum", &[], "resource");
        assert_eq!(bytes.get("endpointslices"), Some(&1.5e6));
        assert_eq!(bytes.get("services"), Some(&250.0));
    }

    #[test]
    fn a_histogram_is_read_over_all_its_series_or_one_familys() {
        // One sync of the agent, observed under both families' labels.
        let text = "\
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family=\"IPv4\"} 1.5
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family=\"IPv6\"} 1.5
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"} 1
";
        let name = "kubeproxy_sync_proxy_rules_duration_seconds";
        let all = Histogram::parse(text, name);
        assert_eq!((all.sum, all.count), (3.0, 2.0));
        let one = Histogram::parse_series(text, name, &[("ip_family", "IPv4")]);
        assert_eq!((one.sum, one.count), (1.5, 1.0));
    }

    #[test]
    fn a_missing_metric_sums_to_zero() {
        assert!(sum(TEXT, "apiserver_storage_objects", &[]).abs() < f64::EPSILON);
        assert!(sum_by(TEXT, "nothing", &[], "resource").is_empty());
    }

    #[test]
    fn a_metric_is_not_matched_by_its_prefix() {
        // `process_cpu_seconds` is not `process_cpu_seconds_total`.
        assert!(sum(TEXT, "process_cpu_seconds", &[]).abs() < f64::EPSILON);
    }

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
}
