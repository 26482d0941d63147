//! What happens to pods after admission, side by side with the real kruise-manager: Kruise
//! writes `kruise.io/podprobe` only when a pod is created (spec §8 gap 1), podprobe-manager
//! keeps it following the PodProbeMarker (backfill, edits, deletion). And Kruise's
//! finalizer cleanup on its NodePodProbe path, which podprobe has no counterpart of.

mod cluster;
mod installed;
mod side_by_side;
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Api, Client};
use serde_json::{Value, json};
use side_by_side::{SideBySide, annotation, ppm_resource};
use support::PODPROBE;

const NS: &str = "lifecycle";
const LIMIT: Duration = Duration::from_secs(60);

/// PodProbeMarker `name` with one probe `probe` (condition `game.io/<name>`). Two markers
/// whose probes share a container and a name merge into one annotation entry (the first
/// wins), so markers meant to apply together need different probe names.
fn game_ppm(name: &str, probe: &str, period: u32) -> Value {
    json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "game"}}, "probes": [{
            "name": probe, "containerName": "main", "podConditionType": format!("game.io/{name}"),
            "probe": {"exec": {"command": ["true"]}, "periodSeconds": period},
            "markerPolicy": [{"state": "Succeeded", "labels": {"idle": "true"}}]
        }]}
    })
}

fn game_pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "game"}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "game:1"}]}
    }))
    .unwrap()
}

/// The kubelet's part: running, initialized (the pod counts as matched), with an IP.
async fn kubelet_runs(client: Client, name: &str) {
    let status = json!({"status": {"phase": "Running", "podIP": "10.0.0.9",
        "podIPs": [{"ip": "10.0.0.9"}], "conditions": [
            {"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"}]}});
    Api::<Pod>::namespaced(client, NS)
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&status))
        .await
        .unwrap();
}

async fn eventually<T>(what: &str, probe: impl AsyncFnMut() -> Option<T>) -> T {
    testkit::wait::until_some(LIMIT, what, probe).await
}

async fn pod_annotation(client: &Client, name: &str) -> Option<String> {
    let pod = Api::<Pod>::namespaced(client.clone(), NS)
        .get(name)
        .await
        .unwrap();
    annotation(&pod, PODPROBE)
}

/// Waits until Kruise's PodProbeMarker controller has processed `name` at its current
/// generation (it writes `status.observedGeneration` at the end of a reconcile).
async fn kruise_observed(client: &Client, name: &str) {
    let ppms: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ppm_resource());
    eventually(&format!("Kruise reconciles {name}"), async || {
        let ppm = ppms.get(name).await.unwrap();
        let generation = ppm.metadata.generation?;
        (ppm.data["status"]["observedGeneration"] == json!(generation)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_admission_kruise_leaves_the_annotation_podprobe_keeps_it_current() {
    let both = SideBySide::start().await;
    both.namespace(NS).await;
    let clients = both.clients();
    let (kruise, podprobe) = (&clients.kruise, &clients.podprobe);
    both.create_pod(&game_pod("early", "vk-1")).await;
    tokio::join!(
        kubelet_runs(kruise.clone(), "early"),
        kubelet_runs(podprobe.clone(), "early")
    );

    // A PodProbeMarker created after the pod: podprobe backfills, Kruise never writes.
    let created = both.create_ppm(&game_ppm("game", "idle", 1)).await;
    assert!(
        created.kruise.is_ok() && created.podprobe.is_ok(),
        "{created:?}"
    );
    let backfilled = eventually("podprobe backfills", async || {
        pod_annotation(podprobe, "early").await
    })
    .await;
    assert!(backfilled.contains(r#""periodSeconds":1"#), "{backfilled}");
    kruise_observed(kruise, "game").await;
    assert_eq!(
        pod_annotation(kruise, "early").await,
        None,
        "Kruise: no backfill"
    );

    // A pod created now: both annotate it alike.
    let admitted = both.create_pod(&game_pod("late", "vk-1")).await;
    let at_admission = annotation(&admitted.kruise, PODPROBE).expect("Kruise annotates");
    assert_eq!(
        Some(&at_admission),
        annotation(&admitted.podprobe, PODPROBE).as_ref()
    );

    // An edit: podprobe rewrites the pod's annotation, Kruise's stays as admitted.
    let edit = json!({"spec": {"probes": [{
        "name": "idle", "containerName": "main", "podConditionType": "game.io/game",
        "probe": {"exec": {"command": ["true"]}, "periodSeconds": 5},
        "markerPolicy": [{"state": "Succeeded", "labels": {"idle": "true"}}]}]}});
    for client in [kruise, podprobe] {
        Api::<DynamicObject>::namespaced_with(client.clone(), NS, &ppm_resource())
            .patch("game", &PatchParams::default(), &Patch::Merge(&edit))
            .await
            .unwrap();
    }
    eventually("podprobe propagates the edit", async || {
        pod_annotation(podprobe, "late")
            .await
            .filter(|a| a.contains(r#""periodSeconds":5"#))
    })
    .await;
    kruise_observed(kruise, "game").await;
    assert_eq!(
        pod_annotation(kruise, "late").await,
        Some(at_admission.clone()),
        "Kruise: no update"
    );

    // Deleted: podprobe removes both annotations, Kruise's stay.
    for client in [kruise, podprobe] {
        Api::<DynamicObject>::namespaced_with(client.clone(), NS, &ppm_resource())
            .delete("game", &DeleteParams::default())
            .await
            .unwrap();
    }
    eventually("podprobe removes the annotation", async || {
        pod_annotation(podprobe, "late")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    let ppms: Api<DynamicObject> = Api::namespaced_with(kruise.clone(), NS, &ppm_resource());
    eventually("Kruise lets the PodProbeMarker go", async || {
        ppms.get_opt("game").await.unwrap().is_none().then_some(())
    })
    .await;
    assert_eq!(
        pod_annotation(kruise, "late").await,
        Some(at_admission),
        "Kruise: no removal"
    );
}

fn npp_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "apps.kruise.io",
        "v1alpha1",
        "NodePodProbe",
    ))
}

/// The probe names in node `node`'s NodePodProbe.
async fn npp_probes(client: &Client, node: &str) -> Vec<String> {
    let npps: Api<DynamicObject> = Api::all_with(client.clone(), &npp_resource());
    let Some(npp) = npps.get_opt(node).await.unwrap() else {
        return vec![];
    };
    let mut names: Vec<String> = npp.data["spec"]["podProbes"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["probes"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

/// openkruise/kruise#2508: deleting PodProbeMarker `way` removes from the NodePodProbe every
/// probe whose name *contains* `way#`, so `gateway`'s probe goes too. podprobe keeps no
/// NodePodProbe and sets no finalizer: nothing to compare, the behaviour is pinned here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kruise_finalizer_strips_the_probes_of_a_marker_whose_name_ends_the_deleted_one() {
    let mut cp = installed::start_control_plane().await;
    cp.start_kruise_manager()
        .await
        .unwrap_or_else(|e| panic!("kruise-manager: {e}"));
    cp.create_namespace(NS).await.unwrap();
    let client = cp.client();
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-1"}})).unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    nodes
        .patch_status("node-1", &PatchParams::default(), &Patch::Strategic(&ready))
        .await
        .unwrap();
    // Kruise's NodePodProbe controller makes one per ready real node; probes are added only
    // to an existing one.
    let npps: Api<DynamicObject> = Api::all_with(client.clone(), &npp_resource());
    eventually("Kruise creates node-1's NodePodProbe", async || {
        npps.get_opt("node-1").await.unwrap()
    })
    .await;
    let ppms: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ppm_resource());
    for name in ["way", "gateway"] {
        let ppm: DynamicObject = serde_json::from_value(game_ppm(name, name, 1)).unwrap();
        ppms.create(&PostParams::default(), &ppm).await.unwrap();
    }
    // Kruise's webhook lists the PodProbeMarkers it saw at admission, and its pod event
    // handler then follows that list: wait until it sees both.
    let pod = game_pod("gs-0", "node-1");
    cp.wait_admission(&pod, |p| {
        annotation(p, "kruise.io/podprobemarker-list").as_deref() == Some("gateway,way")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    kubelet_runs(client.clone(), "gs-0").await;
    let both = ["gateway#gateway".to_owned(), "way#way".to_owned()];
    eventually(
        "Kruise puts both probes in node-1's NodePodProbe",
        async || (npp_probes(&client, "node-1").await == both).then_some(()),
    )
    .await;

    ppms.delete("way", &DeleteParams::default()).await.unwrap();
    eventually("Kruise finishes deleting `way`", async || {
        ppms.get_opt("way").await.unwrap().is_none().then_some(())
    })
    .await;
    assert_eq!(
        npp_probes(&client, "node-1").await,
        Vec::<String>::new(),
        "`gateway#gateway` went with `way#way`"
    );
    assert!(ppms.get_opt("gateway").await.unwrap().is_some());
}
