//! A real control plane for the in-process manager's tests: namespace `test`, the chart's
//! PodProbeMarker CRD, the virtual-kubelet node `vk-1` and (optionally) TV-03's PodProbeMarker,
//! with a fault proxy in front of the apiserver for the manager under test. The manager's
//! requests are journaled there and faults act on them; the test's own go to the apiserver
//! directly, as the admin, and stand in for the kubelet and the sidecar.

use std::path::Path;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use podprobe_manager::crd::PodProbeMarker;
use serde_json::json;
use testkit::real::{ControlPlane, FaultProxy};

use podprobe_manager::webhook::Mode;

use super::{Started, ppm, start_manager, steady_pod, tv03_ppm, vk_node};

pub struct Tv03Cluster {
    /// The manager's way to the apiserver; dropped before the control plane.
    pub proxy: FaultProxy,
    pub cp: ControlPlane,
}

impl Tv03Cluster {
    /// The control plane, namespace `test`, the CRD and node `vk-1`; no PodProbeMarker.
    pub async fn start() -> Tv03Cluster {
        let cp = ControlPlane::start().await.expect("a control plane");
        cp.create_namespace("test").await.expect("namespace test");
        install_crd(&cp);
        let proxy = FaultProxy::start(&cp).await.expect("the fault proxy");
        let cluster = Tv03Cluster { proxy, cp };
        cluster.create_node(&vk_node("vk-1")).await;
        cluster
    }

    /// [`Tv03Cluster::start`] with TV-03's PodProbeMarker `ppm-test`.
    pub async fn with_tv03() -> Tv03Cluster {
        let cluster = Self::start().await;
        cluster
            .ppms()
            .create(&PostParams::default(), &ppm(&tv03_ppm()))
            .await
            .expect("TV-03's PodProbeMarker");
        cluster
    }

    /// The client the manager under test gets, as the binary builds it: the admin, through the
    /// proxy.
    pub fn manager_client(&self) -> kube::Client {
        podprobe_manager::run::client(self.proxy.config_for_token(testkit::real::ADMIN_TOKEN))
            .expect("the manager's client")
    }

    /// A standalone manager in-process (no leader election, no injection) through the proxy.
    pub async fn start_manager(&self, dir: &Path) -> Started {
        start_manager(self.manager_client(), dir, Mode::Standalone, None, None).await
    }

    /// Replaces node `name`'s labels with `labels` (JSON: an object, or null for none).
    pub async fn label_node(&self, name: &str, labels: serde_json::Value) {
        let patch = json!({"metadata": {"labels": labels}});
        self.nodes()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("label the node");
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.cp.client(), "test")
    }

    pub fn ppms(&self) -> Api<PodProbeMarker> {
        Api::namespaced(self.cp.client(), "test")
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.cp.client())
    }

    pub async fn create_node(&self, node: &Node) {
        self.nodes()
            .create(&PostParams::default(), node)
            .await
            .expect("create the node");
    }

    /// Creates `pod` and writes its status, if it has one, as given (the apiserver drops a
    /// status sent with a create; the kubelet and the sidecar write it).
    pub async fn create_pod(&self, pod: &Pod) -> Pod {
        let mut pod = pod.clone();
        pod.metadata.uid = None;
        let status = pod.status.take();
        let name = pod.metadata.name.clone().expect("a named pod");
        let created = self
            .pods()
            .create(&PostParams::default(), &pod)
            .await
            .expect("create the pod");
        match status {
            None => created,
            Some(status) => self.write_status(&name, json!(status)).await,
        }
    }

    /// Writes pod `name`'s status fields given in `status` (a merge patch), as the kubelet
    /// would.
    pub async fn write_status(&self, name: &str, status: serde_json::Value) -> Pod {
        let patch = json!({ "status": status });
        self.pods()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("the pod's status")
    }

    /// Creates [`steady_pod`] `i`.
    pub async fn create_steady_pod(&self, i: usize, healthy: bool) -> Pod {
        self.create_pod(&steady_pod(i, healthy)).await
    }

    /// Sets condition `game.kruise.io/healthy` of pod `name` as the sidecar would.
    pub async fn set_healthy(&self, name: &str, healthy: bool) {
        let status = if healthy { "True" } else { "False" };
        let patch = json!({"status": {"conditions": [
            {"type": "game.kruise.io/healthy", "status": status}
        ]}});
        self.pods()
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .expect("set the condition");
    }

    pub async fn pod(&self, name: &str) -> Pod {
        self.pods().get(name).await.expect("the pod")
    }

    /// `ppm-test`'s `status.matchedPods`, once the status controller wrote one.
    pub async fn matched_pods(&self) -> Option<i64> {
        let ppm = self.ppms().get("ppm-test").await.ok()?;
        Some(ppm.status?.matched_pods)
    }

    /// The manager's pod patches, as the proxy saw them.
    pub fn pod_patches(&self) -> usize {
        self.proxy.journal().count("PATCH", "pods")
    }
}

/// The chart's CRD, applied and established, as `helm install` would leave it.
pub fn install_crd(cp: &ControlPlane) {
    let crd =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/podprobe/crds/podprobemarkers.yaml");
    for args in [
        vec!["apply", "-f", crd.to_str().expect("a UTF-8 path")],
        vec![
            "wait",
            "--for=condition=Established",
            "crd/podprobemarkers.apps.kruise.io",
        ],
    ] {
        let out = cp
            .kubectl()
            .expect("kubectl")
            .args(&args)
            .output()
            .expect("kubectl");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
