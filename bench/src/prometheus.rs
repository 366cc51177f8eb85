//! Reading Prometheus text exposition (the API server's and the controller's `/metrics`): sums
//! of the series of one metric that carry given labels, and totals per value of one label.

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
    fn a_missing_metric_sums_to_zero() {
        assert!(sum(TEXT, "apiserver_storage_objects", &[]).abs() < f64::EPSILON);
        assert!(sum_by(TEXT, "nothing", &[], "resource").is_empty());
    }

    #[test]
    fn a_metric_is_not_matched_by_its_prefix() {
        // `process_cpu_seconds` is not `process_cpu_seconds_total`.
        assert!(sum(TEXT, "process_cpu_seconds", &[]).abs() < f64::EPSILON);
    }
}
