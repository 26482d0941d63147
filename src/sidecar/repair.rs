//! When another writer changes or removes a condition podprobe published, put it back, without
//! ever fighting that writer in a hot loop.
//!
//! virtual-kubelet providers and syncers replace the whole pod status (`UpdateStatus`), which
//! drops podprobe's conditions; to kruise-manager a missing condition means a missing or stale
//! marker. Each owned condition is compared with every pod view. A view can predate podprobe's
//! own last write: the watch delivers in order, but the write's answer can arrive before the
//! events preceding it, and a watch on a loaded apiserver lags by seconds. The answer carries
//! the pod's resourceVersion after the write; a view at an older version cannot show the
//! write, so its mismatch is no overwrite and nothing is scheduled for it (the view of the
//! write follows, and is judged when it comes); a mismatch in a view at that version or later
//! is another writer's. Versions are ordered only when both are etcd revisions
//! ([`ResourceVersion::order`]); when they are not, once a view has shown the published
//! condition after the write was queued, every later view is newer than the write, and until
//! then a mismatch counts only after [`CONFIRM_GRACE`]. A mismatch seen while a write is on its
//! way is looked at again [`RECHECK`] later. How soon an overwrite is written back is the
//! [`RepairPolicy`]'s choice.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::condition::writer::WriteProgress;
use crate::resource_version::ResourceVersion;

/// How long a mismatching view may be one written before podprobe's own last write, where
/// resourceVersions cannot tell.
pub const CONFIRM_GRACE: Duration = Duration::from_secs(5);
/// When a mismatch seen while podprobe's own write is on its way is looked at again.
pub const RECHECK: Duration = Duration::from_secs(1);
/// An overwrite this long after the last repair starts a new streak (repaired at once again):
/// a writer that replaces the status now and then (a provider's periodic sync) is answered at
/// once every time; only one that answers podprobe's repairs within this window is backed off.
pub const QUIET: Duration = Duration::from_secs(30);
/// The longest wait before repairing a condition that keeps being overwritten.
pub const MAX_DELAY: Duration = Duration::from_secs(60);

/// Under [`RepairPolicy::Immediate`], the shortest time between two repairs of one condition:
/// a writer that removes it as soon as it sees it costs at most one write a second.
pub const MIN_SPACING: Duration = Duration::from_secs(1);

/// Under [`RepairPolicy::AfterChange`], how long after a probe's result changed every
/// overwrite of its condition is written back at once: long enough for a manager to see the
/// change and write its marker, though the provider undoes each write within seconds.
pub const CHANGE_WINDOW: Duration = Duration::from_secs(30);

/// How soon an overwritten condition is written back (`podprobe run --overwrite-repair`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RepairPolicy {
    /// As [`RepairPolicy::Immediate`] for [`CHANGE_WINDOW`] after the probe's result changed,
    /// as [`RepairPolicy::Backoff`] otherwise: a change stays visible until the managers have
    /// acted on it, and a steady condition costs few writes.
    #[default]
    AfterChange,
    /// The first overwrite at once; each further one within [`QUIET`] of the previous repair
    /// doubles the wait (1 s, 2 s, 4 s …), up to [`MAX_DELAY`]. Few writes against any
    /// overwriter; a provider that replaces the status every few seconds keeps the condition
    /// absent most of the time, and managers can miss a change.
    Backoff,
    /// Every overwrite at once, at most one repair per condition per [`MIN_SPACING`]: the
    /// condition is back within a round trip, at one write per overwrite.
    Immediate,
}

/// What the latest view says about one owned condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Status and message are what podprobe published.
    Published,
    /// Missing, or another status or message.
    Drifted,
}

/// A new overwrite, found in a view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overwrite {
    /// Overwrites in a row, this one included (1 = the first of a streak).
    pub streak: u32,
    /// When the condition will be written back.
    pub repair_at: Instant,
}

/// What a view that shows a condition drifted says of podprobe's own last write of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Another writer changed it after that write (or it was never written here).
    Overwritten,
    /// The view is older than the write, so cannot show it.
    Predates,
    /// The versions do not tell, and the write is not confirmed yet: look again then.
    Unsure { until: Instant },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// Look again at the latest view (a mismatch was held back as possibly stale).
    Recheck,
    /// Write the published condition back.
    Repair,
}

#[derive(Debug, Default)]
struct Track {
    /// When a view last showed the published condition.
    published_seen: Option<Instant>,
    streak: u32,
    /// When the last overwrite was (or is to be) written back.
    last_repair: Option<Instant>,
    /// When the probe's result last changed.
    changed_at: Option<Instant>,
    due: Option<(Instant, Due)>,
}

impl Track {
    /// Judges a view at `view` that shows the condition drifted.
    fn judge(
        &self,
        view: Option<&ResourceVersion>,
        writing: &WriteProgress,
        now: Instant,
    ) -> Verdict {
        let Some(written_at) = writing.written_at else {
            return Verdict::Overwritten;
        };
        match order(view, writing) {
            Some(Ordering::Less) => Verdict::Predates,
            // A view at the write's version is that write; a mismatch in it or a later one is
            // someone else's.
            Some(Ordering::Equal | Ordering::Greater) => Verdict::Overwritten,
            None => {
                let confirmed = self.published_seen >= writing.queued_at;
                let until = written_at + CONFIRM_GRACE;
                if confirmed || now >= until {
                    Verdict::Overwritten
                } else {
                    Verdict::Unsure { until }
                }
            }
        }
    }
}

/// How a view at `view` stands against podprobe's last accepted write, where both versions
/// are known and ordered.
fn order(view: Option<&ResourceVersion>, writing: &WriteProgress) -> Option<Ordering> {
    view?.order(writing.written_rv.as_ref()?)
}

/// Whether a view at `view` is older than podprobe's last accepted write: what it shows of the
/// condition says nothing of that write.
pub fn predates(view: Option<&ResourceVersion>, writing: &WriteProgress) -> bool {
    order(view, writing) == Some(Ordering::Less)
}

/// Per owned condition type: confirmation of podprobe's writes, overwrite streaks, repairs due.
#[derive(Debug, Default)]
pub struct Repairs {
    policy: RepairPolicy,
    by_type: HashMap<String, Track>,
}

impl Repairs {
    pub fn new(policy: RepairPolicy) -> Repairs {
        Repairs {
            policy,
            by_type: HashMap::new(),
        }
    }

    /// Takes in what a view at `view` (or a recheck of the latest one) shows of
    /// `condition_type`; returns the overwrite it reveals, if it reveals one.
    pub fn observe(
        &mut self,
        condition_type: &str,
        seen: Seen,
        view: Option<&ResourceVersion>,
        writing: &WriteProgress,
        now: Instant,
    ) -> Option<Overwrite> {
        let track = self.by_type.entry(condition_type.to_owned()).or_default();
        if seen == Seen::Published {
            track.published_seen = Some(now);
            track.due = None;
            return None;
        }
        if writing.busy {
            track.due = Some((now + RECHECK, Due::Recheck));
            return None;
        }
        if matches!(track.due, Some((_, Due::Repair))) {
            return None;
        }
        match track.judge(view, writing, now) {
            Verdict::Overwritten => {}
            Verdict::Predates => {
                // Not even a recheck: the view of the write is news to the loop when it comes,
                // and is judged then, however long the watch takes.
                track.due = None;
                return None;
            }
            Verdict::Unsure { until } => {
                track.due = Some((until, Due::Recheck));
                return None;
            }
        }
        // Measured from the last repair, not the last overwrite, so a streak survives waits
        // longer than QUIET.
        let recent = track
            .last_repair
            .is_some_and(|last| now.saturating_duration_since(last) < QUIET);
        track.streak = if recent { track.streak + 1 } else { 1 };
        let at_once = match self.policy {
            RepairPolicy::Immediate => true,
            RepairPolicy::Backoff => false,
            RepairPolicy::AfterChange => track
                .changed_at
                .is_some_and(|changed| now.saturating_duration_since(changed) < CHANGE_WINDOW),
        };
        let repair_at = if at_once {
            track
                .last_repair
                .map_or(now, |last| (last + MIN_SPACING).max(now))
        } else {
            now + delay(track.streak)
        };
        track.last_repair = Some(repair_at);
        track.due = Some((repair_at, Due::Repair));
        Some(Overwrite {
            streak: track.streak,
            repair_at,
        })
    }

    /// Whether `condition_type`, drifted in the view at `view` too, goes out with another
    /// condition's write-back: it does when [`Repairs::observe`] would judge it overwritten
    /// (the overwrite that took one usually took it as well), and one patch carries both. Its
    /// own repair, if one is scheduled, is done by that.
    pub fn ride_along(
        &mut self,
        condition_type: &str,
        view: Option<&ResourceVersion>,
        writing: &WriteProgress,
        now: Instant,
    ) -> bool {
        let track = self.by_type.entry(condition_type.to_owned()).or_default();
        if track.judge(view, writing, now) != Verdict::Overwritten {
            return false;
        }
        if matches!(track.due, Some((_, Due::Repair))) {
            track.due = None;
        }
        track.last_repair = Some(now);
        true
    }

    /// The probe writing `condition_type` has a new result (its first one included).
    pub fn changed(&mut self, condition_type: &str, now: Instant) {
        self.by_type
            .entry(condition_type.to_owned())
            .or_default()
            .changed_at = Some(now);
    }

    /// The earliest instant something is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.by_type
            .values()
            .filter_map(|t| t.due.map(|(at, _)| at))
            .min()
    }

    /// Takes what is due at `now`: (types to write back, types to look at again).
    pub fn take_due(&mut self, now: Instant) -> (Vec<String>, Vec<String>) {
        let (mut repair, mut recheck) = (Vec::new(), Vec::new());
        for (condition_type, track) in &mut self.by_type {
            match track.due {
                Some((at, Due::Repair)) if at <= now => repair.push(condition_type.clone()),
                Some((at, Due::Recheck)) if at <= now => recheck.push(condition_type.clone()),
                _ => continue,
            }
            track.due = None;
        }
        (repair, recheck)
    }

    /// A probe left the annotation: its condition is no longer podprobe's to keep.
    pub fn forget(&mut self, condition_type: &str) {
        self.by_type.remove(condition_type);
    }
}

/// Wait before repairing the `streak`-th overwrite in a row: none for the first, then 1 s,
/// doubling, at most [`MAX_DELAY`].
fn delay(streak: u32) -> Duration {
    match streak {
        0 | 1 => Duration::ZERO,
        n => Duration::from_secs(1u64 << (n - 2).min(16)).min(MAX_DELAY),
    }
}

#[cfg(test)]
mod tests;
