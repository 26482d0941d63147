//! Kubernetes Events on the sidecar's pod: `KruiseProbeSucceeded` / `KruiseProbeFailed` on state
//! transitions (the reasons OpenKruise users already watch), and rate-limited warnings
//! `PodProbeInvalid` / `PodProbeError` / `PodProbeConditionOverwritten`. Publishing never blocks probing: each event is sent from
//! its own task, and a failure is only logged.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::time::Instant;

use crate::runner::{ProbeState, Transition};

/// The `reason` of an Event (not of a condition: those are `condition::reason_of`'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventReason {
    /// A probe's state became Succeeded (kruise-daemon's reason).
    ProbeSucceeded,
    /// A probe's state became Failed (kruise-daemon's reason).
    ProbeFailed,
    /// A probe of the annotation was refused by validation.
    ProbeInvalid,
    /// An attempt could not run.
    ProbeError,
    /// Another writer removed or changed a condition podprobe published.
    ConditionOverwritten,
}

impl EventReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            EventReason::ProbeSucceeded => "KruiseProbeSucceeded",
            EventReason::ProbeFailed => "KruiseProbeFailed",
            EventReason::ProbeInvalid => "PodProbeInvalid",
            EventReason::ProbeError => "PodProbeError",
            EventReason::ConditionOverwritten => "PodProbeConditionOverwritten",
        }
    }
}

/// A warning with the same key is emitted at most once per this interval.
pub const WARNING_INTERVAL: Duration = Duration::from_secs(600);

/// Where events go (or nowhere, with `--events=false`).
pub struct EventSink {
    recorder: Option<Recorder>,
    pod: ObjectReference,
    last_warning: HashMap<String, Instant>,
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSink")
            .field("enabled", &self.recorder.is_some())
            .field("pod", &self.pod.name)
            .finish()
    }
}

impl EventSink {
    pub fn new(client: Client, pod: ObjectReference, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: "podprobe".into(),
            instance,
        };
        EventSink {
            recorder: Some(Recorder::new(client, reporter)),
            pod,
            last_warning: HashMap::new(),
        }
    }

    pub fn disabled() -> Self {
        EventSink {
            recorder: None,
            pod: ObjectReference::default(),
            last_warning: HashMap::new(),
        }
    }

    /// The pod's uid, once known (events reference it).
    pub fn set_uid(&mut self, uid: Option<String>) {
        self.pod.uid = uid;
    }

    /// A state transition. `Unknown` (container restarted) emits nothing: it is not a result.
    pub fn transition(&mut self, t: &Transition) {
        let reason = match t.state {
            ProbeState::Succeeded => EventReason::ProbeSucceeded,
            ProbeState::Failed => EventReason::ProbeFailed,
            ProbeState::Unknown => return,
        };
        let note = format!(
            "probe {} ({}): {}",
            t.probe.name, t.probe.condition_type, t.message
        );
        self.publish(EventType::Normal, reason, "Probe", note);
    }

    /// A probe refused by validation; one event per distinct problem per interval.
    pub fn invalid(&mut self, description: &str) {
        if self.allow(format!("invalid/{description}")) {
            self.publish(
                EventType::Warning,
                EventReason::ProbeInvalid,
                "Validate",
                description.to_owned(),
            );
        }
    }

    /// An errored attempt; at most one event per probe per interval.
    pub fn errored(&mut self, condition_type: &str, probe: &str, error: &str) {
        if self.allow(format!("error/{condition_type}")) {
            let note = format!("probe {probe} ({condition_type}) could not run: {error}");
            self.publish(EventType::Warning, EventReason::ProbeError, "Probe", note);
        }
    }

    /// Another writer removed or changed a condition; at most one event per condition per
    /// interval.
    pub fn overwritten(&mut self, condition_type: &str, writer: &str) {
        if self.allow(format!("overwritten/{condition_type}")) {
            let note = format!(
                "{writer} removed or changed condition {condition_type}; podprobe writes it back"
            );
            self.publish(
                EventType::Warning,
                EventReason::ConditionOverwritten,
                "Repair",
                note,
            );
        }
    }

    fn allow(&mut self, key: String) -> bool {
        let now = Instant::now();
        match self.last_warning.get(&key) {
            Some(last) if now.duration_since(*last) < WARNING_INTERVAL => false,
            _ => {
                self.last_warning.insert(key, now);
                true
            }
        }
    }

    fn publish(&self, type_: EventType, reason: EventReason, action: &str, note: String) {
        let Some(recorder) = self.recorder.clone() else {
            return;
        };
        let pod = self.pod.clone();
        // Event notes are limited to 1 KiB by the events API.
        let note = crate::probe::truncate_message(note);
        let event = Event {
            type_,
            reason: reason.as_str().to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &pod).await {
                tracing::warn!(reason = %event.reason, "cannot publish an event: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn warnings_are_rate_limited_per_key() {
        let mut sink = EventSink::disabled();
        assert!(sink.allow("error/a".into()));
        assert!(!sink.allow("error/a".into()));
        assert!(sink.allow("error/b".into()));
        tokio::time::advance(WARNING_INTERVAL).await;
        assert!(sink.allow("error/a".into()));
    }
}
