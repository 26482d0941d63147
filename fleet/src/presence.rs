//! How much of the time a condition showed what it should: a timeline of what an admin's watch
//! saw, scored against what the probe says.
//!
//! A steady probe's condition should always be True. The flipped probe's condition should show
//! the target's state, from the moment the watch first shows the new state after a flip (a
//! probe sees a flip only at its next period: that lag is not the overwriter's doing) or, if
//! it never does, from the flip plus an allowance of a period and a write.

use std::time::Duration;

use tokio::time::Instant;

/// What the watch showed of one condition from an instant on (`None`: absent or Unknown).
pub type Timeline = Vec<(Instant, Option<bool>)>;

/// The score of one condition of one pod over a window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Score {
    /// Time it showed the expected state.
    pub right: Duration,
    /// Length of the window scored.
    pub window: Duration,
    /// The longest stretch it did not.
    pub worst_gap: Duration,
    /// Stretches longer than [`LONG_GAP`].
    pub long_gaps: usize,
    /// Stretches that began with a change the probe did not make: overwrites.
    pub overwrites: usize,
}

/// A gap longer than this breaks the goal.
pub const LONG_GAP: Duration = Duration::from_secs(2);

impl Score {
    pub fn add(&mut self, other: &Score) {
        self.right += other.right;
        self.window += other.window;
        self.worst_gap = self.worst_gap.max(other.worst_gap);
        self.long_gaps += other.long_gaps;
        self.overwrites += other.overwrites;
    }

    /// Share of the window it showed the expected state, in percent.
    pub fn percent(&self) -> f64 {
        if self.window.is_zero() {
            return 0.0;
        }
        100.0 * self.right.as_secs_f64() / self.window.as_secs_f64()
    }
}

/// When the expected state changes: each flip `(at, to)` takes effect when the timeline first
/// shows `to` at or after `at`, or at `at + allowance` if it does not by then.
pub fn expected_changes(
    timeline: &Timeline,
    flips: &[(Instant, bool)],
    allowance: Duration,
) -> Vec<(Instant, bool)> {
    flips
        .iter()
        .map(|&(at, to)| {
            let shown = timeline
                .iter()
                .find(|(t, v)| *t >= at && *v == Some(to))
                .map(|(t, _)| *t);
            let limit = at + allowance;
            (shown.map_or(limit, |t| t.min(limit)), to)
        })
        .collect()
}

/// Scores `timeline` over `[from, to)` against an expectation that starts as `initial` and
/// changes at `changes` (sorted).
pub fn score(
    timeline: &Timeline,
    initial: bool,
    changes: &[(Instant, bool)],
    from: Instant,
    to: Instant,
) -> Score {
    // Every instant either side changes, inside the window.
    let mut cuts: Vec<Instant> = timeline
        .iter()
        .map(|(t, _)| *t)
        .chain(changes.iter().map(|(t, _)| *t))
        .filter(|t| *t > from && *t < to)
        .collect();
    cuts.push(from);
    cuts.push(to);
    cuts.sort();
    cuts.dedup();
    let shown_at = |t: Instant| {
        timeline
            .iter()
            .take_while(|(at, _)| *at <= t)
            .last()
            .and_then(|(_, v)| *v)
    };
    let expected_at = |t: Instant| {
        changes
            .iter()
            .take_while(|(at, _)| *at <= t)
            .last()
            .map_or(initial, |(_, v)| *v)
    };
    let mut result = Score {
        window: to.saturating_duration_since(from),
        ..Score::default()
    };
    let mut gap_start: Option<Instant> = None;
    let close = |result: &mut Score, start: Instant, end: Instant| {
        let gap = end - start;
        result.worst_gap = result.worst_gap.max(gap);
        if gap > LONG_GAP {
            result.long_gaps += 1;
        }
    };
    for pair in cuts.windows(2) {
        let (start, end) = (pair[0], pair[1]);
        let right = shown_at(start) == Some(expected_at(start));
        if right {
            result.right += end - start;
            if let Some(gap) = gap_start.take() {
                close(&mut result, gap, start);
            }
        } else if gap_start.is_none() {
            gap_start = Some(start);
            // A gap that opens where the timeline changed, not where the expectation did.
            let probe_changed = changes.iter().any(|(at, _)| *at == start);
            if start > from && !probe_changed {
                result.overwrites += 1;
            }
        }
    }
    if let Some(gap) = gap_start {
        close(&mut result, gap, to);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, seconds: f64) -> Instant {
        base + Duration::from_secs_f64(seconds)
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_condition_overwritten_twice() {
        let t0 = Instant::now();
        let timeline = vec![
            (at(t0, 0.0), Some(true)),
            (at(t0, 10.0), None),
            (at(t0, 10.5), Some(true)),
            (at(t0, 50.0), None),
            (at(t0, 53.0), Some(true)),
        ];
        let s = score(&timeline, true, &[], at(t0, 0.0), at(t0, 100.0));
        assert_eq!(s.window, Duration::from_secs(100));
        assert_eq!(s.right, Duration::from_secs_f64(96.5));
        assert_eq!(s.worst_gap, Duration::from_secs(3));
        assert_eq!((s.long_gaps, s.overwrites), (1, 2));
        assert!((s.percent() - 96.5).abs() < 1e-9);
    }

    #[tokio::test(start_paused = true)]
    async fn the_probe_s_own_lag_is_not_a_gap_but_a_missed_flip_is() {
        let t0 = Instant::now();
        let timeline = vec![
            (at(t0, 0.0), Some(false)),
            (at(t0, 10.8), Some(true)),
            (at(t0, 40.0), None),
        ];
        let flips = [(at(t0, 10.0), true), (at(t0, 30.0), false)];
        let changes = expected_changes(&timeline, &flips, Duration::from_secs(3));
        // Seen 0.8 s after the first flip; the second never shows: due 3 s after it.
        assert_eq!(changes, vec![(at(t0, 10.8), true), (at(t0, 33.0), false)]);
        let s = score(&timeline, false, &changes, at(t0, 0.0), at(t0, 60.0));
        assert_eq!(s.right, Duration::from_secs(33));
        assert_eq!(s.worst_gap, Duration::from_secs(27));
        // The gap opened where the probe changed, not the timeline: no overwrite.
        assert_eq!((s.long_gaps, s.overwrites), (1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_condition_never_seen_is_one_gap_as_long_as_the_window() {
        let t0 = Instant::now();
        let s = score(&Vec::new(), true, &[], t0, at(t0, 5.0));
        assert_eq!(s.right, Duration::ZERO);
        assert_eq!(s.worst_gap, Duration::from_secs(5));
        assert_eq!(s.percent(), 0.0);
    }
}
