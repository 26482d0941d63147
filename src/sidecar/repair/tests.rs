use super::*;

const C: &str = "game.kruise.io/idle";

fn idle(written_at: Option<Instant>) -> WriteProgress {
    WriteProgress {
        busy: false,
        queued_at: written_at,
        written_at,
        written_rv: None,
    }
}

/// Nothing in flight, the last write accepted at `at` and answered with the pod at `version`.
fn written(at: Instant, version: &str) -> WriteProgress {
    WriteProgress {
        written_rv: rv(version),
        ..idle(Some(at))
    }
}

/// A write queued at `queued` and not answered yet.
fn on_the_wire(queued: Instant) -> WriteProgress {
    WriteProgress {
        busy: true,
        queued_at: Some(queued),
        ..WriteProgress::default()
    }
}

fn rv(version: &str) -> Option<ResourceVersion> {
    Some(ResourceVersion::new(version))
}

#[tokio::test(start_paused = true)]
async fn a_condition_never_written_here_is_repaired_at_once() {
    let mut repairs = Repairs::new(RepairPolicy::Backoff);
    let now = Instant::now();
    let found = repairs
        .observe(C, Seen::Drifted, None, &idle(None), now)
        .unwrap();
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
        repairs.observe(C, Seen::Drifted, None, &idle(Some(written)), written),
        None
    );
    assert_eq!(repairs.next_due(), Some(written + CONFIRM_GRACE));
    // The view of our own write confirms it and cancels the recheck.
    assert_eq!(
        repairs.observe(C, Seen::Published, None, &idle(Some(written)), written),
        None
    );
    assert_eq!(repairs.next_due(), None);
    // From then on a mismatch is an overwrite, even within the grace.
    let found = repairs
        .observe(C, Seen::Drifted, None, &idle(Some(written)), written)
        .unwrap();
    assert_eq!(found.streak, 1);
}

#[tokio::test(start_paused = true)]
async fn the_view_of_our_write_may_come_before_its_answer() {
    let mut repairs = Repairs::new(RepairPolicy::Backoff);
    let queued = Instant::now();
    // The watch shows our write while the patch's answer is still on its way...
    repairs.observe(C, Seen::Published, None, &on_the_wire(queued), queued);
    // ...so a mismatch after the answer is news at once.
    let answered = queued + Duration::from_millis(10);
    let writing = WriteProgress {
        written_at: Some(answered),
        ..idle(Some(queued))
    };
    let found = repairs
        .observe(C, Seen::Drifted, None, &writing, answered)
        .unwrap();
    assert_eq!(found.repair_at, answered);
}

#[tokio::test(start_paused = true)]
async fn a_mismatch_seen_while_our_write_is_on_its_way_is_looked_at_again() {
    let mut repairs = Repairs::new(RepairPolicy::Backoff);
    let now = Instant::now();
    let busy = on_the_wire(now);
    assert_eq!(repairs.observe(C, Seen::Drifted, None, &busy, now), None);
    assert_eq!(repairs.next_due(), Some(now + RECHECK));
    assert_eq!(
        repairs.take_due(now + RECHECK),
        (vec![], vec![C.to_owned()])
    );
}

#[tokio::test(start_paused = true)]
async fn where_versions_do_not_order_an_unconfirmed_write_counts_as_overwritten_after_the_grace() {
    // Opaque resourceVersions (an apiserver not backed by etcd), an answer or a view without
    // one: time is all there is to go by.
    let cases = [
        (rv("a7"), Some("a9")),
        (rv("11"), Some("b3")),
        (rv("11"), None),
        (None, Some("12")),
    ];
    for (view, write) in cases {
        let mut repairs = Repairs::new(RepairPolicy::Backoff);
        let at = Instant::now();
        let writing = WriteProgress {
            written_rv: write.map(ResourceVersion::new),
            ..idle(Some(at))
        };
        assert_eq!(
            repairs.observe(C, Seen::Drifted, view.as_ref(), &writing, at),
            None,
            "{view:?} against {write:?}"
        );
        let later = at + CONFIRM_GRACE;
        assert_eq!(
            repairs.next_due(),
            Some(later),
            "{view:?} against {write:?}"
        );
        assert_eq!(repairs.take_due(later), (vec![], vec![C.to_owned()]));
        assert!(
            repairs
                .observe(C, Seen::Drifted, view.as_ref(), &writing, later)
                .is_some(),
            "{view:?} against {write:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_view_older_than_our_write_is_no_overwrite_however_late_it_comes() {
    // The default policy right after a change: an overwrite would be written back at once.
    let mut repairs = Repairs::new(RepairPolicy::AfterChange);
    let at = Instant::now();
    repairs.changed(C, at);
    let writing = written(at, "12");
    // A watch lagging far behind the apiserver delivers views from before the write, during
    // the grace and long after it. "9" is older than "12", though it sorts after it as text.
    for (view, late) in [
        ("11", Duration::ZERO),
        ("11", CONFIRM_GRACE),
        ("9", Duration::from_secs(20)),
    ] {
        let now = at + late;
        assert_eq!(
            repairs.observe(C, Seen::Drifted, rv(view).as_ref(), &writing, now),
            None,
            "a view at {view}, {late:?} after the write"
        );
        assert_eq!(repairs.next_due(), None, "nothing to look at again");
    }
    // The view of the write comes at last; the next one without the condition is news.
    let now = at + Duration::from_secs(21);
    repairs.observe(C, Seen::Published, rv("12").as_ref(), &writing, now);
    let found = repairs
        .observe(C, Seen::Drifted, rv("14").as_ref(), &writing, now)
        .unwrap();
    assert_eq!(found.repair_at, now);
}

#[tokio::test(start_paused = true)]
async fn a_recheck_that_finds_the_view_still_older_than_our_write_schedules_nothing() {
    let mut repairs = Repairs::new(RepairPolicy::AfterChange);
    let queued = Instant::now();
    repairs.changed(C, queued);
    assert_eq!(
        repairs.observe(
            C,
            Seen::Drifted,
            rv("11").as_ref(),
            &on_the_wire(queued),
            queued
        ),
        None
    );
    let recheck = queued + RECHECK;
    assert_eq!(repairs.take_due(recheck), (vec![], vec![C.to_owned()]));
    // The answer came back (the pod at 12); the watch still shows the pod at 11.
    let answered = WriteProgress {
        queued_at: Some(queued),
        ..written(queued + Duration::from_millis(50), "12")
    };
    assert_eq!(
        repairs.observe(C, Seen::Drifted, rv("11").as_ref(), &answered, recheck),
        None
    );
    assert_eq!(repairs.next_due(), None);
}

#[tokio::test(start_paused = true)]
async fn a_view_newer_than_our_write_that_lacks_the_condition_is_an_overwrite_at_once() {
    let mut repairs = Repairs::new(RepairPolicy::AfterChange);
    let at = Instant::now();
    repairs.changed(C, at);
    // Within the grace, and no view has shown the write yet: the version alone tells.
    let now = at + Duration::from_millis(100);
    let found = repairs
        .observe(C, Seen::Drifted, rv("13").as_ref(), &written(at, "12"), now)
        .unwrap();
    assert_eq!((found.streak, found.repair_at), (1, now));
    assert_eq!(repairs.take_due(now), (vec![C.to_owned()], vec![]));
}

#[tokio::test(start_paused = true)]
async fn a_condition_rides_along_by_the_same_rule() {
    let mut repairs = Repairs::new(RepairPolicy::Backoff);
    let at = Instant::now();
    let long_after = at + Duration::from_secs(20);
    let numeric = written(at, "12");
    assert!(!repairs.ride_along(C, rv("11").as_ref(), &numeric, long_after));
    assert!(repairs.ride_along(C, rv("13").as_ref(), &numeric, at));
    let opaque = written(at, "b");
    assert!(!repairs.ride_along(C, rv("a").as_ref(), &opaque, at));
    assert!(repairs.ride_along(C, rv("a").as_ref(), &opaque, at + CONFIRM_GRACE));
}

#[tokio::test(start_paused = true)]
async fn repeated_overwrites_back_off_and_a_quiet_minute_resets() {
    let mut repairs = Repairs::new(RepairPolicy::Backoff);
    let mut now = Instant::now();
    let mut waits = Vec::new();
    for _ in 0..12 {
        let found = repairs
            .observe(C, Seen::Drifted, None, &idle(None), now)
            .unwrap();
        waits.push(found.repair_at.duration_since(now).as_secs());
        now = found.repair_at;
        assert_eq!(repairs.take_due(now).0, vec![C.to_owned()]);
    }
    assert_eq!(waits, [0, 1, 2, 4, 8, 16, 32, 60, 60, 60, 60, 60]);
    // Already scheduled: a second look at the same mismatch is not a new overwrite.
    let found = repairs
        .observe(C, Seen::Drifted, None, &idle(None), now)
        .unwrap();
    assert_eq!(
        repairs.observe(C, Seen::Drifted, None, &idle(None), now),
        None
    );
    assert_eq!(repairs.take_due(found.repair_at).0, vec![C.to_owned()]);
    let quiet = found.repair_at + QUIET;
    let found = repairs
        .observe(C, Seen::Drifted, None, &idle(None), quiet)
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
        let found = repairs
            .observe(C, Seen::Drifted, None, &idle(None), now)
            .unwrap();
        waits.push(found.repair_at.duration_since(now));
        assert_eq!(repairs.take_due(found.repair_at).0, vec![C.to_owned()]);
        now = found.repair_at + Duration::from_secs(5);
    }
    assert!(waits.iter().all(|w| w.is_zero()), "{waits:?}");
    // A writer that undoes each repair within 100 ms: one write a second, no faster.
    let mut repaired = Vec::new();
    for _ in 0..5 {
        let found = repairs
            .observe(C, Seen::Drifted, None, &idle(None), now)
            .unwrap();
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
        let found = repairs
            .observe(C, Seen::Drifted, None, &idle(None), now)
            .unwrap();
        waits.push(found.repair_at.duration_since(now).as_secs());
        assert_eq!(repairs.take_due(found.repair_at).0, vec![C.to_owned()]);
        now = found.repair_at + Duration::from_secs(5);
    }
    // At once while the change is recent (0 … 25 s), backed off from 30 s on.
    assert_eq!(waits[..6], [0, 0, 0, 0, 0, 0]);
    assert!(waits[6] > 0, "{waits:?}");
    // A new result: at once again.
    repairs.changed(C, now);
    let found = repairs
        .observe(C, Seen::Drifted, None, &idle(None), now)
        .unwrap();
    assert_eq!(found.repair_at, now);
}

#[tokio::test(start_paused = true)]
async fn a_condition_written_along_with_another_needs_no_repair_of_its_own() {
    let mut repairs = Repairs::new(RepairPolicy::Backoff);
    let now = Instant::now();
    repairs
        .observe(C, Seen::Drifted, None, &idle(None), now)
        .unwrap();
    repairs.take_due(now);
    let found = repairs
        .observe(C, Seen::Drifted, None, &idle(None), now)
        .unwrap();
    assert!(found.repair_at > now);
    assert!(repairs.ride_along(C, None, &idle(None), now));
    assert_eq!(repairs.next_due(), None);
}

#[tokio::test(start_paused = true)]
async fn a_restored_condition_cancels_the_repair() {
    let mut repairs = Repairs::new(RepairPolicy::Backoff);
    let now = Instant::now();
    let later = now + Duration::from_secs(1);
    repairs
        .observe(C, Seen::Drifted, None, &idle(None), now)
        .unwrap();
    repairs.take_due(now);
    let found = repairs
        .observe(C, Seen::Drifted, None, &idle(None), now)
        .unwrap();
    assert_eq!(found.repair_at, later);
    repairs.observe(C, Seen::Published, None, &idle(None), now);
    assert_eq!(repairs.next_due(), None);
    repairs.forget(C);
    assert!(repairs.by_type.is_empty());
}
