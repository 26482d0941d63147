//! One probe's worker: its schedule, attempts, and the state it publishes.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::annotation::ProbeSpec;
use crate::probe::{Observation, Target};

use super::{
    Attempter, ContainerView, ProbeId, ProbeState, RunnerConfig, Streak, Timing, Transition,
    WorkerReport,
};

pub(super) struct Worker<A> {
    pub(super) spec: ProbeSpec,
    pub(super) id: ProbeId,
    pub(super) timing: Timing,
    pub(super) target: Target,
    pub(super) prober: A,
    pub(super) container: watch::Receiver<ContainerView>,
    pub(super) events: mpsc::Sender<WorkerReport>,
    pub(super) config: Arc<RunnerConfig>,
}

/// What a worker remembers between ticks.
#[derive(Debug, Default)]
pub(super) struct WorkerState {
    pub(super) streak: Streak,
    pub(super) published: Option<(ProbeState, String)>,
    pub(super) container_id: Option<String>,
    /// The target container's `startedAt` and the tokio instant it corresponds to.
    pub(super) container_start: Option<(Timestamp, Instant)>,
}

impl<A: Attempter> Worker<A> {
    pub(super) async fn run(mut self) {
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

pub(super) struct Running {
    pub(super) spec: ProbeSpec,
    pub(super) ports: Vec<k8s_openapi::api::core::v1::ContainerPort>,
    pub(super) task: JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}
