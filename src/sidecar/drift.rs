//! What the pod shows of podprobe's own conditions, view after view: each published condition
//! is compared with the pod as last seen, an overwrite is handed to [`Repairs`] (when to write
//! it back) and its writer named from `managedFields`, and what is due is said as the
//! conditions to write back. The sidecar's loop does the writing, counting and telling; this
//! unit decides, fed views and a clock.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::PodCondition;
use tokio::time::Instant;

use super::repair::{self, RepairPolicy, Repairs, Seen};
use crate::condition::writer::WriteProgress;
use crate::condition::{ConditionBook, FIELD_MANAGER};
use crate::pod::StatusWriter;
use crate::resource_version::ResourceVersion;

/// An overwrite found in a view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub condition_type: String,
    /// Who changed it, as `managedFields` tell (a removal is owned by no one).
    pub who: String,
    /// How long until it is written back.
    pub wait: Duration,
    /// Overwrites in a row, this one included.
    pub streak: u32,
}

#[derive(Debug)]
pub struct Drift {
    policy: RepairPolicy,
    repairs: Repairs,
    /// Whether views show the pod's conditions (the apiserver source), so overwrites can be seen.
    sees_conditions: bool,
    status_writers: Vec<StatusWriter>,
    /// The resourceVersion of the pod as last seen with its conditions.
    version: Option<ResourceVersion>,
    /// Each overwritten condition not yet seen back, and up to when its absence is counted.
    absent: HashMap<String, Instant>,
    /// Absence counted since the last [`Drift::take_absent`].
    absent_time: Vec<(String, Duration)>,
}

impl Drift {
    pub fn new(policy: RepairPolicy) -> Drift {
        Drift {
            policy,
            repairs: Repairs::new(policy),
            sees_conditions: false,
            status_writers: Vec::new(),
            version: None,
            absent: HashMap::new(),
            absent_time: Vec::new(),
        }
    }

    /// A view of the pod: its conditions (`None` when the source does not show them), who
    /// wrote its status, and its resourceVersion.
    pub fn view(
        &mut self,
        conditions: Option<&[PodCondition]>,
        writers: &[StatusWriter],
        version: Option<&ResourceVersion>,
        book: &mut ConditionBook,
    ) {
        if let Some(conditions) = conditions {
            book.observe(conditions);
            self.sees_conditions = true;
            self.status_writers = writers.to_vec();
            self.version = version.cloned();
        }
    }

    /// Compares each of `owned` with the pod as last seen.
    pub fn check(
        &mut self,
        owned: &[String],
        book: &ConditionBook,
        writing: impl Fn(&str) -> WriteProgress,
        now: Instant,
    ) -> Vec<Found> {
        let found: Vec<Found> = owned
            .iter()
            .filter_map(|condition_type| {
                self.check_one(condition_type, book, writing(condition_type), now)
            })
            .collect();
        self.account(owned, book, &found, now);
        found
    }

    /// Counts how long overwritten conditions have been absent (or wrong), from the view that
    /// revealed the overwrite to the view that shows the condition back, up to `now`.
    fn account(&mut self, owned: &[String], book: &ConditionBook, found: &[Found], now: Instant) {
        for f in found {
            self.absent.entry(f.condition_type.clone()).or_insert(now);
        }
        let counted = &mut self.absent_time;
        self.absent.retain(|condition_type, since| {
            let elapsed = now.saturating_duration_since(*since);
            if !elapsed.is_zero() {
                counted.push((condition_type.clone(), elapsed));
            }
            *since = now;
            owned.contains(condition_type) && book.drifted(condition_type).is_some()
        });
    }

    /// The absence counted since the last call, per condition (a condition may appear more
    /// than once).
    pub fn take_absent(&mut self) -> Vec<(String, Duration)> {
        std::mem::take(&mut self.absent_time)
    }

    fn check_one(
        &mut self,
        condition_type: &str,
        book: &ConditionBook,
        writing: WriteProgress,
        now: Instant,
    ) -> Option<Found> {
        if !self.sees_conditions || book.get(condition_type).is_none() {
            return None;
        }
        let seen = match book.drifted(condition_type) {
            Some(_) => Seen::Drifted,
            None => Seen::Published,
        };
        let view = self.version.as_ref();
        let overwrite = self
            .repairs
            .observe(condition_type, seen, view, &writing, now)?;
        let who = match changed_by(&self.status_writers, condition_type) {
            Some(manager) => format!("another writer ({manager})"),
            None => "another writer (managedFields do not say which)".to_owned(),
        };
        Some(Found {
            condition_type: condition_type.to_owned(),
            who,
            wait: overwrite.repair_at.duration_since(now),
            streak: overwrite.streak,
        })
    }

    /// What is due at `now`: the conditions to write back (none whose write is already on
    /// its way, none written since the view that showed them overwritten), and what rechecks
    /// of the latest view found. A write-back carries every other of `owned` that the latest
    /// view shows overwritten too: the overwrite that took one usually took the pod's other
    /// conditions as well (a provider replaces the whole status), and one patch costs less
    /// than each waiting for its own, maybe backed-off, repair.
    pub fn due(
        &mut self,
        owned: &[String],
        book: &ConditionBook,
        writing: impl Fn(&str) -> WriteProgress,
        now: Instant,
    ) -> (Vec<PodCondition>, Vec<Found>) {
        let version = self.version.as_ref();
        let (mut repair, recheck) = self.repairs.take_due(now);
        // A write of ours that landed after the view showing the overwrite (a new result) put
        // the condition back already.
        repair.retain(|condition_type| !repair::predates(version, &writing(condition_type)));
        if !repair.is_empty() {
            for other in owned {
                if !repair.contains(other)
                    && book.drifted(other).is_some()
                    && self
                        .repairs
                        .ride_along(other, version, &writing(other), now)
                {
                    repair.push(other.clone());
                }
            }
        }
        let write_backs = repair
            .iter()
            .filter(|condition_type| !writing(condition_type).busy)
            .filter_map(|condition_type| book.drifted(condition_type).cloned())
            .collect();
        let found: Vec<Found> = recheck
            .iter()
            .filter_map(|condition_type| {
                self.check_one(condition_type, book, writing(condition_type), now)
            })
            .collect();
        self.account(owned, book, &found, now);
        (write_backs, found)
    }

    /// The probe writing `condition_type` has a new result.
    pub fn changed(&mut self, condition_type: &str, now: Instant) {
        self.repairs.changed(condition_type, now);
    }

    /// A probe left the annotation: its condition is no longer podprobe's to keep.
    pub fn forget(&mut self, condition_type: &str) {
        self.repairs.forget(condition_type);
        self.absent.remove(condition_type);
    }

    /// Probing stopped: nothing is podprobe's to keep any more, nothing is due.
    pub fn stop(&mut self) {
        self.repairs = Repairs::new(self.policy);
        self.sees_conditions = false;
        self.version = None;
        self.absent.clear();
    }

    /// The earliest instant something is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.repairs.next_due()
    }
}

/// Who changed a condition, where `managedFields` tell: the status manager, other than podprobe,
/// that owns a field of its entry. A removed entry is owned by no one, so a removal is not told.
fn changed_by(writers: &[StatusWriter], condition_type: &str) -> Option<String> {
    writers
        .iter()
        .filter(|w| w.manager != FIELD_MANAGER && w.condition_types.contains(condition_type))
        .max_by_key(|w| w.time)
        .map(|w| w.manager.clone())
}

#[cfg(test)]
mod tests;
