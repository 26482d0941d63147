//! Writes condition changes to `pods/<self>/status`: coalesced, one patch in flight, retried with
//! backoff, always converging to the newest state.
//!
//! Callers [`submit`](ConditionWriter::submit) conditions; the writer keeps the newest condition
//! per type in a pending map, waits a short coalescing window, and sends everything pending as
//! one strategic-merge patch with the pod's uid as precondition. A failed patch puts its
//! conditions back unless a newer one of the same type arrived meanwhile, so an older result
//! never overwrites a newer one and nothing is lost.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::sync::{Notify, watch};

use super::status_patch;
use crate::metrics::Metrics;
use podprobe_protocol::uid_guard::refused_by_uid_guard;

/// Timing of the writer.
#[derive(Debug, Clone, Copy)]
pub struct WriterConfig {
    /// Changes arriving within this window after the first go out in one patch.
    pub coalesce: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            coalesce: Duration::from_millis(200),
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    pending: BTreeMap<String, PodCondition>,
    /// Conditions the apiserver refused as invalid (422) on their own: retried after a backoff,
    /// apart from the others, so one refused condition never holds back the rest. A newer
    /// result of the same type replaces a parked one.
    parked: BTreeMap<String, PodCondition>,
    in_flight: bool,
}

impl State {
    /// What the next patch carries: everything pending, or one condition while isolating.
    fn take_batch(&mut self, isolate: bool) -> Vec<PodCondition> {
        self.in_flight = true;
        if isolate {
            self.pending
                .pop_first()
                .map(|(_, c)| vec![c])
                .unwrap_or_default()
        } else {
            std::mem::take(&mut self.pending).into_values().collect()
        }
    }

    /// Sets a refused batch aside; anything pending was submitted after it and wins over it.
    fn park(&mut self, refused: Vec<PodCondition>) {
        let pending = std::mem::take(&mut self.pending);
        requeue(&mut self.parked, refused);
        for (kind, condition) in pending {
            self.parked.remove(&kind);
            self.pending.insert(kind, condition);
        }
    }

    /// Parked conditions are due again, unless a newer result of the same type is pending.
    fn unpark(&mut self) {
        for (kind, condition) in std::mem::take(&mut self.parked) {
            self.pending.entry(kind).or_insert(condition);
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Notify,
    idle: Notify,
}

/// Handle to the writer task.
#[derive(Debug, Clone)]
pub struct ConditionWriter {
    shared: Arc<Shared>,
}

impl ConditionWriter {
    /// Starts the writer for pod `name`. `uid` says the pod's uid once known; nothing is written
    /// before it is (the precondition is what keeps a replacement pod safe).
    pub fn spawn(
        pods: Api<Pod>,
        name: String,
        uid: watch::Receiver<Option<String>>,
        config: WriterConfig,
        metrics: Metrics,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let shared = Arc::new(Shared::default());
        let task = tokio::spawn(write_loop(pods, name, uid, config, metrics, shared.clone()));
        (ConditionWriter { shared }, task)
    }

    /// Queues a condition; a newer one of the same type replaces an older pending one.
    pub fn submit(&self, condition: PodCondition) {
        let mut state = self.lock();
        state.parked.remove(&condition.type_);
        state.pending.insert(condition.type_.clone(), condition);
        drop(state);
        self.shared.wake.notify_one();
    }

    /// Whether nothing is pending or in flight.
    pub fn is_idle(&self) -> bool {
        let state = self.lock();
        state.pending.is_empty() && state.parked.is_empty() && !state.in_flight
    }

    /// Waits until everything submitted is written, at most `limit`. Returns whether it was.
    pub async fn flush(&self, limit: Duration) -> bool {
        let wait = async {
            loop {
                let idle = self.shared.idle.notified();
                if self.is_idle() {
                    return;
                }
                self.shared.wake.notify_one();
                idle.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.shared)
    }
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, State> {
    // A panic while holding this lock cannot leave the map half-updated (single inserts), so a
    // poisoned lock is still usable.
    shared
        .state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn write_loop(
    pods: Api<Pod>,
    name: String,
    mut uid: watch::Receiver<Option<String>>,
    config: WriterConfig,
    metrics: Metrics,
    shared: Arc<Shared>,
) {
    let mut backoff = config.backoff_min;
    let mut coalesce = true;
    // After a 422 for a batch: send one condition per patch until the pending set drains, so
    // the one the apiserver refuses cannot hold back the others.
    let mut isolate = false;
    loop {
        let woken = shared.wake.notified();
        let (nothing_pending, nothing_parked) = {
            let state = lock(&shared);
            (state.pending.is_empty(), state.parked.is_empty())
        };
        if nothing_pending && nothing_parked {
            shared.idle.notify_waiters();
            woken.await;
            coalesce = true;
        } else if nothing_pending {
            // Only refused conditions are left: try them again after the backoff, or write a
            // new result first if one arrives meanwhile.
            tokio::select! {
                () = woken => coalesce = true,
                () = tokio::time::sleep(jitter(backoff)) => {
                    backoff = (backoff * 2).min(config.backoff_max);
                    lock(&shared).unpark();
                    coalesce = false;
                }
            }
            continue;
        }
        if coalesce {
            tokio::time::sleep(config.coalesce).await;
        }
        let Some(pod_uid) = uid.borrow_and_update().clone() else {
            tracing::info!(pod = %name, "waiting for the pod's uid before writing conditions");
            if uid.changed().await.is_err() {
                return;
            }
            continue;
        };
        let batch = lock(&shared).take_batch(isolate);
        if batch.is_empty() {
            lock(&shared).in_flight = false;
            isolate = false;
            continue;
        }
        let patch = status_patch(&pod_uid, &batch);
        let result = pods
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await;
        match result {
            Ok(_) => {
                metrics.write_ok();
                let types: Vec<&str> = batch.iter().map(|c| c.type_.as_str()).collect();
                tracing::debug!(pod = %name, conditions = ?types, "conditions written");
                let mut state = lock(&shared);
                state.in_flight = false;
                if state.parked.is_empty() {
                    backoff = config.backoff_min;
                }
                isolate = isolate && !state.pending.is_empty();
                coalesce = !isolate;
            }
            Err(kube::Error::Api(status))
                if status.code == 422 && !refused_by_uid_guard(&status) =>
            {
                metrics.write_error(Some(422));
                coalesce = false;
                let mut state = lock(&shared);
                state.in_flight = false;
                if batch.len() > 1 {
                    tracing::warn!(pod = %name, conditions = batch.len(), server = %status.message,
                        "the apiserver refused a patch of several conditions as invalid; writing them one at a time so that the others are not held back");
                    requeue(&mut state.pending, batch);
                    isolate = true;
                } else {
                    let types: Vec<&str> = batch.iter().map(|c| c.type_.as_str()).collect();
                    tracing::warn!(pod = %name, conditions = ?types,
                        "writing conditions of pod {name} failed (the apiserver refused the conditions as invalid); retried with backoff apart from the other conditions: {}",
                        status.message);
                    state.park(batch);
                    isolate = isolate && !state.pending.is_empty();
                }
            }
            Err(error) => {
                requeue(&mut lock(&shared).pending, batch);
                lock(&shared).in_flight = false;
                let (code, retry_after) = classify(&error);
                metrics.write_error(code);
                tracing::warn!(pod = %name, "{}", explain(&name, code, &error));
                let wait = retry_after.unwrap_or_else(|| jitter(backoff));
                backoff = (backoff * 2).min(config.backoff_max);
                coalesce = false;
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Puts a failed batch back, except where a newer condition of the same type arrived meanwhile.
fn requeue(into: &mut BTreeMap<String, PodCondition>, batch: Vec<PodCondition>) {
    for condition in batch {
        into.entry(condition.type_.clone()).or_insert(condition);
    }
}

/// The HTTP code (None for transport errors) and the server's retry hint.
fn classify(error: &kube::Error) -> (Option<u16>, Option<Duration>) {
    match error {
        kube::Error::Api(status) => {
            let retry = status
                .details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(u64::from(s)));
            (Some(status.code), retry)
        }
        _ => (None, None),
    }
}

const REPLACED: &str =
    "the pod's uid differs: it was replaced by a same-named pod, which this sidecar must not write";

/// One log line a user can act on.
fn explain(pod: &str, code: Option<u16>, error: &kube::Error) -> String {
    let server = match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    };
    let hint = match code {
        Some(403) => {
            "RBAC does not allow `patch pods/status` for this service account (see the README's Role)"
        }
        Some(401) => {
            "the apiserver no longer accepts this token (a pod-bound token stops working when its pod is deleted)"
        }
        Some(404) => "the pod no longer exists",
        Some(409 | 422) if matches!(error, kube::Error::Api(s) if refused_by_uid_guard(s)) => {
            REPLACED
        }
        Some(429) => "the apiserver asks to slow down",
        Some(c) if c >= 500 => "the apiserver failed",
        Some(_) => "unexpected answer",
        None => "cannot reach the apiserver",
    };
    format!("writing conditions of pod {pod} failed ({hint}); will retry with backoff: {server}")
}

/// Equal jitter: a wait in [backoff/2, backoff], so retries of many pods spread out but none
/// comes back sooner than half the backoff.
fn jitter(backoff: Duration) -> Duration {
    backoff.mul_f64(0.5 + rand::random::<f64>() / 2.0)
}
