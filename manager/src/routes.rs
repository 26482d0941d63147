//! The admission server's paths: the webhook serves them, the metrics label its requests by
//! them (each series exists from start-up), the chart's webhook configurations name them.

/// Pods on CREATE: the `kruise.io/podprobe` annotation and the sidecar.
pub const MUTATE_PODS_PATH: &str = "/mutate-pods";
/// PodProbeMarkers on CREATE and UPDATE.
pub const VALIDATE_PPM_PATH: &str = "/validate-podprobemarkers";
