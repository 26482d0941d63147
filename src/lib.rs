//! podprobe: runs OpenKruise PodProbeMarker probes from inside a pod.

pub mod probe;
