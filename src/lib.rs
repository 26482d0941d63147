//! podprobe: runs OpenKruise PodProbeMarker probes from inside a pod.

pub mod annotation;
pub mod condition;
pub mod probe;
pub mod runner;
