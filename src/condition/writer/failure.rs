//! Reading a failed write: its HTTP code and one log
//! line a user can act on.

use podprobe_protocol::uid_guard::refused_by_uid_guard;

/// The HTTP code (None for transport errors), the `code` label of the write-error metric.
pub(super) fn code_of(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

pub(super) const REPLACED: &str =
    "the pod's uid differs: it was replaced by a same-named pod, which this sidecar must not write";

/// One log line a user can act on.
pub(super) fn explain(pod: &str, code: Option<u16>, error: &kube::Error) -> String {
    let server = match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    };
    let hint = match code {
        // Admission refusals are 403s too: blaming RBAC sent users to a Role that was fine.
        Some(403) if server.contains("ValidatingAdmissionPolicy") => {
            "an admission policy refused the write: the chart's lets a sidecar write only the pod its token is bound to (POD_NAME must be that pod)"
        }
        Some(403) => {
            "RBAC does not allow `patch pods/status` for this service account (the chart's sidecar Role, or examples/sidecar-by-hand.yaml's, grants it)"
        }
        Some(401) => {
            "the apiserver no longer accepts this token (a pod-bound token stops working when its pod is deleted)"
        }
        Some(404) => "the pod no longer exists",
        Some(409 | 422) if matches!(error, kube::Error::Api(s) if refused_by_uid_guard(s)) => {
            REPLACED
        }
        Some(429) => "the apiserver asks to slow down",
        Some(c) if c >= 500 => "the apiserver failed",
        Some(_) => "unexpected answer",
        None => "cannot reach the apiserver",
    };
    format!("writing conditions of pod {pod} failed ({hint}); will retry with backoff: {server}")
}
