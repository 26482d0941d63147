//! The injected pod on the virtual-kubelet library, as providers run it: the chart installed
//! with its defaults, pods created through the real pod webhook, each node a real agent of the
//! library v1.11.0 (the version azure-aci v1.6.4 runs on) registered with the control plane:
//! - `aci-1`: `vk-replacer --aci-rules`, which refuses what azure-aci v1.6.4's provider refuses
//!   (no `downwardAPI` volume, no `args` without `command`, init containers without resources)
//!   and replaces the pods' whole status every 5 s with its own three conditions, as azure-aci
//!   does;
//! - `mock-1`: the library's own mock provider.
//!
//! A pod that tolerates the virtual node's taint gets the virtual-node shape (a plain container
//! with an explicit command, no `status.podIP`, no downward-API volume, probes from the
//! apiserver): accepted, run, probed, its conditions kept against the 5 s replacement and its
//! markers right both ways. A pod bound to the node without tolerating its taint gets the
//! kubelet shape, which the library cannot start ("unsupported fieldPath: status.podIP").
//!
//! Neither agent runs containers: the injected container is run here, as the provider would
//! run it (its command, args and environment as the library resolves it), with a token bound
//! to its pod. azure-aci itself mounts the ServiceAccount's legacy token Secret instead, which
//! the chart's admission policy refuses (docs/providers.md).

mod cluster;
mod installed;
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use podprobe_manager::webhook::Mode;
use serde_json::json;
use testkit::real::virtual_kubelet::{Provider, VirtualKubelet};

use installed::{
    LISTENING, NS, injected_container, install_and_run, listening_target, run_injected_sidecar,
    start_control_plane,
};

const LIMIT: Duration = Duration::from_secs(60);

/// A game pod bound to `node`, tolerating the library's taint when `tolerates`.
fn game_pod(name: &str, node: &str, tolerates: bool) -> Pod {
    let tolerations = if tolerates {
        json!([{"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "game"}},
        "spec": {"nodeName": node, "serviceAccountName": "podprobe-sidecar",
                 "tolerations": tolerations,
                 "containers": [{"name": "main", "image": "game:1",
                                 "command": ["/game"], "args": ["--serve"]}]}
    }))
    .unwrap()
}

async fn create(running: &installed::Running, pod: &Pod) -> Pod {
    running
        .cp
        .wait_admission(pod, |p| support::annotation(p, support::PODPROBE).is_some())
        .await
        .unwrap_or_else(|e| panic!("the pod webhook never sees the PodProbeMarker: {e}"));
    Api::<Pod>::namespaced(running.cp.client(), NS)
        .create(&PostParams::default(), pod)
        .await
        .unwrap()
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

async fn wait_running(running: &installed::Running, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(running.cp.client(), NS);
    testkit::wait::pod(&pods, name, "Running on its virtual node", LIMIT, |p| {
        phase(p) == Some("Running")
    })
    .await
}

/// Waits until the agent's log holds `text`.
async fn wait_logged(agent: &VirtualKubelet, text: &str) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !agent.log().contains(text) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the agent never logged {text:?}; its log ends:\n{}",
            agent.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the pod shows the probe's condition True and its marker at once (the provider
/// removes the condition every 5 s, and the sidecar puts it back).
async fn wait_marked(running: &installed::Running, name: &str) {
    let pods: Api<Pod> = Api::namespaced(running.cp.client(), NS);
    testkit::wait::pod(&pods, name, "condition True and marker", LIMIT, |p| {
        support::label(p, "listening").as_deref() == Some("true")
            && support::condition_status(p, LISTENING).as_deref() == Some("True")
    })
    .await;
}

/// The virtual-node shape, as the pod holds it after admission.
fn assert_virtual_node_shape(pod: &Pod) {
    let spec = pod.spec.as_ref().unwrap();
    assert!(
        spec.init_containers
            .iter()
            .flatten()
            .all(|c| c.name != "podprobe"),
        "an ordinary container"
    );
    let sidecar = injected_container(pod);
    assert!(sidecar.command.is_some(), "an explicit command");
    let fields: Vec<&str> = sidecar
        .env
        .iter()
        .flatten()
        .filter_map(|e| {
            Some(
                e.value_from
                    .as_ref()?
                    .field_ref
                    .as_ref()?
                    .field_path
                    .as_str(),
            )
        })
        .collect();
    assert!(
        fields.iter().all(|f| f.starts_with("metadata.")),
        "{fields:?}"
    );
    assert!(
        spec.volumes
            .iter()
            .flatten()
            .all(|v| v.downward_api.is_none()),
        "no downwardAPI volume"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_aci_rules_accept_the_injected_pod_and_it_is_probed_and_marked() {
    let running = install_and_run(start_control_plane().await, Mode::Standalone).await;
    let aci = VirtualKubelet::start_node(&running.cp, "aci-1", Provider::AciRules)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let target = listening_target(&running).await;

    // The kubelet shape on the virtual node: the library cannot resolve its environment.
    let kubelet_shaped = create(&running, &game_pod("bound-only", "aci-1", false)).await;
    assert!(
        injected_container(&kubelet_shaped)
            .env
            .iter()
            .flatten()
            .any(|e| e.name == "POD_IP"),
        "a pod that does not tolerate the taint keeps the kubelet shape"
    );
    wait_logged(&aci, "unsupported fieldPath: status.podIP").await;

    // The virtual-node shape: accepted by the provider's rules and run.
    let pod = create(&running, &game_pod("game-0", "aci-1", true)).await;
    assert_virtual_node_shape(&pod);
    let pod = wait_running(&running, "game-0").await;
    let _sidecar = run_injected_sidecar(&running, &pod, "podprobe-sidecar").await;
    wait_marked(&running, "game-0").await;

    // The provider replaces the whole status every 5 s: after two replacements the condition
    // is still there, and the marker with it.
    let pods: Api<Pod> = Api::namespaced(running.cp.client(), NS);
    let replaced = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().all(|c| c.type_ != LISTENING))
    };
    testkit::wait::pod(
        &pods,
        "game-0",
        "the provider's replacement",
        LIMIT,
        replaced,
    )
    .await;
    wait_marked(&running, "game-0").await;

    // The other way: the probe fails, the condition turns False, the marker goes.
    drop(target);
    let unmarked = testkit::wait::pod(&pods, "game-0", "marker removed", LIMIT, |p| {
        support::label(p, "listening").is_none()
            && support::condition_status(p, LISTENING).as_deref() == Some("False")
    })
    .await;
    assert_eq!(phase(&unmarked), Some("Running"));
    running.manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mock_provider_runs_the_injected_pod() {
    let running = install_and_run(start_control_plane().await, Mode::Standalone).await;
    let _mock = VirtualKubelet::start_node(&running.cp, "mock-1", Provider::Mock)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let _target = listening_target(&running).await;
    let pod = create(&running, &game_pod("game-0", "mock-1", true)).await;
    assert_virtual_node_shape(&pod);
    wait_running(&running, "game-0").await;
    running.manager.shutdown().await;
}
