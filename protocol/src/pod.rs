//! Which pods still run probes, and who writes their probe conditions.

use k8s_openapi::api::core::v1::Pod;

/// The field manager of the sidecar's status writes, so `managedFields` tell its writes apart
/// from every other writer's (the kubelet, a vendor runtime, kruise-daemon's manager).
pub const FIELD_MANAGER: &str = "podprobe";

/// Not terminating and not finished: its probes run and its markers are kept. A terminating
/// pod is not probed (kruise-daemon stops too), and a finished one never runs again.
pub fn is_active(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && !matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}
