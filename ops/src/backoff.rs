//! How both binaries wait after a failed request to the apiserver: one policy for the watches,
//! the controllers' triggers and the sidecar's status writer.
//!
//! A fleet of identical clients must spread its retries, and a 429 must slow the asker down:
//! - the wait doubles per failure in a row, from the policy's minimum to the cap of the
//!   failure's kind: short while the apiserver cannot answer (no connection, 5xx, 410), long
//!   after a refusal (other 4xx), and longest while API Priority and Fairness throttles (429);
//! - each wait is half to all of the backoff at random ("equal jitter"), so clients that failed
//!   together ask again apart, and none sooner than half the backoff;
//! - a `Retry-After` (`details.retryAfterSeconds`) is a floor under the wait, never the wait:
//!   APF gives every client the same 1 s, and honouring it exactly brings them back together.
//!   APF says it in the header only, which kube-rs's errors do not carry: the throttled
//!   minimum (1 s) stands in for it. kube-rs's client retries 429s itself by default, each
//!   after exactly the header's 1 s: the binaries turn that off (`default_retry`);
//! - a refusal's wait grows with refusals in a row: the first after failures of another kind
//!   (an outage) starts from the minimum, since the apiserver that refuses is back;
//! - only an answer resets it: for a watch, an object of a successful (re)list or watch. A
//!   kube-rs watcher emits `Init` before each new list, an `Ok` item that says nothing of the
//!   apiserver; kube-rs's `StreamBackoff` reset on it, so a watch whose list kept failing never
//!   waited past its first step, whatever the answer (10 000 sidecars under APF made 13.6
//!   watch requests each to start, docs/scale.md).

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::watcher;

/// What a failure says about the apiserver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No answer, a 5xx, or a 410 (a watch too old to resume: re-list).
    Unavailable { retry_after: Option<Duration> },
    /// 429: API Priority and Fairness asks the client to slow down.
    Throttled { retry_after: Option<Duration> },
    /// Any other refusal (403, 404, 422 …): asking again soon rarely changes the answer.
    Refused { retry_after: Option<Duration> },
}

impl Failure {
    /// Reads a failed request.
    pub fn of(error: &kube::Error) -> Failure {
        match error {
            kube::Error::Api(status) => Failure::of_status(status),
            _ => Failure::Unavailable { retry_after: None },
        }
    }

    /// Reads a failed watch (its list, its start, or an error event).
    pub fn of_watch(error: &watcher::Error) -> Failure {
        match error {
            watcher::Error::InitialListFailed(e)
            | watcher::Error::WatchStartFailed(e)
            | watcher::Error::WatchFailed(e) => Failure::of(e),
            watcher::Error::WatchError(status) => Failure::of_status(status),
            watcher::Error::NoResourceVersion => Failure::Refused { retry_after: None },
        }
    }

    fn of_status(status: &kube::core::Status) -> Failure {
        let retry_after = status
            .details
            .as_ref()
            .map(|d| d.retry_after_seconds)
            .filter(|s| *s > 0)
            .map(|s| Duration::from_secs(u64::from(s)));
        match status.code {
            429 => Failure::Throttled { retry_after },
            410 => Failure::Unavailable { retry_after },
            c if c >= 500 || c == 0 => Failure::Unavailable { retry_after },
            _ => Failure::Refused { retry_after },
        }
    }

    /// The apiserver's `Retry-After`, if it gave one.
    pub fn retry_after(&self) -> Option<Duration> {
        match *self {
            Failure::Unavailable { retry_after }
            | Failure::Throttled { retry_after }
            | Failure::Refused { retry_after } => retry_after,
        }
    }
}

/// The bounds of a [`Backoff`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The first backoff after an answer.
    pub min: Duration,
    /// Cap while the apiserver cannot answer: short, so a client follows its recovery.
    pub unavailable_max: Duration,
    /// Cap after a refusal.
    pub refused_max: Duration,
    /// The first backoff after a 429 (also the smallest after one).
    pub throttled_min: Duration,
    /// Cap while the apiserver throttles.
    pub throttled_max: Duration,
}

impl Policy {
    /// Watches and controllers: an unreachable apiserver is asked again within 4 s (1 000
    /// sidecars' watches were back within 7 s of a 20 s outage; kube-rs's default, up to 60 s,
    /// left them away for more than a minute: docs/scale.md, "Outages"); a throttled one from
    /// 1 s doubling to 30 s.
    pub const WATCH: Policy = Policy {
        min: Duration::from_millis(500),
        unavailable_max: Duration::from_secs(4),
        refused_max: Duration::from_secs(30),
        throttled_min: Duration::from_secs(1),
        throttled_max: Duration::from_secs(30),
    };

    /// The sidecar's status writer: its first retry sooner (a result waits on it), a refused
    /// write retried at most every minute.
    pub const STATUS_WRITE: Policy = Policy {
        min: Duration::from_millis(200),
        unavailable_max: Duration::from_secs(4),
        refused_max: Duration::from_secs(60),
        throttled_min: Duration::from_secs(1),
        throttled_max: Duration::from_secs(30),
    };
}

/// Failures in a row and the wait each earns, as the module says.
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: Policy,
    /// The backoff the next failure starts from.
    next: Duration,
    /// Whether the last failure was a refusal.
    refusing: bool,
}

impl Backoff {
    pub fn new(policy: Policy) -> Backoff {
        Backoff {
            policy,
            next: policy.min,
            refusing: false,
        }
    }

    /// The wait after `failure`, and the backoff grown for the next one.
    pub fn wait(&mut self, failure: Failure) -> Duration {
        let refused = matches!(failure, Failure::Refused { .. });
        if refused && !std::mem::replace(&mut self.refusing, true) {
            // The first refusal after an outage is an answer from an apiserver that is back
            // (one that is still starting refuses what its authorizer cannot check yet): it
            // starts from the minimum, not from the outage's grown backoff, which had the
            // last pending writes of a 20 s outage wait 4 to 8 s more.
            self.next = self.policy.min;
        }
        self.refusing = refused;
        let p = &self.policy;
        let (floor, cap) = match failure {
            Failure::Unavailable { .. } => (p.min, p.unavailable_max),
            Failure::Refused { .. } => (p.min, p.refused_max),
            Failure::Throttled { .. } => (p.throttled_min, p.throttled_max),
        };
        let backoff = self.next.max(floor).min(cap);
        // Grown past this kind's cap, so that a 429 after outages in a row still waits longer.
        let largest = p.unavailable_max.max(p.refused_max).max(p.throttled_max);
        self.next = (backoff * 2).min(largest);
        equal_jitter(backoff).max(failure.retry_after().unwrap_or_default())
    }

    /// The apiserver answered: the next failure starts from the minimum.
    pub fn reset(&mut self) {
        self.next = self.policy.min;
        self.refusing = false;
    }
}

/// Half to all of `backoff`, at random.
fn equal_jitter(backoff: Duration) -> Duration {
    backoff.mul_f64(0.5 + rand::random::<f64>() / 2.0)
}

/// A watch stream that waits, as [`Policy::WATCH`] says, after each failure before it asks
/// again. Failures are passed on at once (to be logged); the wait comes before the next poll.
pub trait WatchRetry<K>: Stream<Item = Result<watcher::Event<K>, watcher::Error>> {
    fn retry_backoff(self) -> impl Stream<Item = Self::Item> + Send
    where
        Self: Sized + Send + 'static,
        K: Send + 'static,
    {
        retry_backoff(self, Backoff::new(Policy::WATCH))
    }
}

impl<K, S> WatchRetry<K> for S where S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> {}

type Boxed<K> =
    Pin<Box<dyn Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static>>;

/// [`WatchRetry::retry_backoff`] with a given backoff.
pub fn retry_backoff<K, S>(
    stream: S,
    backoff: Backoff,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    K: Send + 'static,
{
    let stream: Boxed<K> = Box::pin(stream);
    futures::stream::unfold(
        (stream, backoff, None::<Duration>),
        |(mut stream, mut backoff, wait)| async move {
            if let Some(wait) = wait {
                tokio::time::sleep(wait).await;
            }
            let item = stream.next().await?;
            let wait = match &item {
                Err(e) => Some(backoff.wait(Failure::of_watch(e))),
                // Said before each list is asked for: not an answer.
                Ok(watcher::Event::Init) => None,
                Ok(_) => {
                    backoff.reset();
                    None
                }
            };
            Some((item, (stream, backoff, wait)))
        },
    )
}

/// For a kube-rs `Controller` whose trigger stream went through [`WatchRetry::retry_backoff`]:
/// its own backoff would wait a second time, and reset on the wrong items.
#[derive(Debug, Clone, Copy, Default)]
pub struct AlreadyBackedOff;

impl Iterator for AlreadyBackedOff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl kube::runtime::utils::Backoff for AlreadyBackedOff {
    fn reset(&mut self) {}
}

#[cfg(test)]
mod tests;
