//! The writer's queue rules and its retries against an apiserver that cannot answer.

use super::*;

fn set(type_: &str, message: &str) -> ConditionWrite {
    ConditionWrite::Set(PodCondition {
        type_: type_.into(),
        status: "True".into(),
        message: Some(message.into()),
        ..Default::default()
    })
}

#[test]
fn a_delete_replaces_a_pending_result_and_a_newer_result_replaces_a_delete() {
    let mut state = State::default();
    state.queue(set("a", "old"));
    state.queue(ConditionWrite::Delete("a".into()));
    assert_eq!(
        state.take_batch(false),
        vec![ConditionWrite::Delete("a".into())]
    );
    state.in_flight.clear();
    state.queue(ConditionWrite::Delete("b".into()));
    state.queue(set("b", "new"));
    assert_eq!(state.take_batch(false), vec![set("b", "new")]);
}

#[test]
fn sets_and_deletes_never_share_a_patch_and_sets_go_first() {
    let mut state = State::default();
    state.queue(ConditionWrite::Delete("a".into()));
    state.queue(set("b", "m"));
    state.queue(set("c", "m"));
    assert_eq!(state.take_batch(false), vec![set("b", "m"), set("c", "m")]);
    assert_eq!(
        state.take_batch(false),
        vec![ConditionWrite::Delete("a".into())]
    );
    assert!(state.take_batch(false).is_empty());
}

#[test]
fn a_write_back_skips_the_coalescing_window_of_the_next_patch_only() {
    let (writer, _task) = {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let uid = watch::channel(None).1;
        ConditionWriter::spawn(
            unreachable_pods(),
            "p".into(),
            uid,
            WriterConfig::default(),
            Metrics::new(),
            ApiserverAnswered::default(),
        )
    };
    let ConditionWrite::Set(condition) = set("a", "m") else {
        unreachable!()
    };
    writer.write_back(condition.clone());
    assert!(writer.lock().urgent);
    assert_eq!(writer.lock().take_batch(false), vec![set("a", "m")]);
    assert!(!writer.lock().urgent, "the next patch waits again");
    writer.submit(condition);
    assert!(!writer.lock().urgent);
}

#[test]
fn a_failed_batch_never_overwrites_what_was_queued_meanwhile() {
    let mut state = State::default();
    state.queue(set("a", "first"));
    let batch = state.take_batch(false);
    assert!(state.in_flight.contains("a"));
    state.queue(ConditionWrite::Delete("a".into()));
    requeue(&mut state.pending, batch);
    assert_eq!(state.pending["a"], ConditionWrite::Delete("a".into()));
}

/// Pods of an apiserver that is not there (a port nothing listens on): every patch fails
/// to connect, as during an outage.
fn unreachable_pods() -> Api<Pod> {
    let port = testkit::port::free_port().expect("a free port");
    let url = format!("http://127.0.0.1:{port}").parse().unwrap();
    let client = kube::Client::try_from(kube::Config::new(url)).expect("client");
    Api::namespaced(client, "games")
}

fn transport_errors(metrics: &Metrics) -> u64 {
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(r#"podprobe_status_write_errors_total{code="transport"} "#))
        .map_or(0, |n| n.trim().parse().unwrap())
}

fn start(config: WriterConfig, answered: ApiserverAnswered) -> (ConditionWriter, Metrics) {
    let metrics = Metrics::new();
    let uid = watch::channel(Some("u".to_owned())).1;
    let (writer, _task) = ConditionWriter::spawn(
        unreachable_pods(),
        "p".into(),
        uid,
        config,
        metrics.clone(),
        answered,
    );
    let ConditionWrite::Set(condition) = set("a", "m") else {
        unreachable!()
    };
    writer.submit(condition);
    (writer, metrics)
}

#[test]
fn a_403_names_the_admission_policy_when_one_refused() {
    let refused = |message: &str| {
        let status = kube::core::Status::failure(message, "Forbidden").with_code(403);
        explain("game-1", Some(403), &kube::Error::Api(Box::new(status)))
    };
    let by_policy = refused(
        "pods \"game-1\" is forbidden: ValidatingAdmissionPolicy 'podprobe-sidecar-pod-status' denied request",
    );
    assert!(
        by_policy.contains("an admission policy refused"),
        "{by_policy}"
    );
    assert!(!by_policy.contains("RBAC"), "{by_policy}");
    let by_rbac = refused("pods \"game-1\" is forbidden: User cannot patch resource");
    assert!(by_rbac.contains("RBAC does not allow"), "{by_rbac}");
}

#[tokio::test(start_paused = true)]
async fn while_the_apiserver_cannot_answer_a_write_is_retried_every_few_seconds() {
    let (_writer, metrics) = start(WriterConfig::default(), ApiserverAnswered::default());
    tokio::time::sleep(Duration::from_secs(120)).await;
    // 200 ms doubling to the 4 s cap, each wait at least half its step: over 30 attempts
    // in 2 minutes (the 60 s cap of refusals makes about 10).
    let attempts = transport_errors(&metrics);
    assert!(
        (30..=130).contains(&attempts),
        "{attempts} attempts in 120 s"
    );
}

/// A first backoff of 30 s: the second attempt comes 15–30 s after the first.
fn slow_second_attempt() -> WriterConfig {
    WriterConfig {
        retry: podprobe_ops::backoff::Policy {
            min: Duration::from_secs(30),
            unavailable_max: Duration::from_secs(60),
            ..podprobe_ops::backoff::Policy::STATUS_WRITE
        },
        ..WriterConfig::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_flush_sends_a_write_waiting_out_its_backoff_at_once_and_only_once() {
    // Without the flush, the second attempt would come 15–30 s after the first: long after
    // a stopping sidecar has exited.
    let (writer, metrics) = start(slow_second_attempt(), ApiserverAnswered::default());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(transport_errors(&metrics), 1, "the first attempt");
    assert!(
        !writer.flush(Duration::from_millis(900)).await,
        "the apiserver still cannot answer"
    );
    assert_eq!(
        transport_errors(&metrics),
        2,
        "the flush did not send the waiting write"
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        transport_errors(&metrics),
        2,
        "a write that failed during the flush waits its backoff again"
    );
}

#[tokio::test(start_paused = true)]
async fn an_answer_from_the_apiserver_releases_a_waiting_write_at_once() {
    let answered = ApiserverAnswered::default();
    // Without the release, the second attempt would come 15–30 s after the first.
    let (_writer, metrics) = start(slow_second_attempt(), answered.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = transport_errors(&metrics);
    assert_eq!(before, 1, "the first attempt");
    answered.notify();
    tokio::time::sleep(RELEASE_SPREAD + Duration::from_millis(100)).await;
    assert_eq!(
        transport_errors(&metrics),
        before + 1,
        "the answer did not release the waiting write within {RELEASE_SPREAD:?}"
    );
}

#[test]
fn deletes_are_strategic_merge_directives_in_the_same_list() {
    let patch = status_patch("u", &[set("a", "m"), ConditionWrite::Delete("b".into())]);
    assert_eq!(
        patch["status"]["conditions"],
        serde_json::json!([
            {"type": "a", "status": "True", "message": "m"},
            {"type": "b", "$patch": "delete"},
        ])
    );
}

#[tokio::test(start_paused = true)]
async fn an_accepted_write_is_dated_by_the_version_its_answer_gave_the_pod() {
    let rv = |v: &str| Some(ResourceVersion::new(v));
    let mut state = State::default();
    state.queue(set("a", "m"));
    state.queue(set("b", "m"));
    let batch = state.take_batch(false);
    assert!(state.progress("a").busy);
    state.landed(&batch, rv("12"));
    let a = state.progress("a");
    assert!(!a.busy);
    assert_eq!(a.written_at, Some(Instant::now()));
    assert_eq!(a.written_rv, rv("12"));

    // An answer without a version: "a" is no longer dated by the earlier one.
    state.queue(set("a", "n"));
    let batch = state.take_batch(false);
    state.landed(&batch, None);
    assert_eq!(state.progress("a").written_rv, None);
    assert_eq!(state.progress("b").written_rv, rv("12"));
}
