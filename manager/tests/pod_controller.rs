//! The pod controller against a real kube-apiserver, through the fault proxy: one patch per
//! condition change even when the pod cache lags behind the manager's own writes, no pod work
//! for PPM status writes, node label changes reaching the pods on the node, and the
//! controller's and the node watch's retries after 429s.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::*;
use testkit::Fault;

/// The manager's pod watches so far.
fn pod_watches(cluster: &Tv03Cluster) -> usize {
    cluster
        .proxy
        .journal()
        .matching("GET", "/api/v1/pods")
        .iter()
        .filter(|e| e.is_watch())
        .count()
}

/// Polls the PodProbeMarker's `matchedPods` until it is `n`.
async fn wait_matched(cluster: &Tv03Cluster, n: i64, what: &str) {
    let limit = Duration::from_secs(10);
    let wait = async {
        while cluster.matched_pods().await != Some(n) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(limit, wait)
        .await
        .unwrap_or_else(|_| panic!("{what}: matchedPods is not {n} within {limit:?}"));
}

/// Waits (watching) until pod `name` carries `server-healthy=true`.
async fn wait_marked(cluster: &Tv03Cluster, name: &str) {
    wait_pod(&cluster.pods(), name, &format!("{name} marked"), |p| {
        label(p, "server-healthy").as_deref() == Some("true")
    })
    .await;
}

/// The benchmark's 10 001st patch: a reconcile triggered by something other than the pod's own
/// watch event (here a PPM spec change, in the benchmark the PPM status write) reads the pod
/// from a cache that has not seen the manager's patch yet, and sent the same patch again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_behind_our_own_patch_does_not_repeat_it() {
    let cluster = Tv03Cluster::with_tv03().await;
    cluster.create_steady_pod(0, true).await;
    // The manager's first pod watch ends after one event; the next one is answered late, so the
    // cache keeps the version from before the manager's patch meanwhile.
    cluster.proxy.faults().add(
        Fault::end_watch_after(1)
            .path_contains("/api/v1/pods")
            .times(1),
    );
    let dir = tempfile::tempdir().unwrap();
    let s = cluster.start_manager(dir.path()).await;
    eventually(Duration::from_secs(10), "pod watch started", || {
        pod_watches(&cluster) == 1
    })
    .await;
    wait_matched(&cluster, 1, "status written").await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let delay = Duration::from_secs(3);
    cluster.proxy.faults().add(
        Fault::delay(delay)
            .path_contains("/api/v1/pods")
            .watch()
            .times(1),
    );
    cluster.proxy.journal().clear();

    cluster.set_healthy("gs-0", false).await;
    assert!(
        cluster
            .proxy
            .journal()
            .wait_for_count("PATCH", "pods", 1, Duration::from_secs(5))
            .await,
        "the condition change is patched"
    );
    // A PPM spec change that leaves this pod's patch as it is (a key of the other state's
    // policy, which the pod does not have): announced, the pod is reconciled from the cache.
    let mut edited = tv03_ppm();
    edited["spec"]["probes"][0]["markerPolicy"][0]["labels"]["extra"] = json!("yes");
    let edit = json!({"spec": edited["spec"]});
    cluster
        .ppms()
        .patch("ppm-test", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    let ppms = s.manager.ppms.clone();
    eventually(Duration::from_secs(5), "PPM cache has the change", || {
        ppms.namespace("test").first().is_some_and(|p| {
            p.spec.probes[0].marker_policy[0]
                .labels
                .contains_key("extra")
        })
    })
    .await;
    let reconciles = s.manager.metrics.pod_reconciles.get();
    eventually(
        Duration::from_secs(5),
        "the PPM change reconciled the pod",
        || s.manager.metrics.pod_reconciles.get() > reconciles,
    )
    .await;
    // The cache catches up after the delay; nothing more to do then either.
    eventually(delay + Duration::from_secs(5), "pod watch resumed", || {
        pod_watches(&cluster) >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let patches = cluster.proxy.journal().matching("PATCH", "pods");
    assert_eq!(patches.len(), 1, "{patches:#?}");
    assert_eq!(
        patches[0].json()["metadata"]["labels"]["server-healthy"],
        "false"
    );
    let pod = cluster.pod("gs-0").await;
    assert_eq!(label(&pod, "server-healthy").as_deref(), Some("false"));
    s.manager.shutdown().await;
}

/// PPM status writes (the status controller's own) change nothing a pod gets: no reconciles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ppm_status_write_reconciles_no_pod() {
    let cluster = Tv03Cluster::with_tv03().await;
    for i in 0..3 {
        cluster.create_steady_pod(i, true).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = cluster.start_manager(dir.path()).await;
    wait_matched(&cluster, 3, "status written").await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let reconciles = s.manager.metrics.pod_reconciles.get();
    // Someone writes a wrong count; the status controller writes it back: two status changes.
    let wrong = json!({"status": {"matchedPods": 42}});
    cluster
        .ppms()
        .patch_status("ppm-test", &PatchParams::default(), &Patch::Merge(&wrong))
        .await
        .unwrap();
    wait_matched(&cluster, 3, "status corrected").await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(s.manager.metrics.pod_reconciles.get(), reconciles);
    assert_eq!(cluster.pod_patches(), 0);
    s.manager.shutdown().await;
}

/// A pod on a node without the serverless label gets no markers; labelling the node marks it
/// without any event of the pod, and so does a node that is created late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labelling_the_node_marks_its_pods() {
    let cluster = Tv03Cluster::with_tv03().await;
    let plain: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "plain-1", "labels": {"type": "normal"}}
    }))
    .unwrap();
    cluster.create_node(&plain).await;
    let unmarked = |i: usize, node: &str| {
        let mut p = steady_pod(i, true);
        p.metadata.labels.as_mut().unwrap().remove("server-healthy");
        p.spec.as_mut().unwrap().node_name = Some(node.into());
        p
    };
    cluster.create_pod(&unmarked(0, "plain-1")).await;
    cluster.create_pod(&unmarked(1, "plain-1")).await;
    cluster.create_pod(&unmarked(2, "vk-late")).await;
    let dir = tempfile::tempdir().unwrap();
    let s = cluster.start_manager(dir.path()).await;
    let metrics = s.manager.metrics.clone();
    eventually(Duration::from_secs(10), "pods reconciled", || {
        metrics.pod_reconciles.get() >= 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let patches = cluster.proxy.journal().matching("PATCH", "pods");
    assert!(
        patches.is_empty(),
        "no markers off serverless nodes: {patches:#?}"
    );

    cluster
        .label_node("plain-1", json!({"type": "virtual-kubelet"}))
        .await;
    for name in ["gs-0", "gs-1"] {
        wait_marked(&cluster, name).await;
    }
    assert!(label(&cluster.pod("gs-2").await, "server-healthy").is_none());
    cluster.create_node(&vk_node("vk-late")).await;
    wait_marked(&cluster, "gs-2").await;
    // Losing the label leaves the markers (nothing to remove), and costs no patch.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(cluster.pod_patches(), 3, "one patch per pod");
    cluster.label_node("plain-1", json!(null)).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(cluster.pod_patches(), 3);
    s.manager.shutdown().await;
}

/// Pods are not reconciled before the PPM cache has its first list: until then every pod would
/// look unmatched and lose its annotations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_pod_is_reconciled_before_the_ppm_cache_has_synced() {
    let cluster = Tv03Cluster::with_tv03().await;
    cluster.create_steady_pod(0, true).await;
    // The PodProbeMarker lists (PPM cache, status controller) answer late.
    cluster.proxy.faults().add(
        Fault::delay(Duration::from_millis(1500))
            .method("GET")
            .path_contains("/podprobemarkers")
            .times(2),
    );
    let dir = tempfile::tempdir().unwrap();
    let s = cluster.start_manager(dir.path()).await;
    eventually(Duration::from_secs(10), "pod reconciled", || {
        s.manager.metrics.pod_reconciles.get() >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let patches = cluster.proxy.journal().matching("PATCH", "pods");
    assert!(patches.is_empty(), "{patches:#?}");
    s.manager.shutdown().await;
}

/// The manager's requests to `path` (a list or watch of the whole cluster), in order.
fn requests_to(cluster: &Tv03Cluster, path: &str) -> Vec<testkit::Entry> {
    cluster
        .proxy
        .journal()
        .entries()
        .into_iter()
        .filter(|e| e.method == "GET" && e.path == path)
        .collect()
}

/// Five 429s on the pod controller's list (its trigger stream) and on the node watch's list:
/// each retry at least the 1 s hint later, and later each time. kube-rs's `StreamBackoff`
/// started over at each `Init` the watcher says before a list, so every retry came within a
/// second whatever the answer; a controller's own trigger backoff waited again on top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_and_a_watch_back_off_after_429s() {
    let cluster = Tv03Cluster::with_tv03().await;
    cluster.create_steady_pod(0, false).await;
    for path in ["/api/v1/pods", "/api/v1/nodes"] {
        cluster.proxy.faults().add(
            Fault::too_many_requests(1)
                .method("GET")
                .path_contains(path)
                .times(5),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let _s = cluster.start_manager(dir.path()).await;
    cluster.set_healthy("gs-0", true).await;
    wait_marked(&cluster, "gs-0").await;
    for path in ["/api/v1/pods", "/api/v1/nodes"] {
        let requests = requests_to(&cluster, path);
        assert!(
            requests.len() >= 6
                && requests[..5].iter().all(|e| e.status == 429)
                && requests[5].status == 200,
            "{path}: {requests:#?}"
        );
        testkit::journal::assert_backs_off(
            &requests[..6],
            Duration::from_secs(1),
            Duration::from_secs(4),
        );
    }
}

/// Four 429s on a pod's marker patch: the controller asks again at least the 1 s hint later,
/// and later each time (its error policy requeued every failure after exactly 1 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_marker_patch_backs_off() {
    let cluster = Tv03Cluster::with_tv03().await;
    cluster.create_steady_pod(0, false).await;
    let dir = tempfile::tempdir().unwrap();
    let _s = cluster.start_manager(dir.path()).await;
    wait_matched(&cluster, 1, "status written").await;
    let path = "/api/v1/namespaces/test/pods/gs-0";
    cluster.proxy.faults().add(
        Fault::too_many_requests(1)
            .method("PATCH")
            .path_contains(path)
            .times(4),
    );
    cluster.set_healthy("gs-0", true).await;
    wait_marked(&cluster, "gs-0").await;
    let patches = || -> Vec<testkit::Entry> {
        cluster
            .proxy
            .journal()
            .entries()
            .into_iter()
            .filter(|e| e.method == "PATCH" && e.path == path)
            .skip_while(|e| e.status != 429)
            .collect()
    };
    // The proxy journals a request when the apiserver's answer reaches it, which may be after
    // the watch already showed the marker: wait for the accepted patch's entry.
    let journaled = async {
        while patches().len() < 5 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), journaled).await;
    let patches = patches();
    assert!(
        patches.len() >= 5 && patches[..4].iter().all(|e| e.status == 429),
        "{patches:#?}"
    );
    testkit::journal::assert_backs_off(
        &patches[..5],
        Duration::from_secs(1),
        Duration::from_secs(4),
    );
}
