//! The recipes of `examples/recipes/`, end to end on a real control plane: the committed
//! YAML is applied as is, except what a test cannot have (a port of its own for the probe's
//! target, the node the pods land on: nothing schedules here).

mod cluster;
mod installed;
mod support;

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Api, Client};
use podprobe_manager::webhook::Mode;
use serde_json::{Value, json};
use support::{condition_status, label, wait_pod};

use installed::{
    NS, install_and_run, kruise_and_companion, kubelet_status, run_injected_sidecar,
    start_control_plane,
};

const LIFECYCLE: &str = "lifecycle.apps.kruise.io/state";
const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The documents of `examples/recipes/<name>`.
fn recipe(name: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/recipes")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    cluster::documents(&text)
}

/// An HTTP server on 127.0.0.1 that answers 200 while `up`, else 503.
async fn serve(up: Arc<AtomicBool>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let up = up.clone();
            let service = hyper::service::service_fn(move |_req| {
                let status = if up.load(Ordering::Relaxed) { 200 } else { 503 };
                async move {
                    let mut response =
                        hyper::Response::new(Full::new(Bytes::from_static(b"lobby")));
                    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                    Ok::<_, Infallible>(response)
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    port
}

/// Creates a recipe's PodProbeMarker, then (once both webhooks' caches have it: a pod of the
/// workload's template is admitted with it) its workload.
async fn apply(running: &installed::Running, docs: &[Value]) {
    let admin = running.cp.client();
    create(&admin, &docs[0]).await;
    let template = &docs[1]["spec"]["template"];
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "template-check", "namespace": NS, "labels": template["metadata"]["labels"]},
        "spec": template["spec"]
    }))
    .unwrap();
    let marker = docs[0]["metadata"]["name"].as_str().unwrap();
    running
        .cp
        .wait_admission(&pod, |p| {
            support::annotation(p, "kruise.io/podprobemarker-list").as_deref() == Some(marker)
        })
        .await
        .unwrap_or_else(|e| panic!("the pod webhook never sees {marker}: {e}"));
    create(&admin, &docs[1]).await;
}

async fn create(client: &Client, doc: &Value) {
    let (group, version) = doc["apiVersion"].as_str().unwrap().split_once('/').unwrap();
    let gvk = GroupVersionKind::gvk(group, version, doc["kind"].as_str().unwrap());
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NS, &ApiResource::from_gvk(&gvk));
    let object: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create {}: {e}", doc["kind"]));
}

/// `cloneset-prenormal.yaml`: the CloneSet's new pod waits in PreparingNormal until its probe
/// passes; the marker label releases the hook and Kruise moves it to Normal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_releases_the_cloneset_prenormal_hook() {
    let running = kruise_and_companion().await;
    let admin = running.cp.client();
    let registered = Arc::new(AtomicBool::new(false));
    let port = serve(registered.clone()).await;

    let mut docs = recipe("cloneset-prenormal.yaml");
    assert_eq!(docs.len(), 2);
    docs[0]["spec"]["probes"][0]["probe"]["httpGet"]["port"] = json!(port);
    docs[1]["spec"]["template"]["spec"]["nodeName"] = json!("vk-1");
    apply(&running, &docs).await;

    // Kruise's CloneSet controller creates the pod through the admission chain: Kruise
    // annotates it and podprobe injects the sidecar.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let created = async {
        loop {
            let list = pods
                .list(&ListParams::default().labels("app=lobby"))
                .await
                .unwrap();
            if let Some(pod) = list.items.into_iter().next() {
                return pod;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    let pod = tokio::time::timeout(std::time::Duration::from_secs(60), created)
        .await
        .expect("the CloneSet creates its pod");
    let name = pod.metadata.name.clone().unwrap();
    assert_eq!(label(&pod, LIFECYCLE).as_deref(), Some("PreparingNormal"));
    assert_eq!(
        label(&pod, "example.com/traffic-online").as_deref(),
        Some("false")
    );
    pods.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Strategic(kubelet_status("lobby")),
    )
    .await
    .unwrap();
    let _sidecar = run_injected_sidecar(&running, &pod, "podprobe-sidecar").await;

    // Not registered yet: the probe fails and the hook holds.
    let held = wait_pod(&pods, &name, "the probe's condition False", |p| {
        condition_status(p, "example.com/registered").as_deref() == Some("False")
    })
    .await;
    assert_eq!(label(&held, LIFECYCLE).as_deref(), Some("PreparingNormal"));
    assert_eq!(
        label(&held, "example.com/traffic-online").as_deref(),
        Some("false")
    );

    // Registered: True → Kruise's marker → the hook is released.
    registered.store(true, Ordering::Relaxed);
    let released = wait_pod(&pods, &name, "the pod goes Normal", |p| {
        label(p, LIFECYCLE).as_deref() == Some("Normal")
    })
    .await;
    assert_eq!(
        label(&released, "example.com/traffic-online").as_deref(),
        Some("true")
    );
    assert_eq!(
        condition_status(&released, "example.com/registered").as_deref(),
        Some("True")
    );
    running.manager.shutdown().await;
}

/// The pods of `app`, once there are `n` of them.
async fn pods_of(pods: &Api<Pod>, app: &str, n: usize) -> Vec<Pod> {
    let listed = async {
        loop {
            let list = pods
                .list(&ListParams::default().labels(&format!("app={app}")))
                .await
                .unwrap();
            if list.items.len() == n {
                return list.items;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), listed)
        .await
        .unwrap_or_else(|_| panic!("{n} pods of {app}"))
}

/// `idle-deletion-cost.yaml`: one idle and one busy server; scaled in, the Deployment's
/// ReplicaSet (the real controllers) deletes the idle one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_in_removes_the_idle_server_first() {
    let mut cp = start_control_plane().await;
    cp.start_controller_manager(&["deployment-controller", "replicaset-controller"])
        .unwrap_or_else(|e| panic!("kube-controller-manager: {e}"));
    let running = install_and_run(cp, Mode::Standalone).await;
    let admin = running.cp.client();
    let flags = running.dir.path().join("idle");
    std::fs::create_dir_all(&flags).unwrap();

    let mut docs = recipe("idle-deletion-cost.yaml");
    assert_eq!(docs.len(), 2);
    // Each server's /idle.sh, here: idle while the test's flag file for that pod exists (the
    // sidecar runs exec probes locally in this harness, with the pod's name in its
    // environment).
    let script = format!("cat {}/$POD_NAME", flags.display());
    docs[0]["spec"]["probes"][0]["probe"]["exec"]["command"] = json!(["sh", "-c", script]);
    docs[1]["spec"]["template"]["spec"]["nodeName"] = json!("vk-1");
    apply(&running, &docs).await;

    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let servers = pods_of(&pods, "arena", 2).await;
    let names: Vec<String> = servers
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    let (idle, busy) = (&names[0], &names[1]);
    std::fs::write(flags.join(idle), "idle").unwrap();
    let mut sidecars = Vec::new();
    for pod in &servers {
        let name = pod.metadata.name.as_deref().unwrap();
        let mut status = kubelet_status("arena");
        status["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .extend([
                json!({"type": "ContainersReady", "status": "True"}),
                json!({"type": "Ready", "status": "True"}),
            ]);
        pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(status))
            .await
            .unwrap();
        sidecars.push(run_injected_sidecar(&running, pod, "podprobe-sidecar").await);
    }
    for (name, cost) in [(idle, "-5"), (busy, "5")] {
        wait_pod(&pods, name, "the deletion cost", |p| {
            support::annotation(p, DELETION_COST).as_deref() == Some(cost)
        })
        .await;
    }

    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(admin.clone(), NS);
    deployments
        .patch(
            "arena",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    let deleted = wait_pod(&pods, idle, "the idle server deleted", |p| {
        p.metadata.deletion_timestamp.is_some()
    })
    .await;
    assert_eq!(
        support::annotation(&deleted, DELETION_COST).as_deref(),
        Some("-5")
    );
    let kept = pods.get(busy).await.unwrap();
    assert!(
        kept.metadata.deletion_timestamp.is_none(),
        "the busy server stays"
    );
    running.manager.shutdown().await;
}
