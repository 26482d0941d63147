//! `kubectl-podprobe explain` where OpenKruise is the manager: the real kruise-manager
//! (`testkit::real::ControlPlane::start_kruise_manager`) admits the pod and writes the
//! annotation and the markers; the test plays the kubelet and the sidecar. The plugin finds
//! Kruise's annotation current (its computation is byte for byte Kruise's) and, after the
//! PodProbeMarker is edited, out of date: Kruise never rewrites it.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use podprobe_model::crd::PodProbeMarker;
use serde_json::json;
use testkit::real::ControlPlane;

const NS: &str = "games";
const LIMIT: Duration = Duration::from_secs(60);

/// `explain POD`'s output, after checking its exit code: 0 when every link holds, 3 when one
/// is broken.
fn explain(cp: &ControlPlane, pod: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-podprobe"))
        .args(["--kubeconfig", cp.admin_kubeconfig().to_str().unwrap()])
        .args(["-n", NS, "explain", pod])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let expected = if stdout.contains("Every link holds.") {
        0
    } else {
        3
    };
    assert_eq!(
        out.status.code(),
        Some(expected),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reads_what_kruise_wrote() {
    let mut cp = ControlPlane::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    cp.start_kruise_manager()
        .await
        .unwrap_or_else(|e| panic!("kruise-manager: {e}"));
    cp.create_namespace(NS).await.unwrap();
    let client = cp.client();
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "vk-1",
        "labels": {"type": "virtual-kubelet"}}}))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let marker: PodProbeMarker = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "game", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "game"}}, "probes": [{
            "name": "idle", "containerName": "main", "podConditionType": "game.io/idle",
            "probe": {"exec": {"command": ["cat", "/tmp/idle"]}, "periodSeconds": 1},
            "markerPolicy": [{"state": "Succeeded", "labels": {"idle": "true"}}]}]}
    }))
    .unwrap();
    let markers: Api<PodProbeMarker> = Api::namespaced(client.clone(), NS);
    markers
        .create(&PostParams::default(), &marker)
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "gs-0", "namespace": NS, "labels": {"app": "game"}},
        "spec": {"nodeName": "vk-1", "containers": [
            {"name": "main", "image": "game:1"}, {"name": "podprobe", "image": "podprobe:dev"}]}
    }))
    .unwrap();
    cp.wait_admission(&pod, |p| {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kruise.io/podprobemarker-list"))
            == Some(&"game".to_owned())
    })
    .await
    .unwrap_or_else(|e| panic!("Kruise's webhook never sees the PodProbeMarker: {e}"));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    assert!(
        created
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("kruise.io/podprobe"),
        "Kruise's webhook annotates the pod"
    );
    let running = |name: &str| {
        json!({"name": name, "ready": true, "restartCount": 0,
        "image": "img", "imageID": "", "started": true,
        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}})
    };
    let status = json!({"status": {"phase": "Running", "conditions": [
        {"type": "Initialized", "status": "True"},
        {"type": "game.io/idle", "status": "True", "message": "idle"}],
        "containerStatuses": [running("main"), running("podprobe")]}});
    pods.patch_status("gs-0", &PatchParams::default(), &Patch::Strategic(&status))
        .await
        .unwrap();
    let marked = kube::runtime::wait::await_condition(pods.clone(), "gs-0", |p: Option<&Pod>| {
        p.and_then(|p| p.metadata.labels.as_ref()?.get("idle").cloned())
            .is_some_and(|v| v == "true")
    });
    tokio::time::timeout(LIMIT, marked)
        .await
        .expect("Kruise writes the marker")
        .unwrap();

    let holds = explain(&cp, "gs-0");
    assert!(holds.contains("Every link holds."), "{holds}");
    assert!(
        holds.contains("ok   annotation     kruise.io/podprobe lists idle (game.io/idle)"),
        "{holds}"
    );

    let edit = json!({"spec": {"probes": [{
        "name": "idle", "containerName": "main", "podConditionType": "game.io/idle",
        "probe": {"exec": {"command": ["cat", "/tmp/idle"]}, "periodSeconds": 5},
        "markerPolicy": [{"state": "Succeeded", "labels": {"idle": "true"}}]}]}});
    markers
        .patch("game", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    let stale = explain(&cp, "gs-0");
    assert!(
        stale.contains(
            "First broken link: annotation: kruise.io/podprobe is out of date with its \
             PodProbeMarkers (probe idle (game.io/idle) changed): OpenKruise never updates it"
        ),
        "{stale}"
    );
}
