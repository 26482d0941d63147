//! The pod annotations of the protocol, the wire type of one probe in `kruise.io/podprobe`, and
//! its parsing and per-probe checks ([`parse`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Probe;
use serde::{Deserialize, Serialize};

/// Pod annotation holding the probes (written by kruise-manager or podprobe-manager).
pub const PODPROBE_ANNOTATION: &str = "kruise.io/podprobe";
/// Pod annotation listing the PodProbeMarkers that contributed probes.
pub const MARKER_LIST_ANNOTATION: &str = "kruise.io/podprobemarker-list";

/// Kubernetes caps the total size of an object's annotations at 256 KiB, so a larger value
/// cannot have come from a real apiserver; refusing it bounds what podprobe parses.
pub const MAX_ANNOTATION_BYTES: usize = 256 * 1024;

/// At most this many probes run in one pod: later valid entries are refused. Each probe has at
/// most one attempt in flight (its next waits for the last, as the kubelet's workers do), so
/// this also bounds a sidecar's concurrent exec streams, processes and connections.
pub const MAX_PROBES_PER_POD: usize = 32;

/// Longest `timeoutSeconds` a probe may ask for (five minutes): one attempt holds its exec
/// stream, process or connection at most this long.
pub const MAX_TIMEOUT_SECONDS: i32 = 300;

/// Condition types owned by the kubelet and Kruise: the sidecar never writes them, the manager
/// refuses a probe that names one, and the chart's admission policy denies the sidecar's token
/// any write of them (with the domains of [`is_reserved_condition_type`]).
pub const RESERVED_CONDITION_TYPES: &[&str] = &[
    "PodScheduled",
    "Initialized",
    "Ready",
    "ContainersReady",
    "KruisePodReady",
    "InPlaceUpdateReady",
    "PodReadyToStartContainers",
    "DisruptionTarget",
    "PodResizePending",
    "PodResizeInProgress",
];

/// Prefix domains Kubernetes reserves for its own components.
const KUBERNETES_DOMAINS: &[&str] = &["kubernetes.io", "k8s.io"];

/// Whether a qualified name (a condition type, a label or annotation key) is in a domain
/// Kubernetes reserves: `kubernetes.io/x`, `k8s.io/x`, `*.kubernetes.io/x`, `*.k8s.io/x`.
pub fn in_kubernetes_domain(name: &str) -> bool {
    let Some((prefix, _)) = name.split_once('/') else {
        return false;
    };
    KUBERNETES_DOMAINS.iter().any(|domain| {
        prefix == *domain
            || prefix
                .strip_suffix(domain)
                .is_some_and(|sub| sub.ends_with('.'))
    })
}

/// Whether a probe may not use `condition_type`: one of [`RESERVED_CONDITION_TYPES`], or a
/// type in a Kubernetes domain ([`in_kubernetes_domain`]), not a probe's to write.
pub fn is_reserved_condition_type(condition_type: &str) -> bool {
    RESERVED_CONDITION_TYPES.contains(&condition_type) || in_kubernetes_domain(condition_type)
}

/// Probe names OpenKruise's webhook refuses: it checks the probe *name* against the first six
/// of [`RESERVED_CONDITION_TYPES`], not the condition type.
pub const RESERVED_PROBE_NAMES: &[&str] = RESERVED_CONDITION_TYPES.split_at(6).0;

/// One probe of a PodProbeMarker (OpenKruise's `PodContainerProbe`).
// One type for both places it travels: a PodProbeMarker's `spec.probes` (the CRD's schema is
// derived from it, `schema` feature) and an element of the `kruise.io/podprobe` annotation,
// where the writer clears `markerPolicy` (accepted if present, never used). Every field
// decodes when missing, so a probe without a name or container is refused with a field error
// rather than failing to decode; the CRD's schema still requires them (model's `crd`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PodContainerProbe {
    /// Probe name, unique within the PodProbeMarker.
    #[serde(default)]
    pub name: String,
    /// The container the probe targets.
    #[serde(default)]
    pub container_name: String,
    /// The probe itself (core/v1 Probe; OpenKruise applies no defaults).
    #[serde(default)]
    pub probe: Probe,
    /// Labels/annotations to set on the pod for each probe state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub marker_policy: Vec<ProbeMarkerPolicy>,
    /// The pod condition that records the probe result.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_condition_type: String,
}

/// Metadata applied to the pod while its probe is in `state`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ProbeMarkerPolicy {
    /// Probe state the policy applies to: `Succeeded` or `Failed`.
    // A plain string, so other values decode and are then refused with a field error.
    pub state: String,
    /// Labels to set on the pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations to set on the pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

mod parse;
#[cfg(test)]
mod tests;

pub use parse::{
    AnnotationError, InvalidProbe, PodContainers, ProbeError, ProbeSet, ProbeSpec, RawTiming,
    from_pod, parse, validate,
};
