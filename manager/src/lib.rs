//! podprobe-manager: the PodProbeMarker feature for clusters without OpenKruise.
pub mod annotate;
pub mod cli;
pub mod config;
pub mod crd;
pub mod gojson;
pub mod inject;
pub mod manifest;
pub mod markers;
pub mod patch;
pub mod selector;
pub mod validate;
