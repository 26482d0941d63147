//! Writes condition changes to `pods/<self>/status`: coalesced, one patch in flight, retried with
//! backoff, always converging to the newest state. The only code of the sidecar that writes the
//! pod's status, for sets and deletes alike, so no two writes of one condition can race.
//!
//! Callers [`submit`](ConditionWriter::submit) conditions (or [`delete`](ConditionWriter::delete)
//! them); the writer keeps the newest write per type in a pending map, waits a short coalescing
//! window, and sends everything pending as one strategic-merge patch with the pod's uid as
//! precondition. A failed patch puts its writes back unless a newer one of the same type arrived
//! meanwhile, so an older result never overwrites a newer one and nothing is lost.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod failure;
mod state;

use super::{FIELD_MANAGER, status_patch};
use crate::failures::{FailureRun, Loudness};
use crate::metrics::Metrics;
use crate::resource_version::ResourceVersion;
use failure::{code_of, explain};
use podprobe_ops::backoff::{Backoff, Failure, Policy};
use podprobe_protocol::uid_guard::refused_by_uid_guard;
use state::{State, requeue};

/// Timing of the writer.
#[derive(Debug, Clone, Copy)]
pub struct WriterConfig {
    /// Changes arriving within this window after the first go out in one patch.
    pub coalesce: Duration,
    /// How long a failed write waits (`podprobe_ops::backoff`): while the apiserver cannot
    /// answer, briefly, so that pending results follow its recovery (a refused connection costs
    /// it nothing; docs/protocol.md, "Outages"); after a refusal, up to a minute; after a 429,
    /// growing to 30 s, its `Retry-After` a floor (docs/scale.md).
    pub retry: Policy,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            coalesce: Duration::from_millis(200),
            retry: Policy::STATUS_WRITE,
        }
    }
}

/// Says the apiserver answered this sidecar again (its pod watch came back): a write waiting
/// out a backoff after the apiserver could not answer goes out now, after a short spread.
#[derive(Debug, Clone, Default)]
pub struct ApiserverAnswered(Arc<Notify>);

impl ApiserverAnswered {
    pub fn notify(&self) {
        // Only writes waiting now: an answer long before a later failure says nothing of it.
        self.0.notify_waiters();
    }

    async fn notified(&self) {
        self.0.notified().await;
    }
}

/// How far the writes released by [`ApiserverAnswered`] are spread: pods whose watches come
/// back in the same instant do not all write in it.
const RELEASE_SPREAD: Duration = Duration::from_secs(1);

/// One change to one condition of the pod: what a patch carries per condition type.
#[derive(Debug, Clone, PartialEq)]
pub enum ConditionWrite {
    Set(PodCondition),
    /// Remove the condition (`--prune-conditions`, for a probe that left the annotation).
    Delete(String),
}

impl ConditionWrite {
    pub fn condition_type(&self) -> &str {
        match self {
            ConditionWrite::Set(condition) => &condition.type_,
            ConditionWrite::Delete(condition_type) => condition_type,
        }
    }

    pub fn is_delete(&self) -> bool {
        matches!(self, ConditionWrite::Delete(_))
    }
}

/// A set is the condition itself; a delete is strategic merge's `$patch: delete` directive
/// for the list entry with that `type`.
impl serde::Serialize for ConditionWrite {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            ConditionWrite::Set(condition) => condition.serialize(serializer),
            ConditionWrite::Delete(condition_type) => {
                let mut map = serializer.serialize_map(Some(2))?;
                map.serialize_entry("type", condition_type)?;
                map.serialize_entry("$patch", "delete")?;
                map.end()
            }
        }
    }
}

/// What the writer is doing with one condition type.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WriteProgress {
    /// A write is pending, parked or on the wire: it will set the condition anyway.
    pub busy: bool,
    /// When the last write of it was queued (`None`: never).
    pub queued_at: Option<Instant>,
    /// When the apiserver last accepted a write of it (`None`: never).
    pub written_at: Option<Instant>,
    /// The pod's resourceVersion in the answer to that write (`None`: never written, or the
    /// answer carried none): a view of the pod at an older version cannot show the write.
    pub written_rv: Option<ResourceVersion>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Notify,
    idle: Notify,
    /// Cancelled by [`ConditionWriter::flush`]: the backoff being waited out then ends at once.
    flushing: CancellationToken,
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
        answered: ApiserverAnswered,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let shared = Arc::new(Shared::default());
        let writer = WriteLoop {
            pods,
            name,
            uid,
            config,
            metrics,
            shared: shared.clone(),
            answered,
            backoff: Backoff::new(config.retry),
            coalesce: true,
            isolate: false,
            failing: FailureRun::default(),
        };
        (ConditionWriter { shared }, tokio::spawn(writer.run()))
    }

    /// Queues a condition; a newer write of the same type replaces an older pending one.
    pub fn submit(&self, condition: PodCondition) {
        self.queue(ConditionWrite::Set(condition));
    }

    /// Queues a condition to write back after another writer removed or changed it. It goes
    /// without the coalescing window: it restores a result already decided, and every
    /// millisecond of the wait is a millisecond the pod shows no condition.
    pub fn write_back(&self, condition: PodCondition) {
        let mut state = self.lock();
        state.queue(ConditionWrite::Set(condition));
        state.urgent = true;
        drop(state);
        self.shared.wake.notify_one();
    }

    /// Queues the removal of a condition; replaces a pending write of the same type, so a
    /// result that was still waiting cannot bring the condition back.
    pub fn delete(&self, condition_type: &str) {
        self.queue(ConditionWrite::Delete(condition_type.to_owned()));
    }

    fn queue(&self, write: ConditionWrite) {
        self.lock().queue(write);
        self.shared.wake.notify_one();
    }

    /// Whether nothing is pending or in flight.
    pub fn is_idle(&self) -> bool {
        let state = self.lock();
        state.pending.is_empty() && state.parked.is_empty() && state.in_flight.is_empty()
    }

    /// What the writer is doing with `condition_type`, read under one lock.
    pub fn progress(&self, condition_type: &str) -> WriteProgress {
        self.lock().progress(condition_type)
    }

    /// Waits until everything submitted is written, at most `limit`. Returns whether it was.
    ///
    /// The writer's last chance (the pod is stopping): a write waiting out a backoff, parked or
    /// not, goes out now instead of after the process has exited, and without the coalescing
    /// window. Only the wait running now is cut short: a write that fails again waits its
    /// backoff, so a flush never turns into a loop of requests.
    pub async fn flush(&self, limit: Duration) -> bool {
        {
            let mut state = self.lock();
            state.unpark();
            state.urgent = true;
        }
        self.shared.flushing.cancel();
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
    // A panic while holding this lock cannot leave the maps half-updated (single inserts), so a
    // poisoned lock is still usable.
    shared
        .state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The writer task: one patch at a time, newest write per type wins.
struct WriteLoop {
    pods: Api<Pod>,
    name: String,
    uid: watch::Receiver<Option<String>>,
    config: WriterConfig,
    metrics: Metrics,
    shared: Arc<Shared>,
    answered: ApiserverAnswered,
    backoff: Backoff,
    failing: FailureRun,
    /// Wait the coalescing window before the next patch (not when retrying or isolating).
    coalesce: bool,
    /// After a 422 for a batch: send one condition per patch until the pending set drains, so
    /// the one the apiserver refuses cannot hold back the others.
    isolate: bool,
}

/// What the loop should do next.
enum Next {
    Write,
    Wait,
}

impl WriteLoop {
    async fn run(mut self) {
        loop {
            if let Next::Wait = self.wait_for_work().await {
                continue;
            }
            if self.coalesce && !lock(&self.shared).urgent && !self.shared.flushing.is_cancelled() {
                tokio::time::sleep(self.config.coalesce).await;
            }
            let Some(pod_uid) = self.uid.borrow_and_update().clone() else {
                tracing::info!(pod = %self.name, "waiting for the pod's uid before writing conditions");
                if self.uid.changed().await.is_err() {
                    return;
                }
                continue;
            };
            let batch = lock(&self.shared).take_batch(self.isolate);
            if batch.is_empty() {
                self.isolate = false;
                continue;
            }
            let patch = status_patch(&pod_uid, &batch);
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let result = self
                .pods
                .patch_status(&self.name, &params, &Patch::Strategic(&patch))
                .await;
            match result {
                Ok(pod) => self.accepted(&batch, pod.metadata.resource_version),
                Err(kube::Error::Api(status))
                    if batch[0].is_delete()
                        && (status.code == 403
                            || status.code == 422 && !refused_by_uid_guard(&status)) =>
                {
                    self.delete_refused(&batch, &status)
                }
                Err(kube::Error::Api(status))
                    if status.code == 422 && !refused_by_uid_guard(&status) =>
                {
                    self.refused_as_invalid(batch, &status.message)
                }
                Err(error) => self.failed(batch, &error).await,
            }
        }
    }

    /// Sleeps until something is due; `Next::Write` when pending writes are.
    async fn wait_for_work(&mut self) -> Next {
        let woken = self.shared.wake.notified();
        let (nothing_pending, nothing_parked) = {
            let state = lock(&self.shared);
            (state.pending.is_empty(), state.parked.is_empty())
        };
        if nothing_pending && nothing_parked {
            self.shared.idle.notify_waiters();
            woken.await;
            self.coalesce = true;
            return Next::Wait;
        }
        if nothing_pending {
            // Only refused writes are left: try them again after the backoff, or write a new
            // result first if one arrives meanwhile.
            tokio::select! {
                () = woken => self.coalesce = true,
                () = tokio::time::sleep(self.backoff.wait(Failure::Refused { retry_after: None })) => {
                    lock(&self.shared).unpark();
                    self.coalesce = false;
                }
            }
            return Next::Wait;
        }
        Next::Write
    }

    fn accepted(&mut self, batch: &[ConditionWrite], version: Option<String>) {
        self.metrics.write_ok();
        let types: Vec<&str> = batch.iter().map(ConditionWrite::condition_type).collect();
        if let Some((attempts, over)) = self.failing.succeeded() {
            tracing::info!(pod = %self.name, conditions = ?types,
                "conditions written again after {attempts} failed attempts over {over:.1?}");
        }
        tracing::debug!(pod = %self.name, conditions = ?types, "conditions written");
        let mut state = lock(&self.shared);
        state.landed(batch, version.map(ResourceVersion::new));
        if state.parked.is_empty() {
            self.backoff.reset();
        }
        self.isolate = self.isolate && !state.pending.is_empty();
        self.coalesce = !self.isolate;
    }

    /// A prune the apiserver will never accept (an admission policy, or RBAC) is given up, not
    /// retried: the condition stays, as it would without `--prune-conditions`.
    fn delete_refused(&mut self, batch: &[ConditionWrite], status: &kube::core::Status) {
        self.metrics.write_error(Some(status.code));
        lock(&self.shared).in_flight.clear();
        let types: Vec<&str> = batch.iter().map(ConditionWrite::condition_type).collect();
        tracing::warn!(pod = %self.name, conditions = ?types, code = status.code,
            "the apiserver refused to remove the conditions of removed probes; they stay (an admission policy that lets the sidecar remove only condition types its annotation declares refuses every prune): {}",
            status.message);
    }

    fn refused_as_invalid(&mut self, batch: Vec<ConditionWrite>, server: &str) {
        let name = &self.name;
        self.metrics.write_error(Some(422));
        self.coalesce = false;
        let mut state = lock(&self.shared);
        if batch.len() > 1 {
            tracing::warn!(pod = %name, conditions = batch.len(), server = %server,
                "the apiserver refused a patch of several conditions as invalid; writing them one at a time so that the others are not held back");
            state.in_flight.clear();
            requeue(&mut state.pending, batch);
            self.isolate = true;
        } else {
            let types: Vec<&str> = batch.iter().map(ConditionWrite::condition_type).collect();
            tracing::warn!(pod = %name, conditions = ?types,
                "writing conditions of pod {name} failed (the apiserver refused the conditions as invalid); retried with backoff apart from the other conditions: {server}");
            state.park(batch);
            self.isolate = self.isolate && !state.pending.is_empty();
        }
    }

    async fn failed(&mut self, batch: Vec<ConditionWrite>, error: &kube::Error) {
        {
            let mut state = lock(&self.shared);
            requeue(&mut state.pending, batch);
            state.in_flight.clear();
        }
        let code = code_of(error);
        self.metrics.write_error(code);
        self.log_failure(code, error);
        let failure = Failure::of(error);
        let wait = self.backoff.wait(failure);
        self.coalesce = false;
        // A write that failed during the flush waits as any other: one more try per flush.
        let flushing = self.shared.flushing.clone();
        let flush_pending = !flushing.is_cancelled();
        // Only a write that waits out an outage is released by the apiserver's answer.
        let released_by_answer = matches!(failure, Failure::Unavailable { retry_after: None });
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = flushing.cancelled(), if flush_pending => {}
            () = self.answered.notified(), if released_by_answer => {
                tokio::time::sleep(RELEASE_SPREAD.mul_f64(rand::random::<f64>())).await;
            }
        }
    }

    /// Logged as [`FailureRun`] says: during an outage every pod retries every few seconds.
    fn log_failure(&mut self, code: Option<u16>, error: &kube::Error) {
        let message = explain(&self.name, code, error);
        match self.failing.failed() {
            Loudness::First => tracing::warn!(pod = %self.name, "{message}"),
            Loudness::Still { attempts, over } => {
                tracing::warn!(pod = %self.name, "still failing after {attempts} attempts over {over:.0?}: {message}")
            }
            Loudness::Quiet => tracing::debug!(pod = %self.name, "{message}"),
        }
    }
}

#[cfg(test)]
mod tests;
