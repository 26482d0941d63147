//! The repair decisions as the loop meets them: results recorded, views of the pod arriving,
//! the writer's progress, a paused clock.

use std::collections::BTreeSet;

use super::*;
use crate::runner::{ProbeId, ProbeState, Transition};

const IDLE: &str = "game.kruise.io/idle";
const HEALTHY: &str = "game.kruise.io/healthy";

fn owned() -> Vec<String> {
    vec![IDLE.to_owned(), HEALTHY.to_owned()]
}

/// Each owned condition's result, recorded as the loop records a transition.
fn published(book: &mut ConditionBook) -> Vec<PodCondition> {
    owned()
        .into_iter()
        .map(|condition_type| {
            book.record(&Transition {
                probe: ProbeId {
                    name: condition_type.clone(),
                    condition_type,
                },
                state: ProbeState::Succeeded,
                message: "ok".into(),
                at: jiff::Timestamp::now(),
            })
            .unwrap()
        })
        .collect()
}

/// Nothing in flight, and the last write of each condition accepted at `at`.
fn written(at: Instant) -> impl Fn(&str) -> WriteProgress {
    move |_| WriteProgress {
        busy: false,
        queued_at: Some(at),
        written_at: Some(at),
        written_rv: None,
    }
}

/// Nothing in flight; the last write of idle and of healthy accepted at `at`, answered with
/// the pod at `idle` and `healthy`.
fn written_as(
    at: Instant,
    idle: &'static str,
    healthy: &'static str,
) -> impl Fn(&str) -> WriteProgress {
    move |condition_type| WriteProgress {
        written_rv: rv(if condition_type == IDLE {
            idle
        } else {
            healthy
        }),
        ..written(at)(condition_type)
    }
}

fn rv(version: &str) -> Option<ResourceVersion> {
    Some(ResourceVersion::new(version))
}

fn writer(manager: &str, owns: &[&str]) -> StatusWriter {
    StatusWriter {
        manager: manager.into(),
        time: None,
        condition_types: owns.iter().map(|c| c.to_string()).collect::<BTreeSet<_>>(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_provider_that_replaces_the_status_gets_every_condition_back_in_one_write() {
    let mut drift = Drift::new(RepairPolicy::AfterChange);
    let mut book = ConditionBook::default();
    let conditions = published(&mut book);
    let start = Instant::now();
    for c in owned() {
        drift.changed(&c, start);
    }
    // The view of podprobe's own write: nothing to do.
    drift.view(Some(&conditions), &[], None, &mut book);
    assert!(
        drift
            .check(&owned(), &book, written(start), start)
            .is_empty()
    );

    // A provider's status update drops both, a second later.
    tokio::time::advance(Duration::from_secs(1)).await;
    let now = Instant::now();
    drift.view(Some(&[]), &[writer("vk-provider", &[])], None, &mut book);
    let found = drift.check(&owned(), &book, written(start), now);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found.iter().all(|f| f.wait.is_zero() && f.streak == 1),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .all(|f| f.who.contains("managedFields do not say which")),
        "a removal is owned by no one: {found:?}"
    );
    let (mut write_backs, rechecks) = drift.due(&owned(), &book, written(start), now);
    write_backs.sort_by(|a, b| a.type_.cmp(&b.type_));
    let mut expected = conditions.clone();
    expected.sort_by(|a, b| a.type_.cmp(&b.type_));
    assert_eq!(write_backs, expected);
    assert!(rechecks.is_empty());
    assert_eq!(drift.next_due(), None, "nothing left to do");
}

#[tokio::test(start_paused = true)]
async fn a_changed_condition_names_its_writer_and_a_write_on_its_way_is_not_doubled() {
    let mut drift = Drift::new(RepairPolicy::Immediate);
    let mut book = ConditionBook::default();
    let conditions = published(&mut book);
    let start = Instant::now();
    drift.view(Some(&conditions), &[], None, &mut book);
    tokio::time::advance(Duration::from_secs(10)).await;
    let now = Instant::now();

    // Another status writer flips idle to False and owns that entry now.
    let mut changed = conditions.clone();
    changed[0].status = "False".into();
    drift.view(
        Some(&changed),
        &[writer("syncer", &[IDLE])],
        None,
        &mut book,
    );
    let found = drift.check(&owned(), &book, written(start), now);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].condition_type, IDLE);
    assert_eq!(found[0].who, "another writer (syncer)");

    // By the time it is due a write of it is on its way anyway: none is added.
    let busy = |_: &str| WriteProgress {
        busy: true,
        queued_at: Some(now),
        written_at: Some(start),
        written_rv: None,
    };
    let (write_backs, _) = drift.due(&owned(), &book, busy, now);
    assert!(write_backs.is_empty(), "{write_backs:?}");
}

#[tokio::test(start_paused = true)]
async fn without_the_pods_conditions_nothing_is_ever_an_overwrite() {
    let mut drift = Drift::new(RepairPolicy::Immediate);
    let mut book = ConditionBook::default();
    published(&mut book);
    let now = Instant::now();
    // The file source: views carry no conditions.
    drift.view(None, &[], None, &mut book);
    assert!(drift.check(&owned(), &book, written(now), now).is_empty());
    assert_eq!(drift.next_due(), None);
}

#[tokio::test(start_paused = true)]
async fn once_probing_stops_nothing_is_due_or_found() {
    let mut drift = Drift::new(RepairPolicy::Immediate);
    let mut book = ConditionBook::default();
    let conditions = published(&mut book);
    let now = Instant::now();
    drift.view(Some(&conditions), &[], None, &mut book);
    assert!(drift.check(&owned(), &book, written(now), now).is_empty());
    drift.view(Some(&[]), &[], None, &mut book);
    assert_eq!(drift.check(&owned(), &book, written(now), now).len(), 2);
    assert_eq!(drift.next_due(), Some(now));
    drift.stop();
    assert_eq!(drift.next_due(), None);
    drift.view(None, &[], None, &mut book);
    assert!(drift.check(&owned(), &book, written(now), now).is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_overwritten_condition_counts_as_absent_until_a_view_shows_it_back() {
    let mut drift = Drift::new(RepairPolicy::Backoff);
    let mut book = ConditionBook::default();
    let conditions = published(&mut book);
    let start = Instant::now();
    drift.view(Some(&conditions), &[], None, &mut book);
    assert!(
        drift
            .check(&owned(), &book, written(start), start)
            .is_empty()
    );
    tokio::time::advance(Duration::from_secs(10)).await;

    // Idle is dropped; healthy stays.
    let dropped = Instant::now();
    drift.view(Some(&conditions[1..]), &[], None, &mut book);
    assert_eq!(
        drift.check(&owned(), &book, written(start), dropped).len(),
        1
    );
    // Another view 2 s later still shows it missing: those 2 s count already.
    tokio::time::advance(Duration::from_secs(2)).await;
    drift.view(Some(&conditions[1..]), &[], None, &mut book);
    drift.check(&owned(), &book, written(start), Instant::now());
    assert_eq!(
        drift.take_absent(),
        vec![(IDLE.to_owned(), Duration::from_secs(2))]
    );
    // Back 1 s later: 1 s more, then nothing.
    tokio::time::advance(Duration::from_secs(1)).await;
    drift.view(Some(&conditions), &[], None, &mut book);
    drift.check(&owned(), &book, written(start), Instant::now());
    tokio::time::advance(Duration::from_secs(5)).await;
    drift.check(&owned(), &book, written(start), Instant::now());
    assert_eq!(
        drift.take_absent(),
        vec![(IDLE.to_owned(), Duration::from_secs(1))]
    );
}

#[tokio::test(start_paused = true)]
async fn a_lagging_watch_never_turns_our_own_write_into_an_overwrite() {
    let mut drift = Drift::new(RepairPolicy::AfterChange);
    let mut book = ConditionBook::default();
    let start = Instant::now();
    let conditions = published(&mut book);
    for c in owned() {
        drift.changed(&c, start);
    }
    // The first results are on their way when a view of the pod without them arrives.
    let on_the_wire = |_: &str| WriteProgress {
        busy: true,
        queued_at: Some(start),
        ..WriteProgress::default()
    };
    drift.view(Some(&[]), &[], rv("11").as_ref(), &mut book);
    assert!(drift.check(&owned(), &book, on_the_wire, start).is_empty());

    // The apiserver answers with the pod at 12; the watch shows nothing newer for a minute.
    let answered = written_as(start, "12", "12");
    while Instant::now() < start + Duration::from_secs(60) {
        let Some(due) = drift.next_due() else { break };
        tokio::time::advance(due - Instant::now()).await;
        let (write_backs, found) = drift.due(&owned(), &book, &answered, Instant::now());
        assert!(write_backs.is_empty(), "{write_backs:?}");
        assert!(found.is_empty(), "{found:?}");
    }
    assert_eq!(drift.next_due(), None, "nothing left to look at");

    // The view of the write, then a provider's replacement of the status.
    tokio::time::advance(Duration::from_secs(60)).await;
    drift.view(Some(&conditions), &[], rv("12").as_ref(), &mut book);
    assert!(
        drift
            .check(&owned(), &book, &answered, Instant::now())
            .is_empty()
    );
    drift.view(Some(&[]), &[], rv("13").as_ref(), &mut book);
    assert_eq!(
        drift
            .check(&owned(), &book, &answered, Instant::now())
            .len(),
        2
    );
}

#[tokio::test(start_paused = true)]
async fn a_condition_rides_along_only_when_the_view_is_past_its_own_write() {
    let mut drift = Drift::new(RepairPolicy::Immediate);
    let mut book = ConditionBook::default();
    let conditions = published(&mut book);
    tokio::time::advance(Duration::from_secs(30)).await;
    let now = Instant::now();
    // Idle was written with the pod at 10, healthy (a newer result) at 20; the view is at 15.
    let writing = written_as(now, "10", "20");
    drift.view(Some(&[]), &[], rv("15").as_ref(), &mut book);
    let found = drift.check(&owned(), &book, &writing, now);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].condition_type, IDLE);
    let (write_backs, _) = drift.due(&owned(), &book, &writing, now);
    assert_eq!(write_backs, conditions[..1]);
}

#[tokio::test(start_paused = true)]
async fn a_repair_that_a_newer_write_of_ours_made_moot_is_not_sent() {
    let mut drift = Drift::new(RepairPolicy::Backoff);
    let mut book = ConditionBook::default();
    let conditions = published(&mut book);
    let start = Instant::now();
    drift.view(Some(&conditions), &[], rv("10").as_ref(), &mut book);
    // Idle is dropped, written back (the pod at 12), dropped again: a repair in 1 s.
    drift.view(Some(&conditions[1..]), &[], rv("11").as_ref(), &mut book);
    assert_eq!(
        drift
            .check(&owned(), &book, written_as(start, "10", "10"), start)
            .len(),
        1
    );
    let (write_backs, _) = drift.due(&owned(), &book, written_as(start, "10", "10"), start);
    assert_eq!(write_backs, conditions[..1]);
    drift.view(Some(&conditions[1..]), &[], rv("13").as_ref(), &mut book);
    let found = drift.check(&owned(), &book, written_as(start, "12", "10"), start);
    assert_eq!(found[0].wait, Duration::from_secs(1), "{found:?}");

    // Meanwhile a new result of idle is written (the pod at 14): that put it back.
    tokio::time::advance(Duration::from_secs(1)).await;
    let now = Instant::now();
    let (write_backs, found) = drift.due(&owned(), &book, written_as(now, "14", "10"), now);
    assert!(write_backs.is_empty(), "{write_backs:?}");
    assert!(found.is_empty(), "{found:?}");
    assert_eq!(drift.next_due(), None);
}
