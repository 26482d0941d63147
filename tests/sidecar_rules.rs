//! Contract rules of `podprobe run` beyond the basic loop (§5 events and refresh, §2 pruning,
//! §5 error explanations): the real binary against the real kube-apiserver behind the fault
//! proxy. §3, terminating pods, is `real_sidecar.rs`.

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;
use testkit::Fault;

const LIMIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_on_transitions_only_and_off_with_events_false() {
    for events in [true, false] {
        let cluster = Cluster::start().await;
        let flag = cluster.dir.path().join("flag");
        std::fs::write(&flag, "up").unwrap();
        let pod = cluster
            .create_pod("gs-e", &array(&[file_probe("p", "c/p", &flag)]), json!([]))
            .await;
        let port = free_port();
        let metrics_addr = format!("127.0.0.1:{port}");
        let mut args = vec!["--metrics-addr", metrics_addr.as_str()];
        if !events {
            args.push("--events=false");
        }
        let _sidecar = cluster.sidecar(&pod, &args).await;
        cluster
            .wait_pod("gs-e", LIMIT, |p| has_status(p, "c/p", "True"))
            .await;
        std::fs::remove_file(&flag).unwrap();
        cluster
            .wait_pod("gs-e", LIMIT, |p| has_status(p, "c/p", "False"))
            .await;
        // Many more attempts with the same result: still one event per transition.
        let seen = attempts(port, "c/p").await;
        wait_attempts(port, "c/p", seen + 5).await;
        let expected = usize::from(events);
        let wait = async {
            while cluster.events_sent("KruiseProbeFailed") < expected {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(LIMIT, wait)
            .await
            .expect("the Failed event");
        assert_eq!(
            cluster.events_sent("KruiseProbeSucceeded"),
            expected,
            "events={events}"
        );
        assert_eq!(
            cluster.events_sent("KruiseProbeFailed"),
            expected,
            "events={events}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_interval_moves_only_last_probe_time() {
    let cluster = Cluster::start().await;
    let (pod, _) = cluster.create_flagged_pod("gs-h").await;
    let _sidecar = cluster.sidecar(&pod, &["--refresh-interval", "2s"]).await;
    let pod = cluster
        .wait_pod("gs-h", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;
    let first = condition(&pod, "c/p").unwrap().clone();
    let writes = cluster.status_patches();
    let pod = cluster
        .wait_pod("gs-h", LIMIT, |p| {
            condition(p, "c/p").is_some_and(|c| c.last_probe_time != first.last_probe_time)
        })
        .await;
    let refreshed = condition(&pod, "c/p").unwrap();
    assert_eq!(refreshed.status, "True");
    assert_eq!(refreshed.message, first.message);
    assert_eq!(refreshed.last_transition_time, first.last_transition_time);
    assert!(refreshed.last_probe_time > first.last_probe_time);
    // The journal records a request once it is answered, which can be just after the watch
    // delivered its change.
    wait_until(LIMIT, "the heartbeat is a write", || {
        cluster.status_patches() > writes
    })
    .await;
}

/// §5 heartbeat: one status patch per pod per refresh, carrying every condition, also when the
/// pod's conditions last changed at different times (before, each kept its own schedule: a
/// patch per condition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_heartbeat_is_one_patch_with_all_its_conditions() {
    let cluster = Cluster::start().await;
    let (a, b) = (cluster.dir.path().join("a"), cluster.dir.path().join("b"));
    std::fs::write(&a, "a").unwrap();
    std::fs::write(&b, "b").unwrap();
    let both = array(&[file_probe("a", "c/a", &a), file_probe("b", "c/b", &b)]);
    let pod = cluster.create_pod("gs-r", &both, json!([])).await;
    let port = free_port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let args = ["--refresh-interval", "4s", "--metrics-addr", &metrics_addr];
    let _sidecar = cluster.sidecar(&pod, &args).await;
    cluster
        .wait_pod("gs-r", LIMIT, |p| {
            has_status(p, "c/a", "True") && has_status(p, "c/b", "True")
        })
        .await;
    // c/b changes seconds after c/a was last written: their lastProbeTimes differ from then on.
    let seen = attempts(port, "c/b").await;
    wait_attempts(port, "c/b", seen + 2).await;
    std::fs::remove_file(&b).unwrap();
    // The patches after c/b's change (the journal records one once it is answered) are
    // heartbeats; c/a's is due first, and carries c/b with it.
    let types = |e: &testkit::Entry| -> Vec<(String, String)> {
        let mut t: Vec<(String, String)> = e.json()["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| Some((c["type"].as_str()?.into(), c["status"].as_str()?.into())))
            .collect();
        t.sort();
        t
    };
    let after_change = || -> Option<Vec<Vec<(String, String)>>> {
        let patches = cluster.proxy.journal().matching("PATCH", "pods/status");
        let change = patches
            .iter()
            .position(|e| types(e).contains(&("c/b".into(), "False".into())))?;
        let heartbeats: Vec<_> = patches[change + 1..].iter().map(types).collect();
        (heartbeats.len() >= 2).then_some(heartbeats)
    };
    wait_until(
        Duration::from_secs(60),
        "two heartbeats after c/b's change",
        || after_change().is_some(),
    )
    .await;
    let heartbeats: Vec<Vec<String>> = after_change()
        .unwrap()
        .into_iter()
        .map(|t| t.into_iter().map(|(ty, _)| ty).collect())
        .collect();
    assert!(
        heartbeats.iter().all(|t| t == &["c/a", "c/b"]),
        "each heartbeat carries both conditions: {heartbeats:?}"
    );
}

/// §5 errors: after a 429 the writer waits at least the server's `Retry-After`, and longer
/// each time it is answered 429 again (10 000 sidecars that all asked again after exactly the
/// hint kept API Priority and Fairness' queues full: docs/scale.md). Six 429s with
/// `Retry-After: 1`: every wait is at least the second, the last one at least 3 s, and the
/// condition lands after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_429s_the_writer_waits_longer_than_the_hint_each_time() {
    let cluster = Cluster::start().await;
    let (pod, _) = cluster.create_flagged_pod("gs-t").await;
    cluster.proxy.faults().add(
        Fault::too_many_requests(1)
            .method("PATCH")
            .path_contains("pods/gs-t/status")
            .times(6),
    );
    let _sidecar = cluster.sidecar(&pod, &[]).await;
    cluster
        .wait_pod("gs-t", Duration::from_secs(60), |p| {
            has_status(p, "c/p", "True")
        })
        .await;
    wait_until(LIMIT, "the accepted write journaled", || {
        cluster.status_patches() >= 7
    })
    .await;
    let patches = cluster.proxy.journal().matching("PATCH", "pods/status");
    let codes: Vec<u16> = patches.iter().map(|e| e.status).collect();
    assert_eq!(codes[..7], [429, 429, 429, 429, 429, 429, 200], "{codes:?}");
    let at: Vec<jiff::Timestamp> = patches[..7]
        .iter()
        .map(|e| e.time.parse().unwrap())
        .collect();
    let gaps: Vec<f64> = at
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64())
        .collect();
    assert!(
        gaps.iter().all(|g| *g >= 0.99),
        "each wait at least the hint: {gaps:?}"
    );
    assert!(
        gaps[5] >= 3.0,
        "the sixth wait grew past the hint: {gaps:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_conditions_deletes_only_removed_probes_conditions() {
    let cluster = Cluster::start().await;
    let a = cluster.dir.path().join("a");
    let b = cluster.dir.path().join("b");
    std::fs::write(&a, "a").unwrap();
    std::fs::write(&b, "b").unwrap();
    let both = array(&[file_probe("a", "c/a", &a), file_probe("b", "c/b", &b)]);
    let pod = cluster.create_pod("gs-p", &both, json!([])).await;
    let _sidecar = cluster.sidecar(&pod, &["--prune-conditions"]).await;
    cluster
        .wait_pod("gs-p", LIMIT, |p| {
            has_status(p, "c/a", "True") && has_status(p, "c/b", "True")
        })
        .await;
    cluster
        .set_annotation("gs-p", &array(&[file_probe("b", "c/b", &b)]))
        .await;
    let pod = cluster
        .wait_pod("gs-p", LIMIT, |p| condition(p, "c/a").is_none())
        .await;
    assert!(has_status(&pod, "c/b", "True"));
    assert!(
        has_status(&pod, "Ready", "True"),
        "kubelet's conditions stay"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_writes_are_explained_and_retried() {
    let cluster = Cluster::start().await;
    let (pod, _) = cluster.create_flagged_pod("gs-x").await;
    let faults = cluster.proxy.faults();
    faults.add(
        Fault::status(403)
            .method("PATCH")
            .path_contains("/status")
            .times(1),
    );
    faults.add(
        Fault::status(422)
            .method("PATCH")
            .path_contains("/status")
            .times(1),
    );
    faults.add(
        Fault::status(404)
            .method("PATCH")
            .path_contains("/status")
            .times(1),
    );
    let sidecar = cluster.sidecar(&pod, &[]).await;
    cluster
        .wait_pod("gs-x", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;
    let log = sidecar.log();
    for hint in [
        "RBAC does not allow `patch pods/status`",
        "the apiserver refused the conditions as invalid",
        "the pod no longer exists",
    ] {
        assert_eq!(log.matches(hint).count(), 1, "{hint:?} once in:\n{log}");
    }
    assert!(!log.contains("panicked"), "{log}");
}

/// The pod watch as a fleet's member must retry (`podprobe_ops::backoff`):
/// - five 429s on its list (as API Priority and Fairness answers a fleet): each retry at least
///   the 1 s hint later, and later each time. kube-rs's own backoff started over at the `Init`
///   it says before each list, so every retry came within a second, whatever the answer;
/// - an apiserver that refuses connections is asked again within 4 s;
/// - a re-watch the apiserver answers 410 `Expired` is listed again once, then watched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_watch_backs_off_after_429s_returns_after_an_outage_and_relists_once_after_a_410() {
    let cluster = Cluster::start().await;
    let (pod, flag) = cluster.create_flagged_pod("gs-w").await;
    let pods_path = format!("/api/v1/namespaces/{NS}/pods");
    let watch_requests = |from_seq: u64| -> Vec<testkit::Entry> {
        cluster
            .proxy
            .journal()
            .entries()
            .into_iter()
            .filter(|e| e.seq > from_seq && e.method == "GET" && e.path == pods_path)
            .collect()
    };
    cluster.proxy.faults().add(
        Fault::too_many_requests(1)
            .method("GET")
            .path_contains(pods_path.as_str())
            .times(5),
    );
    let _sidecar = cluster.sidecar(&pod, &["--source", "api"]).await;
    // The probes come from the watch: no condition before its list succeeds.
    cluster
        .wait_pod("gs-w", Duration::from_secs(90), |p| {
            has_status(p, "c/p", "True")
        })
        .await;
    let requests = watch_requests(0);
    assert!(
        requests[..5].iter().all(|e| e.status == 429) && requests[5].status == 200,
        "{requests:#?}"
    );
    testkit::journal::assert_backs_off(
        &requests[..6],
        Duration::from_secs(1),
        Duration::from_secs(4),
    );

    // An outage: the watch drops; the next re-watch is answered "too old".
    let before = cluster
        .proxy
        .journal()
        .entries()
        .last()
        .map_or(0, |e| e.seq);
    cluster.proxy.stop().await;
    let outage = Duration::from_secs(10);
    tokio::time::sleep(outage).await;
    cluster.proxy.faults().add(
        Fault::watch_expired()
            .method("GET")
            .path_contains(pods_path.as_str())
            .times(1),
    );
    let back = std::time::SystemTime::now();
    cluster.proxy.restart().await.expect("the proxy back");
    // A second probe, seen only through the watch once it is back.
    let flag2 = cluster.dir.path().join("flag2");
    std::fs::write(&flag2, "up").unwrap();
    cluster
        .set_annotation(
            "gs-w",
            &array(&[
                file_probe("p", "c/p", &flag),
                file_probe("q", "c/q", &flag2),
            ]),
        )
        .await;
    cluster
        .wait_pod("gs-w", LIMIT, |p| has_status(p, "c/q", "True"))
        .await;
    let after = watch_requests(before);
    let first = after.first().expect("the watch asked again");
    let asked_again = first.arrived().duration_since(back).unwrap_or_default();
    assert!(
        asked_again <= Duration::from_millis(4_500),
        "first request {asked_again:?} after the apiserver was back"
    );
    let kinds: Vec<(bool, u16)> = after.iter().map(|e| (e.is_watch(), e.status)).collect();
    // The re-watch answered 410, one list, then watches only.
    assert_eq!(kinds[0], (true, 200), "{after:#?}");
    assert!(after[0].fault, "the 410 answered the re-watch: {after:#?}");
    let lists = kinds.iter().filter(|(watch, _)| !watch).count();
    assert_eq!(lists, 1, "listed once after the 410: {after:#?}");
    assert_eq!(kinds[1], (false, 200), "{after:#?}");
}

/// A probe whose every attempt errors (its command does not exist) gives no result: no state,
/// no condition, and `podprobe_probe_erroring` says so, which `PodProbeNoResults` alerts on;
/// the pod's other probe is not held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_whose_attempts_all_error_shows_as_erroring() {
    let cluster = Cluster::start().await;
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "up").unwrap();
    let broken = json!({"name": "b", "containerName": "main",
        "probe": {"exec": {"command": ["/nonexistent/probe"]}, "periodSeconds": 1},
        "podConditionType": "c/b"})
    .to_string();
    let annotation = array(&[file_probe("p", "c/p", &flag), broken]);
    let pod = cluster.create_pod("gs-x", &annotation, json!([])).await;
    let port = free_port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let args = [
        "--exec-mode",
        "local",
        "--metrics-addr",
        metrics_addr.as_str(),
    ];
    let _sidecar = cluster.sidecar(&pod, &args).await;
    cluster
        .wait_pod("gs-x", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;
    wait_attempts(port, "c/b", 2).await;
    let text = metrics(port).await.unwrap();
    assert_eq!(
        condition_metric(&text, "podprobe_probe_erroring", "c/b"),
        1.0,
        "{text}"
    );
    assert_eq!(
        condition_metric(&text, "podprobe_probe_erroring", "c/p"),
        0.0,
        "{text}"
    );
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("podprobe_probe_state") && l.contains("condition=\"c/b\"")),
        "no state without a result: {text}"
    );
    let pod = cluster.pods().get("gs-x").await.unwrap();
    assert!(
        condition(&pod, "c/b").is_none(),
        "no condition without a result"
    );
}
