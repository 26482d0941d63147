//! End to end without a node: a real kube-apiserver + the manager (in-process, real HTTPS
//! webhook) + the real `podprobe` sidecar binary. A PodProbeMarker is created; a pod is
//! admitted through the webhook and created as patched (annotated and injected); the test
//! writes the kubelet's status; the sidecar's probe flips and the marker label follows; the
//! PPM is edited and the pod's probe changes; the PPM is deleted and the pod is cleaned up.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use podprobe_manager::crd::PodProbeMarker;
use podprobe_manager::webhook::{MUTATE_PODS_PATH, Mode};
use serde_json::{Value, json};
use support::*;

fn flag_probe(flag: &Path) -> Value {
    let script = format!(
        "if [ -f {f} ]; then cat {f}; else echo down >&2; exit 1; fi",
        f = flag.display()
    );
    json!({"exec": {"command": ["sh", "-c", script]}, "periodSeconds": 1})
}

fn marker(flag: &Path) -> Value {
    json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "game", "namespace": "test"},
        "spec": {
            "selector": {"matchLabels": {"app": "test"}},
            "probes": [{
                "name": "healthy", "containerName": "main",
                "probe": flag_probe(flag),
                "podConditionType": "game.kruise.io/healthy",
                "markerPolicy": [
                    {"state": "Succeeded", "labels": {"server-healthy": "true"},
                     "annotations": {"controller.kubernetes.io/pod-deletion-cost": "-10"}},
                    {"state": "Failed", "labels": {"server-healthy": "false"},
                     "annotations": {"controller.kubernetes.io/pod-deletion-cost": "10"}}
                ]
            }]
        }
    })
}

/// The kubelet's report for a running pod with the native sidecar.
async fn kubelet_runs(cluster: &Tv03Cluster, name: &str) {
    let status = json!({
        "phase": "Running",
        "podIP": "127.0.0.1",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": "True"},
            {"type": "Ready", "status": "True"}
        ],
        "initContainerStatuses": [
            {"name": "podprobe", "ready": true, "restartCount": 0, "image": "podprobe:dev",
             "imageID": "", "containerID": "containerd://sidecar", "started": true,
             "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}
        ],
        "containerStatuses": [
            {"name": "main", "ready": true, "restartCount": 0, "image": "game:1",
             "imageID": "", "containerID": "containerd://main-1", "started": true,
             "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}
        ]
    });
    cluster.write_status(name, status).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ppm_webhook_sidecar_markers_edit_and_delete() {
    let bin = sidecar_binary();
    let cluster = Tv03Cluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("healthy");
    let flag2 = dir.path().join("healthy-v2");
    let ppms: Api<PodProbeMarker> = cluster.ppms();
    ppms.create(&Default::default(), &ppm(&marker(&flag)))
        .await
        .unwrap();

    let s = start_manager(
        cluster.manager_client(),
        dir.path(),
        Mode::Standalone,
        None,
        Some(injection()),
    )
    .await;
    let cache = s.manager.ppms.clone();
    eventually(Duration::from_secs(10), "PPM cached", || {
        !cache.namespace("test").is_empty()
    })
    .await;

    // Admission: the webhook's answer, applied, is what gets created.
    let mut pod = app_pod("gs-1", "test");
    let labels = pod.metadata.labels.as_mut().unwrap();
    labels.insert("podprobe.io/inject".into(), "enabled".into());
    pod.spec.as_mut().unwrap().node_name = Some("vk-1".into());
    let mut client = HttpsClient::connect(s.manager.webhook_addr, &s.cert.cert_pem)
        .await
        .unwrap();
    let response = client
        .review(MUTATE_PODS_PATH, &pod_review(&pod, "test"))
        .await;
    assert!(response.allowed && response.patch.is_some());
    let admitted = patched(&pod, &response);
    assert!(annotation(&admitted, PODPROBE).unwrap().contains("healthy"));
    assert_eq!(annotation(&admitted, LIST).as_deref(), Some("game"));
    let init = admitted.spec.as_ref().unwrap().init_containers.clone();
    let sidecar = init.iter().flatten().find(|c| c.name == "podprobe");
    assert_eq!(
        sidecar.and_then(|c| c.restart_policy.as_deref()),
        Some("Always"),
        "native sidecar injected"
    );
    cluster.create_pod(&admitted).await;
    kubelet_runs(&cluster, "gs-1").await;

    // The sidecar, as the injected container would run it (as the admin here).
    let kubeconfig = dir.path().join("kubeconfig");
    cluster
        .cp
        .write_kubeconfig_for_token(&kubeconfig, testkit::real::ADMIN_TOKEN)
        .unwrap();
    let log = dir.path().join("sidecar.log");
    let _sidecar = Sidecar::new(
        Command::new(&bin)
            .args(["run", "--pod-name", "gs-1", "--pod-namespace", "test"])
            .args([
                "--source",
                "api",
                "--coalesce-window",
                "50ms",
                "--events=false",
                // No node runs the pod: the probe's command runs here, beside the sidecar.
                "--exec-mode",
                "local",
            ])
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "podprobe=debug,info")
            .env_remove("POD_UID")
            .env_remove("POD_IP")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start podprobe run"),
        log,
    );
    let pods: Api<Pod> = cluster.pods();

    // Probe fails (no flag) → condition False → marker label false.
    let p = wait_pod(&pods, "gs-1", "failed marker", |p| {
        label(p, "server-healthy").as_deref() == Some("false")
    })
    .await;
    assert_eq!(
        condition_status(&p, "game.kruise.io/healthy").as_deref(),
        Some("False")
    );
    assert_eq!(
        annotation(&p, "controller.kubernetes.io/pod-deletion-cost").as_deref(),
        Some("10")
    );

    // Probe succeeds → True → label true, deletion cost -10.
    std::fs::write(&flag, "ok").unwrap();
    let p = wait_pod(&pods, "gs-1", "succeeded marker", |p| {
        label(p, "server-healthy").as_deref() == Some("true")
    })
    .await;
    assert_eq!(
        condition_status(&p, "game.kruise.io/healthy").as_deref(),
        Some("True")
    );
    assert_eq!(
        annotation(&p, "controller.kubernetes.io/pod-deletion-cost").as_deref(),
        Some("-10")
    );

    // Edit the PPM: the probe now checks another file. The annotation is propagated, the
    // sidecar reloads, the probe fails (flag2 missing), then succeeds again.
    let mut edited = marker(&flag2);
    edited["metadata"] = json!({"name": "game", "namespace": "test"});
    ppms.patch(
        "game",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"probes": edited["spec"]["probes"]}})),
    )
    .await
    .unwrap();
    let flag2_text = flag2.display().to_string();
    let p = wait_pod(&pods, "gs-1", "annotation propagated", |p| {
        annotation(p, PODPROBE).is_some_and(|a| a.contains(&flag2_text))
    })
    .await;
    assert_eq!(annotation(&p, LIST).as_deref(), Some("game"));
    wait_pod(&pods, "gs-1", "edited probe fails", |p| {
        label(p, "server-healthy").as_deref() == Some("false")
    })
    .await;
    std::fs::write(&flag2, "ok").unwrap();
    wait_pod(&pods, "gs-1", "edited probe succeeds", |p| {
        label(p, "server-healthy").as_deref() == Some("true")
    })
    .await;

    // PPM status followed.
    let status = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let ppm = ppms.get("game").await.unwrap();
            if let Some(st) = ppm.status.as_ref()
                && st.matched_pods == 1
                && Some(st.observed_generation) == ppm.metadata.generation
            {
                return st.clone();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("status observedGeneration + matchedPods");
    assert_eq!(status.matched_pods, 1);

    // Delete the PPM: both annotations go (markers stay, as in OpenKruise).
    ppms.delete("game", &DeleteParams::default()).await.unwrap();
    let p = wait_pod(&pods, "gs-1", "annotations removed", |p| {
        annotation(p, PODPROBE).is_none() && annotation(p, LIST).is_none()
    })
    .await;
    assert_eq!(label(&p, "server-healthy").as_deref(), Some("true"));
    s.manager.shutdown().await;
}
