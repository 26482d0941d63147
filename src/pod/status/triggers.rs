//! When probing asks the file source for a read of its pod's status: when an attempt's outcome
//! says its container may have stopped or been replaced, and only then, so a steady pod (every
//! probe succeeding, or failing, the same way each time) reads nothing.
//!
//! Attempts, not published states, decide: with a `failureThreshold` above 1 a container can
//! die and be replaced before any probe turns `Failed`, and an exec attempt whose container's
//! process is gone errors (state unchanged) rather than fails. Missing that restart would leave
//! the workers on the old container id for good: `procfs` exec erroring on it forever, the
//! conditions never starting over with `Unknown`.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::probe::Outcome;

/// The first and the longest wait between reads asked for by a probe that keeps erroring: a
/// broken probe (a named port the container does not declare, a missing command) errors on
/// every attempt, and must not cost its pod a read every few seconds.
const ERRORING_FIRST: Duration = Duration::from_secs(5);
const ERRORING_MAX: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Last {
    Succeeded,
    Failed,
    Errored,
}

/// While a probe errors: when its errors may next ask for a read, and the wait after that.
#[derive(Debug, Clone, Copy)]
struct Erroring {
    next: Instant,
    wait: Duration,
}

/// What one probe's attempts were.
#[derive(Debug, Clone, Copy)]
struct Seen {
    last: Last,
    erroring: Option<Erroring>,
}

/// Each probe's last attempt, by condition type. Called on every attempt: a probe's entry is
/// allocated once, at its first attempt.
#[derive(Debug, Default)]
pub struct ReadTriggers {
    probes: HashMap<String, Seen>,
}

impl ReadTriggers {
    /// An attempt that ran. True when the pod should be read: the probe's first failure after
    /// success (its container may have stopped), or its first success after failing or erroring
    /// (its container may be a new one the kubelet had not reported at the failure's read).
    /// A probe's first attempt asks nothing: the pod was read before probing began.
    pub fn attempted(&mut self, condition_type: &str, outcome: Outcome) -> bool {
        let now = match outcome {
            Outcome::Succeeded => Last::Succeeded,
            Outcome::Failed => Last::Failed,
        };
        let Some(seen) = self.probes.get_mut(condition_type) else {
            self.first(condition_type, now);
            return false;
        };
        let before = std::mem::replace(&mut seen.last, now);
        seen.erroring = None;
        matches!(
            (before, now),
            (Last::Succeeded, Last::Failed) | (Last::Failed | Last::Errored, Last::Succeeded)
        )
    }

    /// An attempt that could not run (its container's process is gone, a port is not
    /// declared). True at the first error after a result, then again after 5 s, doubling to
    /// 5 min while the probe keeps erroring.
    pub fn errored(&mut self, condition_type: &str, now: Instant) -> bool {
        let first = Erroring {
            next: now + ERRORING_FIRST,
            wait: ERRORING_FIRST * 2,
        };
        let Some(seen) = self.probes.get_mut(condition_type) else {
            self.first(condition_type, Last::Errored).erroring = Some(first);
            return true;
        };
        seen.last = Last::Errored;
        match &mut seen.erroring {
            None => {
                seen.erroring = Some(first);
                true
            }
            Some(e) if now >= e.next => {
                e.next = now + e.wait;
                e.wait = (e.wait * 2).min(ERRORING_MAX);
                true
            }
            Some(_) => false,
        }
    }

    /// A probe removed or replaced: its next attempt is a first one.
    pub fn forget(&mut self, condition_type: &str) {
        self.probes.remove(condition_type);
    }

    fn first(&mut self, condition_type: &str, last: Last) -> &mut Seen {
        self.probes
            .entry(condition_type.to_owned())
            .or_insert(Seen {
                last,
                erroring: None,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "c/p";

    #[test]
    fn steady_probes_ask_nothing_and_changes_ask_once() {
        let mut t = ReadTriggers::default();
        assert!(!t.attempted(P, Outcome::Failed), "a first attempt");
        assert!(!t.attempted(P, Outcome::Failed), "still failing");
        assert!(t.attempted(P, Outcome::Succeeded), "recovered");
        assert!(!t.attempted(P, Outcome::Succeeded), "still succeeding");
        assert!(t.attempted(P, Outcome::Failed), "failed after success");
        assert!(!t.attempted(P, Outcome::Failed));
        assert!(
            !t.attempted("c/other", Outcome::Succeeded),
            "another probe's first"
        );
    }

    #[test]
    fn an_erroring_probe_asks_at_once_then_ever_more_rarely() {
        let mut t = ReadTriggers::default();
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        assert!(!t.attempted(P, Outcome::Succeeded));
        assert!(t.errored(P, at(0)), "the first error after a result");
        // 5 s, 10 s, 20 s … after the last read asked for, never more than 5 min.
        for due in [5, 15, 35, 75, 155, 315, 615, 915, 1215] {
            assert!(!t.errored(P, at(due - 1)), "before {due} s");
            assert!(t.errored(P, at(due)), "at {due} s");
        }
        let now = 1215;
        assert!(t.attempted(P, Outcome::Succeeded), "a result after errors");
        assert!(t.errored(P, at(now + 300)), "errors start over at once");
    }

    #[test]
    fn a_forgotten_probe_starts_over() {
        let mut t = ReadTriggers::default();
        assert!(!t.attempted(P, Outcome::Succeeded));
        t.forget(P);
        assert!(!t.attempted(P, Outcome::Failed), "a first attempt again");
    }
}
