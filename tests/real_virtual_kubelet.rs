//! podprobe on a node of the virtual-kubelet library (`virtual-kubelet --provider mock`,
//! testkit::real::virtual_kubelet): the node agent serverless providers are built on, which
//! writes the pods' status itself (`UpdateStatus`, the whole `.status`). The sidecar runs as
//! a process beside it with a token bound to its pod, as in a pod there.
//!
//! `vk-replacer` is a provider built on the library that does not notify: the library copies
//! its status (Ready, Initialized, PodScheduled only) over the pod every 5 s, as under
//! azure-aci. There podprobe's conditions are overwritten every time it writes them.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::*;
use testkit::real::VIRTUAL_NODE_NAME;
use testkit::real::virtual_kubelet::{Provider, VIRTUAL_KUBELET_USER, VirtualKubelet};
use tokio::time::Instant;

const LIMIT: Duration = Duration::from_secs(60);
const IDLE: &str = "game.kruise.io/idle";
/// The node `vk-replacer` registers.
const REPLACER: &str = "vk-replacer";

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

/// Pod `name` bound to `node` with the sidecar's service account, `probes` as its annotation.
fn pod_on(name: &str, node: &str, probes: &str) -> Pod {
    let mut pod = game_pod(name, probes, json!([]));
    let spec = pod.spec.as_mut().unwrap();
    spec.node_name = Some(node.to_owned());
    spec.service_account_name = Some(SIDECAR_SA.to_owned());
    pod
}

/// Creates `pod` and waits until the library reports it Running.
async fn run_on_agent(cluster: &Cluster, pod: &Pod) -> Pod {
    cluster
        .pods()
        .create(&PostParams::default(), pod)
        .await
        .unwrap();
    let name = pod.metadata.name.as_deref().unwrap();
    cluster
        .wait_pod(name, LIMIT, |p| phase(p) == Some("Running"))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_follow_the_probe_on_a_virtual_kubelet_node() {
    let cluster = Cluster::start().await;
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
    let probes = array(&[file_probe("idle", IDLE, &flag)]);
    // The library "runs" it: the mock provider reports it Running.
    let running = run_on_agent(&cluster, &pod_on("gs-0", VIRTUAL_NODE_NAME, &probes)).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_provider_that_replaces_the_status_a_new_result_is_written_back_after_each_overwrite()
 {
    let cluster = Cluster::start().await;
    let vk = VirtualKubelet::start_node(&cluster.cp, REPLACER, Provider::Replacer)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let flag = cluster.dir.path().join("idle");
    std::fs::write(&flag, "idle").unwrap();
    let probes = array(&[file_probe("idle", IDLE, &flag)]);
    // The library's first copy of the provider's status: Running.
    let running = run_on_agent(&cluster, &pod_on("gs-r", REPLACER, &probes)).await;
    // The default policy (after-change): the first result is new for 30 s, and each
    // overwrite meanwhile is written back at once.
    let mut sidecar = cluster.sidecar(&running, &[]).await;

    // What the admin's watch sees of the condition: each time it comes and goes.
    let shown = presence_changes(&cluster, "gs-r", IDLE, 6, LIMIT).await;
    let at = |n: usize| shown[n].0;
    assert_eq!(
        shown
            .iter()
            .map(|(_, present)| *present)
            .collect::<Vec<_>>(),
        [true, false, true, false, true, false],
        "{shown:?}\nsidecar: {}\nagent: {}",
        sidecar.log(),
        vk.log_tail(20)
    );
    // Each overwrite is the library's copy, within its 5 s sync period of the write it undid,
    // and each is written back within a round trip, not after a backoff.
    for n in [1, 3] {
        let undone = at(n) - at(n - 1);
        assert!(
            undone < Duration::from_secs(7),
            "overwrite {n} after {undone:?}"
        );
        let back = at(n + 1) - at(n);
        assert!(
            back < Duration::from_secs(1),
            "written back {back:?} after overwrite {n}\n{}",
            sidecar.log()
        );
    }
    let writes = status_writes(&cluster, "gs-r");
    assert!(
        writes.provider >= 3 && writes.sidecar >= 3,
        "{writes:?}: the library's copies and podprobe's writes"
    );
    let log = sidecar.log();
    assert!(
        log.contains("removed or changed condition game.kruise.io/idle; writing it back in 0ns"),
        "{log}"
    );
    // A removed entry has no owner, so the sidecar cannot name the writer; the pod's status
    // managers can (what `kubectl podprobe explain` lists): the library writes as its binary.
    let pod = cluster.pods().get("gs-r").await.unwrap();
    let status_managers: Vec<_> = pod
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.subresource.as_deref() == Some("status"))
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        status_managers.iter().any(|m| m == "vk-replacer"),
        "{status_managers:?}"
    );
    sidecar.terminate(Duration::from_secs(5));
}

/// A write-back carries the pod's other overwritten conditions. Once 30 s have passed since a
/// steady probe's first result, its own repairs back off (the default policy), but while
/// another probe of the pod has just changed, that probe's immediate write-backs bring the
/// steady condition back with them, within the same round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_back_brings_the_pods_other_overwritten_conditions_with_it() {
    const STEADY: &str = "game.kruise.io/steady";
    let cluster = Cluster::start().await;
    let _vk = VirtualKubelet::start_node(&cluster.cp, REPLACER, Provider::Replacer)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (idle, steady) = (
        cluster.dir.path().join("idle"),
        cluster.dir.path().join("up"),
    );
    std::fs::write(&idle, "idle").unwrap();
    std::fs::write(&steady, "up").unwrap();
    let probes = array(&[
        file_probe("idle", IDLE, &idle),
        file_probe("steady", STEADY, &steady),
    ]);
    let running = run_on_agent(&cluster, &pod_on("gs-a", REPLACER, &probes)).await;
    let sidecar = cluster.sidecar(&running, &[]).await;
    cluster
        .wait_pod("gs-a", LIMIT, |p| {
            has_status(p, IDLE, "True") && has_status(p, STEADY, "True")
        })
        .await;
    // Both first results are older than the policy's 30 s window once this wait is over: from
    // then on, the steady condition's own repairs are backed off (by then 1 s, 2 s … 32 s).
    tokio::time::sleep(Duration::from_secs(31)).await;
    std::fs::remove_file(&idle).unwrap();
    cluster
        .wait_pod("gs-a", LIMIT, |p| has_status(p, IDLE, "False"))
        .await;
    let shown = presence_changes(&cluster, "gs-a", STEADY, 5, LIMIT).await;
    assert_eq!(
        shown.iter().map(|(_, p)| *p).collect::<Vec<_>>(),
        [true, false, true, false, true],
        "{shown:?}"
    );
    for n in [1, 3] {
        let back = shown[n + 1].0 - shown[n].0;
        assert!(
            back < Duration::from_secs(1),
            "{STEADY} back {back:?} after overwrite {n}: it waited for its own backed-off repair\n{}",
            sidecar.log()
        );
    }
}

/// Times condition `condition_type` appeared (true) or went (false) in a watch of pod `name`,
/// from its first appearance, until `count` changes.
async fn presence_changes(
    cluster: &Cluster,
    name: &str,
    condition_type: &str,
    count: usize,
    limit: Duration,
) -> Vec<(Instant, bool)> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut pods = std::pin::pin!(watcher(cluster.pods(), config).applied_objects());
    let mut shown: Vec<(Instant, bool)> = Vec::new();
    let deadline = Instant::now() + limit;
    while shown.len() < count {
        let next = tokio::time::timeout_at(deadline, pods.next()).await;
        let Ok(Some(Ok(pod))) = next else {
            panic!(
                "{} of {count} changes within {limit:?}: {shown:?}",
                shown.len()
            );
        };
        let present = condition(&pod, condition_type).is_some();
        if shown.is_empty() && !present {
            continue;
        }
        let changed = shown.last().map_or(present, |(_, last)| *last != present);
        if changed {
            shown.push((Instant::now(), present));
        }
    }
    shown
}

#[derive(Debug, Default)]
struct StatusWrites {
    provider: usize,
    sidecar: usize,
}

/// Pod `name`'s status writes by the node agent and by the sidecar, from the audit log.
fn status_writes(cluster: &Cluster, name: &str) -> StatusWrites {
    let mut writes = StatusWrites::default();
    for e in cluster.cp.audit().expect("audit log") {
        if e.user.username == VIRTUAL_KUBELET_USER && e.is("update", "pods/status", Some(name)) {
            writes.provider += 1;
        } else if e.user.username.ends_with(SIDECAR_SA) && e.is("patch", "pods/status", Some(name))
        {
            writes.sidecar += 1;
        }
    }
    writes
}

/// The pod status writes the virtual-kubelet made, as the apiserver's audit log has them.
fn library_status_writes(cluster: &Cluster) -> usize {
    status_writes(cluster, "gs-0").provider
}

/// Issue 24 step 5, end to end through the real library: a PodProbeMarker in OpenKruise's
/// kruise-manager (`EnablePodProbeMarkerOnServerless`), whose webhook writes the annotation on
/// a pod bound to the library's node; the library runs it (mock provider); podprobe writes the
/// condition; kruise-manager, which needs the node's `type=virtual-kubelet` label and the
/// library's `Initialized`, writes the markers, and each marker is a pod update the library
/// answers with a status write of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kruise_marks_through_the_virtual_kubelet_library() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let mut cluster = Cluster::start().await;
    cluster
        .cp
        .start_kruise_manager()
        .await
        .unwrap_or_else(|e| panic!("kruise-manager: {e}"));
    let vk = VirtualKubelet::start(&cluster.cp)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let flag = cluster.dir.path().join("idle");
    std::fs::write(&flag, "idle").unwrap();
    let mut probe: serde_json::Value =
        serde_json::from_str(&file_probe("idle", IDLE, &flag)).unwrap();
    probe["markerPolicy"] = json!([
        {"state": "Succeeded", "labels": {"gameserver-idle": "true"}},
        {"state": "Failed", "labels": {"gameserver-idle": "false"}}]);
    let ppm: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "game", "namespace": "games"},
        "spec": {"selector": {"matchLabels": {"app": "game"}}, "probes": [probe]}
    }))
    .unwrap();
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "apps.kruise.io",
        "v1alpha1",
        "PodProbeMarker",
    ));
    Api::<DynamicObject>::namespaced_with(cluster.cp.client(), "games", &resource)
        .create(&PostParams::default(), &ppm)
        .await
        .unwrap_or_else(|e| panic!("Kruise's webhook refused the PodProbeMarker: {e}"));
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "gs-k", "namespace": "games", "labels": {"app": "game"}},
        "spec": {"nodeName": VIRTUAL_NODE_NAME, "serviceAccountName": SIDECAR_SA,
                 "containers": [{"name": "main", "image": "game:1"}]}
    }))
    .unwrap();
    let annotated = |p: &Pod| {
        p.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("kruise.io/podprobe"))
    };
    cluster
        .cp
        .wait_admission(&pod, annotated)
        .await
        .unwrap_or_else(|e| panic!("Kruise's webhook never annotates: {e}"));
    let running = run_on_agent(&cluster, &pod).await;
    let sidecar = cluster.sidecar(&running, &[]).await;
    let marker = |p: &Pod, value: &str| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("gameserver-idle"))
            .is_some_and(|v| v == value)
    };
    cluster
        .wait_pod("gs-k", LIMIT, |p| {
            has_status(p, IDLE, "True") && marker(p, "true")
        })
        .await;
    let library_writes = status_writes(&cluster, "gs-k").provider;
    std::fs::remove_file(&flag).unwrap();
    let pod = cluster
        .wait_pod("gs-k", LIMIT, |p| {
            has_status(p, IDLE, "False") && marker(p, "false")
        })
        .await;
    for kubelet_condition in ["PodScheduled", "Initialized", "Ready"] {
        assert!(
            condition(&pod, kubelet_condition).is_some(),
            "{kubelet_condition}: {:?}\nvirtual-kubelet: {}",
            pod.status,
            vk.log_tail(20)
        );
    }
    assert!(
        status_writes(&cluster, "gs-k").provider > library_writes,
        "the library wrote the status again after the flip and its marker\nsidecar: {}",
        sidecar.log()
    );
}
