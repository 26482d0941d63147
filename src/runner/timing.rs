//! A probe's effective timing and its consecutive-result thresholds.

use std::time::Duration;

use crate::annotation::RawTiming;
use crate::probe::Outcome;

use super::ProbeState;

/// Which defaults apply to unset or out-of-range timing fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TimingDefaults {
    /// kruise-daemon's minimums: period, timeout, initial delay, thresholds all at least 1.
    #[default]
    Kruise,
    /// The kubelet's defaults for 0/unset: period 10 s, timeout 1 s, delay 0, success 1, failure 3.
    Kubernetes,
}

/// Effective timing of one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl Timing {
    pub fn effective(raw: &RawTiming, defaults: TimingDefaults) -> Timing {
        let secs = |v: i32| Duration::from_secs(u64::try_from(v).unwrap_or(0));
        let count = |v: i32| u32::try_from(v).unwrap_or(0);
        match defaults {
            TimingDefaults::Kruise => Timing {
                initial_delay: secs(raw.initial_delay_seconds.unwrap_or(0).max(1)),
                period: secs(raw.period_seconds.unwrap_or(0).max(1)),
                timeout: secs(raw.timeout_seconds.unwrap_or(0).max(1)),
                success_threshold: count(raw.success_threshold.unwrap_or(0).max(1)),
                failure_threshold: count(raw.failure_threshold.unwrap_or(0).max(1)),
            },
            TimingDefaults::Kubernetes => {
                let or = |v: Option<i32>, default: i32| match v {
                    Some(v) if v > 0 => v,
                    _ => default,
                };
                Timing {
                    initial_delay: secs(raw.initial_delay_seconds.unwrap_or(0).max(0)),
                    period: secs(or(raw.period_seconds, 10)),
                    timeout: secs(or(raw.timeout_seconds, 1)),
                    success_threshold: count(or(raw.success_threshold, 1)),
                    failure_threshold: count(or(raw.failure_threshold, 3)),
                }
            }
        }
    }
}

/// Consecutive-result counting (kubelet/kruise-daemon): the streak survives everything but a
/// different result; a result is published once its streak reaches the threshold.
#[derive(Debug, Clone, Default)]
pub struct Streak {
    last: Option<Outcome>,
    run: u32,
}

impl Streak {
    /// Records one real result; returns the state to publish, if the threshold is reached.
    pub fn observe(&mut self, outcome: Outcome, timing: &Timing) -> Option<ProbeState> {
        if self.last == Some(outcome) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(outcome);
            self.run = 1;
        }
        let threshold = match outcome {
            Outcome::Succeeded => timing.success_threshold,
            Outcome::Failed => timing.failure_threshold,
        };
        (self.run >= threshold).then_some(outcome.into())
    }

    pub fn reset(&mut self) {
        *self = Streak::default();
    }

    /// Length of the current streak.
    pub fn run(&self) -> u32 {
        self.run
    }
}
