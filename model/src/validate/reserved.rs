//! Marker keys a PodProbeMarker may not set: a marker is a label or annotation patch on every
//! pod the PodProbeMarker selects, so the keys that steer the protocol, Kubernetes' own
//! controllers or the PodProbeMarker's own selection are refused here (podprobe's rule, not
//! OpenKruise's; docs/kruise-compatibility.md). Every other key stays the author's to set:
//! grant PodProbeMarker creation as you would label and annotation patches on those pods.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use podprobe_protocol::annotation::{
    MARKER_LIST_ANNOTATION, PODPROBE_ANNOTATION, in_kubernetes_domain,
};
use podprobe_protocol::field::{FieldError, invalid, quoted};

use crate::crd::ProbeMarkerPolicy;

/// The one key in a Kubernetes domain a marker may set: the deletion cost that decides which
/// pods a ReplicaSet or CloneSet scales in first (the idle recipe).
pub const POD_DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// Label keys without a domain that controllers use to tell their pods apart; changed, a pod
/// leaves its ReplicaSet or StatefulSet revision.
const CONTROLLER_LABELS: &[&str] = &["pod-template-hash", "controller-revision-hash"];

/// The label keys `selector` reads.
pub fn selector_keys(selector: Option<&LabelSelector>) -> BTreeSet<&str> {
    let Some(selector) = selector else {
        return BTreeSet::new();
    };
    let labels = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, _)| k.as_str());
    let expressions = selector
        .match_expressions
        .iter()
        .flatten()
        .map(|e| e.key.as_str());
    labels.chain(expressions).collect()
}

/// One error per key of `policy` a marker may not set.
pub fn reserved_key_errors(
    policy: &ProbeMarkerPolicy,
    selected_by: &BTreeSet<&str>,
    path: &str,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for key in policy.labels.keys() {
        let why = if selected_by.contains(key.as_str()) {
            Some(
                "is a key of this PodProbeMarker's selector: the marker would change which pods it selects",
            )
        } else if CONTROLLER_LABELS.contains(&key.as_str()) {
            Some("is set by the pod's controller to tell its pods apart")
        } else {
            shared_reason(key)
        };
        if let Some(why) = why {
            errors.push(invalid(&format!("{path}.labels"), quoted(key), why));
        }
    }
    for (key, value) in &policy.annotations {
        let why = if key == POD_DELETION_COST {
            value
                .parse::<i32>()
                .is_err()
                .then_some("must be an integer in the int32 range, as the apiserver requires")
        } else {
            shared_reason(key)
        };
        if let Some(why) = why {
            let shown = if key == POD_DELETION_COST { value } else { key };
            errors.push(invalid(&format!("{path}.annotations"), quoted(shown), why));
        }
    }
    errors
}

/// Why neither a label nor an annotation may use `key`.
fn shared_reason(key: &str) -> Option<&'static str> {
    if key == PODPROBE_ANNOTATION || key == MARKER_LIST_ANNOTATION {
        return Some(
            "is written by the PodProbeMarker controller: the marker would change the probes the sidecar runs",
        );
    }
    in_kubernetes_domain(key).then_some(
        "is in a domain Kubernetes reserves for its components (kubernetes.io, k8s.io); of those, a marker may set only the annotation controller.kubernetes.io/pod-deletion-cost",
    )
}
