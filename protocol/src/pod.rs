//! Which pods still run probes.

use k8s_openapi::api::core::v1::Pod;

/// Not terminating and not finished: its probes run and its markers are kept. A terminating
/// pod is not probed (kruise-daemon stops too), and a finished one never runs again.
pub fn is_active(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && !matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}
