//! Kubernetes Events on the sidecar's pod: `KruiseProbeSucceeded` / `KruiseProbeFailed` on state
//! transitions (the reasons OpenKruise users already watch), and rate-limited warnings
//! `PodProbeInvalid` / `PodProbeError` / `PodProbeConditionOverwritten`. Publishing never blocks
//! probing: each event is sent from its own task, and a failure is only logged. Every Event
//! passes client-go's spam filter first ([`EventBudget`]), as the kubelet's and kruise-daemon's
//! probe events do: a pod flipping all day costs the apiserver one Event write per type every
//! five minutes, not one per transition.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::Clock;
use governor::{Quota, RateLimiter};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::time::Instant;

use podprobe_protocol::event;

use crate::runner::{ProbeState, Transition};

/// The `reason` of an Event (not of a condition: those are `ProbeState::condition_reason`'s).
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
            EventReason::ProbeSucceeded => event::PROBE_SUCCEEDED,
            EventReason::ProbeFailed => event::PROBE_FAILED,
            EventReason::ProbeInvalid => event::PROBE_INVALID,
            EventReason::ProbeError => event::PROBE_ERROR,
            EventReason::ConditionOverwritten => event::CONDITION_OVERWRITTEN,
        }
    }
}

/// A warning with the same key is emitted at most once per this interval.
pub const WARNING_INTERVAL: Duration = Duration::from_secs(600);

/// How many Events of one type (Normal, Warning) a sidecar publishes: `burst` at once, then
/// one per `refill`. client-go's EventCorrelator filters every recorder's Events this way
/// (burst 25, one per 5 minutes, keyed by source, object and type), so the defaults make
/// podprobe exactly as frugal as the kubelet and kruise-daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventBudget {
    pub burst: NonZeroU32,
    pub refill: Duration,
}

impl Default for EventBudget {
    fn default() -> Self {
        EventBudget {
            burst: NonZeroU32::new(25).expect("non-zero"),
            refill: Duration::from_secs(300),
        }
    }
}

/// governor's clock on tokio's time, so that paused-time tests drive the budget.
#[derive(Debug, Clone, Copy, Default)]
struct TokioClock;

impl Clock for TokioClock {
    type Instant = std::time::Instant;
    fn now(&self) -> Self::Instant {
        Instant::now().into_std()
    }
}

type Limiter = RateLimiter<
    governor::state::NotKeyed,
    governor::state::InMemoryState,
    TokioClock,
    governor::middleware::NoOpMiddleware<std::time::Instant>,
>;

/// One budget per Event type, as client-go's spam key includes the type.
struct Budgets {
    budget: EventBudget,
    normal: Limiter,
    warning: Limiter,
    /// Whether a refusal of that type was logged at info already (later ones go to debug).
    refusal_said: [bool; 2],
}

impl Budgets {
    fn new(budget: EventBudget) -> Self {
        // `--event-refill 0s` means no limit: a cell back every nanosecond (governor refuses
        // a zero period).
        let period = budget.refill.max(Duration::from_nanos(1));
        let quota = Quota::with_period(period)
            .expect("non-zero period")
            .allow_burst(budget.burst);
        Budgets {
            budget,
            normal: RateLimiter::direct_with_clock(quota, TokioClock),
            warning: RateLimiter::direct_with_clock(quota, TokioClock),
            refusal_said: [false; 2],
        }
    }

    /// Takes one Event of `type_` from its budget; a refusal is logged, the first one of each
    /// type at info so that a user looking for Events learns why they stopped.
    fn admit(&mut self, type_: EventType, reason: EventReason) -> bool {
        if self.take(type_) {
            return true;
        }
        let index = usize::from(type_ == EventType::Warning);
        if std::mem::replace(&mut self.refusal_said[index], true) {
            tracing::debug!(
                reason = reason.as_str(),
                "event budget spent: event not published"
            );
        } else {
            tracing::info!(
                reason = reason.as_str(),
                event_type = ?type_,
                burst = self.budget.burst.get(),
                refill = ?self.budget.refill,
                "this pod's Events of this type exceed their budget (--event-burst, then one per \
                 --event-refill, as client-go's spam filter): further ones are dropped until it \
                 refills; conditions are written as always"
            );
        }
        false
    }

    fn take(&self, type_: EventType) -> bool {
        match type_ {
            EventType::Normal => self.normal.check().is_ok(),
            EventType::Warning => self.warning.check().is_ok(),
        }
    }
}

/// Where events go (or nowhere, with `--events=false`).
pub struct EventSink {
    recorder: Option<Recorder>,
    budgets: Budgets,
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
    pub fn new(
        client: Client,
        pod: ObjectReference,
        instance: Option<String>,
        budget: EventBudget,
    ) -> Self {
        let reporter = Reporter {
            controller: "podprobe".into(),
            instance,
        };
        EventSink {
            recorder: Some(Recorder::new(client, reporter)),
            budgets: Budgets::new(budget),
            pod,
            last_warning: HashMap::new(),
        }
    }

    pub fn disabled() -> Self {
        EventSink {
            recorder: None,
            budgets: Budgets::new(EventBudget::default()),
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

    fn publish(&mut self, type_: EventType, reason: EventReason, action: &str, note: String) {
        let Some(recorder) = self.recorder.clone() else {
            return;
        };
        if !self.budgets.admit(type_, reason) {
            return;
        }
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

    #[tokio::test(start_paused = true)]
    async fn each_event_type_has_a_burst_then_one_per_refill() {
        let budget = EventBudget {
            burst: NonZeroU32::new(3).unwrap(),
            refill: Duration::from_secs(300),
        };
        let mut budgets = Budgets::new(budget);
        for _ in 0..3 {
            assert!(budgets.take(EventType::Normal));
        }
        assert!(
            !budgets.admit(EventType::Normal, EventReason::ProbeFailed),
            "the burst is spent"
        );
        assert_eq!(budgets.refusal_said, [true, false], "said once, for Normal");
        assert!(
            budgets.take(EventType::Warning),
            "warnings have their own budget"
        );
        tokio::time::advance(Duration::from_secs(299)).await;
        assert!(
            !budgets.take(EventType::Normal),
            "one comes back per refill"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(budgets.take(EventType::Normal));
        assert!(!budgets.take(EventType::Normal));
    }

    #[test]
    fn the_default_budget_is_client_gos_spam_filter() {
        let budget = EventBudget::default();
        assert_eq!(
            (budget.burst.get(), budget.refill),
            (25, Duration::from_secs(300))
        );
    }
}
