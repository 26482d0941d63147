//! The `reason`s of the Events the sidecar writes on its pod: what users filter on, and what
//! `kubectl podprobe` reads back. One spelling for both.

/// A probe's state became Succeeded (kruise-daemon's reason, kept for OpenKruise users).
pub const PROBE_SUCCEEDED: &str = "KruiseProbeSucceeded";
/// A probe's state became Failed (kruise-daemon's reason).
pub const PROBE_FAILED: &str = "KruiseProbeFailed";
/// A probe of the annotation was refused by validation.
pub const PROBE_INVALID: &str = "PodProbeInvalid";
/// An attempt could not run.
pub const PROBE_ERROR: &str = "PodProbeError";
/// Another writer removed or changed a condition the sidecar published.
pub const CONDITION_OVERWRITTEN: &str = "PodProbeConditionOverwritten";
