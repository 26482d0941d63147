//! The pod controller against testkit: one patch per condition change even when the pod cache
//! lags behind the manager's own writes, no pod work for PPM status writes, and node label
//! changes reaching the pods on the node.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use podprobe_manager::crd::PodProbeMarker;
use podprobe_manager::webhook::Mode;
use support::*;
use testkit::{ApiServer, Fault};

async fn cluster() -> ApiServer {
    let api = ApiServer::start().await.unwrap();
    api.create_namespace("test").unwrap();
    api.set_object(&vk_node("vk-1")).unwrap();
    api.create(&ppm(&tv03_ppm())).unwrap();
    api
}

fn matched_pods(api: &ApiServer) -> Option<i64> {
    api.get::<PodProbeMarker>("test", "ppm-test")
        .and_then(|p| p.status)
        .map(|s| s.matched_pods)
}

fn pod_watches(api: &ApiServer) -> usize {
    api.journal()
        .matching("GET", "/api/v1/pods")
        .iter()
        .filter(|e| e.is_watch())
        .count()
}

/// The benchmark's 10 001st patch: a reconcile triggered by something other than the pod's own
/// watch event (here a PPM spec change, in the benchmark the PPM status write) reads the pod
/// from a cache that has not seen the manager's patch yet, and sent the same patch again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_behind_our_own_patch_does_not_repeat_it() {
    let api = cluster().await;
    api.set_object(&steady_pod(0, true)).unwrap();
    // The manager's first pod watch ends after one event; the next one is answered late, so the
    // cache keeps the version from before the manager's patch meanwhile.
    api.faults().add(
        Fault::end_watch_after(1)
            .path_contains("/api/v1/pods")
            .times(1),
    );
    let dir = tempfile::tempdir().unwrap();
    let s = start_manager(&api, dir.path(), Mode::Standalone, None, None).await;
    eventually(Duration::from_secs(10), "pod watch started", || {
        pod_watches(&api) == 1
    })
    .await;
    eventually(Duration::from_secs(10), "status written", || {
        matched_pods(&api) == Some(1)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let delay = Duration::from_secs(3);
    api.faults().add(
        Fault::delay(delay)
            .path_contains("/api/v1/pods")
            .watch()
            .times(1),
    );
    api.journal().clear();

    set_healthy(&api, "gs-0", false);
    assert!(
        api.journal()
            .wait_for_count("PATCH", "pods", 1, Duration::from_secs(5))
            .await,
        "the condition change is patched"
    );
    // A PPM spec change that leaves this pod's patch as it is (a key of the other state's
    // policy, which the pod does not have): announced, the pod is reconciled from the cache.
    api.modify::<PodProbeMarker>("test", "ppm-test", |p| {
        p.spec.probes[0].marker_policy[0]
            .labels
            .insert("extra".into(), "yes".into());
    })
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
        pod_watches(&api) >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let patches = api.journal().matching("PATCH", "pods");
    assert_eq!(patches.len(), 1, "{patches:#?}");
    assert_eq!(
        patches[0].json()["metadata"]["labels"]["server-healthy"],
        "false"
    );
    let pod = api.get::<Pod>("test", "gs-0").unwrap();
    assert_eq!(label(&pod, "server-healthy").as_deref(), Some("false"));
    s.manager.shutdown().await;
}

/// PPM status writes (the status controller's own) change nothing a pod gets: no reconciles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ppm_status_write_reconciles_no_pod() {
    let api = cluster().await;
    for i in 0..3 {
        api.set_object(&steady_pod(i, true)).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let s = start_manager(&api, dir.path(), Mode::Standalone, None, None).await;
    eventually(Duration::from_secs(10), "status written", || {
        matched_pods(&api) == Some(3)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let reconciles = s.manager.metrics.pod_reconciles.get();
    // Someone writes a wrong count; the status controller writes it back: two status changes.
    api.modify::<PodProbeMarker>("test", "ppm-test", |p| {
        p.status.as_mut().unwrap().matched_pods = 42;
    })
    .unwrap();
    eventually(Duration::from_secs(10), "status corrected", || {
        matched_pods(&api) == Some(3)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(s.manager.metrics.pod_reconciles.get(), reconciles);
    assert_eq!(api.journal().count("PATCH", "pods"), 0);
    s.manager.shutdown().await;
}

/// A pod on a node without the serverless label gets no markers; labelling the node marks it
/// without any event of the pod, and so does a node that is created late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labelling_the_node_marks_its_pods() {
    let api = cluster().await;
    api.set_object(&serde_json::from_value::<Node>(serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "plain-1", "labels": {"type": "normal"}}
    })).unwrap())
    .unwrap();
    let unmarked = |i: usize, node: &str| {
        let mut p = steady_pod(i, true);
        p.metadata.labels.as_mut().unwrap().remove("server-healthy");
        p.spec.as_mut().unwrap().node_name = Some(node.into());
        p
    };
    api.set_object(&unmarked(0, "plain-1")).unwrap();
    api.set_object(&unmarked(1, "plain-1")).unwrap();
    api.set_object(&unmarked(2, "vk-late")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let s = start_manager(&api, dir.path(), Mode::Standalone, None, None).await;
    let metrics = s.manager.metrics.clone();
    eventually(Duration::from_secs(10), "pods reconciled", || {
        metrics.pod_reconciles.get() >= 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let patches = api.journal().matching("PATCH", "pods");
    assert!(
        patches.is_empty(),
        "no markers off serverless nodes: {patches:#?}"
    );

    api.modify::<Node>("", "plain-1", |n| {
        n.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("type".into(), "virtual-kubelet".into());
    })
    .unwrap();
    for name in ["gs-0", "gs-1"] {
        eventually(Duration::from_secs(5), &format!("{name} marked"), || {
            api.get::<Pod>("test", name)
                .and_then(|p| label(&p, "server-healthy"))
                .as_deref()
                == Some("true")
        })
        .await;
    }
    assert!(label(&api.get::<Pod>("test", "gs-2").unwrap(), "server-healthy").is_none());
    api.set_object(&vk_node("vk-late")).unwrap();
    eventually(Duration::from_secs(5), "gs-2 marked", || {
        api.get::<Pod>("test", "gs-2")
            .and_then(|p| label(&p, "server-healthy"))
            .as_deref()
            == Some("true")
    })
    .await;
    // Losing the label leaves the markers (nothing to remove), and costs no patch.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let patches = api.journal().count("PATCH", "pods");
    assert_eq!(patches, 3, "one patch per pod");
    api.modify::<Node>("", "plain-1", |n| {
        n.metadata.labels = None;
    })
    .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(api.journal().count("PATCH", "pods"), 3);
    s.manager.shutdown().await;
}

/// Pods are not reconciled before the PPM cache has its first list: until then every pod would
/// look unmatched and lose its annotations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_pod_is_reconciled_before_the_ppm_cache_has_synced() {
    let api = cluster().await;
    api.set_object(&steady_pod(0, true)).unwrap();
    // The PodProbeMarker lists (PPM cache, status controller) answer late.
    api.faults().add(
        Fault::delay(Duration::from_millis(1500))
            .method("GET")
            .path_contains("/podprobemarkers")
            .times(2),
    );
    let dir = tempfile::tempdir().unwrap();
    let s = start_manager(&api, dir.path(), Mode::Standalone, None, None).await;
    eventually(Duration::from_secs(10), "pod reconciled", || {
        s.manager.metrics.pod_reconciles.get() >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let patches = api.journal().matching("PATCH", "pods");
    assert!(patches.is_empty(), "{patches:#?}");
    s.manager.shutdown().await;
}
