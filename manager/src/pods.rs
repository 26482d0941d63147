//! The pod controller (standalone mode): one reconcile per pod change that matters, at most one
//! strategic-merge metadata patch per reconcile, covering both
//!
//! - **markers**: `markerPolicy` labels/annotations from the probe conditions ([`markers`]), for
//!   pods on serverless nodes (node label selector, default `type=virtual-kubelet`) or running
//!   the podprobe sidecar (a container or restartable init container named `podprobe`, or any
//!   container whose image contains `podprobe`);
//! - **propagation** (beyond OpenKruise): the `kruise.io/podprobe` and
//!   `kruise.io/podprobemarker-list` annotations of every active pod follow the PPMs of its
//!   namespace. They are re-derived from the PPM *selectors*: after admission the list
//!   annotation is the manager's record of what it wrote, not an input, so a pod that stops
//!   matching (labels changed, PPM deleted) loses both annotations, and a PPM created later is
//!   backfilled. Consequence for OpenKruise-style pinning (a list annotation set by the pod's
//!   creator, TV-05): it is honoured by the webhook at admission, and replaced by the selector
//!   view at the pod's first reconcile. A pod carrying `kruise.io/podprobe` without the list
//!   annotation was annotated by hand and is never touched.
//!
//! Events: the pod watch is filtered by a fingerprint of what these decisions read (condition
//! types and statuses, labels, the two annotations, phase, deletion, node); the manager's own
//! marker patch changes labels only in ways the next reconcile finds already done, so it costs
//! one extra reconcile and no patch. PPM spec changes reach the pods of their namespace through the
//! PPM cache's announcements, after the cache applied them; a node that becomes or stops being
//! serverless (label change) reaches the pods on it through an index of the pod cache by node.
//! Per event the work is O(PPMs of the namespace), per node change O(pods on the node): no list
//! calls, only cache reads. A reconcile never repeats a patch from a cached pod older than that
//! patch ([`WrittenPatches`]), so one condition change is one patch.
//!
//! The patch carries `metadata.uid` as a guard, so a same-named replacement pod is never marked
//! from the old pod's conditions (kube-apiserver answers 422 on `metadata.uid` → dropped; the
//! new pod has its own events).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;
use kube::runtime::{PredicateConfig, WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use podprobe_protocol::annotation::{MARKER_LIST_ANNOTATION, PODPROBE_ANNOTATION};
use podprobe_protocol::uid_guard::refused_by_uid_guard;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{BroadcastStream, UnboundedReceiverStream};
use tokio_util::sync::CancellationToken;

use crate::annotate;
use crate::cache::{PpmCache, PpmChange};
use crate::crd::PodProbeMarker;
use crate::markers::{MarkerPatch, marker_patch};
use crate::metrics::Metrics;
use crate::selector;

/// Which pods get markers.
#[derive(Debug, Clone)]
pub struct MarkerScope {
    /// Nodes whose pods are serverless (default `type=virtual-kubelet`).
    pub serverless_nodes: LabelSelector,
    /// The sidecar's container name (default `podprobe`).
    pub sidecar_name: String,
}

impl Default for MarkerScope {
    fn default() -> Self {
        Self {
            serverless_nodes: parse_selector("type=virtual-kubelet").unwrap_or_default(),
            sidecar_name: "podprobe".into(),
        }
    }
}

/// `k=v,k2=v2` (equality only) as a LabelSelector.
pub fn parse_selector(s: &str) -> Result<LabelSelector, String> {
    let mut labels = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once("==")
            .or_else(|| part.split_once('='))
            .ok_or_else(|| format!("{part:?} is not key=value"))?;
        labels.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    if labels.is_empty() {
        return Err("empty selector".into());
    }
    Ok(LabelSelector {
        match_labels: Some(labels),
        match_expressions: None,
    })
}

use podprobe_protocol::pod::is_active;

/// The pod runs the podprobe sidecar: a container (or native sidecar) named as the webhook
/// injects it. By name only: an image name says nothing about what a container runs.
pub fn runs_sidecar(pod: &Pod, sidecar_name: &str) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    let ours = |c: &k8s_openapi::api::core::v1::Container| c.name == sidecar_name;
    spec.containers.iter().any(ours)
        || spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"))
            .any(ours)
}

/// The node is serverless (its labels match the scope's node selector).
pub fn is_serverless(node: &Node, scope: &MarkerScope) -> bool {
    let empty = BTreeMap::new();
    selector::matches(
        &scope.serverless_nodes,
        node.metadata.labels.as_ref().unwrap_or(&empty),
    )
    .unwrap_or(false)
}

/// Markers apply to this pod.
pub fn gets_markers(pod: &Pod, node: Option<&Node>, scope: &MarkerScope) -> bool {
    is_active(pod)
        && (runs_sidecar(pod, &scope.sidecar_name) || node.is_some_and(|n| is_serverless(n, scope)))
}

/// Annotation changes that make the pod's two annotations follow the PPM selectors (`None`
/// value = delete).
pub fn annotation_changes(
    pod: &Pod,
    namespace_ppms: &[PodProbeMarker],
) -> BTreeMap<String, Option<String>> {
    let current = pod.metadata.annotations.as_ref();
    let get = |k: &str| current.and_then(|a| a.get(k));
    let has_list = get(MARKER_LIST_ANNOTATION).is_some_and(|v| !v.is_empty());
    let mut changes = BTreeMap::new();
    if get(PODPROBE_ANNOTATION).is_some() && !has_list {
        return changes;
    }
    let mut by_selector = Pod {
        metadata: pod.metadata.clone(),
        spec: pod.spec.clone(),
        status: None,
    };
    if let Some(a) = by_selector.metadata.annotations.as_mut() {
        a.remove(MARKER_LIST_ANNOTATION);
    }
    match annotate::compute(&by_selector, namespace_ppms) {
        Some(wanted) => {
            for (k, v) in wanted.pairs() {
                if get(k).map(String::as_str) != Some(v) {
                    changes.insert(k.to_owned(), Some(v.to_owned()));
                }
            }
        }
        None if has_list => {
            for k in [PODPROBE_ANNOTATION, MARKER_LIST_ANNOTATION] {
                if get(k).is_some() {
                    changes.insert(k.to_owned(), None);
                }
            }
        }
        None => {}
    }
    changes
}

/// The one patch this pod needs, or `None`.
pub fn desired_patch(
    pod: &Pod,
    namespace_ppms: &[PodProbeMarker],
    node: Option<&Node>,
    scope: &MarkerScope,
) -> Option<MarkerPatch> {
    if !is_active(pod) {
        return None;
    }
    let annotations = annotation_changes(pod, namespace_ppms);
    let mut patch = MarkerPatch::default();
    if gets_markers(pod, node, scope) {
        let markers = if annotations.is_empty() {
            marker_patch(pod, namespace_ppms)
        } else {
            let mut after = pod.clone();
            let map = after.metadata.annotations.get_or_insert_with(BTreeMap::new);
            for (k, v) in &annotations {
                match v {
                    Some(v) => map.insert(k.clone(), v.clone()),
                    None => map.remove(k),
                };
            }
            marker_patch(&after, namespace_ppms)
        };
        if let Some(m) = markers {
            patch = m;
        }
    }
    patch.metadata.annotations.extend(annotations);
    (!patch.is_empty()).then_some(patch)
}

/// The strategic-merge body for `patch`, with the pod's `metadata.uid` as a guard (a
/// same-named replacement pod is refused: [`refused_by_uid_guard`]).
pub fn patch_body(pod: &Pod, patch: &MarkerPatch) -> serde_json::Value {
    let mut body = serde_json::to_value(patch).unwrap_or_default();
    if let (Some(meta), Some(uid)) = (
        body.get_mut("metadata").and_then(|m| m.as_object_mut()),
        pod.metadata.uid.as_ref(),
    ) {
        meta.insert("uid".into(), uid.clone().into());
    }
    body
}

/// What the decisions above read from a pod; the watch drops events that leave it unchanged.
pub fn fingerprint(pod: &Pod) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    pod.metadata.labels.hash(&mut h);
    let annotations = pod.metadata.annotations.as_ref();
    for k in [PODPROBE_ANNOTATION, MARKER_LIST_ANNOTATION] {
        annotations.and_then(|a| a.get(k)).hash(&mut h);
    }
    pod.metadata.deletion_timestamp.is_some().hash(&mut h);
    pod.metadata.uid.hash(&mut h);
    if let Some(spec) = &pod.spec {
        spec.node_name.hash(&mut h);
    }
    if let Some(status) = &pod.status {
        status.phase.hash(&mut h);
        for c in status.conditions.iter().flatten() {
            (&c.type_, &c.status).hash(&mut h);
        }
    }
    Some(h.finish())
}

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
#[derive(Debug, Default)]
pub struct WrittenPatches {
    pending: Mutex<HashMap<ObjectRef<Pod>, Written>>,
}

#[derive(Debug)]
struct Written {
    patch: MarkerPatch,
    /// The pod's resourceVersion after the patch, as the server answered.
    resource_version: String,
    /// A reconcile wanted something else meanwhile: run again once the cache has the write.
    recheck: bool,
}

impl WrittenPatches {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<Pod>, Written>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `patch` of `pod` was answered with `resource_version`.
    pub fn record(
        &self,
        pod: ObjectRef<Pod>,
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
                },
            );
        }
    }

    /// The cached `pod` predates the last patch sent for it: send nothing now. `wanted` is what
    /// this stale view asks for; when it differs from that patch, the pod is reconciled again
    /// once the cache has the write.
    pub fn is_stale(
        &self,
        pod_ref: &ObjectRef<Pod>,
        pod: &Pod,
        wanted: Option<&MarkerPatch>,
    ) -> bool {
        let mut pending = self.lock();
        let Some(w) = pending.get_mut(pod_ref) else {
            return false;
        };
        if pod.metadata.resource_version.as_ref() == Some(&w.resource_version) {
            // The cache has the write (a patch that changed nothing has no watch event).
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
    pub fn observe(&self, event: &Event<Pod>, recheck: &mpsc::UnboundedSender<ObjectRef<Pod>>) {
        let mut pending = self.lock();
        if pending.is_empty() {
            return;
        }
        match event {
            Event::Apply(pod) => {
                let pod_ref = ObjectRef::from_obj(pod);
                let caught_up = pending.get(&pod_ref).is_some_and(|w| {
                    pod.metadata.resource_version.as_ref() == Some(&w.resource_version)
                });
                if caught_up && pending.remove(&pod_ref).is_some_and(|w| w.recheck) {
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

/// Pods by node name, kept from the pod watch (the same events the pod cache applies), so a node
/// change reaches exactly the pods on that node without a list call.
#[derive(Debug, Default)]
pub struct PodsByNode {
    inner: Mutex<NodeIndex>,
}

#[derive(Debug, Default)]
struct NodeIndex {
    by_node: HashMap<String, HashSet<ObjectRef<Pod>>>,
    node_of: HashMap<ObjectRef<Pod>, String>,
    /// During a relist: the listed pods, swapped in at its end (as the cache does).
    relist: Option<Vec<(ObjectRef<Pod>, String)>>,
}

fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

impl NodeIndex {
    fn remove(&mut self, pod_ref: &ObjectRef<Pod>) {
        if let Some(node) = self.node_of.remove(pod_ref)
            && let Some(pods) = self.by_node.get_mut(&node)
        {
            pods.remove(pod_ref);
            if pods.is_empty() {
                self.by_node.remove(&node);
            }
        }
    }

    fn insert(&mut self, pod_ref: ObjectRef<Pod>, node: String) {
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
    pub fn observe(&self, event: &Event<Pod>) {
        let mut index = self.lock();
        match event {
            Event::Apply(pod) => {
                let pod_ref = ObjectRef::from_obj(pod);
                let node = node_name(pod);
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
                if let (Some(listed), Some(node)) = (index.relist.as_mut(), node_name(pod)) {
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
    pub fn pods_on(&self, node: &str) -> Vec<ObjectRef<Pod>> {
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
struct ServerlessNodes {
    current: HashMap<String, bool>,
    relist: Option<HashMap<String, bool>>,
}

impl ServerlessNodes {
    /// Nodes that became or stopped being serverless with `event` (already applied to the node
    /// cache: for a relist, at its end, when the cache swaps the list in).
    fn changed(&mut self, event: &Event<Node>, scope: &MarkerScope) -> Vec<String> {
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
fn node_triggers(
    client: Client,
    writer: reflector::store::Writer<Node>,
    scope: MarkerScope,
    pods: Arc<PodsByNode>,
) -> impl Stream<Item = ObjectRef<Pod>> + Send + 'static {
    let mut serverless = ServerlessNodes::default();
    watcher::watcher(Api::<Node>::all(client), watcher::Config::default())
        .default_backoff()
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
            let refs: Vec<ObjectRef<Pod>> = serverless
                .changed(&event, &scope)
                .iter()
                .flat_map(|node| pods.pods_on(node))
                .collect();
            futures::stream::iter(refs)
        })
}

/// The pod controller's context.
pub struct PodContext {
    pub client: Client,
    pub ppms: Arc<PpmCache>,
    pub nodes: Store<Node>,
    pub scope: MarkerScope,
    pub metrics: Arc<Metrics>,
    /// PPMs whose matched-pod count may have changed.
    pub status_triggers: mpsc::UnboundedSender<ObjectRef<PodProbeMarker>>,
    /// Patches sent whose result the pod cache has not shown yet.
    pub written: Arc<WrittenPatches>,
}

impl std::fmt::Debug for PodContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodContext")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("patching pod {0}: {1}")]
    Patch(String, kube::Error),
}

async fn reconcile(pod: Arc<Pod>, ctx: Arc<PodContext>) -> Result<Action, ReconcileError> {
    ctx.metrics.pod_reconciles.inc();
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ppms = ctx.ppms.namespace(&ns);
    for ppm in ppms.iter() {
        let _ = ctx.status_triggers.send(ObjectRef::from_obj(ppm));
    }
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .and_then(|n| ctx.nodes.get(&ObjectRef::new(n)));
    let oref = ObjectRef::from_obj(&*pod);
    let desired = desired_patch(&pod, &ppms, node.as_deref(), &ctx.scope);
    if ctx.written.is_stale(&oref, &pod, desired.as_ref()) {
        tracing::debug!(pod = %format!("{ns}/{name}"), "cache older than our last patch; waiting for it");
        return Ok(Action::await_change());
    }
    let Some(patch) = desired else {
        return Ok(Action::await_change());
    };
    let body = patch_body(&pod, &patch);
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    match api
        .patch(&name, &PatchParams::default(), &Patch::Strategic(body))
        .await
    {
        Ok(written) => {
            tracing::debug!(pod = %format!("{ns}/{name}"), patch = %patch.to_json(), "patched");
            ctx.written
                .record(oref, patch, written.metadata.resource_version);
            ctx.metrics.pod_patch("ok");
            Ok(Action::await_change())
        }
        Err(kube::Error::Api(s)) if s.code == 404 || refused_by_uid_guard(&s) => {
            ctx.metrics.pod_patch("gone");
            Ok(Action::await_change())
        }
        Err(e) => {
            ctx.metrics.pod_patch("error");
            Err(ReconcileError::Patch(format!("{ns}/{name}"), e))
        }
    }
}

fn error_policy(_pod: Arc<Pod>, error: &ReconcileError, _ctx: Arc<PodContext>) -> Action {
    tracing::warn!("{error}; retrying");
    Action::requeue(Duration::from_secs(1))
}

/// Pods to look at again after a PPM change.
fn pods_for_change(change: &PpmChange, pods: &Store<Pod>, ppms: &PpmCache) -> Vec<ObjectRef<Pod>> {
    let all = pods.state();
    let refs = |it: &mut dyn Iterator<Item = &Arc<Pod>>| -> Vec<ObjectRef<Pod>> {
        it.map(|p| ObjectRef::from_obj(&**p)).collect()
    };
    match change {
        PpmChange::All => refs(&mut all.iter()),
        PpmChange::One(ppm) => {
            let ns = ppm.namespace.clone().unwrap_or_default();
            let current = ppms.namespace(&ns);
            let selector = current
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(ppm.name.as_str()))
                .and_then(|p| p.spec.selector.clone());
            let empty = BTreeMap::new();
            refs(&mut all.iter().filter(|p| {
                p.metadata.namespace.as_deref() == Some(ns.as_str())
                    && (p
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(MARKER_LIST_ANNOTATION))
                        .is_some_and(|l| l.split(',').any(|n| n == ppm.name))
                        || selector.as_ref().is_some_and(|s| {
                            !selector::is_empty(s)
                                && selector::matches(
                                    s,
                                    p.metadata.labels.as_ref().unwrap_or(&empty),
                                )
                                .unwrap_or(false)
                        }))
            }))
        }
    }
}

fn ppm_triggers(
    ppms: Arc<PpmCache>,
    pods: Store<Pod>,
) -> impl Stream<Item = ObjectRef<Pod>> + Send + 'static {
    BroadcastStream::new(ppms.subscribe()).flat_map(move |change| {
        let change = change.unwrap_or(PpmChange::All);
        futures::stream::iter(pods_for_change(&change, &pods, &ppms))
    })
}

/// Run the pod controller until `shutdown`, filling `store` through `writer` (the PPM status
/// controller counts pods from the same store) and the node cache `ctx.nodes` through
/// `node_writer`.
pub async fn run(
    ctx: Arc<PodContext>,
    (store, writer): (Store<Pod>, reflector::store::Writer<Pod>),
    node_writer: reflector::store::Writer<Node>,
    concurrency: u16,
    shutdown: CancellationToken,
) {
    // Before the PPM cache has its first list every pod looks unmatched and would lose its
    // two annotations (put back once the list arrives: two writes per pod for nothing).
    while !ctx.ppms.is_synced() {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    let by_node = Arc::new(PodsByNode::default());
    let (recheck_tx, recheck_rx) = mpsc::unbounded_channel();
    let stream = watcher::watcher(
        Api::<Pod>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .inspect_ok({
        let (by_node, written) = (by_node.clone(), ctx.written.clone());
        move |event| {
            by_node.observe(event);
            written.observe(event, &recheck_tx);
        }
    })
    .applied_objects()
    .predicate_filter(fingerprint, PredicateConfig::default());
    let triggers = ppm_triggers(ctx.ppms.clone(), store.clone());
    let nodes = node_triggers(ctx.client.clone(), node_writer, ctx.scope.clone(), by_node);
    Controller::for_stream(stream, store)
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        .reconcile_on(triggers)
        .reconcile_on(nodes)
        .reconcile_on(UnboundedReceiverStream::new(recheck_rx))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const PODPROBE: &str = PODPROBE_ANNOTATION;
    const LIST: &str = MARKER_LIST_ANNOTATION;

    fn ppm() -> PodProbeMarker {
        serde_json::from_value(json!({
            "apiVersion": "apps.kruise.io/v1alpha1",
            "kind": "PodProbeMarker",
            "metadata": {"name": "ppm-test", "namespace": "test"},
            "spec": {
                "selector": {"matchLabels": {"app": "test"}},
                "probes": [{
                    "name": "healthy",
                    "containerName": "main",
                    "probe": {"exec": {"command": ["/healthy.sh"]}},
                    "podConditionType": "game.kruise.io/healthy",
                    "markerPolicy": [
                        {"state": "Succeeded", "labels": {"server-healthy": "true"}},
                        {"state": "Failed", "labels": {"server-healthy": "false"}}
                    ]
                }]
            }
        }))
        .unwrap()
    }

    fn node(labels: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": "n", "labels": labels}})).unwrap()
    }

    fn vk() -> Node {
        node(json!({"type": "virtual-kubelet"}))
    }

    /// A running pod `app=<app>` on node `n` with condition healthy=`healthy` (None: no
    /// condition), plus `labels` and `annotations`.
    fn pod(
        app: &str,
        healthy: Option<&str>,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) -> Pod {
        let mut l = BTreeMap::from([("app".to_owned(), app.to_owned())]);
        l.extend(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let a: BTreeMap<String, String> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let conditions: Vec<_> = healthy
            .map(|s| json!({"type": "game.kruise.io/healthy", "status": s}))
            .into_iter()
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "test", "uid": "uid-p", "resourceVersion": "1",
                         "labels": l, "annotations": a},
            "spec": {"nodeName": "n", "containers": [{"name": "main", "image": "game:1"}]},
            "status": {"phase": "Running", "conditions": conditions}
        }))
        .unwrap()
    }

    /// The two annotations the PPM gives an `app=test` pod.
    fn wanted_annotations() -> (String, String) {
        let a = annotate::compute(&pod("test", None, &[], &[]), &[ppm()]).unwrap();
        (a.probes, a.marker_list)
    }

    fn set(v: &str) -> Option<String> {
        Some(v.to_owned())
    }

    #[test]
    fn one_patch_carries_markers_and_propagated_annotations() {
        let (probes, list) = wanted_annotations();
        let p = pod("test", Some("False"), &[], &[]);
        let patch = desired_patch(&p, &[ppm()], Some(&vk()), &MarkerScope::default()).unwrap();
        assert_eq!(
            patch.metadata.annotations,
            BTreeMap::from([
                (PODPROBE.to_owned(), Some(probes)),
                (LIST.to_owned(), Some(list))
            ])
        );
        assert_eq!(
            patch.metadata.labels,
            BTreeMap::from([("server-healthy".to_owned(), set("false"))])
        );
    }

    #[test]
    fn nothing_differs_no_patch() {
        let (probes, list) = wanted_annotations();
        let p = pod(
            "test",
            Some("True"),
            &[("server-healthy", "true")],
            &[(PODPROBE, &probes), (LIST, &list)],
        );
        assert_eq!(
            desired_patch(&p, &[ppm()], Some(&vk()), &MarkerScope::default()),
            None
        );
    }

    #[test]
    fn markers_only_on_serverless_nodes_or_with_the_sidecar() {
        let (probes, list) = wanted_annotations();
        let p = pod(
            "test",
            Some("True"),
            &[],
            &[(PODPROBE, &probes), (LIST, &list)],
        );
        let scope = MarkerScope::default();
        let plain = node(json!({"type": "normal"}));
        assert_eq!(desired_patch(&p, &[ppm()], Some(&plain), &scope), None);
        assert_eq!(desired_patch(&p, &[ppm()], None, &scope), None);
        let marked = desired_patch(&p, &[ppm()], Some(&vk()), &scope).unwrap();
        assert_eq!(marked.metadata.labels["server-healthy"], set("true"));
        let with = |container: serde_json::Value| {
            let mut p = p.clone();
            let container = serde_json::from_value(container).unwrap();
            p.spec.as_mut().unwrap().containers.push(container);
            p
        };
        let with_sidecar = with(json!({"name": "podprobe", "image": "registry.example/pp:1"}));
        assert!(desired_patch(&with_sidecar, &[ppm()], Some(&plain), &scope).is_some());
        let lookalike = with(json!({"name": "tools", "image": "podprobe:1"}));
        assert_eq!(
            desired_patch(&lookalike, &[ppm()], Some(&plain), &scope),
            None
        );
    }

    #[test]
    fn patch_body_has_the_uid_precondition() {
        let p = pod("test", Some("False"), &[], &[]);
        let patch = desired_patch(&p, &[ppm()], Some(&vk()), &MarkerScope::default()).unwrap();
        let body = patch_body(&p, &patch);
        assert_eq!(body["metadata"]["uid"], "uid-p");
        assert_eq!(body["metadata"]["labels"]["server-healthy"], "false");
    }

    #[test]
    fn no_ppm_applies_both_annotations_go() {
        let (probes, list) = wanted_annotations();
        // Labels no longer match the PPM; it is still the one named in the list annotation.
        let p = pod(
            "other",
            Some("True"),
            &[],
            &[(PODPROBE, &probes), (LIST, &list)],
        );
        let patch = desired_patch(&p, &[ppm()], Some(&vk()), &MarkerScope::default()).unwrap();
        assert_eq!(
            patch.metadata.annotations,
            BTreeMap::from([(PODPROBE.to_owned(), None), (LIST.to_owned(), None)])
        );
        assert!(patch.metadata.labels.is_empty(), "{patch:?}");
        // PPM deleted: the same.
        let patch = desired_patch(&p, &[], Some(&vk()), &MarkerScope::default()).unwrap();
        assert_eq!(
            patch.metadata.annotations,
            BTreeMap::from([(PODPROBE.to_owned(), None), (LIST.to_owned(), None)])
        );
        assert_eq!(
            patch_body(&p, &patch)["metadata"]["annotations"][PODPROBE],
            json!(null)
        );
    }

    #[test]
    fn hand_written_podprobe_annotation_is_never_touched() {
        let by_hand = r#"[{"name":"mine","containerName":"main","podConditionType":"x"}]"#;
        for ppms in [vec![ppm()], vec![]] {
            let p = pod("test", None, &[], &[(PODPROBE, by_hand)]);
            assert_eq!(
                desired_patch(&p, &ppms, Some(&vk()), &MarkerScope::default()),
                None
            );
            let p = pod("other", None, &[], &[(PODPROBE, by_hand)]);
            assert_eq!(
                desired_patch(&p, &ppms, Some(&vk()), &MarkerScope::default()),
                None
            );
        }
        // Markers still follow the conditions, the annotation stays.
        let p = pod("test", Some("True"), &[], &[(PODPROBE, by_hand)]);
        let patch = desired_patch(&p, &[ppm()], Some(&vk()), &MarkerScope::default()).unwrap();
        assert!(patch.metadata.annotations.is_empty(), "{patch:?}");
    }

    #[test]
    fn inactive_pods_get_nothing() {
        let mut p = pod("test", Some("True"), &[], &[]);
        p.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert_eq!(
            desired_patch(&p, &[ppm()], Some(&vk()), &MarkerScope::default()),
            None
        );
    }

    fn label_patch(v: &str) -> MarkerPatch {
        let mut patch = MarkerPatch::default();
        patch
            .metadata
            .labels
            .insert("server-healthy".into(), set(v));
        patch
    }

    fn with_rv(mut p: Pod, rv: &str) -> Pod {
        p.metadata.resource_version = Some(rv.into());
        p
    }

    #[test]
    fn written_patch_is_not_repeated_from_an_older_cached_pod() {
        let written = WrittenPatches::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let stale = with_rv(
            pod("test", Some("False"), &[("server-healthy", "true")], &[]),
            "5",
        );
        let r = ObjectRef::from_obj(&stale);
        assert!(!written.is_stale(&r, &stale, Some(&label_patch("false"))));
        written.record(r.clone(), label_patch("false"), Some("6".into()));
        // Same view, same patch: nothing to send, nothing to recheck.
        assert!(written.is_stale(&r, &stale, Some(&label_patch("false"))));
        // The watch delivers the patched version: forgotten, no recheck.
        let fresh = with_rv(
            pod("test", Some("False"), &[("server-healthy", "false")], &[]),
            "6",
        );
        written.observe(&Event::Apply(fresh.clone()), &tx);
        assert!(written.is_empty());
        assert!(rx.try_recv().is_err());
        assert!(!written.is_stale(&r, &fresh, None));
    }

    #[test]
    fn a_different_wish_from_an_older_pod_is_rechecked_once_the_cache_catches_up() {
        let written = WrittenPatches::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let stale = with_rv(pod("test", Some("False"), &[], &[]), "5");
        let r = ObjectRef::from_obj(&stale);
        written.record(r.clone(), label_patch("false"), Some("6".into()));
        assert!(written.is_stale(&r, &stale, Some(&label_patch("down"))));
        // An older version passing by changes nothing.
        written.observe(&Event::Apply(with_rv(stale.clone(), "5")), &tx);
        assert!(rx.try_recv().is_err());
        written.observe(&Event::Apply(with_rv(stale.clone(), "6")), &tx);
        assert_eq!(rx.try_recv().unwrap(), r);
        assert!(written.is_empty());
    }

    #[test]
    fn written_patches_end_with_the_pod_a_relist_or_a_cache_already_current() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let p = with_rv(pod("test", None, &[], &[]), "5");
        let r = ObjectRef::from_obj(&p);
        let written = WrittenPatches::default();
        written.record(r.clone(), label_patch("false"), Some("6".into()));
        written.observe(&Event::Delete(p.clone()), &tx);
        assert!(written.is_empty());
        written.record(r.clone(), label_patch("false"), Some("6".into()));
        assert!(written.is_stale(&r, &p, None));
        written.observe(&Event::InitDone, &tx);
        assert!(written.is_empty());
        assert_eq!(
            rx.try_recv().unwrap(),
            r,
            "the stale view wanted something else"
        );
        // A patch that changed nothing keeps the version and has no event.
        written.record(r.clone(), label_patch("false"), Some("5".into()));
        assert!(!written.is_stale(&r, &p, Some(&label_patch("false"))));
        assert!(written.is_empty());
    }

    fn on_node(name: &str, node: &str) -> Pod {
        let mut p = pod("test", None, &[], &[]);
        p.metadata.name = Some(name.into());
        p.spec.as_mut().unwrap().node_name = Some(node.into());
        p
    }

    fn names(mut refs: Vec<ObjectRef<Pod>>) -> Vec<String> {
        refs.sort_by(|a, b| a.name.cmp(&b.name));
        refs.into_iter().map(|r| r.name).collect()
    }

    #[test]
    fn pods_by_node_follows_the_pod_watch() {
        let index = PodsByNode::default();
        index.observe(&Event::Init);
        index.observe(&Event::InitApply(on_node("a", "n1")));
        index.observe(&Event::InitApply(on_node("b", "n1")));
        assert!(index.pods_on("n1").is_empty(), "a relist counts at its end");
        index.observe(&Event::InitDone);
        assert_eq!(names(index.pods_on("n1")), ["a", "b"]);
        index.observe(&Event::Apply(on_node("b", "n2")));
        index.observe(&Event::Apply(on_node("c", "n2")));
        assert_eq!(names(index.pods_on("n1")), ["a"]);
        assert_eq!(names(index.pods_on("n2")), ["b", "c"]);
        index.observe(&Event::Delete(on_node("c", "n2")));
        assert_eq!(names(index.pods_on("n2")), ["b"]);
        index.observe(&Event::Init);
        index.observe(&Event::InitApply(on_node("a", "n2")));
        index.observe(&Event::InitDone);
        assert!(index.pods_on("n1").is_empty());
        assert_eq!(names(index.pods_on("n2")), ["a"]);
    }

    fn named(name: &str, labels: serde_json::Value) -> Node {
        let mut n = node(labels);
        n.metadata.name = Some(name.into());
        n
    }

    #[test]
    fn only_changes_of_serverlessness_are_node_triggers() {
        let scope = MarkerScope::default();
        let mut nodes = ServerlessNodes::default();
        let vk = json!({"type": "virtual-kubelet"});
        assert!(
            nodes
                .changed(&Event::Apply(named("n1", json!({}))), &scope)
                .is_empty()
        );
        assert_eq!(
            nodes.changed(&Event::Apply(named("n1", vk.clone())), &scope),
            ["n1"]
        );
        let more = json!({"type": "virtual-kubelet", "zone": "a"});
        assert!(
            nodes
                .changed(&Event::Apply(named("n1", more)), &scope)
                .is_empty()
        );
        assert_eq!(
            nodes.changed(&Event::Apply(named("n1", json!({}))), &scope),
            ["n1"]
        );
        assert_eq!(
            nodes.changed(&Event::Apply(named("n2", vk.clone())), &scope),
            ["n2"]
        );
        assert_eq!(
            nodes.changed(&Event::Delete(named("n2", vk.clone())), &scope),
            ["n2"]
        );
        // A relist: n3 new and serverless, n4 plain; decided at its end.
        nodes.changed(&Event::Apply(named("n5", vk.clone())), &scope);
        assert!(nodes.changed(&Event::Init, &scope).is_empty());
        assert!(
            nodes
                .changed(&Event::InitApply(named("n3", vk.clone())), &scope)
                .is_empty()
        );
        assert!(
            nodes
                .changed(&Event::InitApply(named("n4", json!({}))), &scope)
                .is_empty()
        );
        let mut changed = nodes.changed(&Event::InitDone, &scope);
        changed.sort();
        assert_eq!(changed, ["n3", "n5"], "n3 appeared, n5 is gone");
    }
}
