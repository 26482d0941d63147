//! The figures of a window of the run: CPU of each component (from /proc), memory at the
//! window's end, and what kube-apiserver (its `/metrics`) and etcd (its `/metrics`) counted.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use testkit::real::cpu_group::CpuGroup;
use testkit::real::metrics::{self, RequestCounts};
use testkit::real::usage::{ConnectionTable, cores, cpu_ticks, rss_kib};

use crate::FleetError;
use crate::agents::Agents;
use crate::cluster::Cluster;

/// The processes whose cost is measured.
#[derive(Debug, Clone)]
pub struct Processes {
    pub apiserver: u32,
    pub etcd: u32,
    pub manager: u32,
    pub sidecars: Vec<u32>,
    /// The pods' exec agents (`--exec agent`), standing for their game containers.
    pub agents: Vec<u32>,
    /// The agents' CPU with their commands'.
    pub agents_cpu: Option<Arc<CpuGroup>>,
}

impl Processes {
    pub fn of(cluster: &Cluster, sidecars: Vec<u32>, agents: &Agents) -> Processes {
        let pids = cluster.cp.pids();
        Processes {
            apiserver: pids.apiserver,
            etcd: pids.etcd,
            manager: cluster.manager_pid(),
            sidecars,
            agents: agents.pids(),
            agents_cpu: agents.cpu(),
        }
    }
}

/// One reading, taken at a window's start and end.
#[derive(Debug)]
pub struct Sample {
    at: Instant,
    apiserver: u64,
    etcd: u64,
    manager: u64,
    sidecars: u64,
    /// Nanoseconds.
    agents: u64,
    metrics: String,
    etcd_metrics: String,
}

impl Sample {
    /// The apiserver's `/metrics` text at this reading.
    pub fn metrics(&self) -> &str {
        &self.metrics
    }
}

pub async fn sample(cluster: &Cluster, processes: &Processes) -> Result<Sample, FleetError> {
    let metrics = cluster.cp.metrics().await?;
    let etcd: SocketAddr = cluster
        .cp
        .etcd_url()
        .trim_start_matches("http://")
        .parse()
        .map_err(|e| FleetError::Setup(format!("etcd url: {e}")))?;
    let (_, etcd_metrics) = crate::http::get(etcd, "/metrics").await?;
    Ok(Sample {
        at: Instant::now(),
        apiserver: cpu_ticks(processes.apiserver),
        etcd: cpu_ticks(processes.etcd),
        manager: cpu_ticks(processes.manager),
        sidecars: processes.sidecars.iter().map(|&p| cpu_ticks(p)).sum(),
        agents: processes.agents_cpu.as_ref().map_or(0, |g| g.usage_ns()),
        metrics,
        etcd_metrics,
    })
}

/// A window in which the run only waits for `length`: the cost of what is standing, with the
/// apiserver's [`Footprint`] at its end.
pub async fn quiet(
    cluster: &Cluster,
    processes: &Processes,
    length: std::time::Duration,
    pods: usize,
) -> Result<Window, FleetError> {
    let before = sample(cluster, processes).await?;
    tokio::time::sleep(length).await;
    let after = sample(cluster, processes).await?;
    let mut window = window(&before, &after, processes, pods);
    window.footprint = Some(footprint(cluster, processes).await?);
    Ok(window)
}

/// What the apiserver holds at one moment. Taken after a window's last reading: the forced
/// collection it asks for costs the apiserver CPU that is not the window's.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Footprint {
    /// Established connections on the apiserver's serving port (clients', not its own to etcd).
    pub apiserver_connections: usize,
    /// Its Go heap right after a collection (`/debug/pprof/heap?gc=1`): what it holds alive,
    /// without the garbage RSS and `heap_inuse` carry until the next collection.
    pub apiserver_live_heap_mib: f64,
    pub apiserver_rss_mib: f64,
    /// Connections to the apiserver the sidecars' processes hold: theirs alone, where the
    /// apiserver's count also holds the bench's and the manager's.
    pub sidecar_connections: usize,
}

/// The apiserver's growth per sidecar from a run without them to one with them: the names
/// are those of `bench_fleet`'s JSON line.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct PerSidecar {
    pub apiserver_connections_per_sidecar: f64,
    pub apiserver_live_heap_mib_per_sidecar: f64,
    pub apiserver_rss_mib_per_sidecar: f64,
    /// [`Footprint::sidecar_connections`] per sidecar.
    pub sidecar_connections_per_sidecar: f64,
}

impl Footprint {
    /// This footprint's growth over `base` (the same pods without sidecars), per sidecar.
    pub fn over(&self, base: &Footprint, sidecars: usize) -> PerSidecar {
        let n = sidecars.max(1) as f64;
        PerSidecar {
            apiserver_connections_per_sidecar: (self.apiserver_connections as f64
                - base.apiserver_connections as f64)
                / n,
            apiserver_live_heap_mib_per_sidecar: (self.apiserver_live_heap_mib
                - base.apiserver_live_heap_mib)
                / n,
            apiserver_rss_mib_per_sidecar: (self.apiserver_rss_mib - base.apiserver_rss_mib) / n,
            sidecar_connections_per_sidecar: self.sidecar_connections as f64 / n,
        }
    }
}

pub async fn footprint(cluster: &Cluster, processes: &Processes) -> Result<Footprint, FleetError> {
    let serving = cluster.cp.address();
    let live_heap = cluster.cp.live_heap_bytes().await?;
    // Both ends counted from one reading of the kernel's table: connections close by the
    // second while the fleet's ~200 processes are looked at one by one.
    let table = ConnectionTable::read();
    let to_apiserver = |pid: &u32| {
        table
            .held_by(*pid)
            .iter()
            .filter(|c| c.remote.port() == serving.port())
            .count()
    };
    Ok(Footprint {
        apiserver_connections: table
            .held_by(processes.apiserver)
            .iter()
            .filter(|c| c.local.port() == serving.port())
            .count(),
        apiserver_live_heap_mib: live_heap as f64 / 1024.0 / 1024.0,
        apiserver_rss_mib: mib(rss_kib(processes.apiserver)),
        sidecar_connections: processes.sidecars.iter().map(to_apiserver).sum(),
    })
}

/// A window's figures.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Window {
    pub seconds: f64,
    pub apiserver_cpu_cores: f64,
    pub apiserver_rss_mib: f64,
    /// The apiserver's Go heap in use at the window's end (its `go_memstats_heap_inuse_bytes`):
    /// steadier than RSS, which the Go runtime returns to the system only slowly.
    pub apiserver_heap_inuse_mib: f64,
    /// Goroutines the apiserver runs at the window's end (each connection and watch holds some).
    pub apiserver_goroutines: f64,
    /// File descriptors the apiserver holds at the window's end (mostly connections).
    pub apiserver_open_files: usize,
    pub etcd_cpu_cores: f64,
    pub etcd_rss_mib: f64,
    pub etcd_db_mib: f64,
    pub manager_cpu_cores: f64,
    pub manager_rss_mib: f64,
    /// All sidecars together.
    pub sidecars_cpu_cores: f64,
    pub sidecar_rss_mib_per_pod: f64,
    /// All exec agents together (`--exec agent`), with the probes' commands they ran.
    pub agents_cpu_cores: f64,
    pub agent_rss_mib_per_pod: f64,
    /// Watches of pods the apiserver is serving at the window's end.
    pub pod_watchers: f64,
    /// `VERB resource[/subresource]` → requests per second over the window.
    pub requests_per_second: BTreeMap<String, f64>,
    pub patch_status_p99_ms: Option<f64>,
    /// The apiserver's [`Footprint`] at the window's end, where the run took it.
    pub footprint: Option<Footprint>,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

pub fn window(before: &Sample, after: &Sample, processes: &Processes, pods: usize) -> Window {
    let seconds = after.at.duration_since(before.at).as_secs_f64();
    let counts = |m: &str| -> RequestCounts { metrics::request_counts(m) };
    let delta = metrics::request_delta(&counts(&before.metrics), &counts(&after.metrics));
    let requests_per_second = delta
        .into_iter()
        .map(|((verb, resource, sub), n)| {
            let key = if sub.is_empty() {
                format!("{verb} {resource}")
            } else {
                format!("{verb} {resource}/{sub}")
            };
            (key, n as f64 / seconds)
        })
        .collect();
    let buckets = |m: &str| metrics::duration_buckets(m, "PATCH", "pods", "status");
    let patch_buckets = metrics::bucket_delta(&buckets(&before.metrics), &buckets(&after.metrics));
    let sidecar_rss: u64 = processes.sidecars.iter().map(|&p| rss_kib(p)).sum();
    Window {
        seconds,
        apiserver_cpu_cores: cores(before.apiserver, after.apiserver, seconds),
        apiserver_rss_mib: mib(rss_kib(processes.apiserver)),
        apiserver_heap_inuse_mib: metrics::sum(&after.metrics, "go_memstats_heap_inuse_bytes", &[])
            / 1024.0
            / 1024.0,
        apiserver_goroutines: metrics::sum(&after.metrics, "go_goroutines", &[]),
        apiserver_open_files: std::fs::read_dir(format!("/proc/{}/fd", processes.apiserver))
            .map_or(0, Iterator::count),
        etcd_cpu_cores: cores(before.etcd, after.etcd, seconds),
        etcd_rss_mib: mib(rss_kib(processes.etcd)),
        etcd_db_mib: metrics::sum(&after.etcd_metrics, "etcd_mvcc_db_total_size_in_bytes", &[])
            / 1024.0
            / 1024.0,
        manager_cpu_cores: cores(before.manager, after.manager, seconds),
        manager_rss_mib: mib(rss_kib(processes.manager)),
        sidecars_cpu_cores: cores(before.sidecars, after.sidecars, seconds),
        sidecar_rss_mib_per_pod: if pods == 0 {
            0.0
        } else {
            mib(sidecar_rss) / pods as f64
        },
        agents_cpu_cores: after.agents.saturating_sub(before.agents) as f64 / 1e9 / seconds,
        agent_rss_mib_per_pod: if processes.agents.is_empty() {
            0.0
        } else {
            mib(processes.agents.iter().map(|&p| rss_kib(p)).sum()) / processes.agents.len() as f64
        },
        pod_watchers: metrics::sum(
            &after.metrics,
            "apiserver_longrunning_requests",
            &[("verb", "WATCH"), ("resource", "pods"), ("subresource", "")],
        ),
        requests_per_second,
        patch_status_p99_ms: metrics::quantile(&patch_buckets, 0.99).map(|s| s * 1000.0),
        footprint: None,
    }
}
