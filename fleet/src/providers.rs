//! What the virtual-kubelet library does to podprobe's conditions: pods on real
//! node agents — the mock provider, which notifies the library of each pod's status, and
//! `vk-replacer`, which does not, so the library copies its status (without podprobe's
//! conditions) over the pods every 5 s — each with sidecars under each overwrite-repair
//! policy, probes flipping and a manager writing markers. Per group: the share of time each
//! condition showed the probe's state, its worst gap, overwrites and writes per pod-hour.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::watcher;
use podprobe::sidecar::RepairPolicy;
use podprobe_ops::backoff::WatchRetry;
use rand::Rng;
use testkit::real::virtual_kubelet::Provider;
use tokio::time::Instant;

use crate::audit::{WriteCounts, Writes};
use crate::cluster::{CONDITION, CONDITIONS, Cluster, ManagerKind, NS, Nodes, Periods};
use crate::presence::{Score, Timeline, expected_changes, score};
use crate::report::Source;
use crate::{FleetError, pods, sidecars, targets};

/// The groups of a run: every provider with every policy.
/// Pod `i` is in group `i % 6`; the providers alternate, as the nodes' round-robin placement
/// of pods over the two agents does.
pub const GROUPS: [(Provider, RepairPolicy); 6] = [
    (Provider::Mock, RepairPolicy::Backoff),
    (Provider::Replacer, RepairPolicy::Backoff),
    (Provider::Mock, RepairPolicy::Immediate),
    (Provider::Replacer, RepairPolicy::Immediate),
    (Provider::Mock, RepairPolicy::AfterChange),
    (Provider::Replacer, RepairPolicy::AfterChange),
];

/// The probes' periods: the flipped http probe is seen within a second.
pub const PERIODS: Periods = Periods {
    http: 1,
    tcp: 2,
    exec: 5,
};

/// From a flip, how long the probe may take before its condition counts as wrong: a period,
/// the writer's coalescing and a round trip, with a second to spare.
const FLIP_ALLOWANCE: Duration = Duration::from_secs(PERIODS.http as u64 + 2);

#[derive(Debug, Clone)]
pub struct ProvidersOptions {
    pub pods_per_group: usize,
    /// Length of the measured window.
    pub seconds: u64,
    /// Mean time between two flips of one pod's http target.
    pub flip_every: Duration,
    pub manager: ManagerKind,
    pub sidecar_host: PathBuf,
    pub manager_binary: PathBuf,
}

/// The figures of one group.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GroupFigures {
    pub provider: &'static str,
    pub policy: RepairPolicy,
    pub pods: usize,
    /// Per condition type: share of time right (%), worst gap (s), gaps over 2 s, overwrites
    /// per pod-hour.
    pub conditions: Vec<ConditionFigures>,
    pub flips_per_pod_hour: f64,
    pub sidecar_writes_per_pod_hour: f64,
    pub provider_writes_per_pod_hour: f64,
    pub marker_writes_per_pod_hour: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ConditionFigures {
    pub condition: &'static str,
    pub presence_percent: f64,
    pub worst_gap_seconds: f64,
    pub gaps_over_2s: usize,
    pub overwrites_per_pod_hour: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ProvidersReport {
    pub manager: ManagerKind,
    pub seconds: u64,
    pub flip_every_seconds: f64,
    pub groups: Vec<GroupFigures>,
}

fn policy_name(policy: RepairPolicy) -> &'static str {
    match policy {
        RepairPolicy::AfterChange => "after-change",
        RepairPolicy::Backoff => "backoff",
        RepairPolicy::Immediate => "immediate",
    }
}

fn provider_name(provider: Provider) -> &'static str {
    match provider {
        Provider::Mock => "mock",
        Provider::MockNewest => "mock-v1.14.1",
        Provider::Replacer => "replacer",
        Provider::AciRules => "aci-rules",
        Provider::ReadyOnly => "ready-only",
    }
}

/// The node agents: one per provider.
fn nodes() -> Nodes {
    let mut agents = Vec::new();
    for (provider, _) in GROUPS {
        let name = format!("vk-{}", provider_name(provider));
        if !agents.iter().any(|(n, _)| *n == name) {
            agents.push((name, provider));
        }
    }
    Nodes::Agents(agents)
}

/// Every pod's conditions as the admin's watch saw them, and the flips made.
#[derive(Debug, Default)]
struct Seen {
    /// Per pod, per condition of [`CONDITIONS`].
    timelines: Vec<[Timeline; 3]>,
    /// Per pod and condition: whether it has been seen once.
    shown: Vec<[bool; 3]>,
    flips: Vec<Vec<(Instant, bool)>>,
}

impl Seen {
    fn observe(&mut self, pod: &Pod) {
        let now = Instant::now();
        let Some(i) = pod
            .metadata
            .name
            .as_deref()
            .and_then(pods::index_of)
            .filter(|i| *i < self.timelines.len())
        else {
            return;
        };
        let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
        for (n, condition_type) in CONDITIONS.iter().enumerate() {
            let value = conditions
                .and_then(|c| c.iter().find(|c| c.type_ == *condition_type))
                .and_then(|c| match c.status.as_str() {
                    "True" => Some(true),
                    "False" => Some(false),
                    _ => None,
                });
            self.shown[i][n] |= value.is_some();
            let timeline = &mut self.timelines[i][n];
            if timeline.last().is_none_or(|(_, last)| *last != value) {
                timeline.push((now, value));
            }
        }
    }
}

/// Runs the measurement once: the cluster with both node agents, every group's pods and
/// sidecars, `seconds` of flips, then the audit log.
pub async fn run(options: &ProvidersOptions) -> Result<ProvidersReport, FleetError> {
    let per_group = options.pods_per_group;
    let n = per_group * GROUPS.len();
    let work = tempfile::Builder::new()
        .prefix("podprobe-providers-")
        .tempdir()?;
    let targets = targets::Targets::start(n).await?;
    let ports = (targets.http_port, targets.tcp_port);
    let nodes = nodes();
    let cluster = Cluster::start(
        options.manager,
        &options.manager_binary,
        &[],
        &nodes,
        ports,
        PERIODS,
    )
    .await?;
    let group_of = |i: usize| GROUPS[i % GROUPS.len()];
    let placed = (0..n).all(|i| nodes.node_of(i) == format!("vk-{}", provider_name(group_of(i).0)));
    if !placed {
        return Err(FleetError::Setup("pods and groups do not line up".into()));
    }
    let seen = Arc::new(Mutex::new(Seen {
        timelines: vec![Default::default(); n],
        shown: vec![[false; 3]; n],
        flips: vec![Vec::new(); n],
    }));
    let _watch = watch(cluster.cp.client(), seen.clone());
    let pods = pods::create(&cluster.cp, work.path(), n, &nodes, ports).await?;
    eprintln!("providers: {n} pods created on {nodes:?}");
    let mut hosts = Vec::new();
    for (g, (_, policy)) in GROUPS.iter().enumerate() {
        let group: Vec<_> = pods
            .iter()
            .filter(|p| p.index % GROUPS.len() == g)
            .cloned()
            .collect();
        let dir = work.path().join(format!("group-{g}"));
        std::fs::create_dir_all(&dir)?;
        hosts.push(
            sidecars::Hosts::start(
                &options.sidecar_host,
                &dir,
                &group,
                1,
                Source::Api,
                std::num::NonZeroU32::new(25).expect("non-zero"),
                *policy,
                None,
            )
            .await?,
        );
    }
    wait_complete(&seen, &cluster, &mut hosts).await?;
    // Start-up's writes (first results, Events) are not what is measured.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let from = Instant::now();
    let from_wall = jiff::Timestamp::now();
    flip(&targets, &seen, n, options).await;
    let to = Instant::now();
    let to_wall = jiff::Timestamp::now();
    for host in &mut hosts {
        host.check_running()?;
    }
    let writes = Writes::read(&cluster.cp.audit_path())?;
    let seen = seen.lock().expect("not poisoned");
    let hours = to.duration_since(from).as_secs_f64() / 3600.0;
    let mut groups = Vec::new();
    for (g, (provider, policy)) in GROUPS.iter().enumerate() {
        let members: Vec<usize> = (0..n).filter(|i| i % GROUPS.len() == g).collect();
        let mut scores = [Score::default(); 3];
        let mut counts = WriteCounts::default();
        let mut flips = 0;
        for &i in &members {
            // Every target starts healthy.
            let initial = true;
            let flipped: Vec<_> = seen.flips[i]
                .iter()
                .copied()
                .filter(|(at, _)| *at >= from)
                .collect();
            flips += flipped.len();
            for (c, scored) in scores.iter_mut().enumerate() {
                let timeline = &seen.timelines[i][c];
                let changes = if CONDITIONS[c] == CONDITION {
                    expected_changes(timeline, &flipped, FLIP_ALLOWANCE)
                } else {
                    Vec::new()
                };
                let start = if CONDITIONS[c] == CONDITION {
                    initial
                } else {
                    true
                };
                scored.add(&score(timeline, start, &changes, from, to));
            }
            let c = writes.counts(i, from_wall, to_wall);
            counts.sidecar_status += c.sidecar_status;
            counts.provider_status += c.provider_status;
            counts.markers += c.markers;
        }
        let pod_hours = members.len() as f64 * hours;
        groups.push(GroupFigures {
            provider: provider_name(*provider),
            policy: *policy,
            pods: members.len(),
            conditions: CONDITIONS
                .iter()
                .zip(scores)
                .map(|(condition, s)| ConditionFigures {
                    condition,
                    presence_percent: s.percent(),
                    worst_gap_seconds: s.worst_gap.as_secs_f64(),
                    gaps_over_2s: s.long_gaps,
                    overwrites_per_pod_hour: s.overwrites as f64 / pod_hours,
                })
                .collect(),
            flips_per_pod_hour: flips as f64 / pod_hours,
            sidecar_writes_per_pod_hour: counts.sidecar_status as f64 / pod_hours,
            provider_writes_per_pod_hour: counts.provider_status as f64 / pod_hours,
            marker_writes_per_pod_hour: counts.markers as f64 / pod_hours,
        });
    }
    Ok(ProvidersReport {
        manager: options.manager,
        seconds: options.seconds,
        flip_every_seconds: options.flip_every.as_secs_f64(),
        groups,
    })
}

/// The admin's watch of the fleet's pods, feeding `seen` until dropped.
fn watch(client: kube::Client, seen: Arc<Mutex<Seen>>) -> crate::AbortOnDrop {
    let api: Api<Pod> = Api::namespaced(client, NS);
    crate::AbortOnDrop(tokio::spawn(async move {
        let config = watcher::Config::default().labels("app=fleet");
        let mut events = std::pin::pin!(watcher(api, config).retry_backoff());
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                    seen.lock().expect("not poisoned").observe(&pod)
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("providers watch: {e}"),
            }
        }
    }))
}

/// Waits until every pod has shown each condition once.
async fn wait_complete(
    seen: &Mutex<Seen>,
    cluster: &Cluster,
    hosts: &mut [sidecars::Hosts],
) -> Result<(), FleetError> {
    let limit = Duration::from_secs(120);
    let started = Instant::now();
    loop {
        let (shown, pods) = {
            let seen = seen.lock().expect("not poisoned");
            let shown = seen.shown.iter().filter(|s| s.iter().all(|c| *c)).count();
            (shown, seen.shown.len())
        };
        if shown == pods {
            return Ok(());
        }
        for host in hosts.iter_mut() {
            host.check_running()?;
        }
        if started.elapsed() > limit {
            return Err(FleetError::Setup(format!(
                "only {shown} of {pods} pods showed every condition within {limit:?}; the node \
                 agents' logs end:\n{}",
                cluster.agent_log_tails(20)
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Flips each pod's http target at random times, `flip_every` apart on average, for
/// `seconds`; records each flip in `seen`.
async fn flip(
    targets: &targets::Targets,
    seen: &Mutex<Seen>,
    pods: usize,
    options: &ProvidersOptions,
) {
    let mean = options.flip_every.as_secs_f64();
    let mut rng = rand::rng();
    let mut next: Vec<Instant> = (0..pods)
        .map(|_| Instant::now() + Duration::from_secs_f64(rng.random_range(0.0..mean)))
        .collect();
    let end = Instant::now() + Duration::from_secs(options.seconds);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut last_report = Instant::now();
    while Instant::now() < end {
        tick.tick().await;
        let now = Instant::now();
        for (i, due) in next.iter_mut().enumerate() {
            if *due > now {
                continue;
            }
            let to = !targets.is_healthy(i);
            targets.set_healthy(i, to);
            seen.lock().expect("not poisoned").flips[i].push((now, to));
            *due = now + Duration::from_secs_f64(rng.random_range(0.5 * mean..1.5 * mean));
        }
        if last_report.elapsed() > Duration::from_secs(60) {
            let left = end.saturating_duration_since(now).as_secs();
            eprintln!("providers: flipping, {left} s to go");
            last_report = now;
        }
    }
}

impl ProvidersReport {
    /// A table: one line per group and condition.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "manager {:?}, {} s, each pod's probe flipping every {:.0} s on average\n\
             provider  policy       condition          right %  worst gap s  gaps>2s  overwrites/pod-h\n",
            self.manager, self.seconds, self.flip_every_seconds
        );
        for g in &self.groups {
            for c in &g.conditions {
                out += &format!(
                    "{:<9} {:<12} {:<18} {:>7.2}  {:>11.1}  {:>7}  {:>16.0}\n",
                    g.provider,
                    policy_name(g.policy),
                    c.condition,
                    c.presence_percent,
                    c.worst_gap_seconds,
                    c.gaps_over_2s,
                    c.overwrites_per_pod_hour
                );
            }
        }
        out += "provider  policy       pods  flips/pod-h  podprobe writes/pod-h  provider writes/pod-h  marker writes/pod-h\n";
        for g in &self.groups {
            out += &format!(
                "{:<9} {:<12} {:>4}  {:>11.0}  {:>21.0}  {:>21.0}  {:>19.0}\n",
                g.provider,
                policy_name(g.policy),
                g.pods,
                g.flips_per_pod_hour,
                g.sidecar_writes_per_pod_hour,
                g.provider_writes_per_pod_hour,
                g.marker_writes_per_pod_hour
            );
        }
        out
    }
}
