//! OpenKruise's own PodProbeMarker e2e specs (`test/e2e/apps/v1alpha1/podprobemarker.go` of
//! the kruise module in `hack/kruise`, v1.9.1), ported to the serverless path with podprobe as
//! the executor: the real kruise-manager (`EnablePodProbeMarkerOnServerless`), a real kubelet
//! node labelled `type=virtual-kubelet`, podprobe's chart in companion mode with its defaults
//! injecting the sidecar, Kruise's Advanced StatefulSet creating the pods. The four specs run
//! one after the other on one cluster, each in a namespace of its own as Ginkgo's framework
//! gives it; every adaptation is said where it is made and listed with its reason in
//! docs/kruise-compatibility.md ("OpenKruise's e2e specs, serverless").

mod cluster;
mod installed;
mod on_node;
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use serde_json::{Value, json};
use testkit::real::node::images::{GAMESERVER_IMAGE, MANAGER_IMAGE, SIDECAR_IMAGE};
use testkit::real::{ControlPlane, Node, NodeOptions};

use on_node::{chart_default_images, node_for_workloads, run_as_user};
use support::condition_status;

/// The namespaces of the four specs.
const EXEC: &str = "ppm-exec";
const PROBE_IMAGE: &str = "ppm-probe-image";
const TCP: &str = "ppm-tcp";
const HTTP: &str = "ppm-http";
const HEALTHY: &str = "game.kruise.io/healthy";
const CHECK: &str = "game.kruise.io/check";
const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
const APP: &str = "probe-e2e";
/// The specs' `nodeLen` replicas: one pod per node there. Here there is one node, so the
/// scale-down to 1 and back would change nothing: two replicas, the framework's own default
/// (`NewBaseStatefulSet`).
const REPLICAS: i64 = 2;
/// The framework's waits: two minutes.
const LIMIT: Duration = Duration::from_secs(120);

fn resource(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

struct Spec<'a> {
    cp: &'a ControlPlane,
    node: &'a Node,
    ns: &'static str,
    pods: Api<Pod>,
    ppms: Api<DynamicObject>,
    sets: Api<DynamicObject>,
}

impl<'a> Spec<'a> {
    fn new(cp: &'a ControlPlane, node: &'a Node, ns: &'static str) -> Self {
        let client = cp.client();
        Spec {
            cp,
            node,
            ns,
            pods: Api::namespaced(client.clone(), ns),
            ppms: Api::namespaced_with(
                client.clone(),
                ns,
                &resource("apps.kruise.io", "v1alpha1", "PodProbeMarker"),
            ),
            sets: Api::namespaced_with(
                client,
                ns,
                &resource("apps.kruise.io", "v1beta1", "StatefulSet"),
            ),
        }
    }

    fn fail(&self, what: &str) -> ! {
        let objects = self
            .cp
            .kubectl()
            .unwrap()
            .args(["get", "-n", self.ns, "-o", "yaml"])
            .arg("podprobemarkers,statefulsets.apps.kruise.io,pods")
            .output()
            .expect("run kubectl");
        let manager = self
            .cp
            .kubectl()
            .unwrap()
            .args([
                "logs",
                "-n",
                "podprobe-system",
                "deploy/podprobe-manager",
                "--tail=30",
            ])
            .output()
            .expect("run kubectl");
        let apiserver = self.cp.apiserver_log_tail(400);
        let webhook_calls: Vec<&str> = apiserver
            .lines()
            .filter(|l| l.contains("webhook"))
            .collect();
        panic!(
            "[{}] {what}\n{}\nkruise-manager:\n{}\npodprobe-manager:\n{}\nthe apiserver on webhooks:\n{}\nkubelet:\n{}",
            self.ns,
            String::from_utf8_lossy(&objects.stdout),
            self.cp.kruise_log_tail(30),
            String::from_utf8_lossy(&manager.stdout),
            webhook_calls.join("\n"),
            self.node.kubelet_log_tail(20)
        );
    }

    /// Polls `check` every 250 ms until it holds or `limit` passes.
    async fn eventually<F: AsyncFnMut() -> bool>(&self, limit: Duration, what: &str, mut check: F) {
        let start = Instant::now();
        while !check().await {
            if start.elapsed() > limit {
                self.fail(&format!("{what}: not within {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// `ListActivePods`: running or pending, not being deleted, scheduled.
    async fn active_pods(&self) -> Vec<Pod> {
        let mut pods: Vec<Pod> = self
            .pods
            .list(&ListParams::default().labels(&format!("app={APP}")))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.spec.as_ref().is_some_and(|s| s.node_name.is_some())
                    && !matches!(
                        p.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Succeeded" | "Failed")
                    )
            })
            .collect();
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        pods
    }

    async fn create_ppm(&self, ppm: Value) {
        let ppm: DynamicObject = serde_json::from_value(ppm).unwrap();
        if let Err(e) = self.ppms.create(&PostParams::default(), &ppm).await {
            self.fail(&format!("create PodProbeMarker: {e}"));
        }
        self.wait_ppm_processed(ppm.metadata.name.as_deref().unwrap())
            .await;
    }

    /// `WaitForPodProbeMarkerProcessed`: Kruise observed the PodProbeMarker's generation.
    async fn wait_ppm_processed(&self, name: &str) {
        self.eventually(LIMIT, &format!("{name} processed"), async || {
            let ppm = self.ppms.get(name).await.unwrap();
            ppm.metadata.generation.is_some()
                && ppm.data["status"]["observedGeneration"].as_i64() == ppm.metadata.generation
        })
        .await;
    }

    /// Replaces the first probe's handler of PodProbeMarker `name` and waits until processed.
    async fn set_handler(&self, name: &str, handler: Value) {
        let mut ppm = self.ppms.get(name).await.unwrap();
        let probe = &mut ppm.data["spec"]["probes"][0]["probe"];
        for kind in ["exec", "tcpSocket", "httpGet"] {
            probe.as_object_mut().unwrap().remove(kind);
        }
        for (key, value) in handler.as_object().unwrap() {
            probe[key] = value.clone();
        }
        if let Err(e) = self.ppms.replace(name, &PostParams::default(), &ppm).await {
            self.fail(&format!("update {name}: {e}"));
        }
        self.wait_ppm_processed(name).await;
    }

    async fn delete_ppms(&self, names: &[&str]) {
        for name in names {
            self.ppms
                .delete(name, &DeleteParams::default())
                .await
                .unwrap();
        }
        for name in names {
            self.eventually(LIMIT, &format!("{name} deleted"), async || {
                self.ppms.get_opt(name).await.unwrap().is_none()
            })
            .await;
        }
    }

    /// `CreateStatefulSet`: Kruise's Advanced StatefulSet of `REPLICAS` pods with `containers`.
    async fn create_set(&self, containers: Value) {
        let set: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "StatefulSet",
            "metadata": {"name": "stateful-test", "namespace": self.ns},
            "spec": {
                "podManagementPolicy": "Parallel",
                "serviceName": "fake-service",
                "replicas": REPLICAS,
                "selector": {"matchLabels": {"app": APP}},
                "template": {
                    "metadata": {"labels": {"app": APP}},
                    "spec": {
                        // Adapted: the injected sidecar authenticates as the pod, with the
                        // chart's sidecar account; and the stand-ins run as PID 1, which
                        // ignores SIGTERM (as centos' `sleep` does): 1 s, not 30 s, to stop.
                        "serviceAccountName": "podprobe-sidecar",
                        "terminationGracePeriodSeconds": 1,
                        "containers": containers,
                    }
                }
            }
        }))
        .unwrap();
        if let Err(e) = self.sets.create(&PostParams::default(), &set).await {
            self.fail(&format!("create StatefulSet: {e}"));
        }
        self.wait_set_running(REPLICAS).await;
    }

    async fn scale(&self, replicas: i64) {
        self.sets
            .patch(
                "stateful-test",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"replicas": replicas}})),
            )
            .await
            .unwrap();
        self.wait_set_running(replicas).await;
    }

    /// `WaitForStatefulSetRunning`: observed, and every replica created, updated and ready.
    async fn wait_set_running(&self, replicas: i64) {
        self.eventually(LIMIT, &format!("{replicas} replicas running"), async || {
            let set = self.sets.get("stateful-test").await.unwrap();
            let status = &set.data["status"];
            set.metadata.generation.is_some()
                && status["observedGeneration"].as_i64() == set.metadata.generation
                && ["replicas", "updatedReplicas", "readyReplicas"]
                    .iter()
                    .all(|k| status[k].as_i64().unwrap_or(0) == replicas)
                && self.active_pods().await.len() == replicas as usize
        })
        .await;
    }

    /// Adapted: Kruise writes `kruise.io/podprobe` at pod creation only (its serverless path
    /// never rewrites it), where kruise-daemon reads a changed PodProbeMarker at once. The pods
    /// are deleted and the StatefulSet creates them again, with the current probes.
    async fn recreate_pods(&self) {
        let before: Vec<String> = self
            .active_pods()
            .await
            .into_iter()
            .filter_map(|p| p.metadata.uid)
            .collect();
        let count = before.len();
        for pod in self.active_pods().await {
            self.pods
                .delete(
                    pod.metadata.name.as_deref().unwrap(),
                    &DeleteParams::default(),
                )
                .await
                .unwrap();
        }
        self.eventually(LIMIT, "pods created again", async || {
            let now = self.active_pods().await;
            now.len() == count
                && now
                    .iter()
                    .all(|p| !before.contains(p.metadata.uid.as_ref().unwrap()))
        })
        .await;
        self.wait_set_running(count as i64).await;
    }

    /// `WaitForPodLabeled` / `WaitForPodAnnotated` (a missing key reads as ""), over a
    /// non-empty set of active pods.
    async fn wait_pods(&self, what: &str, check: impl Fn(&Pod) -> bool) {
        self.eventually(LIMIT, what, async || {
            let pods = self.active_pods().await;
            !pods.is_empty() && pods.iter().all(&check)
        })
        .await;
    }

    /// Adapted from the NodePodProbe checks: on a virtual-kubelet node Kruise keeps no
    /// NodePodProbe; each pod's `kruise.io/podprobe` names the probe instead.
    async fn check_annotated(&self, probe: &str, container: &str) {
        for pod in self.active_pods().await {
            let annotation = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kruise.io/podprobe"))
                .cloned()
                .unwrap_or_default();
            let probes: Vec<Value> = serde_json::from_str(&annotation).unwrap_or_default();
            if !probes
                .iter()
                .any(|p| p["name"] == probe && p["containerName"] == container)
            {
                self.fail(&format!(
                    "{:?}: kruise.io/podprobe has no probe {probe} for {container}: {annotation}",
                    pod.metadata.name
                ));
            }
        }
        self.check_no_node_pod_probe().await;
    }

    /// No NodePodProbe holds a probe of this namespace (the specs' cleanup check, which on
    /// this path holds throughout).
    async fn check_no_node_pod_probe(&self) {
        let probes: Api<DynamicObject> = Api::all_with(
            self.cp.client(),
            &resource("apps.kruise.io", "v1alpha1", "NodePodProbe"),
        );
        for npp in probes.list(&ListParams::default()).await.unwrap() {
            let ours = npp.data["spec"]["podProbes"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|p| p["namespace"] == self.ns);
            if ours {
                self.fail(&format!(
                    "NodePodProbe {:?} probes pods of {}",
                    npp.metadata.name, self.ns
                ));
            }
        }
    }
}

fn label(pod: &Pod, key: &str) -> String {
    support::label(pod, key).unwrap_or_default()
}

fn annotation(pod: &Pod, key: &str) -> String {
    support::annotation(pod, key).unwrap_or_default()
}

fn condition(pod: &Pod, type_: &str) -> Option<String> {
    condition_status(pod, type_)
}

fn condition_message(pod: &Pod, type_: &str) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == type_))
        .and_then(|c| c.message.clone())
        .unwrap_or_default()
}

/// The spec's `nginx:1.15.1`: busybox httpd on port 80 serving `/` (200), in the test game
/// server image, which also has `/bin/sh` and `ls` for the exec probe.
fn nginx() -> Value {
    json!({"name": "nginx", "image": GAMESERVER_IMAGE, "imagePullPolicy": "IfNotPresent",
           "command": ["httpd", "-f", "-p", "80", "-h", "/www"]})
}

/// The spec's `centos:7` with `sleep 999d`: the same command in the test image (busybox `sleep`
/// and `ps -ef`).
fn main_container() -> Value {
    json!({"name": "main", "image": GAMESERVER_IMAGE, "imagePullPolicy": "IfNotPresent",
           "command": ["sleep", "999d"]})
}

/// `NewPodProbeMarker`'s first: exec `ls /` in nginx; label nginx=healthy on success.
fn ppm_nginx(ns: &str, handler: Value) -> Value {
    json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "ppm-nginx", "namespace": ns},
        "spec": {
            "selector": {"matchLabels": {"app": APP}},
            "probes": [{
                "name": "healthy", "containerName": "nginx", "probe": handler,
                "podConditionType": HEALTHY,
                "markerPolicy": [{"state": "Succeeded", "labels": {"nginx": "healthy"}}]
            }]
        }
    })
}

/// `NewPodProbeMarker`'s second: exec `ps -ef` in main; pod-deletion-cost 10 / -10.
fn ppm_main(ns: &str) -> Value {
    json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "ppm-main", "namespace": ns},
        "spec": {
            "selector": {"matchLabels": {"app": APP}},
            "probes": [{
                "name": "check", "containerName": "main",
                "probe": {"exec": {"command": ["/bin/sh", "-c", "ps -ef"]}},
                "podConditionType": CHECK,
                "markerPolicy": [
                    {"state": "Succeeded", "annotations": {DELETION_COST: "10"}},
                    {"state": "Failed", "annotations": {DELETION_COST: "-10"}}
                ]
            }]
        }
    })
}

fn exec(command: &str) -> Value {
    json!({"exec": {"command": ["/bin/sh", "-c", command]}})
}

fn tcp(port: u16) -> Value {
    json!({"tcpSocket": {"port": port}})
}

/// "pod probe marker exec test".
async fn exec_spec(spec: &Spec<'_>) {
    // Adapted: the PodProbeMarker before the StatefulSet (the annotation is written at pod
    // creation only).
    spec.create_ppm(ppm_nginx(spec.ns, exec("ls /"))).await;
    let ppm = spec.ppms.get("ppm-nginx").await.unwrap();
    assert!(
        ppm.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == "kruise.io/node-pod-probe-cleanup"),
        "[{}] Kruise's finalizer: {:?}",
        spec.ns,
        ppm.metadata.finalizers
    );
    spec.create_set(json!([nginx(), main_container()])).await;
    spec.wait_pods("labelled nginx=healthy", |p| label(p, "nginx") == "healthy")
        .await;
    spec.check_annotated("healthy", "nginx").await;
    for pod in spec.active_pods().await {
        assert_eq!(condition(&pod, HEALTHY).as_deref(), Some("True"));
        assert_eq!(condition(&pod, CHECK), None, "no check probe yet");
    }

    spec.create_ppm(ppm_main(spec.ns)).await;
    spec.recreate_pods().await;
    spec.wait_pods("deletion cost 10, nginx=healthy", |p| {
        annotation(p, DELETION_COST) == "10" && label(p, "nginx") == "healthy"
    })
    .await;
    spec.check_annotated("check", "main").await;
    for pod in spec.active_pods().await {
        assert_eq!(condition(&pod, HEALTHY).as_deref(), Some("True"));
        assert_eq!(condition(&pod, CHECK).as_deref(), Some("True"));
    }

    // Both probes fail.
    spec.set_handler("ppm-nginx", exec("failed /")).await;
    spec.set_handler("ppm-main", exec("failed -ef")).await;
    spec.recreate_pods().await;
    // Adapted: the new pods never had the label, so its absence proves nothing until the
    // condition is False (on kruise-daemon's path the label's removal follows the condition).
    spec.wait_pods("healthy False, no nginx label, deletion cost -10", |p| {
        condition(p, HEALTHY).as_deref() == Some("False")
            && label(p, "nginx").is_empty()
            && annotation(p, DELETION_COST) == "-10"
    })
    .await;
    for pod in spec.active_pods().await {
        assert_eq!(condition(&pod, HEALTHY).as_deref(), Some("False"));
        assert_eq!(condition(&pod, CHECK).as_deref(), Some("False"));
    }

    // nginx's probe succeeds again; scale down to one.
    spec.set_handler("ppm-nginx", exec("ls /")).await;
    spec.scale(1).await;
    spec.recreate_pods().await;
    // Both probes' markers: each PodProbeMarker is reconciled on its own.
    spec.wait_pods("nginx=healthy again, deletion cost -10", |p| {
        label(p, "nginx") == "healthy" && annotation(p, DELETION_COST) == "-10"
    })
    .await;
    let pods = spec.active_pods().await;
    assert_eq!(pods.len(), 1);
    for pod in &pods {
        assert_eq!(condition(pod, HEALTHY).as_deref(), Some("True"));
        assert_eq!(annotation(pod, DELETION_COST), "-10");
        assert_eq!(condition(pod, CHECK).as_deref(), Some("False"));
    }
    spec.check_no_node_pod_probe().await;

    // Scale up: the new pod is created with the current probes.
    spec.scale(REPLICAS).await;
    spec.wait_pods("new pods healthy, deletion cost -10", |p| {
        label(p, "nginx") == "healthy" && annotation(p, DELETION_COST) == "-10"
    })
    .await;
    for pod in spec.active_pods().await {
        assert_eq!(condition(&pod, HEALTHY).as_deref(), Some("True"));
        assert_eq!(condition(&pod, CHECK).as_deref(), Some("False"));
    }
    spec.delete_ppms(&["ppm-nginx", "ppm-main"]).await;
    spec.check_no_node_pod_probe().await;
}

/// "pod probe marker test2": the probe image's `probe.sh` fails, then prints `data`, then
/// `gate`; the condition's status and message follow.
async fn probe_image_spec(spec: &Spec<'_>) {
    // Adapted: `bash ./probe.sh` is `sh ./probe.sh` (busybox has no bash).
    spec.create_ppm(json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "ppm-minecraft", "namespace": spec.ns},
        "spec": {
            "selector": {"matchLabels": {"app": APP}},
            "probes": [{
                "name": "healthy", "containerName": "minecraft",
                "probe": {"exec": {"command": ["sh", "./probe.sh"]}},
                "podConditionType": HEALTHY
            }]
        }
    }))
    .await;
    // The spec's `openkruise/minecraft-demo:probe-v0`: the test game server image, whose
    // `/probe.sh` gives the spec's three answers as the server ages.
    spec.create_set(json!([{"name": "minecraft", "image": GAMESERVER_IMAGE,
                             "imagePullPolicy": "IfNotPresent"}]))
        .await;
    for (limit, status, message) in [
        (10, "False", ""),
        (20, "True", "data"),
        (20, "True", "gate"),
    ] {
        spec.eventually(
            Duration::from_secs(limit),
            &format!("{HEALTHY} {status} with message {message:?}"),
            async || {
                let pods = spec.active_pods().await;
                pods.len() == REPLICAS as usize
                    && pods.iter().all(|p| {
                        condition(p, HEALTHY).as_deref() == Some(status)
                            && condition_message(p, HEALTHY).contains(message)
                    })
            },
        )
        .await;
    }
}

/// "pod probe marker tcpCheck test".
async fn tcp_spec(spec: &Spec<'_>) {
    spec.create_ppm(ppm_nginx(spec.ns, tcp(80))).await;
    spec.create_set(json!([nginx(), main_container()])).await;
    spec.wait_pods("labelled nginx=healthy", |p| label(p, "nginx") == "healthy")
        .await;
    spec.check_annotated("healthy", "nginx").await;
    for pod in spec.active_pods().await {
        assert_eq!(condition(&pod, HEALTHY).as_deref(), Some("True"));
        assert_eq!(condition(&pod, CHECK), None);
    }

    // Port 80 -> 8081: nothing listens there.
    spec.set_handler("ppm-nginx", tcp(8081)).await;
    spec.recreate_pods().await;
    // Adapted as in the exec spec: the condition, then the label's absence.
    spec.wait_pods("healthy False, no nginx label", |p| {
        condition(p, HEALTHY).as_deref() == Some("False") && label(p, "nginx").is_empty()
    })
    .await;
    for pod in spec.active_pods().await {
        assert_eq!(condition(&pod, HEALTHY).as_deref(), Some("False"));
    }

    // And back to 80; scale down to one, then up.
    spec.set_handler("ppm-nginx", tcp(80)).await;
    spec.scale(1).await;
    spec.recreate_pods().await;
    spec.wait_pods("nginx=healthy again", |p| label(p, "nginx") == "healthy")
        .await;
    for pod in spec.active_pods().await {
        assert_eq!(condition(&pod, HEALTHY).as_deref(), Some("True"));
    }
    spec.check_no_node_pod_probe().await;
    spec.scale(REPLICAS).await;
    spec.wait_pods("new pods healthy", |p| label(p, "nginx") == "healthy")
        .await;
    let pods = spec.active_pods().await;
    assert_eq!(pods.len(), REPLICAS as usize);
    for pod in pods {
        assert_eq!(condition(&pod, HEALTHY).as_deref(), Some("True"));
    }
    spec.delete_ppms(&["ppm-nginx"]).await;
    spec.check_no_node_pod_probe().await;
}

/// "pod probe marker httpCheck test".
async fn http_spec(spec: &Spec<'_>) {
    spec.create_ppm(ppm_nginx(
        spec.ns,
        json!({"httpGet": {"path": "/", "scheme": "HTTP", "port": 80}}),
    ))
    .await;
    spec.create_set(json!([nginx(), main_container()])).await;
    spec.wait_pods("labelled nginx=healthy", |p| label(p, "nginx") == "healthy")
        .await;
    let pods = spec.active_pods().await;
    assert_eq!(pods.len(), REPLICAS as usize);
    spec.check_annotated("healthy", "nginx").await;
    for pod in pods {
        assert_eq!(condition(&pod, HEALTHY).as_deref(), Some("True"));
        assert_eq!(condition(&pod, CHECK), None);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kruise_e2e_podprobemarker_specs_pass_on_a_serverless_node_with_podprobe() {
    let options = NodeOptions {
        labels: BTreeMap::from([("type".to_owned(), "virtual-kubelet".to_owned())]),
        ..NodeOptions::default()
    };
    let (mut cp, node) = node_for_workloads(options).await;
    cp.start_kruise_manager()
        .await
        .unwrap_or_else(|e| panic!("kruise-manager: {e}"));
    let (manager_image, sidecar_image) = chart_default_images();
    node.tag_image(MANAGER_IMAGE, &manager_image).unwrap();
    node.tag_image(SIDECAR_IMAGE, &sidecar_image).unwrap();
    let namespaces = [EXEC, PROBE_IMAGE, TCP, HTTP];
    // The chart as the OKG recipe installs it (companion mode, defaults), for four namespaces.
    let mut install = String::new();
    for ns in namespaces {
        install.push_str(&format!("kubectl create namespace {ns}\n"));
    }
    install.push_str(&format!(
        "helm install podprobe charts/podprobe -n podprobe-system --create-namespace \
         --set mode=companion --set 'sidecar.namespaces={{{}}}' --wait\n",
        namespaces.join(",")
    ));
    for ns in namespaces {
        install.push_str(&format!(
            "kubectl label namespace {ns} podprobe.io/inject=enabled\n"
        ));
    }
    run_as_user(&cp, &node, &install);

    // On a virtual-kubelet node Kruise keeps no NodePodProbe (the specs expect one per node).
    let npps: Api<DynamicObject> = Api::all_with(
        cp.client(),
        &resource("apps.kruise.io", "v1alpha1", "NodePodProbe"),
    );
    assert!(
        npps.get_opt(node.name()).await.unwrap().is_none(),
        "a NodePodProbe for the virtual-kubelet node"
    );

    exec_spec(&Spec::new(&cp, &node, EXEC)).await;
    probe_image_spec(&Spec::new(&cp, &node, PROBE_IMAGE)).await;
    tcp_spec(&Spec::new(&cp, &node, TCP)).await;
    http_spec(&Spec::new(&cp, &node, HTTP)).await;

    for ns in namespaces {
        let sets: Api<DynamicObject> = Api::namespaced_with(
            cp.client(),
            ns,
            &resource("apps.kruise.io", "v1beta1", "StatefulSet"),
        );
        if sets.get_opt("stateful-test").await.unwrap().is_some() {
            Spec::new(&cp, &node, ns).scale(0).await;
        }
    }
    let leftovers = node.stop(&cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
