use std::collections::VecDeque;
use std::sync::Mutex;

use super::*;
use crate::annotation::RawTiming;
use crate::probe::{Handler, TcpAction};
use tokio::time::Instant;

/// Scripted attempts: each call pops the next result (default: Succeeded "ok") and records when
/// it ran, so timing can be checked under tokio's paused clock.
#[derive(Clone, Default)]
struct Script {
    inner: Arc<Mutex<ScriptState>>,
}

#[derive(Default)]
struct ScriptState {
    results: VecDeque<Result<Observation, String>>,
    attempts: Vec<Instant>,
    busy_for: Duration,
}

impl Script {
    fn new(results: impl IntoIterator<Item = Result<Observation, String>>) -> Self {
        let script = Script::default();
        script.inner.lock().unwrap().results = results.into_iter().collect();
        script
    }
    fn busy_for(self, d: Duration) -> Self {
        self.inner.lock().unwrap().busy_for = d;
        self
    }
    fn attempts(&self) -> Vec<Instant> {
        self.inner.lock().unwrap().attempts.clone()
    }
}

impl Attempter for Script {
    fn attempt(
        &self,
        _handler: &Handler,
        _target: &Target,
        _timeout: Duration,
    ) -> impl Future<Output = Result<Observation, AttemptError>> + Send {
        let (next, busy) = {
            let mut state = self.inner.lock().unwrap();
            state.attempts.push(Instant::now());
            let next = state
                .results
                .pop_front()
                .unwrap_or_else(|| Ok(Observation::succeeded("ok")));
            (next, state.busy_for)
        };
        async move {
            tokio::time::sleep(busy).await;
            next.map_err(AttemptError::Other)
        }
    }
}

fn s(msg: &str) -> Result<Observation, String> {
    Ok(Observation::succeeded(msg))
}
fn f(msg: &str) -> Result<Observation, String> {
    Ok(Observation::failed(msg))
}

fn spec(ct: &str, timing: RawTiming) -> ProbeSpec {
    ProbeSpec {
        name: format!("probe-{ct}"),
        container_name: "main".into(),
        condition_type: ct.into(),
        handler: Handler::Tcp(TcpAction {
            port: crate::probe::Port::Number(80),
        }),
        timing,
    }
}

fn timing(period: i32, success: i32, failure: i32) -> RawTiming {
    RawTiming {
        period_seconds: Some(period),
        success_threshold: Some(success),
        failure_threshold: Some(failure),
        ..Default::default()
    }
}

fn no_jitter() -> RunnerConfig {
    RunnerConfig {
        start_jitter: false,
        ..Default::default()
    }
}

async fn next_transition(rx: &mut mpsc::Receiver<WorkerReport>) -> Transition {
    loop {
        match rx.recv().await.expect("runner dropped the channel") {
            WorkerReport::Transition(t) => return t,
            _ => continue,
        }
    }
}

/// Waits `within` simulated time; returns the transition if one came.
async fn transition_within(
    rx: &mut mpsc::Receiver<WorkerReport>,
    within: Duration,
) -> Option<Transition> {
    tokio::time::timeout(within, next_transition(rx)).await.ok()
}

#[test]
fn kruise_minimums_apply_to_unset_and_invalid_fields() {
    let t = Timing::effective(&RawTiming::default(), TimingDefaults::Kruise);
    assert_eq!(
        t,
        Timing {
            initial_delay: Duration::from_secs(1),
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold: 1,
            failure_threshold: 1,
        }
    );
    let negative = RawTiming {
        initial_delay_seconds: Some(-5),
        timeout_seconds: Some(0),
        period_seconds: Some(-1),
        success_threshold: Some(0),
        failure_threshold: Some(-3),
    };
    assert_eq!(Timing::effective(&negative, TimingDefaults::Kruise), t);
    let explicit = RawTiming {
        initial_delay_seconds: Some(10),
        timeout_seconds: Some(3),
        period_seconds: Some(10),
        success_threshold: Some(2),
        failure_threshold: Some(3),
    };
    let t = Timing::effective(&explicit, TimingDefaults::Kruise);
    assert_eq!(t.initial_delay, Duration::from_secs(10));
    assert_eq!(t.timeout, Duration::from_secs(3));
    assert_eq!((t.success_threshold, t.failure_threshold), (2, 3));
}

#[test]
fn kubernetes_defaults_on_request() {
    let t = Timing::effective(&RawTiming::default(), TimingDefaults::Kubernetes);
    assert_eq!(
        t,
        Timing {
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(10),
            timeout: Duration::from_secs(1),
            success_threshold: 1,
            failure_threshold: 3,
        }
    );
}

#[test]
fn tv16_threshold_sequence() {
    let t = Timing::effective(&timing(1, 2, 3), TimingDefaults::Kruise);
    let mut streak = Streak::default();
    use Outcome::{Failed as F, Succeeded as S};
    let published: Vec<_> = [S, S, F, F, F, S, S]
        .into_iter()
        .map(|o| streak.observe(o, &t))
        .collect();
    assert_eq!(
        published,
        vec![
            None,
            Some(ProbeState::Succeeded),
            None,
            None,
            Some(ProbeState::Failed),
            None,
            Some(ProbeState::Succeeded)
        ]
    );
    let zero = Timing::effective(&timing(1, 0, 0), TimingDefaults::Kruise);
    let mut streak = Streak::default();
    assert_eq!(streak.observe(S, &zero), Some(ProbeState::Succeeded));
    assert_eq!(streak.observe(F, &zero), Some(ProbeState::Failed));
}

#[tokio::test(start_paused = true)]
async fn first_attempt_after_initial_delay_then_fixed_period() {
    let script = Script::default();
    let (tx, mut rx) = mpsc::channel(64);
    let mut runner = Runner::new(script.clone(), no_jitter(), tx);
    let start = Instant::now();
    let raw = RawTiming {
        initial_delay_seconds: Some(5),
        period_seconds: Some(2),
        ..Default::default()
    };
    runner.apply(&[spec("c", raw)], &PodContainers::default());
    let t = next_transition(&mut rx).await;
    assert_eq!((t.state, t.message.as_str()), (ProbeState::Succeeded, "ok"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let offsets: Vec<u64> = script
        .attempts()
        .iter()
        .map(|i| (*i - start).as_secs())
        .collect();
    assert_eq!(offsets, vec![5, 7, 9]);
    // A steady result publishes nothing more.
    assert!(
        transition_within(&mut rx, Duration::from_secs(30))
            .await
            .is_none()
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_probe_skips_ticks_instead_of_queueing_them() {
    let script = Script::default().busy_for(Duration::from_millis(2500));
    let (tx, _rx) = mpsc::channel(64);
    let mut runner = Runner::new(script.clone(), no_jitter(), tx);
    let start = Instant::now();
    runner.apply(&[spec("c", timing(1, 1, 1))], &PodContainers::default());
    tokio::time::sleep(Duration::from_millis(9_900)).await;
    let offsets: Vec<u128> = script
        .attempts()
        .iter()
        .map(|i| (*i - start).as_millis())
        .collect();
    // Attempts start at 1 s; each takes 2.5 s; missed ticks are dropped, so the next attempt
    // waits for the next whole period instead of firing back to back.
    assert_eq!(offsets, vec![1000, 4000, 7000]);
}

#[tokio::test(start_paused = true)]
async fn start_jitter_stays_within_one_period() {
    for _ in 0..20 {
        let script = Script::default();
        let (tx, mut rx) = mpsc::channel(64);
        let mut runner = Runner::new(script.clone(), RunnerConfig::default(), tx);
        let start = Instant::now();
        runner.apply(&[spec("c", timing(10, 1, 1))], &PodContainers::default());
        next_transition(&mut rx).await;
        let first = script.attempts()[0] - start;
        assert!(
            first >= Duration::from_secs(1) && first < Duration::from_secs(10),
            "first attempt at {first:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn thresholds_and_errored_attempts() {
    // S=2, F=2; an errored attempt in the middle of a streak neither breaks nor extends it.
    let script = Script::new([
        s("a"),
        Err("port \"web\" cannot be resolved".into()),
        s("b"),
        f("x"),
        Err("again".into()),
        f("y"),
        s("c"),
        s("d"),
    ]);
    let (tx, mut rx) = mpsc::channel(64);
    let mut runner = Runner::new(script.clone(), no_jitter(), tx);
    runner.apply(&[spec("c", timing(1, 2, 2))], &PodContainers::default());
    let mut seen = Vec::new();
    let mut errored = 0;
    while seen.len() < 3 {
        match rx.recv().await.unwrap() {
            WorkerReport::Transition(t) => seen.push((t.state, t.message, script.attempts().len())),
            WorkerReport::Errored { error, .. } => {
                errored += 1;
                assert!(!error.is_empty());
            }
            WorkerReport::Attempted { .. } => {}
        }
    }
    assert_eq!(errored, 2);
    assert_eq!(
        seen,
        vec![
            (ProbeState::Succeeded, "b".to_owned(), 3),
            (ProbeState::Failed, "y".to_owned(), 6),
            (ProbeState::Succeeded, "d".to_owned(), 8),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn message_changes_within_a_state_are_transitions_too() {
    let script = Script::new([s("v1"), s("v1"), s("v2")]);
    let (tx, mut rx) = mpsc::channel(64);
    let mut runner = Runner::new(script, no_jitter(), tx);
    runner.apply(&[spec("c", timing(1, 1, 1))], &PodContainers::default());
    assert_eq!(next_transition(&mut rx).await.message, "v1");
    let t = next_transition(&mut rx).await;
    assert_eq!((t.state, t.message.as_str()), (ProbeState::Succeeded, "v2"));
}

#[tokio::test(start_paused = true)]
async fn container_awareness() {
    let script = Script::default();
    let (tx, mut rx) = mpsc::channel(64);
    let mut runner = Runner::new(script.clone(), no_jitter(), tx);
    runner.set_container(
        "main",
        ContainerView::Running {
            container_id: Some("containerd://a".into()),
            started_at: Some(Timestamp::now()),
            started: Some(false),
        },
    );
    let raw = RawTiming {
        initial_delay_seconds: Some(3),
        period_seconds: Some(1),
        ..Default::default()
    };
    runner.apply(&[spec("c", raw)], &PodContainers::default());
    // Not started (startup probe pending): no attempts at all.
    assert!(
        transition_within(&mut rx, Duration::from_secs(20))
            .await
            .is_none()
    );
    assert!(script.attempts().is_empty());

    // Started long ago: the initial delay has passed already, the next tick probes.
    runner.set_container(
        "main",
        ContainerView::Running {
            container_id: Some("containerd://a".into()),
            started_at: Some(Timestamp::now() - jiff::SignedDuration::from_secs(100)),
            started: Some(true),
        },
    );
    let t = next_transition(&mut rx).await;
    assert_eq!(t.state, ProbeState::Succeeded);

    // Stopped: Failed with OpenKruise's message, no threshold, no attempt.
    let before = script.attempts().len();
    runner.set_container(
        "main",
        ContainerView::NotRunning {
            container_id: Some("containerd://a".into()),
        },
    );
    let t = next_transition(&mut rx).await;
    assert_eq!(
        (t.state, t.message.as_str()),
        (ProbeState::Failed, "Container(main) is Non-running")
    );
    assert_eq!(script.attempts().len(), before);

    // Restarted (new container ID): Unknown "container restarted", then the new container is
    // probed only after its own initial delay.
    let restarted_at = Instant::now();
    runner.set_container(
        "main",
        ContainerView::Running {
            container_id: Some("containerd://b".into()),
            started_at: Some(Timestamp::now()),
            started: Some(true),
        },
    );
    let t = next_transition(&mut rx).await;
    assert_eq!(
        (t.state, t.message.as_str()),
        (ProbeState::Unknown, "container restarted")
    );
    let t = next_transition(&mut rx).await;
    assert_eq!(t.state, ProbeState::Succeeded);
    let first_new = *script.attempts().last().unwrap();
    assert!(first_new - restarted_at >= Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn apply_starts_stops_and_restarts_changed_probes() {
    let script = Script::new([f("down")]);
    let (tx, mut rx) = mpsc::channel(64);
    let mut runner = Runner::new(script.clone(), no_jitter(), tx);
    let a = spec("a", timing(1, 1, 1));
    let b = spec("b", timing(1, 1, 1));
    let applied = runner.apply(&[a.clone(), b.clone()], &PodContainers::default());
    assert_eq!(applied.started, vec!["a", "b"]);
    assert_eq!(runner.len(), 2);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(script.attempts().len(), 2);

    // Re-applying the same set touches nothing.
    assert_eq!(
        runner.apply(&[a.clone(), b.clone()], &PodContainers::default()),
        Applied::default()
    );

    // Changing b's thresholds restarts it; removing a stops it.
    let b2 = spec("b", timing(1, 3, 1));
    let applied = runner.apply(&[b2], &PodContainers::default());
    assert_eq!(applied.restarted, vec!["b"]);
    assert_eq!(applied.stopped, vec!["a"]);
    assert_eq!(runner.len(), 1);

    // Drain what was published so far, then check the restarted worker has fresh counters:
    // with successThreshold 3 it needs three successes before publishing.
    while transition_within(&mut rx, Duration::from_millis(1))
        .await
        .is_some()
    {}
    let before = script.attempts().len();
    let t = next_transition(&mut rx).await;
    assert_eq!(t.probe.condition_type, "b");
    assert_eq!(t.state, ProbeState::Succeeded);
    assert_eq!(script.attempts().len() - before, 3);

    runner.stop_all();
    assert!(runner.is_empty());
    let count = script.attempts().len();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        script.attempts().len(),
        count,
        "stopped workers do not probe"
    );
}
