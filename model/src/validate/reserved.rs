//! Marker keys a PodProbeMarker may not set: a marker is a label or annotation patch on every
//! pod the PodProbeMarker selects, so the keys that steer the protocol, Kubernetes' own
//! controllers or the PodProbeMarker's own selection are refused here (podprobe's rule, not
//! OpenKruise's; docs/kruise-compatibility.md). Labels select pods (Services, controllers), so
//! labels in the domains Kubernetes reserves are refused too; annotations there are what
//! markers are for (the deletion cost, the cluster autoscaler's safe-to-evict, OpenKruise's own
//! test vectors use `controller.kubernetes.io/*`), so only the protocol's and a malformed
//! deletion cost are. Every other key stays the author's to set: grant PodProbeMarker creation
//! as you would label and annotation patches on those pods.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use podprobe_protocol::annotation::{
    MARKER_LIST_ANNOTATION, PODPROBE_ANNOTATION, in_kubernetes_domain,
};
use podprobe_protocol::field::{FieldError, invalid, quoted};

use crate::crd::ProbeMarkerPolicy;

/// The deletion cost that decides which pods a ReplicaSet or CloneSet scales in first (the
/// idle recipe): the apiserver refuses a pod whose value is not an int32.
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
        } else if in_kubernetes_domain(key) {
            Some(
                "is a label in a domain Kubernetes reserves for its components (kubernetes.io, k8s.io), which Services and controllers select by",
            )
        } else {
            protocol_reason(key)
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
            protocol_reason(key)
        };
        if let Some(why) = why {
            let shown = if key == POD_DELETION_COST { value } else { key };
            errors.push(invalid(&format!("{path}.annotations"), quoted(shown), why));
        }
    }
    errors
}

/// Why neither a label nor an annotation may use `key`: the protocol's own.
fn protocol_reason(key: &str) -> Option<&'static str> {
    (key == PODPROBE_ANNOTATION || key == MARKER_LIST_ANNOTATION).then_some(
        "is written by the PodProbeMarker controller: the marker would change the probes the sidecar runs",
    )
}
