//! How the binaries' watches on the apiserver retry after a failure.

use std::time::Duration;

use backon::BackoffBuilder;

/// A watch's backoff after a failure: 0.5 s doubling to 2 s, each wait lengthened by up
/// to itself at random (backon's jitter), so at most 4 s; reset by kube-rs on the next event.
/// kube-rs's default (0.8 s doubling to 30 s, up to 60 s with jitter) left watches away for
/// more than a minute after a 20 s outage; with at most 4 s, 1 000 sidecars' watches were back
/// within 7 s, where at most 20 s took 37 s (a watch may need two rounds: the re-watch the
/// restarted apiserver answers 410, then the re-list). See docs/scale.md, "Outages", for what
/// it costs at 5 000 pods. The manager's watches and controllers use it too (a kube-rs
/// `Controller` backs its trigger stream off again, by the default unless given
/// `trigger_backoff`): with the default, the sidecar-token issuer's pod watch was still away
/// when 100 sidecars' were back after a 20 s outage (`fleet/tests/fleet_outage.rs`).
#[derive(Debug)]
pub struct WatchBackoff {
    builder: backon::ExponentialBuilder,
    current: backon::ExponentialBackoff,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        let builder = backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(500))
            .with_max_delay(Duration::from_secs(2))
            .with_jitter()
            .without_max_times();
        WatchBackoff {
            current: builder.build(),
            builder,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.current.next()
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.current = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff;

    #[test]
    fn the_watch_retries_within_4_s_and_starts_over_after_an_answer() {
        let mut backoff = WatchBackoff::default();
        let waits: Vec<Duration> = (0..30).map(|_| backoff.next().unwrap()).collect();
        assert!(
            waits.iter().all(|w| *w <= Duration::from_secs(4)),
            "{waits:?}"
        );
        assert!(
            waits.iter().any(|w| *w >= Duration::from_secs(2)),
            "{waits:?}"
        );
        backoff.reset();
        assert!(backoff.next().unwrap() <= Duration::from_secs(1));
    }
}
