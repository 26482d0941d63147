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
//! one extra reconcile and no patch. PPM changes reach the pods of their namespace through the
//! PPM cache's announcements, after the cache applied them. Per event the work is O(PPMs of the
//! namespace): no list calls, only cache reads.
//!
//! The patch carries `metadata.uid` as a precondition, so a same-named replacement pod is never
//! marked from the old pod's conditions (409 → dropped; the new pod has its own events).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use podprobe::annotation::{MARKER_LIST_ANNOTATION, PODPROBE_ANNOTATION};
use tokio::sync::mpsc;
use tokio_stream::wrappers::BroadcastStream;
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

/// Not terminating and not finished.
pub fn is_active(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && !matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

/// The pod runs the podprobe sidecar.
pub fn runs_sidecar(pod: &Pod, sidecar_name: &str) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    let ours = |c: &k8s_openapi::api::core::v1::Container| {
        c.name == sidecar_name || c.image.as_deref().is_some_and(|i| i.contains("podprobe"))
    };
    spec.containers.iter().any(ours)
        || spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"))
            .any(ours)
}

/// Markers apply to this pod.
pub fn gets_markers(pod: &Pod, node: Option<&Node>, scope: &MarkerScope) -> bool {
    is_active(pod)
        && (runs_sidecar(pod, &scope.sidecar_name)
            || node.is_some_and(|n| {
                let empty = BTreeMap::new();
                selector::matches(
                    &scope.serverless_nodes,
                    n.metadata.labels.as_ref().unwrap_or(&empty),
                )
                .unwrap_or(false)
            }))
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

/// The pod controller's context.
pub struct PodContext {
    pub client: Client,
    pub ppms: Arc<PpmCache>,
    pub nodes: Store<Node>,
    pub scope: MarkerScope,
    pub metrics: Arc<Metrics>,
    /// PPMs whose matched-pod count may have changed.
    pub status_triggers: mpsc::UnboundedSender<ObjectRef<PodProbeMarker>>,
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
    let Some(patch) = desired_patch(&pod, &ppms, node.as_deref(), &ctx.scope) else {
        return Ok(Action::await_change());
    };
    let mut body = serde_json::to_value(&patch).unwrap_or_default();
    if let (Some(meta), Some(uid)) = (
        body.get_mut("metadata").and_then(|m| m.as_object_mut()),
        pod.metadata.uid.as_ref(),
    ) {
        meta.insert("uid".into(), uid.clone().into());
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    match api
        .patch(&name, &PatchParams::default(), &Patch::Strategic(body))
        .await
    {
        Ok(_) => {
            tracing::debug!(pod = %format!("{ns}/{name}"), patch = %patch.to_json(), "patched");
            ctx.metrics.pod_patch("ok");
            Ok(Action::await_change())
        }
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
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
/// controller counts pods from the same store).
pub async fn run(
    ctx: Arc<PodContext>,
    (store, writer): (Store<Pod>, reflector::store::Writer<Pod>),
    concurrency: u16,
    shutdown: CancellationToken,
) {
    let stream = watcher::watcher(
        Api::<Pod>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .applied_objects()
    .predicate_filter(fingerprint, PredicateConfig::default());
    let triggers = ppm_triggers(ctx.ppms.clone(), store.clone());
    Controller::for_stream(stream, store)
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        .reconcile_on(triggers)
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}
