//! From probe transitions to the pod conditions podprobe writes, and the patch that writes them.
//!
//! Rules (contract §5): one condition per probe, `type = podConditionType`; `status`
//! `True|False|Unknown`; `reason` `PodProbeSucceeded|PodProbeFailed|PodProbeUnknown`;
//! `lastProbeTime` = when the probe behind the written result ran; `lastTransitionTime` changes
//! only when `status` changes. A condition is due for writing only when its status or message
//! differs from what the pod has. The patch is a strategic merge of `status.conditions` (merge
//! key `type`, so kubelet's conditions are untouched) with `metadata.uid` as a precondition.
//!
//! The model here is pure; [`writer`] sends the patches.

pub mod writer;

pub use writer::ConditionWrite;

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::PodCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::runner::Transition;

pub use podprobe_protocol::state::{
    CONDITION_REASON_FAILED, CONDITION_REASON_SUCCEEDED, CONDITION_REASON_UNKNOWN,
};

/// Kubernetes times have whole-second precision on the wire (Go truncates); keeping them so in
/// memory makes what podprobe holds compare equal to what it reads back.
pub fn kube_time(at: Timestamp) -> Time {
    let whole_seconds = jiff::TimestampRound::new()
        .smallest(jiff::Unit::Second)
        .mode(jiff::RoundMode::Trunc);
    Time(at.round(whole_seconds).unwrap_or(at))
}

pub use podprobe_protocol::pod::FIELD_MANAGER;

/// The conditions podprobe owns on one pod: what it published, and what the pod says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConditionBook {
    /// This sidecar's last result per condition type (refreshed by the heartbeat).
    published: BTreeMap<String, PodCondition>,
    /// The pod's conditions as last seen, first of each type (the apiserver allows duplicate
    /// types; like OpenKruise, the first one counts).
    observed: BTreeMap<String, PodCondition>,
}

impl ConditionBook {
    /// Starts from the pod's conditions, so a restarted sidecar keeps `lastTransitionTime` and
    /// does not rewrite conditions that already say the right thing.
    pub fn from_pod_conditions(existing: &[PodCondition]) -> Self {
        let mut book = ConditionBook::default();
        book.observe(existing);
        book
    }

    /// Follows the pod: what its status says now.
    pub fn observe(&mut self, conditions: &[PodCondition]) {
        self.observed.clear();
        for condition in conditions {
            self.observed
                .entry(condition.type_.clone())
                .or_insert_with(|| condition.clone());
        }
    }

    /// Records a transition. Returns the condition to write when its status or message differs
    /// from the last published one (or, before the first, from what the pod has); `None` when
    /// it already says this.
    pub fn record(&mut self, transition: &Transition) -> Option<PodCondition> {
        let condition_type = &transition.probe.condition_type;
        let status = transition.state.condition_status();
        let at = kube_time(transition.at);
        let previous = self
            .published
            .get(condition_type)
            .or_else(|| self.observed.get(condition_type));
        if previous.is_some_and(|p| says(p, status, &transition.message)) {
            return None;
        }
        let last_transition_time = match previous {
            Some(p) if p.status == status => p.last_transition_time.clone().or(Some(at.clone())),
            _ => Some(at.clone()),
        };
        let condition = PodCondition {
            type_: condition_type.clone(),
            status: status.to_owned(),
            reason: Some(transition.state.condition_reason().to_owned()),
            message: Some(transition.message.clone()),
            last_probe_time: Some(at),
            last_transition_time,
            ..Default::default()
        };
        self.published
            .insert(condition_type.clone(), condition.clone());
        Some(condition)
    }

    /// The published condition of `condition_type` when the pod, as last observed, lacks it or
    /// says another status or message: someone else changed it.
    pub fn drifted(&self, condition_type: &str) -> Option<&PodCondition> {
        let published = self.published.get(condition_type)?;
        let message = published.message.as_deref().unwrap_or("");
        match self.observed.get(condition_type) {
            Some(seen) if says(seen, &published.status, message) => None,
            _ => Some(published),
        }
    }

    /// The `--refresh-interval` heartbeat of a pod's conditions (`condition_types`, its
    /// probes'): when the `lastProbeTime` of one of them is at least `interval` old (and
    /// `interval` is not zero), every one of them that is published gets a new `lastProbeTime`,
    /// and is returned. So the heartbeats of a pod are one status write per interval, however
    /// many probes it has and whenever their results last changed (the writer coalesces the
    /// submissions of one tick into one patch). As before, a refreshed `lastProbeTime` is the
    /// heartbeat's time: the sidecar is alive and still publishes this result.
    pub fn refresh<'a>(
        &mut self,
        condition_types: impl IntoIterator<Item = &'a str> + Clone,
        now: Timestamp,
        interval: std::time::Duration,
    ) -> Vec<PodCondition> {
        if interval.is_zero() {
            return vec![];
        }
        let due = |c: &PodCondition| match &c.last_probe_time {
            Some(Time(last)) => now.duration_since(*last).as_secs_f64() >= interval.as_secs_f64(),
            None => true,
        };
        let any_due = condition_types
            .clone()
            .into_iter()
            .any(|ct| self.published.get(ct).is_some_and(due));
        if !any_due {
            return vec![];
        }
        condition_types
            .into_iter()
            .filter_map(|ct| {
                let condition = self.published.get_mut(ct)?;
                condition.last_probe_time = Some(kube_time(now));
                Some(condition.clone())
            })
            .collect()
    }

    /// The published condition of a type.
    pub fn get(&self, condition_type: &str) -> Option<&PodCondition> {
        self.published.get(condition_type)
    }

    /// Forgets the result of a probe that left the annotation: it is no longer refreshed or
    /// repaired.
    pub fn forget(&mut self, condition_type: &str) {
        self.published.remove(condition_type);
    }

    /// Every published condition, by type.
    pub fn iter(&self) -> impl Iterator<Item = &PodCondition> {
        self.published.values()
    }
}

/// Whether `condition` carries this status and message (what podprobe's writes are about;
/// times and reason follow from them).
fn says(condition: &PodCondition, status: &str, message: &str) -> bool {
    condition.status == status && condition.message.as_deref().unwrap_or("") == message
}

/// The strategic-merge patch for `pods/<name>/status` that sets or deletes conditions (merge
/// key `type`, deletes as `$patch: delete`) and nothing else, guarded by the pod's uid (a
/// same-named replacement pod is never written).
pub fn status_patch(uid: &str, writes: &[ConditionWrite]) -> serde_json::Value {
    serde_json::json!({
        "metadata": { "uid": uid },
        "status": { "conditions": writes },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::{ProbeId, ProbeState};
    use jiff::SignedDuration;
    use std::time::Duration;

    fn t(state: ProbeState, message: &str, at: Timestamp) -> Transition {
        Transition {
            probe: ProbeId {
                name: "idle".into(),
                condition_type: "game.kruise.io/idle".into(),
            },
            state,
            message: message.into(),
            at,
        }
    }

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_790_000_000 + secs).unwrap()
    }

    #[test]
    fn statuses_and_reasons() {
        assert_eq!(ProbeState::Failed.condition_reason(), "PodProbeFailed");
        assert_eq!(ProbeState::Unknown.condition_reason(), "PodProbeUnknown");
    }

    #[test]
    fn transition_times_follow_status_only() {
        let mut book = ConditionBook::default();
        let first = book
            .record(&t(ProbeState::Succeeded, "idle", ts(0)))
            .unwrap();
        assert_eq!(first.status, "True");
        assert_eq!(first.reason.as_deref(), Some("PodProbeSucceeded"));
        assert_eq!(first.last_transition_time, Some(Time(ts(0))));
        assert_eq!(first.last_probe_time, Some(Time(ts(0))));

        // Same status and message: nothing to write.
        assert!(
            book.record(&t(ProbeState::Succeeded, "idle", ts(5)))
                .is_none()
        );

        // Message change only: written, lastTransitionTime kept, lastProbeTime moves.
        let msg = book
            .record(&t(ProbeState::Succeeded, "idle v2", ts(10)))
            .unwrap();
        assert_eq!(msg.last_transition_time, Some(Time(ts(0))));
        assert_eq!(msg.last_probe_time, Some(Time(ts(10))));

        // Status change: both move.
        let failed = book.record(&t(ProbeState::Failed, "busy", ts(20))).unwrap();
        assert_eq!(failed.status, "False");
        assert_eq!(failed.last_transition_time, Some(Time(ts(20))));
    }

    #[test]
    fn a_restarted_sidecar_keeps_what_the_pod_says() {
        let existing = vec![
            PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            },
            PodCondition {
                type_: "game.kruise.io/idle".into(),
                status: "True".into(),
                message: Some("idle".into()),
                last_transition_time: Some(Time(ts(-100))),
                last_probe_time: Some(Time(ts(-100))),
                reason: Some(CONDITION_REASON_SUCCEEDED.into()),
                ..Default::default()
            },
        ];
        let mut book = ConditionBook::from_pod_conditions(&existing);
        assert!(
            book.record(&t(ProbeState::Succeeded, "idle", ts(0)))
                .is_none()
        );
        let changed = book
            .record(&t(ProbeState::Succeeded, "other", ts(1)))
            .unwrap();
        assert_eq!(changed.last_transition_time, Some(Time(ts(-100))));
    }

    #[test]
    fn refresh_heartbeat() {
        let mut book = ConditionBook::default();
        book.record(&t(ProbeState::Succeeded, "idle", ts(0)));
        let interval = Duration::from_secs(600);
        let ct = ["game.kruise.io/idle"];
        assert!(book.refresh(ct, ts(599), interval).is_empty());
        let refreshed = book.refresh(ct, ts(600), interval);
        assert_eq!(refreshed.len(), 1);
        assert_eq!(refreshed[0].last_probe_time, Some(Time(ts(600))));
        assert_eq!(refreshed[0].last_transition_time, Some(Time(ts(0))));
        assert!(book.refresh(ct, ts(601), interval).is_empty());
        assert!(
            book.refresh(ct, ts(100_000), Duration::ZERO).is_empty(),
            "0 = never"
        );
        assert!(book.refresh(["unknown"], ts(100_000), interval).is_empty());
    }

    #[test]
    fn a_pods_heartbeats_are_one_write_per_interval_whatever_its_conditions_times() {
        let mut book = ConditionBook::default();
        let mut second = t(ProbeState::Failed, "busy", ts(300));
        second.probe.condition_type = "game.kruise.io/busy".into();
        book.record(&t(ProbeState::Succeeded, "idle", ts(0)));
        book.record(&second);
        let interval = Duration::from_secs(600);
        let types = ["game.kruise.io/idle", "game.kruise.io/busy"];
        let at = |book: &mut ConditionBook, s| book.refresh(types, ts(s), interval).len();
        assert_eq!(at(&mut book, 599), 0);
        assert_eq!(
            at(&mut book, 600),
            2,
            "the first due brings the other along"
        );
        assert_eq!(at(&mut book, 900), 0, "the second's time moved with it");
        assert_eq!(at(&mut book, 1199), 0);
        assert_eq!(at(&mut book, 1200), 2);
    }

    #[test]
    fn patch_carries_only_conditions_and_the_uid() {
        let mut book = ConditionBook::default();
        let c = book
            .record(&t(
                ProbeState::Failed,
                "busy",
                ts(0) + SignedDuration::from_millis(700),
            ))
            .unwrap();
        let patch = status_patch("uid-1", &[ConditionWrite::Set(c)]);
        assert_eq!(
            patch,
            serde_json::json!({
                "metadata": {"uid": "uid-1"},
                "status": {"conditions": [{
                    "type": "game.kruise.io/idle",
                    "status": "False",
                    "reason": "PodProbeFailed",
                    "message": "busy",
                    "lastProbeTime": "2026-09-21T14:13:20Z",
                    "lastTransitionTime": "2026-09-21T14:13:20Z",
                }]}
            })
        );
        let delete = status_patch("uid-1", &[ConditionWrite::Delete("a".into())]);
        assert_eq!(
            delete["status"]["conditions"][0],
            serde_json::json!({"type": "a", "$patch": "delete"})
        );
    }

    #[test]
    fn the_book_follows_the_pod_and_sees_what_others_changed() {
        let ct = "game.kruise.io/idle";
        let mut book = ConditionBook::default();
        assert_eq!(book.drifted(ct), None, "nothing published, nothing to keep");
        let published = book
            .record(&t(ProbeState::Succeeded, "idle", ts(0)))
            .unwrap();
        book.observe(&[]);
        assert_eq!(book.drifted(ct), Some(&published), "removed");
        let mut changed = published.clone();
        changed.message = Some("busy".into());
        book.observe(&[changed.clone()]);
        assert_eq!(book.drifted(ct), Some(&published), "message changed");
        changed.message = published.message.clone();
        changed.status = "False".into();
        book.observe(&[changed.clone()]);
        assert_eq!(book.drifted(ct), Some(&published), "status changed");
        // Times and reason are not what another writer's change is judged by.
        let mut same = published.clone();
        same.last_probe_time = Some(Time(ts(50)));
        book.observe(&[same]);
        assert_eq!(book.drifted(ct), None);
        // The last published result, not the pod, decides what is new.
        book.observe(&[changed]);
        assert!(
            book.record(&t(ProbeState::Succeeded, "idle", ts(1)))
                .is_none()
        );
        book.forget(ct);
        assert_eq!(
            book.drifted(ct),
            None,
            "a removed probe's condition is not kept"
        );
    }

    #[test]
    fn a_first_result_is_judged_against_the_pod_as_last_seen() {
        let ct = "game.kruise.io/idle";
        let mut book = ConditionBook::from_pod_conditions(&[]);
        let mut later = ConditionBook::default();
        let existing = later
            .record(&t(ProbeState::Failed, "busy", ts(-100)))
            .unwrap();
        // The pod gained the condition after the first view (e.g. a previous sidecar's write).
        book.observe(&[existing]);
        let written = book
            .record(&t(ProbeState::Failed, "busy, 2 players", ts(0)))
            .unwrap();
        assert_eq!(written.last_transition_time, Some(Time(ts(-100))));
        assert_eq!(book.get(ct), Some(&written));
    }
}
