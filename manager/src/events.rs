//! Who the manager's Events say reported them: one name for every room that records one (the
//! unprobed-pod sweep, the token issuer), so the chart's policy, which admits Events from that
//! controller only, and `kubectl get events` see one reporter.

use kube::runtime::events::Reporter;

/// The Events' `reportingController` (the chart's policy checks it).
pub const REPORTING_CONTROLLER: &str = "podprobe-manager";

/// This replica as the reporter of an Event.
pub fn reporter() -> Reporter {
    Reporter {
        controller: REPORTING_CONTROLLER.into(),
        instance: Some(crate::leader::replica_name()),
    }
}
