//! podprobe-model: PodProbeMarker's pure core, with no I/O, shared by podprobe-manager (which
//! drives it from its controllers and admission server) and the kubectl plugin (which shows
//! what it decides):
//! - [`crd`]: the `PodProbeMarker` resource and its CRD, wire-compatible with OpenKruise;
//! - [`selector`]: label selectors and which PodProbeMarkers apply to a pod;
//! - [`annotate`] (+ [`gojson`]): the `kruise.io/podprobe` annotation a pod should hold, and
//!   its patch, byte for byte as kruise-manager writes it;
//! - [`markers`]: pod conditions → markerPolicy labels/annotations;
//! - [`validate`]: the PodProbeMarker validating webhook's rules;
//! - [`patch`]: RFC 6902 operations.
//!
//! The annotation's own wire type, parsing and per-probe checks are `podprobe-protocol`'s.

pub mod annotate;
pub mod crd;
pub mod gojson;
pub mod markers;
pub mod patch;
pub mod selector;
pub mod validate;
