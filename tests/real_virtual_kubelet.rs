//! podprobe on a node of the virtual-kubelet library (`virtual-kubelet --provider mock`,
//! testkit::real::virtual_kubelet): the node agent serverless providers are built on, which
//! writes the pods' status itself (`UpdateStatus`, the whole `.status`). The sidecar runs as
//! a process beside it with a token bound to its pod, as in a pod there.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::real::{RealCluster, SIDECAR_SA};
use support::*;
use testkit::real::VIRTUAL_NODE_NAME;
use testkit::real::virtual_kubelet::VirtualKubelet;

const LIMIT: Duration = Duration::from_secs(60);
const IDLE: &str = "game.kruise.io/idle";

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_follow_the_probe_on_a_virtual_kubelet_node() {
    let cluster = RealCluster::start().await;
    let vk = VirtualKubelet::start(&cluster.cp)
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    // The node as the library registers it: what Kruise's serverless path selects.
    let node = Api::<Node>::all(cluster.cp.client())
        .get(VIRTUAL_NODE_NAME)
        .await
        .unwrap();
    let labels = node.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("type").map(String::as_str),
        Some("virtual-kubelet")
    );
    let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(
        taints
            .iter()
            .any(|t| t.key == "virtual-kubelet.io/provider"),
        "{taints:?}"
    );

    let flag = cluster.dir.path().join("idle");
    std::fs::write(&flag, "idle").unwrap();
    let mut pod = game_pod(
        "gs-0",
        &array(&[file_probe("idle", IDLE, &flag)]),
        json!([]),
    );
    let spec = pod.spec.as_mut().unwrap();
    spec.node_name = Some(VIRTUAL_NODE_NAME.to_owned());
    spec.service_account_name = Some(SIDECAR_SA.to_owned());
    cluster
        .pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    // The library "runs" it: the mock provider reports it Running.
    let running = cluster
        .wait_pod("gs-0", LIMIT, |p| phase(p) == Some("Running"))
        .await;
    let sidecar = cluster.sidecar(&running, &[]).await;

    cluster
        .wait_pod("gs-0", LIMIT, |p| has_status(p, IDLE, "True"))
        .await;
    // A marker is a pod update: the library hands it to the provider and writes the
    // provider's status back, whole. podprobe's condition still follows the probe.
    let library_writes_before = library_status_writes(&cluster);
    cluster
        .pods()
        .patch(
            "gs-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {IDLE: "true"}}})),
        )
        .await
        .unwrap();
    std::fs::remove_file(&flag).unwrap();
    let pod = cluster
        .wait_pod("gs-0", LIMIT, |p| has_status(p, IDLE, "False"))
        .await;
    assert_eq!(phase(&pod), Some("Running"));
    // The library's own conditions and podprobe's side by side.
    for kubelet_condition in ["PodScheduled", "Initialized", "Ready"] {
        assert!(
            condition(&pod, kubelet_condition).is_some(),
            "{kubelet_condition}: {:?}\nvirtual-kubelet: {}",
            pod.status,
            vk.log_tail(20)
        );
    }
    let library_writes = library_status_writes(&cluster);
    assert!(
        library_writes > library_writes_before,
        "the library wrote the pod's status after the marker ({library_writes_before} -> {library_writes})\nsidecar: {}",
        sidecar.log()
    );
}

/// The pod status writes the virtual-kubelet made, as the apiserver's audit log has them.
fn library_status_writes(cluster: &RealCluster) -> usize {
    cluster
        .cp
        .audit()
        .expect("audit log")
        .into_iter()
        .filter(|e| {
            e.user.username == "virtual-kubelet" && e.is("update", "pods/status", Some("gs-0"))
        })
        .count()
}
