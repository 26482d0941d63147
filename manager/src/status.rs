//! The PodProbeMarker status controller (standalone mode): `observedGeneration` and
//! `matchedPods` through the status subresource, written only when either differs.
//!
//! `matchedPods` counts the pods OpenKruise's `getMatchingPods` keeps: same namespace, selected
//! by the (non-empty) selector, active, bound to a node, `Initialized=True`. Unlike OpenKruise
//! the node object need not exist. Counting reads the pod controller's cache; reconciles are
//! triggered by PPM events and by pod reconciles (debounced, so a burst of pod changes costs one
//! count per PPM), plus a periodic recount for pods deleted without a prior update.
//!
//! No finalizer: nothing has to happen *before* a PPM disappears. Cleaning the pods'
//! annotations after a deletion is level-triggered in the pod controller (the PPM is simply
//! absent from the cache, also after a manager restart), and there is no NodePodProbe to prune.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use podprobe_ops::backoff::WatchRetry;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::crd::PodProbeMarker;
use crate::metrics::Metrics;
use crate::pods::CachedPod;
use crate::selector;

/// How often every PPM is recounted without a trigger.
const RECOUNT: Duration = Duration::from_secs(60);

/// Pods `ppm` matches among `pods` (all namespaces).
pub fn matched_pods<'a>(ppm: &PodProbeMarker, pods: impl Iterator<Item = &'a CachedPod>) -> i64 {
    let Some(sel) = ppm
        .spec
        .selector
        .as_ref()
        .filter(|s| !selector::is_empty(s))
    else {
        return 0;
    };
    let ns = ppm.metadata.namespace.as_deref();
    let empty = BTreeMap::new();
    let n = pods
        .filter(|p| p.metadata.namespace.as_deref() == ns)
        .filter(|p| p.is_active() && p.node().is_some())
        .filter(|p| p.condition("Initialized") == Some("True"))
        .filter(|p| {
            selector::matches(sel, p.metadata.labels.as_ref().unwrap_or(&empty)).unwrap_or(false)
        })
        .count();
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub struct StatusContext {
    pub client: Client,
    pub pods: Store<CachedPod>,
    pub metrics: Arc<Metrics>,
}

impl std::fmt::Debug for StatusContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusContext").finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("updating the status of PodProbeMarker {0}: {1}")]
pub struct StatusError(String, kube::Error);

async fn reconcile(
    ppm: Arc<PodProbeMarker>,
    ctx: Arc<StatusContext>,
) -> Result<Action, StatusError> {
    if ppm.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let pods = ctx.pods.state();
    let matched = matched_pods(&ppm, pods.iter().map(|p| &**p));
    let generation = ppm.metadata.generation.unwrap_or_default();
    let current = ppm.status.as_ref();
    if current.is_some_and(|s| s.observed_generation == generation && s.matched_pods == matched) {
        return Ok(Action::requeue(RECOUNT));
    }
    let ns = ppm.metadata.namespace.clone().unwrap_or_default();
    let name = ppm.metadata.name.clone().unwrap_or_default();
    let api: Api<PodProbeMarker> = Api::namespaced(ctx.client.clone(), &ns);
    let body = json!({"status": {"observedGeneration": generation, "matchedPods": matched}});
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(body))
        .await
    {
        Ok(_) => {
            ctx.metrics.status_update("ok");
            Ok(Action::requeue(RECOUNT))
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            ctx.metrics.status_update("gone");
            Ok(Action::await_change())
        }
        Err(e) => {
            ctx.metrics.status_update("error");
            Err(StatusError(format!("{ns}/{name}"), e))
        }
    }
}

fn error_policy(
    _ppm: Arc<PodProbeMarker>,
    error: &StatusError,
    _ctx: Arc<StatusContext>,
) -> Action {
    tracing::warn!("{error}; retrying");
    Action::requeue(Duration::from_secs(2))
}

/// Run until `shutdown`; `triggers` name PPMs to recount.
pub async fn run(
    ctx: Arc<StatusContext>,
    triggers: mpsc::UnboundedReceiver<ObjectRef<PodProbeMarker>>,
    shutdown: CancellationToken,
) {
    let (store, writer) = reflector::store();
    let stream = watcher::watcher(
        Api::<PodProbeMarker>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .retry_backoff()
    .reflect(writer)
    .applied_objects();
    Controller::for_stream(stream, store)
        .with_config(
            kube::runtime::controller::Config::default()
                .debounce(Duration::from_millis(500))
                .concurrency(4),
        )
        .trigger_backoff(podprobe_ops::backoff::AlreadyBackedOff)
        .reconcile_on(UnboundedReceiverStream::new(triggers))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::Value;

    /// A pod as the pod cache keeps it: `Initialized` as given, bound to `node`.
    fn cached(namespace: &str, labels: Value, node: Option<&str>, initialized: &str) -> CachedPod {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "gs-0", "namespace": namespace, "uid": "u-1", "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "main"}]},
            "status": {"phase": "Running",
                       "conditions": [{"type": "Initialized", "status": initialized},
                                      {"type": "game.kruise.io/healthy", "status": "False"}]},
        }))
        .unwrap();
        CachedPod::from(pod)
    }

    fn ppm(selector: Value) -> PodProbeMarker {
        serde_json::from_value(json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
            "metadata": {"name": "ppm", "namespace": "test"},
            "spec": {"selector": selector, "probes": []}
        }))
        .unwrap()
    }

    #[test]
    fn matched_pods_counts_what_openkruise_counts_on_the_cached_pod() {
        let game = ppm(json!({"matchLabels": {"app": "game"}}));
        let app = |a: &str| json!({"app": a});
        let pods = [
            cached("test", app("game"), Some("vk-1"), "True"),
            cached("test", app("game"), Some("node-1"), "True"),
            // A failing probe and the marker it left: still matched.
            cached(
                "test",
                json!({"app": "game", "server-healthy": "false"}),
                Some("vk-1"),
                "True",
            ),
            cached("test", app("other"), Some("vk-1"), "True"),
            cached("other", app("game"), Some("vk-1"), "True"),
            cached("test", app("game"), None, "True"),
            cached("test", app("game"), Some("vk-1"), "False"),
        ];
        assert_eq!(matched_pods(&game, pods.iter()), 3);
        let everything = ppm(json!({}));
        assert_eq!(
            matched_pods(&everything, pods.iter()),
            0,
            "an empty selector"
        );
    }
}
