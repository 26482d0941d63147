//! Reading a failed write: could the apiserver answer at all, what it asked for, and one log
//! line a user can act on.

use std::time::Duration;

use podprobe_protocol::uid_guard::refused_by_uid_guard;

/// Whether a failure says the apiserver could not answer (no answer at all, 5xx, 429) rather
/// than refused the write (other 4xx): the former is retried within
/// [`WriterConfig::unavailable_backoff_max`].
pub(super) fn cannot_answer(code: Option<u16>) -> bool {
    code.is_none_or(|c| c >= 500 || c == 429)
}

/// The HTTP code (None for transport errors) and the server's retry hint.
pub(super) fn classify(error: &kube::Error) -> (Option<u16>, Option<Duration>) {
    match error {
        kube::Error::Api(status) => {
            let retry = status
                .details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(u64::from(s)));
            (Some(status.code), retry)
        }
        _ => (None, None),
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

/// Equal jitter: a wait in [backoff/2, backoff], so retries of many pods spread out but none
/// comes back sooner than half the backoff.
/// The wait after a failed write, and the backoff after it: doubling from `backoff` to the
/// cap of its kind (refused, cannot answer, throttled), half to all of it at random. A
/// `Retry-After` is the wait as given, except on a 429, where it is a floor under the growing
/// backoff: every sidecar of a fleet gets the same 1 s, and honouring it exactly makes them
/// ask again together.
pub(super) fn failure_wait(
    config: &super::WriterConfig,
    code: Option<u16>,
    retry_after: Option<Duration>,
    backoff: Duration,
) -> (Duration, Duration) {
    let cap = match code {
        Some(429) => config.throttled_backoff_max,
        _ if cannot_answer(code) => config.unavailable_backoff_max,
        _ => config.backoff_max,
    };
    let next = (backoff * 2).min(cap);
    let wait = match (code, retry_after) {
        (Some(429), hint) => jitter(backoff.min(cap)).max(hint.unwrap_or_default()),
        (_, Some(hint)) => hint,
        _ => jitter(backoff.min(cap)),
    };
    (wait, next)
}

pub(super) fn jitter(backoff: Duration) -> Duration {
    backoff.mul_f64(0.5 + rand::random::<f64>() / 2.0)
}
