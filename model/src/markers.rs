//! Markers: turning the pod conditions the sidecar writes into the `markerPolicy`
//! labels/annotations of the probes' PodProbeMarkers.
//!
//! Per pod (not per PPM as in OpenKruise), so one pod event yields at most one patch covering
//! every PPM that applies. Unlike OpenKruise's serverless path, the keys of the opposite-state
//! policy are removed (the contract and OpenKruise's daemon path both do this), and a pod whose
//! labels or annotations map is missing gets no empty `{}` patch when nothing changes.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use serde::Serialize;

use podprobe_protocol::state::ProbeState;

use crate::crd::{PodContainerProbe, PodProbeMarker};
use crate::selector::markers_for_pod;

/// A strategic-merge patch of pod metadata: `Some` sets a key, `None` (JSON `null`) deletes it.
/// Serializes as `{"metadata":{"annotations":{..},"labels":{..}}}` with sorted keys, which is
/// the byte order Go's map encoding produces for OpenKruise's patch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MarkerPatch {
    pub metadata: MetadataPatch,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MetadataPatch {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, Option<String>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, Option<String>>,
}

impl MarkerPatch {
    /// The body for `PATCH pods/<name>` with `application/strategic-merge-patch+json`.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn is_empty(&self) -> bool {
        self.metadata.annotations.is_empty() && self.metadata.labels.is_empty()
    }
}

/// What the policies of one pass want for each key: a value, or removal.
#[derive(Default)]
struct Desired {
    labels: BTreeMap<String, Option<String>>,
    annotations: BTreeMap<String, Option<String>>,
}

/// Records the first value set for a key; a removal only when no policy sets the key, so a
/// key shared by several probes never flaps with PPM order.
fn want(map: &mut BTreeMap<String, Option<String>>, key: &str, value: Option<&str>) {
    match (map.get(key), value) {
        (Some(Some(_)), _) | (Some(None), None) => {}
        _ => {
            map.insert(key.to_owned(), value.map(str::to_owned));
        }
    }
}

/// The patch that brings `pod`'s metadata in line with its probe conditions, or `None` when it
/// already is (no API call). `namespace_ppms` are the PPMs of the pod's namespace; the ones
/// that apply are chosen as the webhook does (list annotation, else selector), in name order.
pub fn marker_patch(pod: &Pod, namespace_ppms: &[PodProbeMarker]) -> Option<MarkerPatch> {
    let conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let mut desired = Desired::default();
    // Sets are collected before removals so "sets beat removals" holds across probes too.
    let mut removals: Vec<(&PodContainerProbe, &str)> = Vec::new();
    for ppm in markers_for_pod(pod, namespace_ppms) {
        for probe in &ppm.spec.probes {
            if probe.pod_condition_type.is_empty() || probe.marker_policy.is_empty() {
                continue;
            }
            let Some(state) = condition_state(conditions, &probe.pod_condition_type) else {
                continue;
            };
            for policy in probe.marker_policy.iter().filter(|p| p.state == state) {
                for (k, v) in &policy.labels {
                    want(&mut desired.labels, k, Some(v));
                }
                for (k, v) in &policy.annotations {
                    want(&mut desired.annotations, k, Some(v));
                }
            }
            removals.push((probe, state));
        }
    }
    for (probe, state) in removals {
        let matched: Vec<_> = probe
            .marker_policy
            .iter()
            .filter(|p| p.state == state)
            .collect();
        for policy in probe.marker_policy.iter().filter(|p| p.state != state) {
            for k in policy.labels.keys() {
                if !matched.iter().any(|m| m.labels.contains_key(k)) {
                    want(&mut desired.labels, k, None);
                }
            }
            for k in policy.annotations.keys() {
                if !matched.iter().any(|m| m.annotations.contains_key(k)) {
                    want(&mut desired.annotations, k, None);
                }
            }
        }
    }
    let patch = MarkerPatch {
        metadata: MetadataPatch {
            labels: diff(pod.metadata.labels.as_ref(), desired.labels),
            annotations: diff(pod.metadata.annotations.as_ref(), desired.annotations),
        },
    };
    (!patch.is_empty()).then_some(patch)
}

/// The policy state a condition selects: `True` → Succeeded, `False` → Failed; `Unknown`,
/// anything else or no condition → none (markers stay as they are until the probe decides).
fn condition_state(conditions: &[PodCondition], condition_type: &str) -> Option<&'static str> {
    let condition = conditions.iter().find(|c| c.type_ == condition_type)?;
    ProbeState::of_condition_status(&condition.status).marker_state()
}

fn diff(
    current: Option<&BTreeMap<String, String>>,
    desired: BTreeMap<String, Option<String>>,
) -> BTreeMap<String, Option<String>> {
    desired
        .into_iter()
        .filter(|(k, want)| current.and_then(|c| c.get(k)) != want.as_ref())
        .collect()
}

/// Condition types whose status changed between two versions of a pod, including types new in
/// `new`; removed conditions and message/reason/time-only changes do not count (OpenKruise's
/// pod event filter, so controllers react to the same events).
pub fn changed_condition_types(old: &Pod, new: &Pod) -> BTreeSet<String> {
    let conds = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default()
    };
    let old = conds(old);
    conds(new)
        .into_iter()
        .filter(|n| {
            old.iter()
                .find(|o| o.type_ == n.type_)
                .is_none_or(|o| o.status != n.status)
        })
        .map(|c| c.type_)
        .collect()
}

/// Whether any PPM applying to `pod` has a marker probe on one of `condition_types`; lets a pod
/// watcher skip events that cannot change markers.
pub fn affects_markers(
    pod: &Pod,
    namespace_ppms: &[PodProbeMarker],
    condition_types: &BTreeSet<String>,
) -> bool {
    markers_for_pod(pod, namespace_ppms).iter().any(|ppm| {
        ppm.spec
            .probes
            .iter()
            .any(|p| !p.marker_policy.is_empty() && condition_types.contains(&p.pod_condition_type))
    })
}

#[cfg(test)]
mod tests;
