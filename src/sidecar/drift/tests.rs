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
    }
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
    drift.view(Some(&conditions), &[], &mut book);
    assert!(
        drift
            .check(&owned(), &book, written(start), start)
            .is_empty()
    );

    // A provider's status update drops both, a second later.
    tokio::time::advance(Duration::from_secs(1)).await;
    let now = Instant::now();
    drift.view(Some(&[]), &[writer("vk-provider", &[])], &mut book);
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
    drift.view(Some(&conditions), &[], &mut book);
    tokio::time::advance(Duration::from_secs(10)).await;
    let now = Instant::now();

    // Another status writer flips idle to False and owns that entry now.
    let mut changed = conditions.clone();
    changed[0].status = "False".into();
    drift.view(Some(&changed), &[writer("syncer", &[IDLE])], &mut book);
    let found = drift.check(&owned(), &book, written(start), now);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].condition_type, IDLE);
    assert_eq!(found[0].who, "another writer (syncer)");

    // By the time it is due a write of it is on its way anyway: none is added.
    let busy = |_: &str| WriteProgress {
        busy: true,
        queued_at: Some(now),
        written_at: Some(start),
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
    drift.view(None, &[], &mut book);
    assert!(drift.check(&owned(), &book, written(now), now).is_empty());
    assert_eq!(drift.next_due(), None);
}

#[tokio::test(start_paused = true)]
async fn once_probing_stops_nothing_is_due_or_found() {
    let mut drift = Drift::new(RepairPolicy::Immediate);
    let mut book = ConditionBook::default();
    let conditions = published(&mut book);
    let now = Instant::now();
    drift.view(Some(&conditions), &[], &mut book);
    assert!(drift.check(&owned(), &book, written(now), now).is_empty());
    drift.view(Some(&[]), &[], &mut book);
    assert_eq!(drift.check(&owned(), &book, written(now), now).len(), 2);
    assert_eq!(drift.next_due(), Some(now));
    drift.stop();
    assert_eq!(drift.next_due(), None);
    drift.view(None, &[], &mut book);
    assert!(drift.check(&owned(), &book, written(now), now).is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_overwritten_condition_counts_as_absent_until_a_view_shows_it_back() {
    let mut drift = Drift::new(RepairPolicy::Backoff);
    let mut book = ConditionBook::default();
    let conditions = published(&mut book);
    let start = Instant::now();
    drift.view(Some(&conditions), &[], &mut book);
    assert!(
        drift
            .check(&owned(), &book, written(start), start)
            .is_empty()
    );
    tokio::time::advance(Duration::from_secs(10)).await;

    // Idle is dropped; healthy stays.
    let dropped = Instant::now();
    drift.view(Some(&conditions[1..]), &[], &mut book);
    assert_eq!(
        drift.check(&owned(), &book, written(start), dropped).len(),
        1
    );
    // Another view 2 s later still shows it missing: those 2 s count already.
    tokio::time::advance(Duration::from_secs(2)).await;
    drift.view(Some(&conditions[1..]), &[], &mut book);
    drift.check(&owned(), &book, written(start), Instant::now());
    assert_eq!(
        drift.take_absent(),
        vec![(IDLE.to_owned(), Duration::from_secs(2))]
    );
    // Back 1 s later: 1 s more, then nothing.
    tokio::time::advance(Duration::from_secs(1)).await;
    drift.view(Some(&conditions), &[], &mut book);
    drift.check(&owned(), &book, written(start), Instant::now());
    tokio::time::advance(Duration::from_secs(5)).await;
    drift.check(&owned(), &book, written(start), Instant::now());
    assert_eq!(
        drift.take_absent(),
        vec![(IDLE.to_owned(), Duration::from_secs(1))]
    );
}
