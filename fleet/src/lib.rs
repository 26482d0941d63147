//! The fleet benchmark: N serverless pods and N real sidecars on a real control
//! plane, a manager turning their conditions into markers, P % of the pods flipping a probe
//! every second, and what that costs the apiserver, etcd, the manager and the sidecars.
//!
//! - [`cluster`]: kube-apiserver + etcd, virtual-kubelet nodes, the PodProbeMarker, the manager;
//! - [`pods`]: the pods as a provider makes them, tokens and downward-API files;
//! - [`targets`]: one HTTP and one TCP server answering for every pod's own address;
//! - [`sidecars`]: the real sidecar code, hosted by `podprobe-fleet-sidecars` processes;
//! - [`agents`]: with `--exec agent`, one real exec agent per pod, where injection wrapped its
//!   game container;
//! - [`flips`]: flipping targets, watching conditions and markers follow;
//! - [`audit`]: each flip's patches and the time its status patch was answered;
//! - [`outage`]: an apiserver or etcd outage during the flips, and [`bystander`]: what another
//!   workload's requests see meanwhile;
//! - [`providers`], [`presence`]: real virtual-kubelet node agents rewriting the pods' status,
//!   and how much of the time each condition showed the probe's state (docs/providers.md);
//! - [`measure`], [`report`]: the figures.
//!
//! The run: pods created → baseline window (no sidecars) → sidecars started, until every pod
//! is marked → idle window → flipping window → drain → audit read → [`Report`].

pub mod agents;
pub mod audit;
pub mod bystander;
mod children;
pub mod cluster;
pub mod flips;
mod http;
pub mod measure;
pub mod outage;
pub mod pods;
pub mod presence;
pub mod providers;
pub mod report;
pub mod sidecars;
pub mod targets;

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use agents::ExecPath;
pub use cluster::{ManagerKind, Periods};
pub use outage::{Fault, OutagePlan};
pub use report::{Report, Source};

/// Quiet time between start-up and the idle window.
const SETTLE: Duration = Duration::from_secs(5);

/// What can stop a run.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("control plane: {0}")]
    ControlPlane(#[from] testkit::real::Error),
    #[error("apiserver: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Setup(String),
    #[error("only {shown} of {pods} pods showed their condition and marker within {limit:?}")]
    NotMarked {
        shown: usize,
        pods: usize,
        limit: Duration,
    },
}

/// One run's parameters.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    pub pods: usize,
    pub flip_percent: f64,
    /// Length of the flipping window.
    pub seconds: u64,
    /// Length of the baseline and idle windows.
    pub idle_seconds: u64,
    pub manager: ManagerKind,
    pub source: Source,
    pub sidecars_per_process: usize,
    /// Each sidecar's Events burst (`podprobe run --event-burst`).
    pub event_burst: std::num::NonZeroU32,
    pub nodes: usize,
    pub periods: Periods,
    /// `podprobe-fleet-sidecars` and `podprobe-manager` to run.
    pub sidecar_host: PathBuf,
    pub manager_binary: PathBuf,
    /// A fault during the flips (the flipping window should outlast its recovery window).
    pub outage: Option<OutagePlan>,
    /// Sidecars started per second at most (`None`: all at once).
    pub start_rate: Option<std::num::NonZeroU32>,
    /// `KEY=VALUE`s given to `helm install` beside the bench's own (podprobe-manager only),
    /// e.g. `flowControl.enabled=false`.
    pub chart_values: Vec<String>,
    /// Where the exec probe runs: in the sidecars, or through the exec agents injection wraps
    /// the pods' game containers with (the shipped static `podprobe` binary).
    pub exec: ExecPath,
}

/// Open files a production kube-apiserver may hold (containerd's and systemd units'
/// `LimitNOFILE`): every sidecar holds a connection to it.
const OPEN_FILES: u64 = 1 << 20;

/// Raises this process' open-files limit towards [`OPEN_FILES`], so the control plane it
/// starts inherits what a real one has; a sandbox's lower hard limit would otherwise refuse
/// connections long before the apiserver runs out of anything else.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if setrlimit(Resource::RLIMIT_NOFILE, OPEN_FILES, OPEN_FILES).is_err() {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
    let (now, _) = getrlimit(Resource::RLIMIT_NOFILE).unwrap_or((soft, hard));
    if now < OPEN_FILES {
        eprintln!(
            "fleet: open files limited to {now} (wanted {OPEN_FILES}): the apiserver will refuse \
             connections past about {now} sidecars (one connection each)"
        );
    }
}

/// Runs the whole benchmark once.
pub async fn run(options: &FleetOptions) -> Result<Report, FleetError> {
    raise_open_files_limit();
    let n = options.pods;
    let work = tempfile::Builder::new()
        .prefix("podprobe-fleet-")
        .tempdir()?;
    let targets = targets::Targets::start(n).await?;
    let ports = (targets.http_port, targets.tcp_port);
    let nodes = match options.exec {
        ExecPath::Local => cluster::Nodes::Objects(options.nodes),
        ExecPath::Agent => cluster::Nodes::Kubelet(options.nodes),
    };
    let mut cluster = cluster::Cluster::start(
        options.manager,
        &options.manager_binary,
        &options.chart_values,
        &nodes,
        ports,
        options.periods,
    )
    .await?;
    let (tracker, watch) = flips::Tracker::watch(cluster.cp.client(), n);
    let _stop_watch = AbortOnDrop(watch);
    // The empty cluster (control plane, manager, PodProbeMarker, nodes; no pod yet): what
    // each pod and sidecar costs is measured over it.
    let no_sidecars = measure::Processes::of(&cluster, Vec::new(), &agents::Agents::none());
    let empty = measure::quiet(&cluster, &no_sidecars, SETTLE, n).await?;

    let started = Instant::now();
    let pods = pods::create(&cluster.cp, work.path(), n, &nodes, ports).await?;
    eprintln!("fleet: {n} pods created in {:.1?}", started.elapsed());

    // The game containers start before their sidecars probe them; their cost is measured
    // from the start-up window on, as the sidecars' is.
    let mut agents = match options.exec {
        ExecPath::Local => agents::Agents::none(),
        ExecPath::Agent => {
            // The agent's own binary, which the pods' install container copies.
            let binary = testkit::real::node::images::shipped_binaries()?.join("podprobe-agent");
            agents::Agents::start(&binary, work.path(), &pods).await?
        }
    };
    let idle_window = Duration::from_secs(options.idle_seconds);
    let baseline = measure::quiet(&cluster, &no_sidecars, idle_window, n).await?;

    // The start-up window opens before the first sidecar: with a paced start (`start_rate`)
    // starting them all takes minutes, and what the first ones ask meanwhile is start-up too.
    // The sidecars' CPU counts from 0 in it (their processes do not exist yet).
    let before = measure::sample(
        &cluster,
        &measure::Processes::of(&cluster, Vec::new(), &agents),
    )
    .await?;
    let started = Instant::now();
    let started_at = jiff::Timestamp::now();
    let mut hosts = sidecars::Hosts::start(
        &options.sidecar_host,
        work.path(),
        &pods,
        options.sidecars_per_process,
        options.source,
        options.event_burst,
        podprobe::sidecar::RepairPolicy::default(),
        options.start_rate,
    )
    .await?;
    let processes = measure::Processes::of(&cluster, hosts.pids(), &agents);
    wait_all_showing(&tracker, &targets, &mut hosts, n, false).await?;
    let all_marked_seconds = started.elapsed().as_secs_f64();
    eprintln!("fleet: every pod marked {all_marked_seconds:.1} s after the sidecars started");
    // The idle window starts once every probe has reported (the exec probe's first run comes
    // anywhere in its first period, as the kubelet spreads them).
    wait_all_showing(&tracker, &targets, &mut hosts, n, true).await?;
    let startup = measure::window(
        &before,
        &measure::sample(&cluster, &processes).await?,
        &processes,
        n,
    );
    let startup_to = jiff::Timestamp::now();
    // Start-up's last writes (other probes' first results, Events) are not the idle cost.
    tokio::time::sleep(SETTLE).await;

    let idle_from = jiff::Timestamp::now();
    let idle = measure::quiet(&cluster, &processes, idle_window, n).await?;
    let idle_to = jiff::Timestamp::now();

    let before = measure::sample(&cluster, &processes).await?;
    let flipping = flips::drive(&targets, &tracker, n, options.flip_percent, options.seconds);
    let (flips_made, flipping, mut outage) = match options.outage {
        None => {
            let made = flipping.await;
            let after = measure::sample(&cluster, &processes).await?;
            let mut window = measure::window(&before, &after, &processes, n);
            window.footprint = Some(measure::footprint(&cluster, &processes).await?);
            (made, window, None)
        }
        Some(plan) => {
            let fault = outage::inject(&mut cluster, &processes, &before, plan, n);
            let (made, injected) = tokio::join!(flipping, fault);
            let (window, report) = injected?;
            (made, window, Some(report))
        }
    };
    // The last flips need a probe period to be seen, then a patch and a marker; after an
    // outage the manager's and this bench's watches come back on their own backoff.
    let drain = Duration::from_secs(u64::from(options.periods.http) * 3 + 30)
        + if outage.is_some() {
            Duration::from_secs(120)
        } else {
            Duration::ZERO
        };
    let deadline = Instant::now() + drain;
    while tracker.in_flight() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    hosts.check_running()?;
    agents.check_running()?;
    let exec_not_true_at_end = tracker.count_exec_not_true();
    let wrong_at_end = tracker.count_wrong_without_flip(&targets);
    let conditions_wrong_at_end = tracker.count_condition_wrong(&targets);
    let (unmarked_at_end, never_written) = tracker.in_flight_by_condition(&targets);
    let (done, lost) = tracker.results();
    eprintln!(
        "fleet: {flips_made} flips, {} marked, {} not marked by the end; reading the audit log",
        done.len(),
        lost.len()
    );

    let mut all = done.clone();
    all.extend(lost.iter().cloned());
    let writes = audit::Writes::read(&cluster.cp.audit_path())?;
    if writes.is_empty() && !all.is_empty() {
        return Err(FleetError::Setup(
            "the audit log holds no pod writes".into(),
        ));
    }
    let costs = writes.costs(&all);
    let idle_sidecar_requests =
        audit::sidecar_requests(&cluster.cp.audit_path(), idle_from, idle_to)?;
    let startup_status_patches =
        audit::status_patches(&cluster.cp.audit_path(), started_at, startup_to)?;
    let startup_sidecar_requests =
        audit::sidecar_requests(&cluster.cp.audit_path(), started_at, startup_to)?;
    // A flip that cost more than one status patch or marker write is what the figures are
    // about: show a few with their writes.
    for cost in costs
        .iter()
        .filter(|c| c.status_patches > 1 || c.marker_writes > 1)
        .take(3)
    {
        eprintln!(
            "fleet: flip of pod {} at {} cost {} status patches and {} marker writes:\n{}",
            cost.pod,
            cost.at,
            cost.status_patches,
            cost.marker_writes,
            writes.describe(cost.pod, cost.at)
        );
    }
    if let Some(report) = &mut outage {
        // A flip's result is known within a period, a timeout and a second of slack.
        let known = Duration::from_secs(u64::from(options.periods.http) + 2);
        outage::delivery(report, &costs, known);
    }
    let mut latencies: Vec<f64> = costs.iter().filter_map(|c| c.marker_latency_ms).collect();
    let mut condition_latencies: Vec<f64> = costs
        .iter()
        .filter_map(|c| Some(c.status_answered?.duration_since(c.at).as_secs_f64() * 1000.0))
        .collect();
    let flips = all.len().max(1) as f64;
    let base = baseline.footprint;
    let per_sidecar = |w: &measure::Window| Some(w.footprint?.over(&base?, n));
    Ok(Report {
        pods: n,
        source: options.source,
        manager: options.manager,
        sidecars_per_process: options.sidecars_per_process,
        event_burst: options.event_burst.get(),
        flip_percent: options.flip_percent,
        flips: all.len(),
        lost: never_written + wrong_at_end,
        unmarked_at_end,
        wrong_at_end,
        conditions_wrong_at_end,
        exec: options.exec,
        exec_not_true_at_end,
        exec_agent_ms_per_attempt: (options.exec == ExecPath::Agent).then(|| {
            let attempts_per_second = n as f64 / f64::from(options.periods.exec.max(1));
            idle.agents_cpu_cores * 1000.0 / attempts_per_second
        }),
        condition_latency_p50_ms: report::percentile(&mut condition_latencies, 0.5),
        condition_latency_p99_ms: report::percentile(&mut condition_latencies, 0.99),
        marker_latency_p50_ms: report::percentile(&mut latencies, 0.5),
        marker_latency_p99_ms: report::percentile(&mut latencies, 0.99),
        marker_latency_max_ms: report::percentile(&mut latencies, 1.0),
        status_patches_per_flip: costs.iter().map(|c| c.status_patches).sum::<usize>() as f64
            / flips,
        status_patches_per_flip_max: costs.iter().map(|c| c.status_patches).max().unwrap_or(0),
        marker_writes_per_flip: costs.iter().map(|c| c.marker_writes).sum::<usize>() as f64 / flips,
        marker_writes_per_flip_max: costs.iter().map(|c| c.marker_writes).max().unwrap_or(0),
        all_marked_seconds,
        startup,
        startup_status_patches,
        startup_sidecar_requests,
        apiserver_cpu_cores: flipping.apiserver_cpu_cores,
        apiserver_rss_mib: flipping.apiserver_rss_mib,
        manager_cpu_cores: flipping.manager_cpu_cores,
        manager_rss_mib: flipping.manager_rss_mib,
        empty,
        baseline,
        flipping_per_sidecar: per_sidecar(&flipping),
        idle_per_sidecar: per_sidecar(&idle),
        idle,
        idle_sidecar_requests,
        flipping,
        outage,
    })
}

/// Waits until every pod shows its condition and marker (and, with `settled`, every
/// condition).
async fn wait_all_showing(
    tracker: &flips::Tracker,
    targets: &targets::Targets,
    hosts: &mut sidecars::Hosts,
    pods: usize,
    settled: bool,
) -> Result<(), FleetError> {
    // Generous: at 10 000 pods on 2 cores start-up is minutes of TLS and first writes.
    let limit = Duration::from_secs(120) + Duration::from_millis(60 * pods as u64);
    let started = Instant::now();
    let mut last_report = Instant::now();
    loop {
        let shown = tracker.count_showing(targets, settled);
        if shown == pods {
            return Ok(());
        }
        hosts.check_running()?;
        if started.elapsed() > limit {
            return Err(FleetError::NotMarked { shown, pods, limit });
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            eprintln!("fleet: {shown} of {pods} pods marked");
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
