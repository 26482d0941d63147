//! podprobe-manager beside the real OpenKruise (kruise-manager built from the pinned Go module,
//! `EnablePodProbeMarkerOnServerless` on) on a real control plane.
//!
//! Companion mode: Kruise owns the PodProbeMarker (its CRD, its validating webhook), writes
//! the pod annotations and the markers; podprobe-manager, installed by the chart with
//! `mode=companion`, only injects the sidecar; the real `podprobe` binary runs as the injected
//! container would (its args, its downward-API environment, a token of the pod's
//! ServiceAccount bound to the pod).

mod cluster;
mod installed;
mod support;

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use podprobe_manager::crd::PodProbeMarker;
use serde_json::{Value, json};
use support::{LIST, PODPROBE, annotation, app_pod, label, ppm, wait_pod};

use installed::{NS, kruise_and_companion, kubelet_status, run_injected_sidecar};

const LIMIT: Duration = Duration::from_secs(60);
const HEALTHY: &str = "game.kruise.io/healthy";
const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
const MANAGER_USER: &str = "system:serviceaccount:podprobe-system:podprobe-manager";
const SIDECAR_SA: &str = "podprobe-sidecar";

/// One exec probe that succeeds while `flag` exists, with both marker policies.
fn game_ppm(flag: &Path) -> Value {
    let script = format!(
        "if [ -f {f} ]; then cat {f}; else echo down >&2; exit 1; fi",
        f = flag.display()
    );
    json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "game", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": "game"}},
            "probes": [{
                "name": "healthy", "containerName": "main", "podConditionType": HEALTHY,
                "probe": {"exec": {"command": ["sh", "-c", script]}, "periodSeconds": 1},
                "markerPolicy": [
                    {"state": "Succeeded", "labels": {"server-healthy": "true"},
                     "annotations": {DELETION_COST: "-10"}},
                    {"state": "Failed", "labels": {"server-healthy": "false"},
                     "annotations": {DELETION_COST: "10"}}
                ]
            }]
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn companion_injects_the_sidecar_and_kruise_marks_what_it_probes() {
    let running = kruise_and_companion().await;
    let admin = running.cp.client();
    let flag = running.dir.path().join("healthy");
    let ppms: Api<PodProbeMarker> = Api::namespaced(admin.clone(), NS);
    ppms.create(&PostParams::default(), &ppm(&game_ppm(&flag)))
        .await
        .unwrap_or_else(|e| panic!("Kruise's webhook refused the PodProbeMarker: {e}"));
    let cache = running.manager.ppms.clone();
    support::eventually(LIMIT, "PPM cached", || !cache.namespace(NS).is_empty()).await;

    // A pod as a user writes it: Kruise annotates, podprobe injects.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let mut pod = app_pod("gs-1", "game");
    let spec = pod.spec.as_mut().unwrap();
    spec.node_name = Some("vk-1".into());
    spec.service_account_name = Some(SIDECAR_SA.into());
    running
        .cp
        .wait_admission(&pod, |p| annotation(p, LIST).as_deref() == Some("game"))
        .await
        .unwrap_or_else(|e| panic!("Kruise's webhook never sees the PodProbeMarker: {e}"));
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    assert_eq!(annotation(&created, LIST).as_deref(), Some("game"));
    let written: Vec<Value> =
        serde_json::from_str(&annotation(&created, PODPROBE).unwrap()).expect("Kruise wrote JSON");
    assert_eq!(written.len(), 1);
    assert_eq!(written[0]["podConditionType"], HEALTHY);
    let spec = created.spec.as_ref().unwrap();
    // After the exec agent's install container (the pod's exec probe targets a container
    // without a command: the agent starts beside its entrypoint).
    let inits = spec.init_containers.as_ref().expect("the sidecar");
    let sidecar = inits.last().expect("the sidecar");
    assert_eq!(
        (sidecar.name.as_str(), sidecar.restart_policy.as_deref()),
        ("podprobe", Some("Always")),
        "a native sidecar"
    );
    let gates: Vec<&str> = spec
        .readiness_gates
        .iter()
        .flatten()
        .map(|g| g.condition_type.as_str())
        .collect();
    assert_eq!(gates, [HEALTHY], "the readiness gate of Kruise's probe");

    pods.patch_status(
        "gs-1",
        &PatchParams::default(),
        &Patch::Strategic(kubelet_status("main")),
    )
    .await
    .unwrap();
    let _sidecar = run_injected_sidecar(&running, &created, SIDECAR_SA).await;

    // No flag: the probe fails, podprobe writes False, Kruise marks Failed.
    let pod = wait_pod(&pods, "gs-1", "Failed markers by Kruise", |p| {
        label(p, "server-healthy").as_deref() == Some("false")
            && annotation(p, DELETION_COST).as_deref() == Some("10")
    })
    .await;
    let condition = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| {
                c.iter()
                    .find(|c| c.type_ == HEALTHY)
                    .map(|c| c.status.clone())
            })
    };
    assert_eq!(condition(&pod).as_deref(), Some("False"));
    std::fs::write(&flag, "ok").unwrap();
    let pod = wait_pod(&pods, "gs-1", "Succeeded markers by Kruise", |p| {
        label(p, "server-healthy").as_deref() == Some("true")
            && annotation(p, DELETION_COST).as_deref() == Some("-10")
    })
    .await;
    assert_eq!(condition(&pod).as_deref(), Some("True"));

    // podprobe-manager wrote nothing to pods or PodProbeMarkers: in companion mode those are
    // Kruise's, and its chart RBAC was enough for what it did (no 401/403).
    let by_manager: Vec<String> = running
        .cp
        .audit()
        .unwrap()
        .into_iter()
        .filter(|e| e.user.username == MANAGER_USER)
        .filter(|e| {
            matches!(e.code(), 401 | 403)
                || (matches!(e.verb.as_str(), "patch" | "update" | "create")
                    && e.request_uri.contains("/pods"))
                || (e.verb != "get"
                    && e.verb != "list"
                    && e.verb != "watch"
                    && e.request_uri.contains("podprobemarkers"))
        })
        .map(|e| format!("{} {} -> {}", e.verb, e.request_uri, e.code()))
        .collect();
    assert!(by_manager.is_empty(), "{by_manager:#?}");
    running.manager.shutdown().await;
}
