//! Per object, what a controller remembers between reconciles — above all the backoff of its
//! failed writes in a row (`podprobe_ops::backoff`): under API Priority and Fairness a fleet's
//! writes must not all come back after a fixed delay. An entry lives until the controller
//! removes it or the object is gone from its cache, so objects deleted meanwhile are not kept
//! for the manager's lifetime.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;
use podprobe_ops::backoff::{Backoff, Failure, Policy};

/// A value per object of a controller's cache, dropped with the object.
#[derive(Debug)]
pub struct PerObject<K: Resource<DynamicType = ()>, V>(Mutex<HashMap<ObjectRef<K>, V>>);

impl<K: Resource<DynamicType = ()>, V> Default for PerObject<K, V> {
    fn default() -> Self {
        PerObject(Mutex::default())
    }
}

impl<K: Resource<DynamicType = ()> + Clone, V> PerObject<K, V>
where
    ObjectRef<K>: Hash + Eq,
{
    pub fn lock(&self) -> MutexGuard<'_, HashMap<ObjectRef<K>, V>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Follow the controller's cache (after it applied `event`): a deleted object's entry
    /// goes, and a relist keeps only the objects it still holds (a deletion missed while the
    /// watch was away has no `Delete` event).
    pub fn observe(&self, event: &Event<K>, cache: &Store<K>) {
        let mut entries = self.lock();
        if entries.is_empty() {
            return;
        }
        match event {
            Event::Delete(object) => {
                entries.remove(&ObjectRef::from_obj(object));
            }
            Event::InitDone => entries.retain(|object, _| cache.get(object).is_some()),
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

/// Per object, the backoff of its failed writes in a row.
#[derive(Debug)]
pub struct Retries<K: Resource<DynamicType = ()>> {
    policy: Policy,
    backoffs: PerObject<K, Backoff>,
}

impl<K: Resource<DynamicType = ()> + Clone> Retries<K>
where
    ObjectRef<K>: Hash + Eq,
{
    pub fn new(policy: Policy) -> Self {
        Retries {
            policy,
            backoffs: PerObject::default(),
        }
    }

    /// How long to wait before writing `object` again after `failure`.
    pub fn failed(&self, object: ObjectRef<K>, failure: Failure) -> Duration {
        let policy = self.policy;
        self.backoffs
            .lock()
            .entry(object)
            .or_insert_with(|| Backoff::new(policy))
            .wait(failure)
    }

    /// The object's write was answered: its next failure starts the backoff over.
    pub fn answered(&self, object: &ObjectRef<K>) {
        self.backoffs.lock().remove(object);
    }

    /// See [`PerObject::observe`].
    pub fn observe(&self, event: &Event<K>, cache: &Store<K>) {
        self.backoffs.observe(event, cache);
    }

    pub fn len(&self) -> usize {
        self.backoffs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.backoffs.is_empty()
    }
}
