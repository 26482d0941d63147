//! The oldest Kubernetes the chart claims (`kubeVersion: >=1.30.0-0`), run, not only declared:
//! kube-apiserver v1.30.14 built from the pinned module `hack/k8s-oldest`. On it: `helm install`
//! (helm checks the live cluster's version against the chart's claim), the pod webhook's
//! injection (a native sidecar), the sidecar's conditions through the `pods/status` admission
//! policy, the manager's markers, and the policy refusing a neighbour's status.

mod cluster;
mod installed;
mod support;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use podprobe_manager::webhook::Mode;
use serde_json::json;
use testkit::real::{ControlPlane, OLDEST_KUBERNETES};

use installed::{
    LISTENING, NS, admitted_game_pod, install_and_run_with, listening_target, run_injected_sidecar,
    wait_marked,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_inject_probe_and_mark_on_the_oldest_apiserver() {
    let cp = ControlPlane::start_oldest()
        .await
        .unwrap_or_else(|e| panic!("kube-apiserver {OLDEST_KUBERNETES}: {e}"));
    let version = cp.client().apiserver_version().await.expect("/version");
    assert_eq!(version.git_version, OLDEST_KUBERNETES);

    let running = install_and_run_with(cp, Mode::Standalone, &[]).await;
    // A probe target, a PodProbeMarker, a pod the webhook injects.
    let _target = listening_target(&running).await;
    let pod = admitted_game_pod(&running, "game-0").await;
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(
        spec.init_containers.as_ref().unwrap()[0]
            .restart_policy
            .as_deref(),
        Some("Always"),
        "a native sidecar on 1.30"
    );
    let neighbour = admitted_game_pod(&running, "game-1").await;

    let _sidecar = run_injected_sidecar(&running, &pod, "podprobe-sidecar").await;
    wait_marked(&running, "game-0").await;

    // game-0's sidecar token may not write game-1's conditions: the policy holds on 1.30.
    let token = running
        .cp
        .pod_token("podprobe-sidecar", &pod)
        .await
        .unwrap();
    let as_sidecar: Api<Pod> = Api::namespaced(running.cp.client_for_token(&token), NS);
    let patch = json!({"status": {"conditions": [
        {"type": LISTENING, "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    ]}});
    // The apiserver loads a new policy asynchronously: until it refuses, a write gets through
    // (then the next one is refused), within a minute.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let refused = loop {
        match as_sidecar
            .patch_status(
                neighbour.metadata.name.as_deref().unwrap(),
                &PatchParams::default(),
                &Patch::Strategic(patch.clone()),
            )
            .await
        {
            Err(e) => break e,
            Ok(_) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the policy never refused a neighbour's status"
                );
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    };
    match refused {
        kube::Error::Api(e) => {
            assert_eq!(e.code, 403, "{e:?}");
            assert!(e.message.contains("podprobe-sidecar-pod-status"), "{e:?}");
        }
        other => panic!("{other}"),
    }
    running.manager.shutdown().await;
}
