//! What B3 reads from the API server's own `/metrics`: watches it holds, bytes and events of watch
//! events it sent (per resource), bytes of LIST responses, and its CPU time. Watch events are
//! counted per watch connection, each with the bytes encoded for that client (JSON or protobuf,
//! as it asked), before TLS and HTTP/2 framing.

use crate::prometheus::{sum, sum_by};
use serde::Serialize;
use std::collections::BTreeMap;

/// Counters and gauges of the API server at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Long-running WATCH requests being served, per resource (`apiserver_longrunning_requests`).
    pub watches: BTreeMap<String, f64>,
    /// Bytes of watch events sent so far, per resource (`apiserver_watch_events_sizes`).
    pub watch_bytes: BTreeMap<String, f64>,
    /// Watch events sent so far, per resource (`apiserver_watch_events_total`).
    pub watch_events: BTreeMap<String, f64>,
    /// Bytes of LIST responses so far, all resources (`apiserver_response_sizes`).
    pub list_bytes: f64,
    /// CPU seconds the API server process has used (`process_cpu_seconds_total`).
    pub cpu_s: f64,
}

/// How the counters of a [`Snapshot`] grew between two moments.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Growth {
    /// Bytes of watch events sent, per resource.
    pub watch_bytes: BTreeMap<String, f64>,
    /// Watch events sent, per resource.
    pub watch_events: BTreeMap<String, f64>,
    /// Bytes of LIST responses.
    pub list_bytes: f64,
    /// API-server CPU seconds.
    pub cpu_s: f64,
}

impl Snapshot {
    /// Reads a snapshot from the API server's metrics text.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        Self {
            watches: sum_by(
                text,
                "apiserver_longrunning_requests",
                &[("verb", "WATCH")],
                "resource",
            ),
            watch_bytes: sum_by(text, "apiserver_watch_events_sizes_sum", &[], "resource"),
            watch_events: sum_by(text, "apiserver_watch_events_total", &[], "resource"),
            list_bytes: sum(text, "apiserver_response_sizes_sum", &[("verb", "LIST")]),
            cpu_s: sum(text, "process_cpu_seconds_total", &[]),
        }
    }

    /// Every WATCH request being served.
    #[must_use]
    pub fn total_watches(&self) -> f64 {
        self.watches.values().sum()
    }

    /// How the counters grew from `earlier` to this snapshot.
    #[must_use]
    pub fn since(&self, earlier: &Self) -> Growth {
        Growth {
            watch_bytes: growth(&self.watch_bytes, &earlier.watch_bytes),
            watch_events: growth(&self.watch_events, &earlier.watch_events),
            list_bytes: self.list_bytes - earlier.list_bytes,
            cpu_s: self.cpu_s - earlier.cpu_s,
        }
    }
}

/// The resources kube-proxy watches (and so splitproxy's controller, among others); bytes of
/// other resources' watch events (leases, service accounts) are the API server's own business.
pub const PROXY_RESOURCES: [&str; 4] = ["endpointslices", "services", "nodes", "servicecidrs"];

impl Growth {
    /// Bytes of watch events of the [`PROXY_RESOURCES`].
    #[must_use]
    pub fn proxy_watch_bytes(&self) -> f64 {
        PROXY_RESOURCES
            .iter()
            .filter_map(|resource| self.watch_bytes.get(*resource))
            .sum()
    }

    /// Watch events of the [`PROXY_RESOURCES`].
    #[must_use]
    pub fn proxy_watch_events(&self) -> f64 {
        PROXY_RESOURCES
            .iter()
            .filter_map(|resource| self.watch_events.get(*resource))
            .sum()
    }

    /// Bytes of the [`PROXY_RESOURCES`]' watch events and of every LIST response: what clients
    /// syncing from scratch were sent, whether they list then watch or stream the list as watch
    /// events.
    #[must_use]
    pub fn sync_bytes(&self) -> f64 {
        self.proxy_watch_bytes() + self.list_bytes
    }
}

/// Per key, `later - earlier` (a key new in `later` grew from zero); keys that did not grow are
/// left out.
fn growth(later: &BTreeMap<String, f64>, earlier: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    later
        .iter()
        .map(|(key, value)| {
            (
                key.clone(),
                value - earlier.get(key).copied().unwrap_or(0.0),
            )
        })
        .filter(|(_, grown)| *grown > 0.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(slice_bytes: u32, slice_watches: u32, cpu: f64) -> String {
        format!(
            r#"apiserver_longrunning_requests{{group="discovery.k8s.io",resource="endpointslices",scope="cluster",subresource="",verb="WATCH",version="v1"}} {slice_watches}
apiserver_longrunning_requests{{group="",resource="services",scope="cluster",subresource="",verb="WATCH",version="v1"}} 2
apiserver_watch_events_sizes_sum{{group="discovery.k8s.io",resource="endpointslices",version="v1"}} {slice_bytes}
apiserver_watch_events_sizes_sum{{group="",resource="nodes",version="v1"}} 500
apiserver_watch_events_sizes_sum{{group="coordination.k8s.io",resource="leases",version="v1"}} {slice_bytes}
apiserver_response_sizes_sum{{component="apiserver",group="",resource="services",scope="cluster",subresource="",verb="LIST",version="v1"}} 1000
apiserver_response_sizes_sum{{component="apiserver",group="",resource="services",scope="cluster",subresource="",verb="GET",version="v1"}} 7
process_cpu_seconds_total {cpu}
"#
        )
    }

    #[test]
    fn watches_are_counted_per_resource() {
        let snapshot = Snapshot::parse(&metrics(0, 5, 1.0));
        assert_eq!(snapshot.watches.get("endpointslices"), Some(&5.0));
        assert!((snapshot.total_watches() - 7.0).abs() < f64::EPSILON);
        assert!((snapshot.list_bytes - 1000.0).abs() < f64::EPSILON);
    }

    #[test]
    fn growth_keeps_only_what_changed() {
        let before = Snapshot::parse(&metrics(1_000, 5, 1.0));
        let after = Snapshot::parse(&metrics(4_000, 5, 3.5));
        let grown = after.since(&before);
        assert_eq!(
            grown.watch_bytes,
            BTreeMap::from([
                ("endpointslices".to_owned(), 3_000.0),
                ("leases".to_owned(), 3_000.0)
            ])
        );
        // Leases are not a proxy's business.
        assert!((grown.proxy_watch_bytes() - 3_000.0).abs() < f64::EPSILON);
        assert!((grown.cpu_s - 2.5).abs() < f64::EPSILON);
        assert!(grown.list_bytes.abs() < f64::EPSILON);
    }
}
