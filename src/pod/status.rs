//! The file source's window on its pod's status. The downward-API file carries annotations
//! only, but probing by the kubelet's rules needs the target containers' state (wait for
//! `started`, count the initial delay from `startedAt`, start over after a restart, report a
//! container that is not running) and the spec's named ports.
//!
//! Instead of a watch held for the pod's life (a connection, a cacheWatcher and its goroutines
//! on the apiserver for every pod: docs/scale.md), the pod is read when its status matters: at
//! start, again while a probed container has not started (1 s, doubling to 30 s), and
//! [`READ_DELAY`] after an attempt says a container may have stopped or been replaced
//! ([`ReadTriggers`]: a probe's first failure after success, first success after failing, or
//! an attempt that could not run), at most once every [`MIN_SPACING`]. A steady pod reads
//! nothing, and its connection closes between reads.
//!
//! The pod's conditions are not taken from these reads: they would be stale between them, and
//! repairing from a stale view would write back what nobody removed.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::{PodIdentity, PodView};
use crate::failures::{FailureRun, Loudness};
use crate::runner::ContainerView;

mod triggers;
pub use triggers::ReadTriggers;

/// The least time between two reads asked for by probes' attempts.
pub const MIN_SPACING: Duration = Duration::from_secs(5);

/// How long after an attempt asked for it the pod is read: a probe notices a dead container
/// within its period, the kubelet within its 1 s relist and reports the container stopped or
/// restarted right after; read at once, the status would often still show the old container.
pub const READ_DELAY: Duration = Duration::from_secs(2);

/// The first and the longest wait between reads while a container has not started, or while
/// the apiserver does not answer.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Asks for a read of the pod's status ([`ReadTriggers`] says when). Requests made while a read
/// is in progress or spaced out are kept, and served by one read.
#[derive(Debug, Clone, Default)]
pub struct StatusReads(Arc<Notify>);

impl StatusReads {
    pub fn request(&self) {
        self.0.notify_one();
    }
}

/// What one read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// Every probe-able container runs and has started: nothing to read until asked.
    Settled,
    /// A container is absent, not running or not started yet, or the apiserver did not answer:
    /// read again soon.
    Unsettled,
    /// Reading cannot help (RBAC forbids it, the pod is gone, terminating or replaced).
    Stop,
}

/// Reads the pod and publishes its containers, their states and its IP into the views the file
/// source publishes its annotation into.
pub struct StatusReader {
    pods: Api<Pod>,
    identity: PodIdentity,
    tx: watch::Sender<PodView>,
    failing: FailureRun,
    /// `podprobe_pod_status_reads_total`.
    reads: Counter,
}

impl std::fmt::Debug for StatusReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusReader")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl StatusReader {
    pub fn new(
        client: Client,
        identity: PodIdentity,
        tx: watch::Sender<PodView>,
        reads: Counter,
    ) -> Self {
        StatusReader {
            pods: Api::namespaced(client, &identity.namespace),
            identity,
            tx,
            failing: FailureRun::default(),
            reads,
        }
    }

    /// One read of the pod, published when it changed what the views say.
    pub async fn read(&mut self) -> Read {
        self.reads.inc();
        let pod = match self.pods.get(&self.identity.name).await {
            Ok(pod) => pod,
            Err(e) => return self.failed(&e),
        };
        if let Some((attempts, over)) = self.failing.succeeded() {
            tracing::info!(
                "the pod's status read works again after {attempts} failed attempts over {over:.1?}"
            );
        }
        if let (Some(ours), Some(theirs)) = (&self.identity.uid, &pod.metadata.uid)
            && ours != theirs
        {
            tracing::warn!(our_uid = %ours, seen_uid = %theirs,
                "the pod read has another uid (a same-named replacement): its status is not ours; no more status reads");
            return Read::Stop;
        }
        let read = PodView::from_pod(&pod);
        let outcome = if read.terminating {
            Read::Stop
        } else if settled(&read) {
            Read::Settled
        } else {
            Read::Unsettled
        };
        tracing::debug!(?outcome, "read the pod's status");
        self.tx.send_if_modified(|current| {
            let merged = PodView {
                // The file's: the annotation, and no conditions (see the module's comment),
                // so nor the version they would be judged against.
                annotation: current.annotation.clone(),
                conditions: None,
                status_writers: Vec::new(),
                resource_version: None,
                ..read
            };
            let changed = *current != merged;
            *current = merged;
            changed
        });
        outcome
    }

    fn failed(&mut self, error: &kube::Error) -> Read {
        let code = match error {
            kube::Error::Api(status) => Some(status.code),
            _ => None,
        };
        match code {
            Some(403) => {
                tracing::info!(
                    "the sidecar may not read its pod ({error}): probes run without their \
                     containers' status (no wait for the container to start, no named ports)"
                );
                Read::Stop
            }
            Some(404) => {
                tracing::info!("the pod is gone: no more status reads");
                Read::Stop
            }
            _ => {
                match self.failing.failed() {
                    Loudness::First => tracing::warn!(
                        "cannot read the pod's status through the apiserver, retrying: {error}"
                    ),
                    Loudness::Still { attempts, over } => tracing::warn!(
                        "reading the pod's status still fails ({attempts} attempts over {over:.0?}), retrying: {error}"
                    ),
                    Loudness::Quiet => tracing::debug!("reading the pod's status failed: {error}"),
                }
                Read::Unsettled
            }
        }
    }

    /// Reads as the module's comment says, after `first` (the read made before probing began).
    pub async fn run(mut self, first: Read, wanted: StatusReads) {
        let mut outcome = first;
        let mut retry = RETRY_MIN;
        let mut last_read = Instant::now();
        loop {
            match outcome {
                Read::Stop => return,
                Read::Settled => {
                    retry = RETRY_MIN;
                    wanted.0.notified().await;
                    let at = (Instant::now() + READ_DELAY).max(last_read + MIN_SPACING);
                    tokio::time::sleep_until(at).await;
                }
                Read::Unsettled => {
                    // A failure meanwhile does not hurry the retry: it is read soon anyway.
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
            last_read = Instant::now();
            outcome = self.read().await;
        }
    }
}

/// Every probe-able container the status lists runs and has started (or does not say).
fn settled(view: &PodView) -> bool {
    view.containers.is_some()
        && view
            .statuses
            .values()
            .all(|s| matches!(s, ContainerView::Running { started, .. } if *started != Some(false)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(statuses: &[ContainerView]) -> PodView {
        PodView {
            containers: Some(Default::default()),
            statuses: statuses
                .iter()
                .enumerate()
                .map(|(i, s)| (format!("c{i}"), s.clone()))
                .collect(),
            ..PodView::default()
        }
    }

    fn running(started: Option<bool>) -> ContainerView {
        ContainerView::Running {
            container_id: Some("containerd://1".into()),
            started_at: None,
            started,
        }
    }

    #[test]
    fn settled_only_when_every_container_runs_and_started() {
        assert!(settled(&view(&[running(Some(true)), running(None)])));
        assert!(!settled(&view(&[
            running(Some(true)),
            running(Some(false))
        ])));
        assert!(!settled(&view(&[ContainerView::Absent])));
        assert!(!settled(&view(&[ContainerView::NotRunning {
            container_id: None
        }])));
        assert!(
            !settled(&PodView::default()),
            "a view without the spec is not a read"
        );
    }
}
