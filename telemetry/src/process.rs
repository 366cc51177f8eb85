//! The `process_*` metrics every Go binary of Kubernetes exports (client_golang's process
//! collector), kube-proxy's among them, read from `/proc/self` at each scrape: CPU time, memory,
//! open and allowed file descriptors, start time. Dashboards and alerts on kube-proxy's process
//! (its memory, its CPU) then work unchanged.

use procfs::process::{LimitValue, Process};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

/// What `/proc/self` says now.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessStats {
    /// User and system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident set size, in bytes.
    pub resident_memory_bytes: f64,
    /// Virtual memory size, in bytes.
    pub virtual_memory_bytes: f64,
    /// Open file descriptors.
    pub open_fds: f64,
    /// The soft limit on open file descriptors; `None` when unlimited.
    pub max_fds: Option<f64>,
    /// When the process started, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

impl ProcessStats {
    /// The calling process's figures.
    ///
    /// # Errors
    ///
    /// When `/proc/self` cannot be read.
    pub fn of_self() -> procfs::ProcResult<Self> {
        let process = Process::myself()?;
        let stat = process.stat()?;
        let ticks = procfs::ticks_per_second() as f64;
        let max_fds = match process.limits()?.max_open_files.soft_limit {
            LimitValue::Value(limit) => Some(limit as f64),
            LimitValue::Unlimited => None,
        };
        Ok(Self {
            cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
            resident_memory_bytes: (stat.rss * procfs::page_size()) as f64,
            virtual_memory_bytes: stat.vsize as f64,
            open_fds: process.fd_count()? as f64,
            max_fds,
            start_time_seconds: procfs::boot_time_secs()? as f64 + stat.starttime as f64 / ticks,
        })
    }
}

/// Collects [`ProcessStats`] at each scrape; a scrape that cannot read `/proc/self` leaves them
/// out rather than failing the other metrics.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl ProcessCollector {
    /// Registers the collector in `registry`, whose metrics must have no prefix.
    pub fn register(registry: &mut Registry) {
        registry.register_collector(Box::new(Self));
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Ok(stats) = ProcessStats::of_self() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(stats.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        let mut gauges = vec![
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                stats.resident_memory_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                stats.virtual_memory_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                stats.open_fds,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                stats.start_time_seconds,
            ),
        ];
        if let Some(max_fds) = stats.max_fds {
            gauges.push((
                "process_max_fds",
                "Maximum number of open file descriptors.",
                max_fds,
            ));
        }
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_are_this_processs() {
        let stats = ProcessStats::of_self().expect("/proc/self is readable");
        assert!(stats.resident_memory_bytes > 0.0);
        assert!(stats.virtual_memory_bytes >= stats.resident_memory_bytes);
        assert!(stats.open_fds >= 3.0, "stdin, stdout and stderr at least");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        // Started before now, and not before the test binary could have been built.
        assert!(stats.start_time_seconds <= now + 1.0);
        assert!(stats.start_time_seconds > now - 86_400.0);
        // Burn some CPU: the counter moves.
        let before = stats.cpu_seconds;
        let mut x = 0u64;
        let started = std::time::Instant::now();
        while started.elapsed() < std::time::Duration::from_millis(300) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let after = ProcessStats::of_self().expect("readable").cpu_seconds;
        assert!(after > before, "{before} then {after}");
    }

    #[test]
    fn the_metrics_have_client_golangs_names() {
        let mut registry = Registry::default();
        ProcessCollector::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoded");
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_open_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(&format!("\n{name}")), "no {name}in\n{text}");
        }
    }
}
