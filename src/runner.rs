//! Probe workers: timing, thresholds and the per-probe state machine.
//!
//! One tokio task per probe, mirroring kruise-daemon's worker (so one PodProbeMarker behaves the
//! same on normal and serverless nodes): start jitter, initial delay from the container's start,
//! a fixed period that skips (never queues) missed ticks, consecutive-result thresholds, errored
//! attempts that change nothing. Workers report [`WorkerReport`]s; what to write is
//! `condition`'s job.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::annotation::{PodContainers, ProbeSpec, RawTiming};
use crate::probe::{AttemptError, Handler, Observation, Outcome, Prober, Target};

/// Runs one attempt. [`Prober`] is the real one; the runner's own tests script results to check
/// timing and thresholds under tokio's paused clock.
pub trait Attempter: Clone + Send + Sync + 'static {
    fn attempt(
        &self,
        handler: &Handler,
        target: &Target,
        timeout: Duration,
    ) -> impl Future<Output = Result<Observation, AttemptError>> + Send;
}

impl Attempter for Prober {
    fn attempt(
        &self,
        handler: &Handler,
        target: &Target,
        timeout: Duration,
    ) -> impl Future<Output = Result<Observation, AttemptError>> + Send {
        Prober::attempt(self, handler, target, timeout)
    }
}

pub use podprobe_protocol::state::ProbeState;

impl From<Outcome> for ProbeState {
    fn from(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Succeeded => ProbeState::Succeeded,
            Outcome::Failed => ProbeState::Failed,
        }
    }
}

/// Which defaults apply to unset or out-of-range timing fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TimingDefaults {
    /// kruise-daemon's minimums: period, timeout, initial delay, thresholds all at least 1.
    #[default]
    Kruise,
    /// The kubelet's defaults for 0/unset: period 10 s, timeout 1 s, delay 0, success 1, failure 3.
    Kubernetes,
}

/// Effective timing of one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl Timing {
    pub fn effective(raw: &RawTiming, defaults: TimingDefaults) -> Timing {
        let secs = |v: i32| Duration::from_secs(u64::try_from(v).unwrap_or(0));
        let count = |v: i32| u32::try_from(v).unwrap_or(0);
        match defaults {
            TimingDefaults::Kruise => Timing {
                initial_delay: secs(raw.initial_delay_seconds.unwrap_or(0).max(1)),
                period: secs(raw.period_seconds.unwrap_or(0).max(1)),
                timeout: secs(raw.timeout_seconds.unwrap_or(0).max(1)),
                success_threshold: count(raw.success_threshold.unwrap_or(0).max(1)),
                failure_threshold: count(raw.failure_threshold.unwrap_or(0).max(1)),
            },
            TimingDefaults::Kubernetes => {
                let or = |v: Option<i32>, default: i32| match v {
                    Some(v) if v > 0 => v,
                    _ => default,
                };
                Timing {
                    initial_delay: secs(raw.initial_delay_seconds.unwrap_or(0).max(0)),
                    period: secs(or(raw.period_seconds, 10)),
                    timeout: secs(or(raw.timeout_seconds, 1)),
                    success_threshold: count(or(raw.success_threshold, 1)),
                    failure_threshold: count(or(raw.failure_threshold, 3)),
                }
            }
        }
    }
}

/// Consecutive-result counting (kubelet/kruise-daemon): the streak survives everything but a
/// different result; a result is published once its streak reaches the threshold.
#[derive(Debug, Clone, Default)]
pub struct Streak {
    last: Option<Outcome>,
    run: u32,
}

impl Streak {
    /// Records one real result; returns the state to publish, if the threshold is reached.
    pub fn observe(&mut self, outcome: Outcome, timing: &Timing) -> Option<ProbeState> {
        if self.last == Some(outcome) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(outcome);
            self.run = 1;
        }
        let threshold = match outcome {
            Outcome::Succeeded => timing.success_threshold,
            Outcome::Failed => timing.failure_threshold,
        };
        (self.run >= threshold).then_some(outcome.into())
    }

    pub fn reset(&mut self) {
        *self = Streak::default();
    }

    /// Length of the current streak.
    pub fn run(&self) -> u32 {
        self.run
    }
}

/// What the sidecar knows of the target container (from the apiserver; `Unknown` otherwise).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ContainerView {
    /// No status available (file source, `check`): probe from sidecar start.
    #[default]
    Unknown,
    /// The pod status lists no status for this container yet: wait.
    Absent,
    /// Waiting or terminated.
    NotRunning { container_id: Option<String> },
    Running {
        container_id: Option<String>,
        started_at: Option<Timestamp>,
        /// `containerStatuses[].started` (startup probe passed), when reported.
        started: Option<bool>,
    },
}

impl ContainerView {
    fn container_id(&self) -> Option<&str> {
        match self {
            ContainerView::Unknown | ContainerView::Absent => None,
            ContainerView::NotRunning { container_id }
            | ContainerView::Running { container_id, .. } => container_id.as_deref(),
        }
    }
}

/// Identifies a probe in events: its condition type (unique per annotation) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ProbeId {
    pub name: String,
    #[serde(rename = "podConditionType")]
    pub condition_type: String,
}

impl ProbeId {
    pub fn of(spec: &ProbeSpec) -> Self {
        ProbeId {
            name: spec.name.clone(),
            condition_type: spec.condition_type.clone(),
        }
    }
}

/// A change of what a probe publishes (state, or message within the same state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub probe: ProbeId,
    pub state: ProbeState,
    pub message: String,
    /// When the attempt that produced this result ran.
    pub at: Timestamp,
}

/// What workers report.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerReport {
    /// The published result changed.
    Transition(Transition),
    /// An attempt ran (for metrics and `check --once` accounting).
    Attempted {
        probe: ProbeId,
        outcome: Outcome,
        duration: Duration,
    },
    /// An attempt could not run; nothing changed.
    Errored {
        probe: ProbeId,
        error: String,
        at: Timestamp,
    },
}

/// Settings shared by all workers.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    pub timing_defaults: TimingDefaults,
    /// Address network probes aim at (pod IP, or 127.0.0.1).
    pub host: String,
    /// Spread first attempts over one period (off for `check --once`, which wants answers now).
    pub start_jitter: bool,
    /// Ignore the initial delay (`check --once`).
    pub skip_initial_delay: bool,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            timing_defaults: TimingDefaults::Kruise,
            host: "127.0.0.1".into(),
            start_jitter: true,
            skip_initial_delay: false,
        }
    }
}

struct Worker<A> {
    spec: ProbeSpec,
    id: ProbeId,
    timing: Timing,
    target: Target,
    prober: A,
    container: watch::Receiver<ContainerView>,
    events: mpsc::Sender<WorkerReport>,
    config: Arc<RunnerConfig>,
}

/// What a worker remembers between ticks.
#[derive(Debug, Default)]
struct WorkerState {
    streak: Streak,
    published: Option<(ProbeState, String)>,
    container_id: Option<String>,
    /// The target container's `startedAt` and the tokio instant it corresponds to.
    container_start: Option<(Timestamp, Instant)>,
}

impl<A: Attempter> Worker<A> {
    async fn run(mut self) {
        let started = Instant::now();
        let jitter = if self.config.start_jitter {
            self.timing.period.mul_f64(rand::random::<f64>())
        } else {
            Duration::ZERO
        };
        let mut state = WorkerState::default();
        // Ticks on a fixed grid from the first attempt. A slow attempt does not queue the ticks
        // it overran (unlike a Go ticker, which keeps one): the next attempt waits for the next
        // grid point still ahead.
        let mut next = (started + jitter).max(self.delay_deadline(&mut state, started));
        loop {
            tokio::time::sleep_until(next).await;
            self.tick(&mut state, started).await;
            let now = Instant::now();
            while next <= now {
                next += self.timing.period;
            }
        }
    }

    async fn tick(&mut self, state: &mut WorkerState, started: Instant) {
        let view = self.container.borrow_and_update().clone();
        if let Some(id) = view.container_id() {
            if state
                .container_id
                .as_deref()
                .is_some_and(|known| known != id)
            {
                state.streak.reset();
                self.publish(
                    state,
                    ProbeState::Unknown,
                    "container restarted".into(),
                    Timestamp::now(),
                )
                .await;
            }
            state.container_id = Some(id.to_owned());
        }
        match &view {
            ContainerView::NotRunning { .. } => {
                let message = format!("Container({}) is Non-running", self.spec.container_name);
                self.publish(state, ProbeState::Failed, message, Timestamp::now())
                    .await;
                return;
            }
            // No status yet, or the startup probe has not passed: PodProbeMarker probes wait.
            ContainerView::Absent
            | ContainerView::Running {
                started: Some(false),
                ..
            } => return,
            _ => {}
        }
        if Instant::now() < self.delay_deadline(state, started) {
            return;
        }
        // Exec modes that run in the target container follow its current instance.
        self.target.container_id = view.container_id().map(str::to_owned);
        let at = Timestamp::now();
        let attempt_start = Instant::now();
        let result = self
            .prober
            .attempt(&self.spec.handler, &self.target, self.timing.timeout)
            .await;
        match result {
            Ok(Observation { outcome, message }) => {
                let duration = attempt_start.elapsed();
                if let Some(published) = state.streak.observe(outcome, &self.timing) {
                    self.publish(state, published, message, at).await;
                }
                self.send(WorkerReport::Attempted {
                    probe: self.id.clone(),
                    outcome,
                    duration,
                })
                .await;
            }
            Err(error) => {
                tracing::debug!(
                    probe = %self.id.name,
                    condition = %self.id.condition_type,
                    %error,
                    "probe attempt errored; state unchanged"
                );
                self.send(WorkerReport::Errored {
                    probe: self.id.clone(),
                    error: error.to_string(),
                    at,
                })
                .await;
            }
        }
    }

    /// When the initial delay ends: from the container's start when known, else from the
    /// worker's (sidecar's) start. The container's wall-clock start is turned into a tokio
    /// instant once per container start, so all timing follows tokio's clock.
    fn delay_deadline(&self, state: &mut WorkerState, worker_start: Instant) -> Instant {
        if self.config.skip_initial_delay {
            return worker_start;
        }
        let started_at = match &*self.container.borrow() {
            ContainerView::Running {
                started_at: Some(started_at),
                ..
            } => *started_at,
            _ => return worker_start + self.timing.initial_delay,
        };
        let anchor = match state.container_start {
            Some((at, instant)) if at == started_at => instant,
            _ => {
                let age = Duration::try_from(Timestamp::now().duration_since(started_at))
                    .unwrap_or(Duration::ZERO);
                let now = Instant::now();
                let instant = now.checked_sub(age).unwrap_or(now);
                state.container_start = Some((started_at, instant));
                instant
            }
        };
        anchor + self.timing.initial_delay
    }

    /// Reports `state` unless it (and its message) is what was last published.
    async fn publish(
        &self,
        worker: &mut WorkerState,
        state: ProbeState,
        message: String,
        at: Timestamp,
    ) {
        if worker
            .published
            .as_ref()
            .is_some_and(|(s, m)| *s == state && *m == message)
        {
            return;
        }
        worker.published = Some((state, message.clone()));
        self.send(WorkerReport::Transition(Transition {
            probe: self.id.clone(),
            state,
            message,
            at,
        }))
        .await;
    }

    async fn send(&self, event: WorkerReport) {
        // A closed channel means the runner is shutting down; the worker is about to be aborted.
        let _ = self.events.send(event).await;
    }
}

struct Running {
    spec: ProbeSpec,
    ports: Vec<k8s_openapi::api::core::v1::ContainerPort>,
    task: JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The set of running workers, reconciled against the latest probe set.
pub struct Runner<A = Prober> {
    prober: A,
    config: Arc<RunnerConfig>,
    events: mpsc::Sender<WorkerReport>,
    workers: HashMap<String, Running>,
    containers: HashMap<String, watch::Sender<ContainerView>>,
}

impl<A> std::fmt::Debug for Runner<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("config", &self.config)
            .field("probes", &self.workers.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// What [`Runner::apply`] changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    pub started: Vec<String>,
    pub restarted: Vec<String>,
    pub stopped: Vec<String>,
}

impl<A: Attempter> Runner<A> {
    pub fn new(prober: A, config: RunnerConfig, events: mpsc::Sender<WorkerReport>) -> Self {
        Runner {
            prober,
            config: Arc::new(config),
            events,
            workers: HashMap::new(),
            containers: HashMap::new(),
        }
    }

    /// Makes the running workers match `probes` (keyed by condition type): new probes start,
    /// removed ones stop, changed ones (handler, timing, container or ports) restart with fresh
    /// counters; unchanged ones keep running undisturbed.
    pub fn apply(&mut self, probes: &[ProbeSpec], containers: &PodContainers) -> Applied {
        let mut applied = Applied::default();
        let wanted: HashMap<&str, &ProbeSpec> = probes
            .iter()
            .map(|p| (p.condition_type.as_str(), p))
            .collect();
        self.workers.retain(|ct, _| {
            let keep = wanted.contains_key(ct.as_str());
            if !keep {
                applied.stopped.push(ct.clone());
            }
            keep
        });
        for spec in probes {
            let ports = containers
                .ports
                .get(&spec.container_name)
                .cloned()
                .unwrap_or_default();
            if let Some(running) = self.workers.get(&spec.condition_type) {
                if running.spec == *spec && running.ports == ports {
                    continue;
                }
                applied.restarted.push(spec.condition_type.clone());
            } else {
                applied.started.push(spec.condition_type.clone());
            }
            let task = self.spawn(spec, &ports);
            self.workers.insert(
                spec.condition_type.clone(),
                Running {
                    spec: spec.clone(),
                    ports,
                    task,
                },
            );
        }
        applied.stopped.sort();
        applied
    }

    /// Tells the workers probing `container` what the pod status says about it.
    pub fn set_container(&mut self, container: &str, view: ContainerView) {
        self.container_channel(container)
            .send_if_modified(|current| {
                let changed = *current != view;
                *current = view;
                changed
            });
    }

    /// Stops every worker.
    pub fn stop_all(&mut self) {
        self.workers.clear();
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    fn container_channel(&mut self, container: &str) -> &watch::Sender<ContainerView> {
        self.containers
            .entry(container.to_owned())
            .or_insert_with(|| watch::channel(ContainerView::Unknown).0)
    }

    fn spawn(
        &mut self,
        spec: &ProbeSpec,
        ports: &[k8s_openapi::api::core::v1::ContainerPort],
    ) -> JoinHandle<()> {
        let container = self.container_channel(&spec.container_name).subscribe();
        let worker = Worker {
            id: ProbeId::of(spec),
            timing: Timing::effective(&spec.timing, self.config.timing_defaults),
            target: Target {
                host: self.config.host.clone(),
                container_ports: ports.to_vec(),
                container_name: spec.container_name.clone(),
                container_id: None,
            },
            spec: spec.clone(),
            prober: self.prober.clone(),
            container,
            events: self.events.clone(),
            config: self.config.clone(),
        };
        tokio::spawn(worker.run())
    }
}

#[cfg(test)]
mod tests;
