//! A fault in the middle of the flips: kube-apiserver killed and started again on
//! the same etcd (every connection refused, then reset), or etcd killed under a running
//! apiserver (which then answers with errors and timeouts). What is measured: when it came
//! back, how long until every pod watch was back, and what the minute after recovery cost.
//! Which flips were pending and when they were delivered comes from the audit log afterwards
//! ([`delivery`]).

use std::time::{Duration, Instant};

use jiff::Timestamp;
use testkit::real::metrics;

use crate::FleetError;
use crate::audit::FlipCost;
use crate::bystander::{Bystander, BystanderFigures};
use crate::cluster::Cluster;
use crate::measure::{self, Processes, Sample, Window};
use crate::report::percentile;

/// What goes down.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Fault {
    /// kube-apiserver killed (SIGKILL) and started again on the same port and etcd.
    Apiserver,
    /// etcd killed and started again on its data; the apiserver keeps running.
    Etcd,
}

/// When and for how long.
#[derive(Debug, Clone, Copy)]
pub struct OutagePlan {
    pub fault: Fault,
    /// From the first flip to the kill.
    pub after: Duration,
    /// From the kill to starting the process again.
    pub length: Duration,
    /// How long after recovery the load is measured and watches are waited for
    /// ([`RECOVERY_WINDOW`] in the bench).
    pub recovery_window: Duration,
}

/// The bench's recovery window: the minute after recovery.
pub const RECOVERY_WINDOW: Duration = Duration::from_secs(60);

/// An outage's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OutageReport {
    pub fault: Fault,
    pub down_at: Timestamp,
    /// When `/readyz` answered `ok` again.
    pub ready_at: Timestamp,
    /// From the kill to ready.
    pub outage_seconds: f64,
    /// Flips whose result was known before the apiserver was ready again and whose status
    /// patch had not been answered when it went down.
    pub pending_at_recovery: usize,
    /// From ready to the answer to each pending flip's status patch.
    pub delivery_p50_ms: Option<f64>,
    pub delivery_p99_ms: Option<f64>,
    pub delivery_max_ms: Option<f64>,
    /// Pending flips whose status patch never came.
    pub undelivered: usize,
    /// Pod watches the apiserver served just before the outage.
    pub pod_watchers_before: f64,
    /// From ready until it served as many pod watches again (`None`: not within the window).
    pub watches_back_seconds: Option<f64>,
    /// Requests answered 429 in the window after recovery.
    pub throttled_after_recovery: f64,
    /// Another workload's requests in the flipping window before the kill, and in the recovery
    /// window ([`crate::bystander`]).
    pub bystander_before: BystanderFigures,
    pub bystander_after_recovery: BystanderFigures,
    /// The recovery window from ready on.
    pub after_recovery: Window,
}

/// Brings the fault about after `plan.after`, restores it after `plan.length`, then measures
/// the recovery window. Returns the flipping window up to the kill and the report (delivery
/// figures are filled in by [`delivery`] once the audit log is read).
pub async fn inject(
    cluster: &mut Cluster,
    processes: &Processes,
    flips_started: &Sample,
    plan: OutagePlan,
    pods: usize,
) -> Result<(Window, OutageReport), FleetError> {
    let bystander = Bystander::start(&cluster.cp).await?;
    let asking = Instant::now();
    tokio::time::sleep(plan.after).await;
    let last = measure::sample(cluster, processes).await?;
    let flipping = measure::window(flips_started, &last, processes, pods);
    let down_at = Timestamp::now();
    let down = Instant::now();
    let bystander_before = bystander.figures(asking, down);
    match plan.fault {
        Fault::Apiserver => cluster.cp.kill_apiserver(),
        Fault::Etcd => cluster.cp.kill_etcd(),
    }
    eprintln!("fleet: {:?} killed", plan.fault);
    tokio::time::sleep(plan.length).await;
    match plan.fault {
        Fault::Apiserver => cluster.cp.start_apiserver_again().await?,
        Fault::Etcd => cluster.cp.start_etcd_again().await?,
    }
    let ready = Instant::now();
    let ready_at = Timestamp::now();
    eprintln!(
        "fleet: ready again {:.1?} after the kill",
        ready.duration_since(down)
    );
    // A restarted apiserver has a new pid and counts from zero.
    let processes = Processes {
        apiserver: cluster.cp.pids().apiserver,
        etcd: cluster.cp.pids().etcd,
        ..processes.clone()
    };
    let first = measure::sample(cluster, &processes).await?;
    let mut watches_back_seconds = None;
    while ready.elapsed() < plan.recovery_window {
        if watches_back_seconds.is_none() {
            let served = metrics::sum(
                &cluster.cp.metrics().await?,
                "apiserver_longrunning_requests",
                &[("verb", "WATCH"), ("resource", "pods"), ("subresource", "")],
            );
            if served >= flipping.pod_watchers {
                let back = ready.elapsed().as_secs_f64();
                watches_back_seconds = Some(back);
                eprintln!("fleet: every pod watch back {back:.1} s after ready");
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let bystander_after_recovery = bystander.figures(ready, Instant::now());
    drop(bystander);
    let end = measure::sample(cluster, &processes).await?;
    let after_recovery = measure::window(&first, &end, &processes, pods);
    let throttled =
        |s: &Sample| metrics::sum(s.metrics(), "apiserver_request_total", &[("code", "429")]);
    Ok((
        flipping.clone(),
        OutageReport {
            fault: plan.fault,
            down_at,
            ready_at,
            outage_seconds: ready.duration_since(down).as_secs_f64(),
            pending_at_recovery: 0,
            delivery_p50_ms: None,
            delivery_p99_ms: None,
            delivery_max_ms: None,
            undelivered: 0,
            pod_watchers_before: flipping.pod_watchers,
            watches_back_seconds,
            throttled_after_recovery: throttled(&end) - throttled(&first),
            bystander_before,
            bystander_after_recovery,
            after_recovery,
        },
    ))
}

/// Fills in which flips were pending at recovery and when each was delivered, from every
/// flip's cost. A flip was pending when its result was known before the apiserver was ready
/// again (made at least `result_known` before) and its status patch was not answered before
/// the kill.
pub fn delivery(report: &mut OutageReport, costs: &[FlipCost], result_known: Duration) {
    let known_by =
        report.ready_at - jiff::SignedDuration::try_from(result_known).unwrap_or_default();
    let mut delays = Vec::new();
    let mut undelivered = 0;
    for cost in costs.iter().filter(|c| c.at <= known_by) {
        match cost.status_answered {
            Some(answered) if answered < report.down_at => {}
            Some(answered) => delays
                .push((answered.duration_since(report.ready_at).as_secs_f64() * 1000.0).max(0.0)),
            None => undelivered += 1,
        }
    }
    report.pending_at_recovery = delays.len() + undelivered;
    report.undelivered = undelivered;
    report.delivery_p50_ms = percentile(&mut delays, 0.5);
    report.delivery_p99_ms = percentile(&mut delays, 0.99);
    report.delivery_max_ms = percentile(&mut delays, 1.0);
}
