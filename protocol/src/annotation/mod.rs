//! The pod annotations of the protocol, the wire type of one probe in `kruise.io/podprobe`, and
//! its parsing and per-probe checks ([`parse`]).

use k8s_openapi::api::core::v1::Probe;
use serde::{Deserialize, Serialize};

/// Pod annotation holding the probes (written by kruise-manager or podprobe-manager).
pub const PODPROBE_ANNOTATION: &str = "kruise.io/podprobe";
/// Pod annotation listing the PodProbeMarkers that contributed probes.
pub const MARKER_LIST_ANNOTATION: &str = "kruise.io/podprobemarker-list";

/// Kubernetes caps the total size of an object's annotations at 256 KiB, so a larger value
/// cannot have come from a real apiserver; refusing it bounds what podprobe parses.
pub const MAX_ANNOTATION_BYTES: usize = 256 * 1024;

/// Condition types owned by the kubelet and Kruise: the sidecar never writes them and the
/// manager refuses a probe that names one.
pub const RESERVED_CONDITION_TYPES: &[&str] = &[
    "PodScheduled",
    "Initialized",
    "Ready",
    "ContainersReady",
    "KruisePodReady",
    "InPlaceUpdateReady",
    "PodReadyToStartContainers",
    "DisruptionTarget",
];

/// Probe names OpenKruise's webhook refuses: it checks the probe *name* against the first six
/// of [`RESERVED_CONDITION_TYPES`], not the condition type.
pub const RESERVED_PROBE_NAMES: &[&str] = RESERVED_CONDITION_TYPES.split_at(6).0;

/// One element of the annotation, exactly as OpenKruise serialises `PodContainerProbe`
/// (`markerPolicy` is stripped by the writer; it is accepted and ignored if present).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodContainerProbe {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub container_name: String,
    #[serde(default)]
    pub probe: Probe,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_condition_type: Option<String>,
}

mod parse;
#[cfg(test)]
mod tests;

pub use parse::{
    AnnotationError, InvalidProbe, PodContainers, ProbeError, ProbeSet, ProbeSpec, RawTiming,
    from_pod, parse, validate,
};
