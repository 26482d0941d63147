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
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "up").unwrap();
    let pod = cluster
        .create_pod("gs-h", &array(&[file_probe("p", "c/p", &flag)]), json!([]))
        .await;
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
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "up").unwrap();
    let pod = cluster
        .create_pod("gs-x", &array(&[file_probe("p", "c/p", &flag)]), json!([]))
        .await;
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
