//! Contract rules of `podprobe run` beyond the basic loop (§5 events and refresh, §2 pruning,
//! §3 terminating pods, §5 error explanations): the real binary against testkit.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use support::*;
use testkit::Fault;

const LIMIT: Duration = Duration::from_secs(30);

/// Event writes (creates) whose body names `reason`.
fn events_with(cluster: &Cluster, reason: &str) -> usize {
    cluster
        .api
        .journal()
        .matching("POST", "events")
        .iter()
        .filter(|e| e.body.contains(reason))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_on_transitions_only_and_off_with_events_false() {
    for events in [true, false] {
        let cluster = Cluster::start().await;
        let flag = cluster.dir.path().join("flag");
        std::fs::write(&flag, "up").unwrap();
        cluster.create_pod("gs-e", &array(&[file_probe("p", "c/p", &flag)]), json!([]));
        let port = free_port();
        let metrics_addr = format!("127.0.0.1:{port}");
        let mut args = vec!["--metrics-addr", metrics_addr.as_str()];
        if !events {
            args.push("--events=false");
        }
        let _sidecar = cluster.sidecar("gs-e", &args);
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
            while events_with(&cluster, "KruiseProbeFailed") < expected {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(LIMIT, wait)
            .await
            .expect("the Failed event");
        assert_eq!(
            events_with(&cluster, "KruiseProbeSucceeded"),
            expected,
            "events={events}"
        );
        assert_eq!(
            events_with(&cluster, "KruiseProbeFailed"),
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
    cluster.create_pod("gs-h", &array(&[file_probe("p", "c/p", &flag)]), json!([]));
    let _sidecar = cluster.sidecar("gs-h", &["--refresh-interval", "2s"]);
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
    cluster.create_pod("gs-p", &both, json!([]));
    let _sidecar = cluster.sidecar("gs-p", &["--prune-conditions"]);
    cluster
        .wait_pod("gs-p", LIMIT, |p| {
            has_status(p, "c/a", "True") && has_status(p, "c/b", "True")
        })
        .await;
    cluster.set_annotation("gs-p", &array(&[file_probe("b", "c/b", &b)]));
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
async fn a_terminating_pod_is_no_longer_probed_and_sigterm_exits_0() {
    let cluster = Cluster::start().await;
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "up").unwrap();
    cluster.create_pod("gs-d", &array(&[file_probe("p", "c/p", &flag)]), json!([]));
    let port = free_port();
    let mut sidecar = cluster.sidecar("gs-d", &["--metrics-addr", &format!("127.0.0.1:{port}")]);
    cluster
        .wait_pod("gs-d", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;

    // A graceful delete: the pod stays with a deletionTimestamp until the kubelet finishes.
    cluster
        .pods()
        .delete("gs-d", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    sidecar
        .wait_log("stopped probing: the pod is terminating", LIMIT)
        .await;
    let frozen = attempts(port, "c/p").await;
    let writes = cluster.status_patches();
    std::fs::remove_file(&flag).unwrap();
    // Absence over time can only be observed by letting time pass: 3 periods.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        attempts(port, "c/p").await,
        frozen,
        "no attempts after termination began"
    );
    assert_eq!(
        cluster.status_patches(),
        writes,
        "conditions left as they are"
    );
    let pod: Pod = cluster.pods().get("gs-d").await.unwrap();
    assert!(has_status(&pod, "c/p", "True"));

    let status = sidecar
        .terminate(Duration::from_secs(5))
        .expect("exited after SIGTERM");
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_writes_are_explained_and_retried() {
    let cluster = Cluster::start().await;
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "up").unwrap();
    cluster.create_pod("gs-x", &array(&[file_probe("p", "c/p", &flag)]), json!([]));
    let faults = cluster.api.faults();
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
    let sidecar = cluster.sidecar("gs-x", &[]);
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
