//! A probe's state and its two spellings on the pod: the condition status the sidecar writes and
//! the `markerPolicy.state` the manager matches (OpenKruise's `ProbeState`).

use serde::Serialize;

/// `markerPolicy.state` for a probe that succeeded (pod condition `True`).
pub const STATE_SUCCEEDED: &str = ProbeState::Succeeded.as_str();
/// `markerPolicy.state` for a probe that failed (pod condition `False`).
pub const STATE_FAILED: &str = ProbeState::Failed.as_str();

/// The `reason` of a probe's pod condition in each state (its Events have their own reasons:
/// [`crate::event`]).
pub const CONDITION_REASON_SUCCEEDED: &str = "PodProbeSucceeded";
pub const CONDITION_REASON_FAILED: &str = "PodProbeFailed";
pub const CONDITION_REASON_UNKNOWN: &str = "PodProbeUnknown";

/// The state a probe publishes. `Unknown` is a condition status only: no marker policy
/// selects it, so markers stay as they are until the probe decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ProbeState {
    Succeeded,
    Failed,
    Unknown,
}

impl ProbeState {
    pub const fn as_str(self) -> &'static str {
        match self {
            ProbeState::Succeeded => "Succeeded",
            ProbeState::Failed => "Failed",
            ProbeState::Unknown => "Unknown",
        }
    }

    /// `True` / `False` / `Unknown`, as OpenKruise maps probe states to condition statuses.
    pub const fn condition_status(self) -> &'static str {
        match self {
            ProbeState::Succeeded => "True",
            ProbeState::Failed => "False",
            ProbeState::Unknown => "Unknown",
        }
    }

    /// The `reason` the sidecar gives the condition in this state.
    pub const fn condition_reason(self) -> &'static str {
        match self {
            ProbeState::Succeeded => CONDITION_REASON_SUCCEEDED,
            ProbeState::Failed => CONDITION_REASON_FAILED,
            ProbeState::Unknown => CONDITION_REASON_UNKNOWN,
        }
    }

    /// The state a condition status stands for; anything but `True`/`False` is `Unknown`.
    pub fn of_condition_status(status: &str) -> ProbeState {
        match status {
            "True" => ProbeState::Succeeded,
            "False" => ProbeState::Failed,
            _ => ProbeState::Unknown,
        }
    }

    /// The `markerPolicy.state` this state selects, if any.
    pub fn marker_state(self) -> Option<&'static str> {
        match self {
            ProbeState::Unknown => None,
            decided => Some(decided.as_str()),
        }
    }
}

impl std::fmt::Display for ProbeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::ProbeState;

    #[test]
    fn condition_statuses_round_trip_and_only_decided_states_select_markers() {
        for state in [
            ProbeState::Succeeded,
            ProbeState::Failed,
            ProbeState::Unknown,
        ] {
            assert_eq!(
                ProbeState::of_condition_status(state.condition_status()),
                state
            );
        }
        assert_eq!(ProbeState::of_condition_status("true"), ProbeState::Unknown);
        assert_eq!(ProbeState::Succeeded.marker_state(), Some("Succeeded"));
        assert_eq!(ProbeState::Failed.marker_state(), Some("Failed"));
        assert_eq!(ProbeState::Unknown.marker_state(), None);
    }
}
