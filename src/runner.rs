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

use crate::annotation::{PodContainers, ProbeSpec};
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

pub use timing::{Streak, Timing, TimingDefaults};

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

impl WorkerReport {
    /// The probe it is about.
    pub fn probe(&self) -> &ProbeId {
        match self {
            WorkerReport::Transition(t) => &t.probe,
            WorkerReport::Attempted { probe, .. } | WorkerReport::Errored { probe, .. } => probe,
        }
    }
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
mod timing;
mod worker;

use worker::{Running, Worker};
