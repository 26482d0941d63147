//! The bench's result: one JSON object (its last line of output) and a readable summary.

use crate::cluster::ManagerKind;
use crate::measure::{PerSidecar, Window};
use crate::outage::OutageReport;

/// Where the sidecars read their probes.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// A watch on the pod (`--source api`).
    Api,
    /// The downward-API annotations file (`--source file`).
    File,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub pods: usize,
    pub source: Source,
    pub manager: ManagerKind,
    pub sidecars_per_process: usize,
    pub event_burst: u32,
    pub flip_percent: f64,
    pub flips: usize,
    /// Flips whose result never reached their pod (marker not shown and condition not
    /// written by the end of the drain), plus `wrong_at_end`. Records before 2026-11-28
    /// counted `unmarked_at_end` here too (their `lost_was` keeps that figure).
    pub lost: usize,
    /// Flips whose condition was written but whose marker had not shown by the end of the
    /// drain: late, not lost.
    pub unmarked_at_end: usize,
    /// Pods without a lost flip left showing a state their target does not have.
    pub wrong_at_end: usize,
    /// Pods whose flipped condition at the end is not their target's state: a lost transition
    /// (whatever the marker shows).
    pub conditions_wrong_at_end: usize,
    /// Where the exec probe ran.
    pub exec: crate::agents::ExecPath,
    /// Pods whose exec probe's condition (which stays up) is not True at the end.
    pub exec_not_true_at_end: usize,
    /// The agents' CPU with their commands' per exec attempt in the idle window (`--exec
    /// agent`): what the exec path costs in the pods, the sidecars' share aside.
    pub exec_agent_ms_per_attempt: Option<f64>,
    /// From a flip of the target to its status patch answered (probe period, probe, coalesce
    /// window, patch).
    pub condition_latency_p50_ms: Option<f64>,
    pub condition_latency_p99_ms: Option<f64>,
    pub marker_latency_p50_ms: Option<f64>,
    pub marker_latency_p99_ms: Option<f64>,
    pub marker_latency_max_ms: Option<f64>,
    pub status_patches_per_flip: f64,
    pub status_patches_per_flip_max: usize,
    pub marker_writes_per_flip: f64,
    pub marker_writes_per_flip_max: usize,
    /// From starting the sidecars to every pod showing its condition and marker.
    pub all_marked_seconds: f64,
    /// From starting the sidecars to every pod having every condition.
    pub startup: Window,
    /// The sidecars' status patches in the start-up window, against the transitions they
    /// carried.
    pub startup_status_patches: crate::audit::StatusPatches,
    /// The sidecars' own requests answered in the start-up window (`verb resource[/sub]`, any
    /// answer), from the audit log: a list of one named pod is `list pods` here, where the
    /// apiserver's metrics count it as `GET pods`.
    pub startup_sidecar_requests: std::collections::BTreeMap<String, usize>,
    /// The flipping window's figures, flattened for the headline.
    pub apiserver_cpu_cores: f64,
    pub apiserver_rss_mib: f64,
    pub manager_cpu_cores: f64,
    pub manager_rss_mib: f64,
    /// The control plane, the manager and the PodProbeMarker, before any pod.
    pub empty: Window,
    /// The pods and the manager without sidecars.
    pub baseline: Window,
    /// Every sidecar running, nothing flipping.
    pub idle: Window,
    /// The sidecars' requests answered in the idle window (`verb resource[/subresource]`).
    pub idle_sidecar_requests: std::collections::BTreeMap<String, usize>,
    /// Up to the outage when there is one.
    pub flipping: Window,
    /// What the sidecars cost the apiserver at the flipping window's end, over the baseline
    /// (none with an outage).
    #[serde(flatten)]
    pub flipping_per_sidecar: Option<PerSidecar>,
    /// The same at the idle window's end.
    pub idle_per_sidecar: Option<PerSidecar>,
    pub outage: Option<OutageReport>,
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.0} ms"))
}

/// `q` (0..1) of `values` by nearest rank; `None` when empty.
pub fn percentile(values: &mut [f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    Some(values[rank - 1])
}

/// The apiserver's growth from `base` to `to`, per pod, as a phrase.
fn per_pod(to: &Window, base: &Window, pods: usize) -> String {
    let n = pods.max(1) as f64;
    format!(
        "heap {:.3} MiB, RSS {:.3} MiB, {:.2} goroutines, {:.2} fds",
        (to.apiserver_heap_inuse_mib - base.apiserver_heap_inuse_mib) / n,
        (to.apiserver_rss_mib - base.apiserver_rss_mib) / n,
        (to.apiserver_goroutines - base.apiserver_goroutines) / n,
        (to.apiserver_open_files as f64 - base.apiserver_open_files as f64) / n,
    )
}

impl Report {
    /// What an idle pod with its sidecar costs the apiserver over the empty cluster, and what
    /// its sidecar alone costs over the pods without sidecars.
    fn idle_cost(&self) -> String {
        format!(
            "apiserver per idle pod over the empty cluster: {}; of which its sidecar: {}; \
             condition after a flip p50 {} p99 {}; sidecars' requests while idle: {:?}\n",
            per_pod(&self.idle, &self.empty, self.pods),
            per_pod(&self.idle, &self.baseline, self.pods),
            ms(self.condition_latency_p50_ms),
            ms(self.condition_latency_p99_ms),
            self.idle_sidecar_requests,
        )
    }

    /// A few lines for a person; the JSON line follows it.
    pub fn summary(&self) -> String {
        let per_1000 = |cores: f64| cores * 1000.0 / self.pods.max(1) as f64;
        let mut out = format!(
            "{} pods, source {:?}, manager {:?}: {} flips, {} lost, {} not marked by the end; \
             marker p50 {} p99 {}; \
             {:.2} status patches and {:.2} marker writes per flip; all marked in {:.1} s\n",
            self.pods,
            self.source,
            self.manager,
            self.flips,
            self.lost,
            self.unmarked_at_end,
            ms(self.marker_latency_p50_ms),
            ms(self.marker_latency_p99_ms),
            self.status_patches_per_flip,
            self.marker_writes_per_flip,
            self.all_marked_seconds,
        );
        out.push_str(&format!(
            "{:<9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>10} {:>9} {:>9} {:>8}\n",
            "window",
            "api cores",
            "api MiB",
            "etcd",
            "etcd MiB",
            "mgr",
            "mgr MiB",
            "sidecars",
            "per 1000",
            "watchers",
            "req/s"
        ));
        for (name, w) in [
            ("empty", &self.empty),
            ("baseline", &self.baseline),
            ("start-up", &self.startup),
            ("idle", &self.idle),
            ("flipping", &self.flipping),
        ] {
            let requests: f64 = w.requests_per_second.values().sum();
            out.push_str(&format!(
                "{name:<9} {:>9.3} {:>9.0} {:>8.3} {:>8.1} {:>8.3} {:>9.1} {:>10.3} {:>9.3} {:>9.0} {:>8.1}\n",
                w.apiserver_cpu_cores,
                w.apiserver_rss_mib,
                w.etcd_cpu_cores,
                w.etcd_db_mib,
                w.manager_cpu_cores,
                w.manager_rss_mib,
                w.sidecars_cpu_cores,
                per_1000(w.sidecars_cpu_cores),
                w.pod_watchers,
                requests,
            ));
        }
        out.push_str(&self.idle_cost());
        out.push_str(&format!(
            "exec probe ({:?}): {} pods not True at the end",
            self.exec, self.exec_not_true_at_end
        ));
        if self.exec == crate::agents::ExecPath::Agent {
            out.push_str(&format!(
                "; agents with their commands {:.3} cores idle, {:.3} flipping ({} per attempt); \
                 {:.2} MiB RSS per agent",
                self.idle.agents_cpu_cores,
                self.flipping.agents_cpu_cores,
                self.exec_agent_ms_per_attempt
                    .map_or("-".to_owned(), |v| format!("{v:.2} ms")),
                self.flipping.agent_rss_mib_per_pod,
            ));
        }
        out.push('\n');
        for (name, per) in [
            ("idle", &self.idle_per_sidecar),
            ("flipping", &self.flipping_per_sidecar),
        ] {
            if let Some(p) = per {
                out.push_str(&format!(
                    "apiserver per sidecar at the {name} window's end, over the pods without \
                     sidecars: {:.3} connections ({:.3} held by the sidecars), live heap {:.3} \
                     MiB, RSS {:.3} MiB\n",
                    p.apiserver_connections_per_sidecar,
                    p.sidecar_connections_per_sidecar,
                    p.apiserver_live_heap_mib_per_sidecar,
                    p.apiserver_rss_mib_per_sidecar,
                ));
            }
        }
        if let Some(o) = &self.outage {
            let requests: f64 = o.after_recovery.requests_per_second.values().sum();
            out.push_str(&format!(
                "outage ({:?}) {:.1} s: {} conditions wrong at the end; {} flips pending at recovery, {} never delivered, delivered after ready p50 {} p99 {} max {}; every pod watch back {}; minute after: apiserver {:.3} cores, {:.0} req/s, {:.0} answered 429\n",
                o.fault,
                o.outage_seconds,
                self.conditions_wrong_at_end,
                o.pending_at_recovery,
                o.undelivered,
                ms(o.delivery_p50_ms),
                ms(o.delivery_p99_ms),
                ms(o.delivery_max_ms),
                o.watches_back_seconds.map_or("not within the window".to_owned(), |s| format!("{s:.1} s after ready")),
                o.after_recovery.apiserver_cpu_cores,
                requests,
                o.throttled_after_recovery,
            ));
            for (window, b) in [
                ("before the outage", &o.bystander_before),
                ("in the minute after", &o.bystander_after_recovery),
            ] {
                out.push_str(&format!(
                    "another workload's GET /version {window}: {} requests, p50 {} p99 {} max {}, {} answered 429, {} failed\n",
                    b.requests,
                    ms(b.p50_ms),
                    ms(b.p99_ms),
                    ms(b.max_ms),
                    b.throttled,
                    b.failed,
                ));
            }
        }
        let sp = &self.startup_status_patches;
        let per_pod = |n: usize| n as f64 / self.pods.max(1) as f64;
        out.push_str(&format!(
            "start-up status patches per pod: {:.2} ({:.2} carrying {:.2} transitions; \
             {:.2} beyond them: {:.2} refused, {:.2} of those 429)\n",
            per_pod(sp.patches),
            per_pod(sp.carrying_a_transition),
            per_pod(sp.transitions),
            per_pod(sp.beyond_transitions()),
            per_pod(sp.refused),
            per_pod(sp.throttled),
        ));
        out.push_str("the sidecars' requests per pod during start-up (audit log):");
        for (key, count) in &self.startup_sidecar_requests {
            out.push_str(&format!(" {key} {:.2};", per_pod(*count)));
        }
        out.push_str("\nrequests per pod during start-up (apiserver metrics, every client):");
        for (key, rate) in &self.startup.requests_per_second {
            let per_pod = rate * self.startup.seconds / self.pods.max(1) as f64;
            if per_pod >= 0.01 {
                out.push_str(&format!(" {key} {per_pod:.2};"));
            }
        }
        out.push_str("\nrequests/s while flipping:");
        for (key, rate) in &self.flipping.requests_per_second {
            if *rate >= 0.05 {
                out.push_str(&format!(" {key} {rate:.1};"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_pod_growth_divides_the_difference_by_the_pods() {
        let base = Window {
            apiserver_heap_inuse_mib: 100.0,
            apiserver_rss_mib: 200.0,
            apiserver_goroutines: 2_000.0,
            apiserver_open_files: 90,
            ..Window::default()
        };
        let idle = Window {
            apiserver_heap_inuse_mib: 300.0,
            apiserver_rss_mib: 450.0,
            apiserver_goroutines: 5_000.0,
            apiserver_open_files: 1_090,
            ..Window::default()
        };
        assert_eq!(
            per_pod(&idle, &base, 1_000),
            "heap 0.200 MiB, RSS 0.250 MiB, 3.00 goroutines, 1.00 fds"
        );
    }

    #[test]
    fn nearest_rank_percentiles() {
        let mut v = vec![5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(percentile(&mut v, 0.5), Some(3.0));
        assert_eq!(percentile(&mut v, 0.99), Some(5.0));
        assert_eq!(percentile(&mut v, 0.0), Some(1.0));
        assert_eq!(percentile(&mut [], 0.5), None);
    }
}
