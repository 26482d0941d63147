//! The pod controller (standalone mode): one reconcile per pod change that matters, at most one
//! strategic-merge metadata patch per reconcile, covering both
//!
//! - **markers**: `markerPolicy` labels/annotations from the probe conditions ([`markers`]), for
//!   pods on serverless nodes (node label selector, default `type=virtual-kubelet`) or running
//!   the podprobe sidecar (a container or restartable init container named `podprobe`);
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
//!
//! Rooms: [`decide`] (per pod: markers, propagation, the patch), [`written`] (patches the cache
//! has not shown yet), [`by_node`] (node → pods, serverless nodes), [`CachedPod`] (what the
//! pod cache keeps of each pod), [`unprobed`] (pods that should run the sidecar and do not);
//! the controller is here.

pub mod by_node;
mod cached;
pub mod decide;
#[cfg(test)]
mod tests;
pub mod unprobed;
pub mod written;

pub use by_node::PodsByNode;
use by_node::node_triggers;
pub use cached::{CachedPod, ConditionState};
pub use decide::*;
pub use written::WrittenPatches;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use podprobe_ops::backoff::{Failure, WatchRetry};
use podprobe_protocol::annotation::MARKER_LIST_ANNOTATION;
use podprobe_protocol::uid_guard::refused_by_uid_guard;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{BroadcastStream, UnboundedReceiverStream};
use tokio_util::sync::CancellationToken;

use crate::cache::{PpmCache, PpmChange};
use crate::crd::PodProbeMarker;
use crate::metrics::Metrics;
use crate::retries::Retries;
use crate::selector;

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
    /// Turns true once the pod cache holds its first full list. Other readers of the cache
    /// wait on this rather than on the `Store`'s `wait_until_ready`, which wakes only one of
    /// several waiters in kube-runtime 5.0 (the controller's runner is already one).
    pub pods_listed: watch::Sender<bool>,
    /// Per pod, the backoff of its failed patches in a row.
    pub retries: Retries<CachedPod>,
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

async fn reconcile(pod: Arc<CachedPod>, ctx: Arc<PodContext>) -> Result<Action, ReconcileError> {
    ctx.metrics.pod_reconciles.inc();
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ppms = ctx.ppms.namespace(&ns);
    for ppm in ppms.iter() {
        let _ = ctx.status_triggers.send(ObjectRef::from_obj(ppm));
    }
    let node = pod.node().and_then(|n| ctx.nodes.get(&ObjectRef::new(n)));
    let oref = ObjectRef::from_obj(&*pod);
    let desired = desired_patch(&pod.to_pod(), &ppms, node.as_deref(), &ctx.scope);
    if ctx.written.is_stale(&oref, &pod, desired.as_ref()) {
        tracing::debug!(pod = %format!("{ns}/{name}"), "cache older than our last patch; waiting for it");
        // The watch's delivery of our write normally triggers the next reconcile; this one
        // comes if it never does.
        return Ok(Action::requeue(written::PENDING_MAX));
    }
    let Some(patch) = desired else {
        return Ok(Action::await_change());
    };
    let body = patch_body(&pod.metadata, &patch);
    let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(ctx.client.clone(), &ns);
    match api
        .patch(&name, &PatchParams::default(), &Patch::Strategic(body))
        .await
    {
        Ok(written) => {
            ctx.retries.answered(&oref);
            tracing::debug!(pod = %format!("{ns}/{name}"), patch = %patch.to_json(), "patched");
            ctx.written
                .record(oref, patch, written.metadata.resource_version);
            ctx.metrics.pod_patch("ok");
            Ok(Action::await_change())
        }
        Err(kube::Error::Api(s)) if s.code == 404 || refused_by_uid_guard(&s) => {
            ctx.retries.answered(&oref);
            ctx.metrics.pod_patch("gone");
            Ok(Action::await_change())
        }
        Err(e) => {
            ctx.metrics.pod_patch("error");
            Err(ReconcileError::Patch(format!("{ns}/{name}"), e))
        }
    }
}

fn error_policy(pod: Arc<CachedPod>, error: &ReconcileError, ctx: Arc<PodContext>) -> Action {
    let ReconcileError::Patch(_, e) = error;
    let wait = ctx
        .retries
        .failed(ObjectRef::from_obj(&*pod), Failure::of(e));
    tracing::warn!("{error}; retrying in {wait:.1?}");
    Action::requeue(wait)
}

/// Pods to look at again after a PPM change.
fn pods_for_change(
    change: &PpmChange,
    pods: &Store<CachedPod>,
    ppms: &PpmCache,
) -> Vec<ObjectRef<CachedPod>> {
    let all = pods.state();
    let refs = |it: &mut dyn Iterator<Item = &Arc<CachedPod>>| -> Vec<ObjectRef<CachedPod>> {
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
    pods: Store<CachedPod>,
) -> impl Stream<Item = ObjectRef<CachedPod>> + Send + 'static {
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
    (store, writer): (Store<CachedPod>, reflector::store::Writer<CachedPod>),
    node_writer: reflector::store::Writer<Node>,
    concurrency: u16,
    shutdown: CancellationToken,
) {
    // Before the PPM cache has its first list every pod looks unmatched and would lose its
    // two annotations (put back once the list arrives: two writes per pod for nothing).
    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = ctx.ppms.wait_synced() => {}
    }
    let by_node = Arc::new(PodsByNode::default());
    let (recheck_tx, recheck_rx) = mpsc::unbounded_channel();
    // The cache holds every pod of the cluster: each is read as a `CachedPod`, only what the
    // controllers read.
    let stream = watcher::watcher(
        Api::<CachedPod>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .retry_backoff()
    .reflect(writer)
    .inspect_ok({
        let (by_node, ctx, cache) = (by_node.clone(), ctx.clone(), store.clone());
        move |event| {
            by_node.observe(event);
            ctx.written.observe(event, &recheck_tx);
            ctx.retries.observe(event, &cache);
            if matches!(event, watcher::Event::InitDone) {
                ctx.pods_listed.send_replace(true);
            }
        }
    })
    .applied_objects()
    .predicate_filter(fingerprint, PredicateConfig::default());
    let triggers = ppm_triggers(ctx.ppms.clone(), store.clone());
    let nodes = node_triggers(ctx.client.clone(), node_writer, ctx.scope.clone(), by_node);
    Controller::for_stream(stream, store)
        .trigger_backoff(podprobe_ops::backoff::AlreadyBackedOff)
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        .reconcile_on(triggers)
        .reconcile_on(nodes)
        .reconcile_on(UnboundedReceiverStream::new(recheck_rx))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}
