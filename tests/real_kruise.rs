//! podprobe beside the real OpenKruise: kruise-manager (built from the pinned Go module, with
//! `EnablePodProbeMarkerOnServerless`) admits the pod and writes `kruise.io/podprobe`, the real
//! `podprobe run` (a pod-bound token, the sidecar Role) probes and writes the conditions, and
//! kruise-manager writes the markers. Every assertion is on what Kruise wrote. Run with v1.9.1
//! and with v1.8.0, the first release with the protocol (the compatibility matrix's two).

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use podprobe::demo::{GamePort, serve_health};
use serde_json::{Value, json};
use support::*;
use testkit::real::KruiseRelease;

const LIMIT: Duration = Duration::from_secs(60);
const IDLE: &str = "game.kruise.io/idle";
const PORT: &str = "game.kruise.io/port-open";
const HEALTHY: &str = "game.kruise.io/healthy";
const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// OpenKruise's PodProbeMarker resource (its CRD, installed from its own manifests).
fn ppm_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "apps.kruise.io",
        "v1alpha1",
        "PodProbeMarker",
    ))
}

/// A node of a serverless provider, as Kruise recognises it.
fn virtual_kubelet_node() -> Node {
    serde_json::from_value(json!({"metadata": {"name": "vk-1",
        "labels": {"type": "virtual-kubelet"}}}))
    .unwrap()
}

/// Three probes, one of each kind: exec (idle: both policies, the deletion cost), tcp (a
/// `Succeeded` policy only) and, with `http`, http on a named port (both policies,
/// annotations only).
fn game_ppm(idle_flag: &str, tcp_port: u16, http: bool) -> DynamicObject {
    let script =
        format!("if [ -f {idle_flag} ]; then cat {idle_flag}; else echo busy >&2; exit 1; fi");
    let mut ppm = json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "game", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": "game"}},
            "probes": [
                {"name": "idle", "containerName": "main", "podConditionType": IDLE,
                 "probe": {"exec": {"command": ["sh", "-c", script]}, "periodSeconds": 1},
                 "markerPolicy": [
                     {"state": "Succeeded", "labels": {"gameserver-idle": "true"},
                      "annotations": {DELETION_COST: "-10"}},
                     {"state": "Failed", "labels": {"gameserver-idle": "false"},
                      "annotations": {DELETION_COST: "10"}}]},
                {"name": "port", "containerName": "main", "podConditionType": PORT,
                 "probe": {"tcpSocket": {"port": tcp_port}, "periodSeconds": 1},
                 "markerPolicy": [{"state": "Succeeded", "labels": {"port-open": "true"}}]},
                {"name": "healthy", "containerName": "main", "podConditionType": HEALTHY,
                 "probe": {"httpGet": {"path": "/healthz", "port": "main-port", "scheme": "HTTP"},
                           "periodSeconds": 1},
                 "markerPolicy": [
                     {"state": "Succeeded", "annotations": {"game.example/healthy": "yes"}},
                     {"state": "Failed", "annotations": {"game.example/healthy": "no"}}]}
            ]
        }
    });
    if !http {
        ppm["spec"]["probes"].as_array_mut().unwrap().truncate(2);
    }
    serde_json::from_value(ppm).unwrap()
}

/// The game pod as a user writes it: no podprobe annotation, the sidecar container beside.
fn user_pod(name: &str, http_port: u16) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "game"}},
        "spec": {"nodeName": "vk-1", "serviceAccountName": SIDECAR_SA, "containers": [
            {"name": "main", "image": "game:1",
             "ports": [{"name": "main-port", "containerPort": http_port}]},
            {"name": "podprobe", "image": "podprobe:dev"}
        ]}
    }))
    .unwrap()
}

fn labels(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata.labels.clone().unwrap_or_default()
}

fn annotations(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata.annotations.clone().unwrap_or_default()
}

fn has(map: &BTreeMap<String, String>, key: &str, value: &str) -> bool {
    map.get(key).map(String::as_str) == Some(value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kruise_manager_marks_what_the_podprobe_sidecar_probes() {
    marks_what_podprobe_probes(KruiseRelease::V1_9_1).await;
}

/// The oldest release with the serverless protocol: the same flow, the same assertions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kruise_1_8_manager_marks_what_the_podprobe_sidecar_probes() {
    marks_what_podprobe_probes(KruiseRelease::V1_8_0).await;
}

async fn marks_what_podprobe_probes(release: KruiseRelease) {
    let mut cluster = Cluster::start().await;
    cluster
        .cp
        .start_kruise_release(release)
        .await
        .unwrap_or_else(|e| panic!("kruise-manager {release:?}: {e}"));
    let admin = cluster.cp.client();
    Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &virtual_kubelet_node())
        .await
        .unwrap();
    let flag = cluster.dir.path().join("idle");
    std::fs::write(&flag, "idle").unwrap();
    let mut game = GamePort::open(0).await.unwrap();
    let healthy = Arc::new(AtomicBool::new(true));
    let http = serve_health(healthy.clone()).await.unwrap();
    let ppms: Api<DynamicObject> = Api::namespaced_with(admin.clone(), NS, &ppm_resource());
    let flag_path = flag.to_str().unwrap();
    // v1.8.0's webhook refuses httpGet probes ("current no support http probe"); v1.9 takes
    // them (docs/kruise-compatibility.md).
    let with_http = release != KruiseRelease::V1_8_0;
    if !with_http {
        let refused = ppms
            .create(
                &PostParams::default(),
                &game_ppm(flag_path, game.addr.port(), true),
            )
            .await;
        assert!(
            matches!(&refused, Err(kube::Error::Api(e)) if e.message.contains("no support http probe")),
            "{release:?} refuses an httpGet probe: {refused:?}"
        );
    }
    ppms.create(
        &PostParams::default(),
        &game_ppm(flag_path, game.addr.port(), with_http),
    )
    .await
    .unwrap_or_else(|e| panic!("Kruise's webhook refused the PodProbeMarker: {e}"));

    // Admission: Kruise's pod webhook writes the protocol annotations.
    let pod = user_pod("gs-0", http.port());
    let lists_game = |p: &Pod| {
        annotations(p)
            .get("kruise.io/podprobemarker-list")
            .map(String::as_str)
            == Some("game")
    };
    cluster
        .cp
        .wait_admission(&pod, lists_game)
        .await
        .unwrap_or_else(|e| panic!("Kruise's webhook never sees the PodProbeMarker: {e}"));
    let created = cluster
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let written = annotations(&created);
    assert_eq!(
        written
            .get("kruise.io/podprobemarker-list")
            .map(String::as_str),
        Some("game"),
        "Kruise's webhook lists the PodProbeMarker"
    );
    let podprobe: Vec<Value> =
        serde_json::from_str(&written["kruise.io/podprobe"]).expect("Kruise wrote JSON");
    let types: Vec<&str> = podprobe
        .iter()
        .map(|p| p["podConditionType"].as_str().unwrap())
        .collect();
    let probed = if with_http {
        &[IDLE, PORT, HEALTHY][..]
    } else {
        &[IDLE, PORT]
    };
    assert_eq!(types, probed);
    if with_http {
        assert_eq!(
            podprobe[2]["probe"]["httpGet"]["port"], "main-port",
            "Kruise leaves named ports for the sidecar to resolve"
        );
    }
    assert!(podprobe.iter().all(|p| p.get("markerPolicy").is_none()));

    let pod = cluster
        .kubelet_reports_started("gs-0", "containerd://main-1", long_ago())
        .await;
    let _sidecar = cluster.sidecar(&pod, &[]).await;

    // Every probe up: conditions by podprobe, markers by Kruise.
    let pod = cluster
        .wait_pod("gs-0", LIMIT, |p| {
            let (l, a) = (labels(p), annotations(p));
            has(&l, "gameserver-idle", "true")
                && has(&a, DELETION_COST, "-10")
                && has(&l, "port-open", "true")
                && (!with_http || has(&a, "game.example/healthy", "yes"))
        })
        .await;
    for &type_ in probed {
        assert!(has_status(&pod, type_, "True"), "{type_} True: {pod:?}");
    }
    // Kruise writes the status at the end of the reconcile that wrote the markers.
    let counted = async {
        while ppms.get_status("game").await.unwrap().data["status"]["matchedPods"] != 1 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(LIMIT, counted)
        .await
        .unwrap_or_else(|_| panic!("Kruise did not count the pod in the PodProbeMarker's status"));

    // The port closes: podprobe writes False; Kruise has no Failed policy for it and, on its
    // serverless path, never removes the Succeeded policy's label (spec §8 gap 3; the
    // kruise-daemon path would delete it). Then idle and health flip; Kruise's reconcile for
    // those sees the port False too, and still leaves `port-open`.
    game.close();
    cluster
        .wait_pod("gs-0", LIMIT, |p| has_status(p, PORT, "False"))
        .await;
    std::fs::remove_file(&flag).unwrap();
    healthy.store(false, Ordering::Relaxed);
    let pod = cluster
        .wait_pod("gs-0", LIMIT, |p| {
            let (l, a) = (labels(p), annotations(p));
            has(&l, "gameserver-idle", "false")
                && has(&a, DELETION_COST, "10")
                && (!with_http || has(&a, "game.example/healthy", "no"))
        })
        .await;
    assert!(has_status(&pod, IDLE, "False"));
    assert_eq!(has_status(&pod, HEALTHY, "False"), with_http);
    assert!(
        has(&labels(&pod), "port-open", "true"),
        "Kruise's serverless marking keeps a key whose condition went False"
    );

    // And back: Kruise overwrites with the Succeeded policy's values.
    std::fs::write(&flag, "idle again").unwrap();
    cluster
        .wait_pod("gs-0", LIMIT, |p| {
            has(&labels(p), "gameserver-idle", "true") && has(&annotations(p), DELETION_COST, "-10")
        })
        .await;
}
