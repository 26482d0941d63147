//! A run of failed requests, logged so that an outage reads well: the first failure at once,
//! then one line per [`LOG_INTERVAL`] saying how many and for how long, and one line when it is
//! over. During an outage every pod retries every few seconds; a line per attempt would drown
//! the log. The pod's watch, its status reads and the condition writer each keep one run.

use std::time::Duration;

use tokio::time::Instant;

/// While requests keep failing, one warning per this interval (the first at once).
pub const LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Failures in a row of one kind of request.
#[derive(Debug, Default)]
pub struct FailureRun {
    since: Option<Instant>,
    attempts: u32,
    logged_at: Option<Instant>,
}

/// How loudly to log one failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loudness {
    /// The first of a run: a warning.
    First,
    /// A minute or more since the last warning: a warning saying how long it has gone on.
    Still { attempts: u32, over: Duration },
    /// Debug level only.
    Quiet,
}

impl FailureRun {
    /// Records a failure.
    pub fn failed(&mut self) -> Loudness {
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        self.attempts += 1;
        match self.logged_at {
            None => {
                self.logged_at = Some(now);
                Loudness::First
            }
            Some(at) if now.duration_since(at) >= LOG_INTERVAL => {
                self.logged_at = Some(now);
                Loudness::Still {
                    attempts: self.attempts,
                    over: now.duration_since(since),
                }
            }
            Some(_) => Loudness::Quiet,
        }
    }

    /// Records a success: the run that it ends (failed attempts and their span), if any.
    pub fn succeeded(&mut self) -> Option<(u32, Duration)> {
        let since = self.since.take()?;
        self.logged_at = None;
        Some((std::mem::take(&mut self.attempts), since.elapsed()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn first_at_once_then_once_a_minute_then_the_end() {
        let mut run = FailureRun::default();
        assert_eq!(run.succeeded(), None, "nothing failed");
        assert_eq!(run.failed(), Loudness::First);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(run.failed(), Loudness::Quiet);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(
            run.failed(),
            Loudness::Still {
                attempts: 3,
                over: Duration::from_secs(60)
            }
        );
        assert_eq!(run.failed(), Loudness::Quiet);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(run.succeeded(), Some((4, Duration::from_secs(65))));
        assert_eq!(run.succeeded(), None, "already over");
        assert_eq!(run.failed(), Loudness::First, "a new run");
    }
}
