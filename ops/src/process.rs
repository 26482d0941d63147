//! The process metrics every Prometheus client library exports (client_golang's names, so the
//! usual dashboards and alerts work unchanged) and the `<binary>_build_info` metric, for both
//! binaries.
//!
//! Values are read from `/proc/self` (through the `procfs` crate) on each scrape: nothing runs
//! between scrapes. A value that cannot be read (no `/proc`, a restricted `/proc`) is left out
//! of that scrape rather than reported as zero.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// Registers the `process_*` metrics (unprefixed, as every client library names them) on
/// `registry`, which must therefore be the unprefixed root registry.
pub fn register_process_metrics(registry: &mut Registry) {
    registry.register_collector(Box::new(ProcessCollector));
}

/// Registers `build_info{version="…"} 1` on `registry` (prefixed by the binary's own prefix,
/// e.g. `podprobe_build_info`), the series dashboards join on to show which version runs.
pub fn register_build_info(registry: &mut Registry, version: &'static str) {
    registry.register(
        "build",
        "The version of the running binary (always 1)",
        Info::new(vec![("version", version)]),
    );
}

#[derive(Debug)]
struct ProcessCollector;

/// One scrape's figures; `None` where `/proc` did not answer.
#[derive(Debug, Default, PartialEq)]
struct ProcessFigures {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<i64>,
    virtual_bytes: Option<i64>,
    start_time_seconds: Option<f64>,
    threads: Option<i64>,
    open_fds: Option<i64>,
    max_fds: Option<i64>,
}

impl ProcessFigures {
    fn read() -> Self {
        let Ok(me) = procfs::process::Process::myself() else {
            return Self::default();
        };
        let mut figures = Self::default();
        let ticks = procfs::ticks_per_second() as f64;
        if let Ok(stat) = me.stat() {
            figures.cpu_seconds = Some((stat.utime + stat.stime) as f64 / ticks);
            figures.resident_bytes = Some(stat.rss as i64 * procfs::page_size() as i64);
            figures.virtual_bytes = Some(stat.vsize as i64);
            figures.threads = Some(stat.num_threads);
            if let Ok(boot) = procfs::boot_time_secs() {
                figures.start_time_seconds = Some(boot as f64 + stat.starttime as f64 / ticks);
            }
        }
        figures.open_fds = me.fd_count().ok().map(|n| n as i64);
        figures.max_fds = me
            .limits()
            .ok()
            .and_then(|l| match l.max_open_files.soft_limit {
                procfs::process::LimitValue::Value(v) => Some(v as i64),
                procfs::process::LimitValue::Unlimited => None,
            });
        figures
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let figures = ProcessFigures::read();
        if let Some(v) = figures.cpu_seconds {
            let m = ConstCounter::new(v);
            m.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                m.metric_type(),
            )?)?;
        }
        let gauges: [(&str, &str, Option<i64>); 5] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                figures.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                figures.virtual_bytes,
            ),
            (
                "process_threads",
                "Number of OS threads in the process",
                figures.threads,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                figures.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                figures.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let m = ConstGauge::new(v);
                m.encode(encoder.encode_descriptor(name, help, None, m.metric_type())?)?;
            }
        }
        if let Some(v) = figures.start_time_seconds {
            let m = ConstGauge::new(v);
            m.encode(encoder.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds",
                None,
                m.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
    }

    #[test]
    fn process_metrics_describe_this_process() {
        let mut registry = Registry::default();
        register_process_metrics(&mut registry);
        // Work until the kernel has charged this process a clock tick (10 ms): the counter
        // must then read above zero. Bounded, so a counter that never moves fails the test.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut x = 0u64;
        while ProcessFigures::read().cpu_seconds.unwrap_or(0.0) == 0.0 {
            assert!(
                std::time::Instant::now() < deadline,
                "no CPU time charged in 30 s"
            );
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
        let text = exposition(&registry);

        assert!(value(&text, "process_cpu_seconds_total") > 0.0, "{text}");
        let rss = value(&text, "process_resident_memory_bytes");
        assert!(rss > 1_000_000.0, "resident {rss} bytes: {text}");
        assert!(
            value(&text, "process_virtual_memory_bytes") >= rss,
            "{text}"
        );
        assert!(value(&text, "process_threads") >= 1.0, "{text}");
        assert!(value(&text, "process_open_fds") >= 3.0, "{text}");
        assert!(value(&text, "process_max_fds") >= value(&text, "process_open_fds"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = value(&text, "process_start_time_seconds");
        // The test binary started within the last hour, not at the epoch nor in the future.
        assert!(
            started <= now + 1.0 && started > now - 3600.0,
            "{started} vs {now}"
        );
        assert!(
            text.contains("# TYPE process_cpu_seconds counter"),
            "{text}"
        );
    }

    #[test]
    fn build_info_carries_the_version_under_the_binary_prefix() {
        let mut registry = Registry::default();
        register_build_info(registry.sub_registry_with_prefix("podprobe"), "1.2.3");
        let text = exposition(&registry);
        assert!(
            text.contains("podprobe_build_info{version=\"1.2.3\"} 1"),
            "{text}"
        );
    }
}
