//! Informer caches shared by the webhooks and the controllers: PodProbeMarkers indexed by
//! namespace (so a pod event or an admission request reads its namespace's PPMs in O(1) of the
//! cluster size), and plain reflector stores for namespaces and nodes.
//!
//! The PPM cache also announces every PPM it applied (created, spec changed, deleted) on a
//! broadcast channel *after* the index has it, so a controller reacting to the announcement
//! never reads a stale index. Status-only changes are not announced: nothing a pod gets depends
//! on them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector::Lookup};
use kube::{Api, Client, Resource};
use podprobe_ops::backoff::WatchRetry;
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::crd::PodProbeMarker;

/// What the PPM cache announces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PpmChange {
    /// This PPM was created, changed or deleted.
    One(ObjectRef<PodProbeMarker>),
    /// The whole cache was (re)listed; anything may have changed.
    All,
}

/// PodProbeMarkers by namespace, sorted by name.
#[derive(Debug)]
pub struct PpmCache {
    by_namespace: RwLock<HashMap<String, Arc<Vec<PodProbeMarker>>>>,
    synced: watch::Sender<bool>,
    changes: broadcast::Sender<PpmChange>,
}

impl Default for PpmCache {
    fn default() -> Self {
        Self {
            by_namespace: RwLock::default(),
            synced: watch::Sender::new(false),
            changes: broadcast::channel(4096).0,
        }
    }
}

impl PpmCache {
    /// The PPMs of `namespace` (empty when none).
    pub fn namespace(&self, namespace: &str) -> Arc<Vec<PodProbeMarker>> {
        self.by_namespace
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(namespace)
            .cloned()
            .unwrap_or_default()
    }

    /// Resolves once the first full list has been applied.
    pub async fn wait_synced(&self) {
        let mut synced = self.synced.subscribe();
        // The sender lives as long as `self`, so the wait ends only by the list.
        let _ = synced.wait_for(|s| *s).await;
    }

    /// Announcements of applied changes, from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<PpmChange> {
        self.changes.subscribe()
    }

    fn rebuild(&self, store: &Store<PodProbeMarker>, namespaces: &BTreeSet<String>) {
        let all = store.state();
        let mut index = self.by_namespace.write().unwrap_or_else(|e| e.into_inner());
        for ns in namespaces {
            let mut ppms: Vec<PodProbeMarker> = all
                .iter()
                .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
                .map(|p| (**p).clone())
                .collect();
            ppms.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            if ppms.is_empty() {
                index.remove(ns);
            } else {
                index.insert(ns.clone(), Arc::new(ppms));
            }
        }
    }

    /// Replace the index for tests and benchmarks that do not run a watch.
    pub fn set_for_tests(&self, ppms: Vec<PodProbeMarker>) {
        let mut by: HashMap<String, Vec<PodProbeMarker>> = HashMap::new();
        for p in ppms {
            by.entry(p.metadata.namespace.clone().unwrap_or_default())
                .or_default()
                .push(p);
        }
        let mut index = self.by_namespace.write().unwrap_or_else(|e| e.into_inner());
        index.clear();
        for (ns, mut v) in by {
            v.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            index.insert(ns, Arc::new(v));
        }
        self.synced.send_replace(true);
    }

    /// Watch every PodProbeMarker of the cluster into the index until `shutdown`.
    pub fn spawn(self: &Arc<Self>, client: Client, shutdown: CancellationToken) {
        let cache = self.clone();
        tokio::spawn(async move {
            let (store, mut writer) = reflector::store::<PodProbeMarker>();
            let stream = watcher(Api::<PodProbeMarker>::all(client)).retry_backoff();
            let mut stream = std::pin::pin!(stream);
            loop {
                let event = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    e = stream.next() => e,
                };
                let event = match event {
                    Some(Ok(e)) => e,
                    Some(Err(e)) => {
                        tracing::warn!("PodProbeMarker watch: {e}");
                        continue;
                    }
                    None => return,
                };
                // Pods read only the spec of a PPM: a status write (the status controller's,
                // on every change of a matched-pod count) must not send every pod of the
                // PPM back through the pod controller.
                let spec_changed = match &event {
                    Event::Apply(p) => store
                        .get(&ObjectRef::from_obj(p))
                        .is_none_or(|old| old.spec != p.spec),
                    _ => true,
                };
                writer.apply_watcher_event(&event);
                match &event {
                    Event::Apply(p) | Event::Delete(p) => {
                        let ns = p.metadata.namespace.clone().unwrap_or_default();
                        cache.rebuild(&store, &BTreeSet::from([ns]));
                        if spec_changed {
                            let _ = cache.changes.send(PpmChange::One(ObjectRef::from_obj(p)));
                        }
                    }
                    Event::InitDone => {
                        let mut namespaces: BTreeSet<String> = cache
                            .by_namespace
                            .read()
                            .unwrap_or_else(|e| e.into_inner())
                            .keys()
                            .cloned()
                            .collect();
                        namespaces.extend(
                            store
                                .state()
                                .iter()
                                .filter_map(|p| p.metadata.namespace.clone()),
                        );
                        cache.rebuild(&store, &namespaces);
                        cache.synced.send_replace(true);
                        let _ = cache.changes.send(PpmChange::All);
                    }
                    Event::Init | Event::InitApply(_) => {}
                }
            }
        });
    }
}

fn watcher<K>(api: Api<K>) -> impl futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher::watcher(api, watcher::Config::default())
}

/// A reflector store of every `K` in the cluster, kept until `shutdown`; readiness through
/// [`Store::wait_until_ready`].
pub fn spawn_store<K>(client: Client, shutdown: CancellationToken) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Lookup<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let stream = watcher(Api::<K>::all(client))
        .retry_backoff()
        .reflect(writer)
        .map_err(|e| tracing::warn!("{} watch: {e}", <K as Resource>::kind(&())))
        .for_each(|_| futures::future::ready(()));
    spawn_until(stream, shutdown);
    store
}

/// Runs `reflection` until it ends or `shutdown`.
fn spawn_until(
    reflection: impl std::future::Future<Output = ()> + Send + 'static,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = reflection => {}
        }
    });
}

/// A reflector store of the cluster's nodes for the pod webhook's shape decision, holding of
/// each node only its name, labels and spec (taints): a node's status (images, conditions)
/// and annotations are most of its size, and a cluster may have thousands.
pub fn spawn_node_store(client: Client, shutdown: CancellationToken) -> Store<Node> {
    let (store, writer) = reflector::store::<Node>();
    let stream = watcher(Api::<Node>::all(client))
        .retry_backoff()
        .modify(|node| {
            node.status = None;
            node.metadata.annotations = None;
            node.metadata.managed_fields = None;
        })
        .reflect(writer)
        .map_err(|e| tracing::warn!("Node watch: {e}"))
        .for_each(|_| futures::future::ready(()));
    spawn_until(stream, shutdown);
    store
}

/// The labels of namespace `name` in `store`, if known.
pub fn namespace_labels(store: &Store<Namespace>, name: &str) -> Option<BTreeMap<String, String>> {
    store
        .get(&ObjectRef::new(name))
        .and_then(|n| n.metadata.labels.clone())
}
