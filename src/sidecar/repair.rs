//! When another writer changes or removes a condition podprobe published, put it back, without
//! ever fighting that writer in a hot loop.
//!
//! virtual-kubelet providers and syncers replace the whole pod status (`UpdateStatus`), which
//! drops podprobe's conditions; to kruise-manager a missing condition means a missing or stale
//! marker. Each owned condition is compared with every pod view. A view can predate podprobe's
//! own last write (the watch delivers in order, but the write's answer can arrive before the
//! events preceding it). Once a view has shown the published condition after the write was
//! queued, every later view is newer than the write; until then a mismatch counts only after
//! [`CONFIRM_GRACE`]. A mismatch seen while a write is on its way is looked at again
//! [`RECHECK`] later. How soon an overwrite is written back is the [`RepairPolicy`]'s choice.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::condition::writer::WriteProgress;

/// How long a mismatching view may be one written before podprobe's own last write.
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

    /// Takes in what a view (or a recheck of the latest one) shows of `condition_type`;
    /// returns the overwrite it reveals, if it reveals one.
    pub fn observe(
        &mut self,
        condition_type: &str,
        seen: Seen,
        writing: WriteProgress,
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
        let confirmed = track.published_seen >= writing.queued_at;
        if let Some(written_at) = writing.written_at
            && !confirmed
            && now < written_at + CONFIRM_GRACE
        {
            track.due = Some((written_at + CONFIRM_GRACE, Due::Recheck));
            return None;
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

    /// `condition_type` goes out with another condition's write-back: the same overwrite took
    /// it, and one patch carries both. Its own repair, if one is scheduled, is done by that.
    pub fn ride_along(&mut self, condition_type: &str, now: Instant) {
        let track = self.by_type.entry(condition_type.to_owned()).or_default();
        if matches!(track.due, Some((_, Due::Repair))) {
            track.due = None;
        }
        track.last_repair = Some(now);
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
mod tests {
    use super::*;

    const C: &str = "game.kruise.io/idle";

    fn idle(written_at: Option<Instant>) -> WriteProgress {
        WriteProgress {
            busy: false,
            queued_at: written_at,
            written_at,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_condition_never_written_here_is_repaired_at_once() {
        let mut repairs = Repairs::new(RepairPolicy::Backoff);
        let now = Instant::now();
        let found = repairs.observe(C, Seen::Drifted, idle(None), now).unwrap();
        assert_eq!(found.streak, 1);
        assert_eq!(found.repair_at, now);
        assert_eq!(repairs.take_due(now), (vec![C.to_owned()], vec![]));
        assert_eq!(repairs.next_due(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_view_from_before_our_write_waits_for_confirmation() {
        let mut repairs = Repairs::new(RepairPolicy::Backoff);
        let written = Instant::now();
        // A stale view right after our write: not an overwrite, only a recheck later.
        assert_eq!(
            repairs.observe(C, Seen::Drifted, idle(Some(written)), written),
            None
        );
        assert_eq!(repairs.next_due(), Some(written + CONFIRM_GRACE));
        // The view of our own write confirms it and cancels the recheck.
        assert_eq!(
            repairs.observe(C, Seen::Published, idle(Some(written)), written),
            None
        );
        assert_eq!(repairs.next_due(), None);
        // From then on a mismatch is an overwrite, even within the grace.
        let found = repairs
            .observe(C, Seen::Drifted, idle(Some(written)), written)
            .unwrap();
        assert_eq!(found.streak, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_view_of_our_write_may_come_before_its_answer() {
        let mut repairs = Repairs::new(RepairPolicy::Backoff);
        let queued = Instant::now();
        let on_the_wire = WriteProgress {
            busy: true,
            queued_at: Some(queued),
            written_at: None,
        };
        // The watch shows our write while the patch's answer is still on its way...
        repairs.observe(C, Seen::Published, on_the_wire, queued);
        // ...so a mismatch after the answer is news at once.
        let answered = queued + Duration::from_millis(10);
        let writing = WriteProgress {
            busy: false,
            queued_at: Some(queued),
            written_at: Some(answered),
        };
        let found = repairs
            .observe(C, Seen::Drifted, writing, answered)
            .unwrap();
        assert_eq!(found.repair_at, answered);
    }

    #[tokio::test(start_paused = true)]
    async fn a_mismatch_seen_while_our_write_is_on_its_way_is_looked_at_again() {
        let mut repairs = Repairs::new(RepairPolicy::Backoff);
        let now = Instant::now();
        let busy = WriteProgress {
            busy: true,
            queued_at: Some(now),
            written_at: None,
        };
        assert_eq!(repairs.observe(C, Seen::Drifted, busy, now), None);
        assert_eq!(repairs.next_due(), Some(now + RECHECK));
        assert_eq!(
            repairs.take_due(now + RECHECK),
            (vec![], vec![C.to_owned()])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_unconfirmed_write_counts_as_overwritten_after_the_grace() {
        let mut repairs = Repairs::new(RepairPolicy::Backoff);
        let written = Instant::now();
        assert_eq!(
            repairs.observe(C, Seen::Drifted, idle(Some(written)), written),
            None
        );
        let later = written + CONFIRM_GRACE;
        assert_eq!(repairs.take_due(later), (vec![], vec![C.to_owned()]));
        assert!(
            repairs
                .observe(C, Seen::Drifted, idle(Some(written)), later)
                .is_some()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn repeated_overwrites_back_off_and_a_quiet_minute_resets() {
        let mut repairs = Repairs::new(RepairPolicy::Backoff);
        let mut now = Instant::now();
        let mut waits = Vec::new();
        for _ in 0..12 {
            let found = repairs.observe(C, Seen::Drifted, idle(None), now).unwrap();
            waits.push(found.repair_at.duration_since(now).as_secs());
            now = found.repair_at;
            assert_eq!(repairs.take_due(now).0, vec![C.to_owned()]);
        }
        assert_eq!(waits, [0, 1, 2, 4, 8, 16, 32, 60, 60, 60, 60, 60]);
        // Already scheduled: a second look at the same mismatch is not a new overwrite.
        let found = repairs.observe(C, Seen::Drifted, idle(None), now).unwrap();
        assert_eq!(repairs.observe(C, Seen::Drifted, idle(None), now), None);
        assert_eq!(repairs.take_due(found.repair_at).0, vec![C.to_owned()]);
        let quiet = found.repair_at + QUIET;
        let found = repairs
            .observe(C, Seen::Drifted, idle(None), quiet)
            .unwrap();
        assert_eq!((found.streak, found.repair_at), (1, quiet));
    }

    #[tokio::test(start_paused = true)]
    async fn immediate_repairs_every_overwrite_at_most_once_a_second() {
        let mut repairs = Repairs::new(RepairPolicy::Immediate);
        let start = Instant::now();
        let mut now = start;
        let mut waits = Vec::new();
        // A 5 s replacer: each repair is undone at the next sync, streaks never reset.
        for _ in 0..20 {
            let found = repairs.observe(C, Seen::Drifted, idle(None), now).unwrap();
            waits.push(found.repair_at.duration_since(now));
            assert_eq!(repairs.take_due(found.repair_at).0, vec![C.to_owned()]);
            now = found.repair_at + Duration::from_secs(5);
        }
        assert!(waits.iter().all(|w| w.is_zero()), "{waits:?}");
        // A writer that undoes each repair within 100 ms: one write a second, no faster.
        let mut repaired = Vec::new();
        for _ in 0..5 {
            let found = repairs.observe(C, Seen::Drifted, idle(None), now).unwrap();
            repaired.push(found.repair_at);
            repairs.take_due(found.repair_at);
            now = found.repair_at + Duration::from_millis(100);
        }
        for pair in repaired.windows(2) {
            assert_eq!(pair[1] - pair[0], MIN_SPACING);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_change_every_overwrite_is_written_back_at_once_then_backed_off() {
        let mut repairs = Repairs::new(RepairPolicy::AfterChange);
        let start = Instant::now();
        repairs.changed(C, start);
        let mut now = start;
        let mut waits = Vec::new();
        // A 5 s replacer for a minute after the change.
        while now < start + Duration::from_secs(60) {
            let found = repairs.observe(C, Seen::Drifted, idle(None), now).unwrap();
            waits.push(found.repair_at.duration_since(now).as_secs());
            assert_eq!(repairs.take_due(found.repair_at).0, vec![C.to_owned()]);
            now = found.repair_at + Duration::from_secs(5);
        }
        // At once while the change is recent (0 … 25 s), backed off from 30 s on.
        assert_eq!(waits[..6], [0, 0, 0, 0, 0, 0]);
        assert!(waits[6] > 0, "{waits:?}");
        // A new result: at once again.
        repairs.changed(C, now);
        let found = repairs.observe(C, Seen::Drifted, idle(None), now).unwrap();
        assert_eq!(found.repair_at, now);
    }

    #[tokio::test(start_paused = true)]
    async fn a_condition_written_along_with_another_needs_no_repair_of_its_own() {
        let mut repairs = Repairs::new(RepairPolicy::Backoff);
        let now = Instant::now();
        repairs.observe(C, Seen::Drifted, idle(None), now).unwrap();
        repairs.take_due(now);
        let found = repairs.observe(C, Seen::Drifted, idle(None), now).unwrap();
        assert!(found.repair_at > now);
        repairs.ride_along(C, now);
        assert_eq!(repairs.next_due(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_restored_condition_cancels_the_repair() {
        let mut repairs = Repairs::new(RepairPolicy::Backoff);
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        repairs.observe(C, Seen::Drifted, idle(None), now).unwrap();
        repairs.take_due(now);
        let found = repairs.observe(C, Seen::Drifted, idle(None), now).unwrap();
        assert_eq!(found.repair_at, later);
        repairs.observe(C, Seen::Published, idle(None), now);
        assert_eq!(repairs.next_due(), None);
        repairs.forget(C);
        assert!(repairs.by_type.is_empty());
    }
}
