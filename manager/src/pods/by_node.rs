//! Pods by node and which nodes are serverless, so that a node label change reaches exactly the
//! pods on that node.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use podprobe_ops::backoff::WatchRetry;

use super::{CachedPod, MarkerScope, is_serverless};

/// Pods by node name, kept from the pod watch (the same events the pod cache applies), so a node
/// change reaches exactly the pods on that node without a list call.
#[derive(Debug, Default)]
pub struct PodsByNode {
    inner: Mutex<NodeIndex>,
}

#[derive(Debug, Default)]
struct NodeIndex {
    by_node: HashMap<String, HashSet<ObjectRef<CachedPod>>>,
    node_of: HashMap<ObjectRef<CachedPod>, String>,
    /// During a relist: the listed pods, swapped in at its end (as the cache does).
    relist: Option<Vec<(ObjectRef<CachedPod>, String)>>,
}

impl NodeIndex {
    fn remove(&mut self, pod_ref: &ObjectRef<CachedPod>) {
        if let Some(node) = self.node_of.remove(pod_ref)
            && let Some(pods) = self.by_node.get_mut(&node)
        {
            pods.remove(pod_ref);
            if pods.is_empty() {
                self.by_node.remove(&node);
            }
        }
    }

    fn insert(&mut self, pod_ref: ObjectRef<CachedPod>, node: String) {
        self.by_node
            .entry(node.clone())
            .or_default()
            .insert(pod_ref.clone());
        self.node_of.insert(pod_ref, node);
    }
}

impl PodsByNode {
    fn lock(&self) -> std::sync::MutexGuard<'_, NodeIndex> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Follow the pod watch.
    pub fn observe(&self, event: &Event<CachedPod>) {
        let mut index = self.lock();
        match event {
            Event::Apply(pod) => {
                let pod_ref = ObjectRef::from_obj(pod);
                let node = pod.node();
                if index.node_of.get(&pod_ref).map(String::as_str) != node {
                    index.remove(&pod_ref);
                    if let Some(node) = node {
                        index.insert(pod_ref, node.to_owned());
                    }
                }
            }
            Event::Delete(pod) => index.remove(&ObjectRef::from_obj(pod)),
            Event::Init => index.relist = Some(Vec::new()),
            Event::InitApply(pod) => {
                if let (Some(listed), Some(node)) = (index.relist.as_mut(), pod.node()) {
                    listed.push((ObjectRef::from_obj(pod), node.to_owned()));
                }
            }
            Event::InitDone => {
                let listed = index.relist.take().unwrap_or_default();
                index.by_node.clear();
                index.node_of.clear();
                for (pod_ref, node) in listed {
                    index.insert(pod_ref, node);
                }
            }
        }
    }

    /// The pods on `node`.
    pub fn pods_on(&self, node: &str) -> Vec<ObjectRef<CachedPod>> {
        self.lock()
            .by_node
            .get(node)
            .map(|pods| pods.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Which nodes are serverless, as last applied to the node cache; tells the nodes whose pods
/// must be looked at again.
#[derive(Debug, Default)]
pub(super) struct ServerlessNodes {
    current: HashMap<String, bool>,
    relist: Option<HashMap<String, bool>>,
}

impl ServerlessNodes {
    /// Nodes that became or stopped being serverless with `event` (already applied to the node
    /// cache: for a relist, at its end, when the cache swaps the list in).
    pub(super) fn changed(&mut self, event: &Event<Node>, scope: &MarkerScope) -> Vec<String> {
        let name = |n: &Node| n.metadata.name.clone().unwrap_or_default();
        match event {
            Event::Apply(node) => {
                let now = is_serverless(node, scope);
                let was = self.current.insert(name(node), now).unwrap_or(false);
                if was != now {
                    vec![name(node)]
                } else {
                    Vec::new()
                }
            }
            Event::Delete(node) => {
                if self.current.remove(&name(node)).unwrap_or(false) {
                    vec![name(node)]
                } else {
                    Vec::new()
                }
            }
            Event::Init => {
                self.relist = Some(HashMap::new());
                Vec::new()
            }
            Event::InitApply(node) => {
                if let Some(listed) = self.relist.as_mut() {
                    listed.insert(name(node), is_serverless(node, scope));
                }
                Vec::new()
            }
            Event::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                let old = std::mem::replace(&mut self.current, listed);
                let mut changed: Vec<String> = self
                    .current
                    .iter()
                    .filter(|(n, now)| old.get(*n).copied().unwrap_or(false) != **now)
                    .map(|(n, _)| n.clone())
                    .collect();
                changed.extend(
                    old.into_iter()
                        .filter(|(n, was)| *was && !self.current.contains_key(n))
                        .map(|(n, _)| n),
                );
                changed
            }
        }
    }
}

/// Pods to look at again because their node became or stopped being serverless; fills the node
/// cache the reconciles read.
pub(super) fn node_triggers(
    client: Client,
    writer: reflector::store::Writer<Node>,
    scope: MarkerScope,
    pods: Arc<PodsByNode>,
) -> impl Stream<Item = ObjectRef<CachedPod>> + Send + 'static {
    let mut serverless = ServerlessNodes::default();
    watcher::watcher(Api::<Node>::all(client), watcher::Config::default())
        .retry_backoff()
        .reflect(writer)
        .filter_map(|event| {
            futures::future::ready(match event {
                Ok(e) => Some(e),
                Err(e) => {
                    tracing::warn!("Node watch: {e}");
                    None
                }
            })
        })
        .flat_map(move |event| {
            let refs: Vec<ObjectRef<CachedPod>> = serverless
                .changed(&event, &scope)
                .iter()
                .flat_map(|node| pods.pods_on(node))
                .collect();
            futures::stream::iter(refs)
        })
}
