use std::sync::{Arc, Mutex};

use futures::stream;
use kube::core::Status;
use kube::core::response::StatusDetails;

use super::*;

fn status(code: u16, retry_after: u32) -> Box<Status> {
    Box::new(Status {
        code,
        details: Some(StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            causes: Vec::new(),
            retry_after_seconds: retry_after,
        }),
        ..Default::default()
    })
}

fn throttled(hint: u64) -> Failure {
    Failure::Throttled {
        retry_after: Some(Duration::from_secs(hint)),
    }
}

const UNAVAILABLE: Failure = Failure::Unavailable { retry_after: None };

#[test]
fn failures_are_read_by_what_they_say_of_the_apiserver() {
    let list = |code, hint| watcher::Error::InitialListFailed(kube::Error::Api(status(code, hint)));
    assert_eq!(Failure::of_watch(&list(429, 1)), throttled(1));
    assert_eq!(
        Failure::of_watch(&list(503, 0)),
        Failure::Unavailable { retry_after: None }
    );
    assert_eq!(
        Failure::of_watch(&watcher::Error::WatchError(status(410, 0))),
        Failure::Unavailable { retry_after: None }
    );
    assert_eq!(
        Failure::of_watch(&list(403, 0)),
        Failure::Refused { retry_after: None }
    );
}

#[test]
fn waits_after_429s_grow_from_1_s_to_30_s_never_below_the_hint() {
    let mut backoff = Backoff::new(Policy::WATCH);
    let waits: Vec<Duration> = (0..12).map(|_| backoff.wait(throttled(1))).collect();
    assert!(
        waits.iter().all(|w| *w >= Duration::from_secs(1)),
        "{waits:?}"
    );
    assert!(
        waits.iter().all(|w| *w <= Duration::from_secs(30)),
        "{waits:?}"
    );
    // Equal jitter: the n-th wait is within [b/2, b] of a backoff that doubles.
    for (n, w) in waits.iter().enumerate().take(5) {
        let b = Duration::from_secs(1 << n);
        assert!(
            *w >= (b / 2).max(Duration::from_secs(1)) && *w <= b,
            "{n}: {waits:?}"
        );
    }
    assert!(waits[11] >= Duration::from_secs(15), "{waits:?}");
}

#[test]
fn an_unreachable_apiserver_is_asked_again_within_4_s_and_an_answer_starts_over() {
    let mut backoff = Backoff::new(Policy::WATCH);
    let waits: Vec<Duration> = (0..30).map(|_| backoff.wait(UNAVAILABLE)).collect();
    assert!(
        waits.iter().all(|w| *w <= Duration::from_secs(4)),
        "{waits:?}"
    );
    assert!(
        waits.iter().any(|w| *w >= Duration::from_secs(2)),
        "{waits:?}"
    );
    // Throttled right after the outage: longer than the outage's cap allows.
    let after = backoff.wait(throttled(1));
    assert!(after >= Duration::from_secs(4), "{after:?}");
    backoff.reset();
    assert!(backoff.wait(UNAVAILABLE) <= Duration::from_millis(500));
}

#[test]
fn many_clients_failing_together_ask_again_apart() {
    let waits: Vec<Duration> = (0..100)
        .map(|_| {
            let mut b = Backoff::new(Policy::WATCH);
            b.wait(throttled(1));
            b.wait(throttled(1))
        })
        .collect();
    let distinct: std::collections::BTreeSet<_> = waits.iter().collect();
    assert!(distinct.len() > 90, "{} distinct of 100", distinct.len());
}

type Item = Result<watcher::Event<()>, watcher::Error>;

fn list_failed() -> Item {
    Err(watcher::Error::InitialListFailed(kube::Error::Api(status(
        429, 1,
    ))))
}

/// When each item of `items` is polled, through [`retry_backoff`], on a paused clock.
async fn polled_at(items: Vec<Item>) -> Vec<Duration> {
    let start = tokio::time::Instant::now();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let source = stream::iter(items).inspect(move |_| {
        record.lock().unwrap().push(start.elapsed());
    });
    retry_backoff(source, Backoff::new(Policy::WATCH))
        .for_each(|_| async {})
        .await;
    seen.lock().unwrap().clone()
}

#[tokio::test(start_paused = true)]
async fn a_watch_whose_list_keeps_failing_backs_off_though_init_comes_between() {
    // kube-rs's watcher: Init, then the list fails; again and again.
    let mut items = Vec::new();
    for _ in 0..5 {
        items.push(Ok(watcher::Event::Init));
        items.push(list_failed());
    }
    items.push(Ok(watcher::Event::Init));
    let at = polled_at(items).await;
    // The gaps before each Init after a failure: ≥ the 1 s hint, and growing.
    let gaps: Vec<Duration> = (1..=5).map(|i| at[2 * i] - at[2 * i - 1]).collect();
    assert!(
        gaps.iter().all(|g| *g >= Duration::from_secs(1)),
        "{gaps:?}"
    );
    assert!(gaps[4] >= Duration::from_secs(8), "{gaps:?}");
}

#[tokio::test(start_paused = true)]
async fn an_answer_after_the_list_starts_the_backoff_over() {
    let mut items = Vec::new();
    for _ in 0..4 {
        items.push(list_failed());
    }
    items.push(Ok(watcher::Event::InitDone));
    items.push(list_failed());
    items.push(Ok(watcher::Event::Init));
    let at = polled_at(items).await;
    let last_gap = at[6] - at[5];
    assert!(last_gap <= Duration::from_secs(1), "{at:?}");
}

#[test]
fn a_refused_write_waits_up_to_a_minute_and_a_503s_hint_is_a_floor() {
    let mut backoff = Backoff::new(Policy::STATUS_WRITE);
    let refused = Failure::Refused { retry_after: None };
    let waits: Vec<Duration> = (0..12).map(|_| backoff.wait(refused)).collect();
    assert!(waits[0] <= Duration::from_millis(200), "{waits:?}");
    assert!(waits[11] >= Duration::from_secs(30), "{waits:?}");
    assert!(
        waits.iter().all(|w| *w <= Duration::from_secs(60)),
        "{waits:?}"
    );
    backoff.reset();
    let hinted = Failure::Unavailable {
        retry_after: Some(Duration::from_secs(3)),
    };
    assert!(backoff.wait(hinted) >= Duration::from_secs(3));
}

#[test]
fn a_refusal_after_an_outage_starts_from_the_minimum_and_refusals_in_a_row_grow() {
    let mut backoff = Backoff::new(Policy::STATUS_WRITE);
    for _ in 0..8 {
        backoff.wait(UNAVAILABLE);
    }
    let refused = Failure::Refused { retry_after: None };
    let first = backoff.wait(refused);
    assert!(first <= Duration::from_millis(200), "{first:?}");
    let waits: Vec<Duration> = (0..4).map(|_| backoff.wait(refused)).collect();
    assert!(
        waits[3] >= Duration::from_millis(1600),
        "refusals in a row still back off: {waits:?}"
    );
}
