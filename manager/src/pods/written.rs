//! The memory of marker patches sent, so that a stale cached pod never repeats one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use super::CachedPod;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::markers::MarkerPatch;

/// Marker patches sent whose result the pod cache has not shown yet.
///
/// Reconciles read the pod from the cache, and not only the pod's own watch events trigger them
/// (PPM announcements, node label changes): such a reconcile can start after a patch of the pod
/// returned but before the watch delivered the patched version, and would send the same patch
/// again from the same stale pod (one extra write per pod per stale trigger). So per pod this
/// keeps the last patch sent and the resourceVersion the server answered with, until the watch
/// delivers that version (or the pod goes, or the watch relists). Meanwhile the cached pod is
/// older than the server's and nothing is sent: when the stale view wanted the same patch
/// nothing is lost (the server has it already); when it wanted something else, the pod is
/// reconciled again once the cache has caught up.
///
/// The cache has caught up when its version is the written one or a later one: the watch can
/// deliver the written version before the patch's answer is recorded, and the pod can move on
/// before any reconcile reads it, so that version may never be seen here. Later is told by
/// number (the apiserver's versions are etcd revisions); a version that is not a number only
/// counts when equal, and no entry holds a pod back longer than [`PENDING_MAX`]: at worst one
/// patch is sent twice, never one lost.
#[derive(Debug, Default)]
pub struct WrittenPatches {
    pending: Mutex<HashMap<ObjectRef<CachedPod>, Written>>,
}

/// How long a write not yet seen in the cache holds reconciles of its pod back.
pub const PENDING_MAX: Duration = Duration::from_secs(5);

/// Whether a cached pod at version `cached` includes the write answered with `written`.
fn caught_up(cached: Option<&String>, written: &str) -> bool {
    let Some(cached) = cached else {
        return false;
    };
    match (cached.parse::<u64>(), written.parse::<u64>()) {
        (Ok(cached), Ok(written)) => cached >= written,
        _ => cached == written,
    }
}

#[derive(Debug)]
struct Written {
    patch: MarkerPatch,
    /// The pod's resourceVersion after the patch, as the server answered.
    resource_version: String,
    /// A reconcile wanted something else meanwhile: run again once the cache has the write.
    recheck: bool,
    recorded: Instant,
}

impl WrittenPatches {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<CachedPod>, Written>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `patch` of `pod` was answered with `resource_version`.
    pub fn record(
        &self,
        pod: ObjectRef<CachedPod>,
        patch: MarkerPatch,
        resource_version: Option<String>,
    ) {
        // Without a version there is no telling when the cache has the write.
        if let Some(resource_version) = resource_version {
            self.lock().insert(
                pod,
                Written {
                    patch,
                    resource_version,
                    recheck: false,
                    recorded: Instant::now(),
                },
            );
        }
    }

    /// The cached `pod` predates the last patch sent for it: send nothing now. `wanted` is what
    /// this stale view asks for; when it differs from that patch, the pod is reconciled again
    /// once the cache has the write.
    pub fn is_stale(
        &self,
        pod_ref: &ObjectRef<CachedPod>,
        pod: &CachedPod,
        wanted: Option<&MarkerPatch>,
    ) -> bool {
        let mut pending = self.lock();
        let Some(w) = pending.get_mut(pod_ref) else {
            return false;
        };
        if caught_up(pod.metadata.resource_version.as_ref(), &w.resource_version)
            || w.recorded.elapsed() >= PENDING_MAX
        {
            // The cache has the write (a patch that changed nothing has no watch event), or
            // has had time enough to show it.
            pending.remove(pod_ref);
            return false;
        }
        if wanted != Some(&w.patch) {
            w.recheck = true;
        }
        true
    }

    /// Follow the pod watch (after the cache applied `event`); pods to reconcile again go to
    /// `recheck`.
    pub fn observe(
        &self,
        event: &Event<CachedPod>,
        recheck: &mpsc::UnboundedSender<ObjectRef<CachedPod>>,
    ) {
        let mut pending = self.lock();
        if pending.is_empty() {
            return;
        }
        match event {
            Event::Apply(pod) => {
                let pod_ref = ObjectRef::from_obj(pod);
                let has_write = pending.get(&pod_ref).is_some_and(|w| {
                    caught_up(pod.metadata.resource_version.as_ref(), &w.resource_version)
                });
                if has_write && pending.remove(&pod_ref).is_some_and(|w| w.recheck) {
                    let _ = recheck.send(pod_ref);
                }
            }
            Event::Delete(pod) => {
                pending.remove(&ObjectRef::from_obj(pod));
            }
            // A relist replaces the cache with a list newer than any write that had returned
            // when it started.
            Event::InitDone => {
                for (pod_ref, w) in pending.drain() {
                    if w.recheck {
                        let _ = recheck.send(pod_ref);
                    }
                }
            }
            Event::Init | Event::InitApply(_) => {}
        }
    }

    /// Pods with a write not yet seen in the cache.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
