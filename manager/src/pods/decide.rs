//! What the pod controller decides for one pod: whether it gets markers, the annotation
//! changes that make it follow the PPM selectors, and the one patch that does both.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use podprobe_protocol::annotation::{MARKER_LIST_ANNOTATION, PODPROBE_ANNOTATION};

use super::CachedPod;
use crate::annotate;
use crate::crd::PodProbeMarker;
use crate::markers::{MarkerPatch, marker_patch};
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
pub fn patch_body(pod: &ObjectMeta, patch: &MarkerPatch) -> serde_json::Value {
    let mut body = serde_json::to_value(patch).unwrap_or_default();
    if let (Some(meta), Some(uid)) = (
        body.get_mut("metadata").and_then(|m| m.as_object_mut()),
        pod.uid.as_ref(),
    ) {
        meta.insert("uid".into(), uid.clone().into());
    }
    body
}

/// What the decisions above read from a pod; the watch drops events that leave it unchanged.
pub fn fingerprint(pod: &CachedPod) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    pod.metadata.labels.hash(&mut h);
    let annotations = pod.metadata.annotations.as_ref();
    for k in [PODPROBE_ANNOTATION, MARKER_LIST_ANNOTATION] {
        annotations.and_then(|a| a.get(k)).hash(&mut h);
    }
    pod.metadata.deletion_timestamp.is_some().hash(&mut h);
    pod.metadata.uid.hash(&mut h);
    pod.node_name.hash(&mut h);
    pod.phase.hash(&mut h);
    pod.conditions.hash(&mut h);
    Some(h.finish())
}
