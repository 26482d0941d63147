//! The differential: the same steps against testkit's in-process server and a real
//! kube-apiserver (`testkit::real`), through kube-rs, for what podprobe relies on. Each step
//! returns what a client observes; the two backends must observe the same. A difference is
//! fixed in testkit or listed in the README.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event as EventV1;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client};
use serde_json::json;
use testkit::ApiServer;
use testkit::real::ControlPlane;

const NS: &str = "games";

struct Backends {
    fake: ApiServer,
    real: ControlPlane,
}

async fn backends() -> Backends {
    let fake = ApiServer::start().await.unwrap();
    fake.create_namespace(NS).unwrap();
    let real = ControlPlane::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    real.create_namespace(NS).await.unwrap();
    Backends { fake, real }
}

/// A pod on a node with the kubelet's three conditions, created through the API.
async fn pod(client: &Client, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "game"}},
        "spec": {"nodeName": "vk-1", "containers": [{"name": "main", "image": "game:1"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let status = json!({"status": {"conditions": [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "False"},
        {"type": "ContainersReady", "status": "False"}
    ]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(&status))
        .await
        .unwrap()
}

/// (code, reason, message) of a refusal, or (200, "", "") when accepted.
fn answer<T>(result: Result<T, kube::Error>) -> (u16, String, String) {
    match result {
        Ok(_) => (200, String::new(), String::new()),
        Err(kube::Error::Api(s)) => (s.code, s.reason.clone(), s.message.clone()),
        Err(e) => panic!("{e}"),
    }
}

/// Everything a client sees of podprobe's status writes and their refusals.
async fn status_writes(client: &Client) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let created = pod(client, "a").await;
    let uid = created.metadata.uid.clone().unwrap();
    let mut seen = Vec::new();
    let write = async |patch: serde_json::Value| {
        let result = pods
            .patch_status("a", &PatchParams::default(), &Patch::Strategic(&patch))
            .await;
        format!("{:?}", answer(result))
    };
    // Merge by type: one changed, one added, the rest kept, in order.
    seen.push(
        write(json!({"metadata": {"uid": uid}, "status": {"conditions": [
            {"type": "Ready", "status": "True"}, {"type": "game.kruise.io/idle", "status": "True"}
        ]}}))
        .await,
    );
    seen.push(conditions_of(&pods, "a").await);
    // The uid guard of a replaced pod.
    seen.push(
        write(
            json!({"metadata": {"uid": "00000000-0000-4000-8000-000000000000"},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
        )
        .await,
    );
    // An unqualified condition type refuses the whole update.
    seen.push(
        write(json!({"status": {"conditions": [
            {"type": "game.kruise.io/fine", "status": "True"},
            {"type": "not a qualified name!", "status": "True"}
        ]}}))
        .await,
    );
    // Removing one condition with the strategic-merge directive.
    seen.push(
        write(json!({"status": {"conditions": [
            {"type": "game.kruise.io/idle", "$patch": "delete"}
        ]}}))
        .await,
    );
    seen.push(conditions_of(&pods, "a").await);
    // A set and a delete in one list, as podprobe's writer sends them.
    seen.push(
        write(json!({"metadata": {"uid": uid}, "status": {"conditions": [
            {"type": "game.kruise.io/b", "status": "True"},
            {"type": "Ready", "$patch": "delete"}
        ]}}))
        .await,
    );
    seen.push(conditions_of(&pods, "a").await);
    // A stale resourceVersion on a PUT.
    let mut stale = created.clone();
    stale.metadata.labels = Some([("app".to_owned(), "other".to_owned())].into());
    seen.push(format!(
        "{:?}",
        answer(pods.replace("a", &PostParams::default(), &stale).await)
    ));
    seen
}

/// The pod's conditions, in order.
async fn conditions_of(pods: &Api<Pod>, name: &str) -> String {
    let now = pods.get(name).await.unwrap();
    let conditions: Vec<(String, String)> = now
        .status
        .unwrap()
        .conditions
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect();
    format!("{conditions:?}")
}

/// What the sidecar's pod watch and reads see: a field-selected list.
async fn field_selected(client: &Client) -> Vec<String> {
    pod(client, "b").await;
    pod(client, "c").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let list = pods
        .list(&ListParams::default().fields("metadata.name=b"))
        .await
        .unwrap();
    list.items
        .into_iter()
        .map(|p| p.metadata.name.unwrap())
        .collect()
}

/// An event as podprobe's Recorder publishes it, read back through events.k8s.io/v1.
async fn recorded_event(client: &Client) -> Vec<String> {
    let pod = pod(client, "e").await;
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: pod.metadata.name.clone(),
        namespace: Some(NS.into()),
        uid: pod.metadata.uid.clone(),
        ..Default::default()
    };
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "podprobe".into(),
            instance: Some("e".into()),
        },
    );
    let event = Event {
        type_: EventType::Normal,
        reason: "KruiseProbeSucceeded".into(),
        note: Some("probe idle (game.kruise.io/idle): idle".into()),
        action: "Probe".into(),
        secondary: None,
    };
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();
    let events: Api<EventV1> = Api::namespaced(client.clone(), NS);
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| {
            format!(
                "{:?} {:?} {:?} {:?} {:?} series={:?}",
                e.reason,
                e.action,
                e.reporting_controller,
                e.regarding.and_then(|r| r.name),
                e.type_,
                e.series.map(|s| s.count)
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testkit_and_kube_apiserver_answer_the_same() {
    let Backends { fake, real } = backends().await;
    let (fake, real) = (fake.client(), real.client());
    assert_eq!(status_writes(&fake).await, status_writes(&real).await);
    assert_eq!(field_selected(&fake).await, field_selected(&real).await);
    assert_eq!(recorded_event(&fake).await, recorded_event(&real).await);
}
