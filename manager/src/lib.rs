//! podprobe-manager: the PodProbeMarker feature for clusters without OpenKruise.
pub mod crd;
