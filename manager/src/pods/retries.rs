//! Per pod, the backoff of its failed marker patches in a row (`podprobe_ops::backoff`): under
//! API Priority and Fairness a fleet's marker patches must not all come back after 1 s. An
//! entry lives from a pod's first failed patch until a patch of it is answered or the pod is
//! gone from the cache, so pods deleted while failing are not kept for the manager's lifetime.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;
use podprobe_ops::backoff::{Backoff, Failure, Policy};

use super::CachedPod;

#[derive(Debug, Default)]
pub struct PatchRetries(Mutex<HashMap<ObjectRef<CachedPod>, Backoff>>);

impl PatchRetries {
    fn lock(&self) -> MutexGuard<'_, HashMap<ObjectRef<CachedPod>, Backoff>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How long to wait before patching `pod` again after `failure`.
    pub fn failed(&self, pod: ObjectRef<CachedPod>, failure: Failure) -> Duration {
        self.lock()
            .entry(pod)
            .or_insert_with(|| Backoff::new(Policy::WATCH))
            .wait(failure)
    }

    /// The pod's patch was answered: its next failure starts the backoff over.
    pub fn answered(&self, pod: &ObjectRef<CachedPod>) {
        self.lock().remove(pod);
    }

    /// Follow the pod cache (after it applied `event`): a deleted pod's backoff goes, and a
    /// relist keeps only the pods it still holds (a deletion missed while the watch was away
    /// has no `Delete` event).
    pub fn observe(&self, event: &Event<CachedPod>, cache: &Store<CachedPod>) {
        let mut retries = self.lock();
        if retries.is_empty() {
            return;
        }
        match event {
            Event::Delete(pod) => {
                retries.remove(&ObjectRef::from_obj(pod));
            }
            Event::InitDone => retries.retain(|pod, _| cache.get(pod).is_some()),
            Event::Apply(_) | Event::Init | Event::InitApply(_) => {}
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
