//! Verbs, subresource rules, preconditions and error paths through the real
//! kube-rs client.

mod common;

use std::collections::BTreeMap;

use common::{pod, raw, status_of};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{ApiServer, Rule};

fn conditions(p: &Pod) -> Vec<(String, String)> {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect()
}

async fn setup() -> (ApiServer, Api<Pod>) {
    let api = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(api.client(), "default");
    (api, pods)
}

async fn with_conditions(api: &ApiServer, pods: &Api<Pod>, name: &str) -> Pod {
    pods.create(&PostParams::default(), &pod(name, json!({"app": "web"})))
        .await
        .unwrap();
    api.update_pod_status("default", name, |s| {
        s.conditions = Some(
            serde_json::from_value(json!([
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "False"},
                {"type": "ContainersReady", "status": "False"}
            ]))
            .unwrap(),
        );
    })
    .unwrap()
}

#[tokio::test]
async fn create_sets_system_metadata_and_resets_pod_status() {
    let (api, pods) = setup().await;
    let mut p = pod("a", json!({}));
    p.status = Some(serde_json::from_value(json!({"phase": "Running"})).unwrap());
    let rv0 = api.resource_version();
    let created = pods.create(&PostParams::default(), &p).await.unwrap();
    let m = &created.metadata;
    assert!(m.uid.as_ref().is_some_and(|u| u.len() == 36));
    assert!(m.creation_timestamp.is_some());
    assert_eq!(m.generation, Some(1));
    assert_eq!(m.resource_version, Some((rv0 + 1).to_string()));
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));
    let e = pods.create(&PostParams::default(), &p).await.unwrap_err();
    assert_eq!(
        status_of(e),
        (
            409,
            "AlreadyExists".into(),
            "pods \"a\" already exists".into()
        )
    );
}

#[tokio::test]
async fn get_missing_is_404_and_missing_namespace_is_404() {
    let (api, pods) = setup().await;
    let e = pods.get("nope").await.unwrap_err();
    assert_eq!(
        status_of(e),
        (404, "NotFound".into(), "pods \"nope\" not found".into())
    );
    let other: Api<Pod> = Api::namespaced(api.client(), "ghost");
    let mut p = pod("a", json!({}));
    p.metadata.namespace = None;
    let e = other.create(&PostParams::default(), &p).await.unwrap_err();
    assert_eq!(
        status_of(e),
        (
            404,
            "NotFound".into(),
            "namespaces \"ghost\" not found".into()
        )
    );
}

#[tokio::test]
async fn strategic_status_patch_keeps_other_conditions() {
    let (api, pods) = setup().await;
    let p = with_conditions(&api, &pods, "a").await;
    let uid = p.metadata.uid.clone().unwrap();
    let out = pods
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"uid": uid},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(
        conditions(&out),
        vec![
            ("PodScheduled".into(), "True".into()),
            ("Ready".into(), "True".into()),
            ("ContainersReady".into(), "False".into())
        ]
    );
}

#[tokio::test]
async fn merge_status_patch_replaces_the_condition_list() {
    let (api, pods) = setup().await;
    with_conditions(&api, &pods, "a").await;
    let out = pods
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(conditions(&out), vec![("Ready".into(), "True".into())]);
}

#[tokio::test]
async fn a_differing_uid_in_a_patch_is_422_as_kube_apiserver_answers_it() {
    // A PATCH carries no preconditions: kube-apiserver (v1.37, tests/real_sidecar.rs) refuses
    // the uid it sets as a change of an immutable field.
    let (api, pods) = setup().await;
    with_conditions(&api, &pods, "a").await;
    let rv = api.resource_version();
    let e = pods
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"metadata": {"uid": "00000000-0000-4000-8000-000000000000"},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            ),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = &e else {
        panic!("{e:?}")
    };
    assert!(names_the_uid_field(status), "{status:?}");
    let (code, reason, msg) = status_of(e);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(
        msg,
        "Pod \"a\" is invalid: metadata.uid: Invalid value: \"00000000-0000-4000-8000-000000000000\": field is immutable"
    );
    assert_eq!(api.resource_version(), rv, "nothing written");
}

/// The cause names the field, which is how clients tell this 422 from others.
fn names_the_uid_field(status: &kube::core::Status) -> bool {
    status
        .details
        .as_ref()
        .is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"))
}

#[tokio::test]
async fn a_differing_uid_in_a_put_is_a_409_precondition() {
    let (api, pods) = setup().await;
    with_conditions(&api, &pods, "a").await;
    let mut pod = pods.get("a").await.unwrap();
    pod.metadata.uid = Some("00000000-0000-4000-8000-000000000000".into());
    let rv = api.resource_version();
    let e = pods
        .replace("a", &Default::default(), &pod)
        .await
        .unwrap_err();
    let (code, reason, msg) = status_of(e);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert!(
        msg.starts_with(
            "Operation cannot be fulfilled on pods \"a\": StorageError: invalid object"
        ) && msg.contains(
            "Precondition failed: UID in precondition: 00000000-0000-4000-8000-000000000000"
        ),
        "{msg}"
    );
    assert_eq!(api.resource_version(), rv, "nothing written");
}

#[tokio::test]
async fn an_unqualified_condition_type_refuses_the_whole_status_update() {
    let (api, pods) = setup().await;
    with_conditions(&api, &pods, "a").await;
    let rv = api.resource_version();
    let e = pods
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [
                {"type": "game.kruise.io/fine", "status": "True"},
                {"type": "not a qualified name!", "status": "True"}
            ]}})),
        )
        .await
        .unwrap_err();
    let (code, reason, msg) = status_of(e);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    // Word for word what kube-apiserver v1.37 answered (tests/real_sidecar.rs); new items of
    // a strategic merge come before the pod's existing conditions.
    assert_eq!(
        msg,
        "Pod \"a\" is invalid: status.conditions[1].Type: Invalid value: \"not a qualified name!\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
    );
    assert_eq!(api.resource_version(), rv, "nothing written");
}

#[tokio::test]
async fn stale_resource_version_is_409_for_update_and_patch() {
    let (_api, pods) = setup().await;
    let p = pods
        .create(&PostParams::default(), &pod("a", json!({})))
        .await
        .unwrap();
    let mut fresh = p.clone();
    fresh.metadata.labels = Some(BTreeMap::from([("x".into(), "1".into())]));
    pods.replace("a", &PostParams::default(), &fresh)
        .await
        .unwrap();
    let mut stale = p.clone();
    stale.metadata.labels = Some(BTreeMap::from([("x".into(), "2".into())]));
    let e = pods
        .replace("a", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(
        status_of(e),
        (
            409,
            "Conflict".into(),
            "Operation cannot be fulfilled on pods \"a\": the object has been modified; please apply your changes to the latest version and try again".into()
        )
    );
    let e = pods
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": p.metadata.resource_version}})),
        )
        .await
        .unwrap_err();
    assert_eq!(status_of(e).0, 409);
}

#[tokio::test]
async fn pods_status_keeps_spec_and_owners_but_takes_labels() {
    let (api, pods) = setup().await;
    let mut p = pod("a", json!({"app": "web"}));
    p.metadata.owner_references = Some(
        serde_json::from_value(
            json!([{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "u1"}]),
        )
        .unwrap(),
    );
    pods.create(&PostParams::default(), &p).await.unwrap();
    let out = pods
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"labels": {"app": "changed"}, "ownerReferences": null},
                "spec": {"nodeName": "elsewhere"},
                "status": {"phase": "Running"}
            })),
        )
        .await
        .unwrap();
    assert_eq!(out.metadata.labels.unwrap()["app"], "changed");
    assert_eq!(out.metadata.owner_references.unwrap()[0].uid, "u1");
    assert_eq!(out.spec.unwrap().node_name.as_deref(), Some("n1"));
    assert_eq!(out.status.unwrap().phase.as_deref(), Some("Running"));
    let _ = api;
}

#[tokio::test]
async fn main_pod_endpoint_ignores_status_and_refuses_spec_changes() {
    let (_api, pods) = setup().await;
    pods.create(&PostParams::default(), &pod("a", json!({})))
        .await
        .unwrap();
    let out = pods
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"l": "1"}}, "status": {"phase": "Running"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(out.status.unwrap().phase.as_deref(), Some("Pending"));
    assert_eq!(out.metadata.labels.unwrap()["l"], "1");
    // Image changes are allowed and bump generation.
    let out = pods
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"containers": [{"name": "app", "image": "app:2"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(out.metadata.generation, Some(2));
    let e = pods
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": "n2"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(status_of(e).0, 422);
}

#[tokio::test]
async fn unknown_patch_type_is_415() {
    let (api, pods) = setup().await;
    pods.create(&PostParams::default(), &pod("a", json!({})))
        .await
        .unwrap();
    let (code, _, body) = raw(
        &api.client(),
        "PATCH",
        "/api/v1/namespaces/default/pods/a",
        "application/x-yaml",
        "{}",
    )
    .await;
    assert_eq!(code, 415);
    assert_eq!(body["reason"], "UnsupportedMediaType");
    assert_eq!(body["kind"], "Status");
}

#[tokio::test]
async fn list_with_label_and_field_selectors() {
    let (api, pods) = setup().await;
    for (n, app) in [("a", "web"), ("b", "db"), ("c", "cache")] {
        pods.create(&PostParams::default(), &pod(n, json!({"app": app})))
            .await
            .unwrap();
    }
    let names = |l: kube::core::ObjectList<Pod>| {
        l.items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect::<Vec<_>>()
    };
    let l = pods
        .list(&ListParams::default().labels("app in (web,db)"))
        .await
        .unwrap();
    assert_eq!(names(l), ["a", "b"]);
    let l = pods
        .list(&ListParams::default().labels("app notin (web),app"))
        .await
        .unwrap();
    assert_eq!(names(l), ["b", "c"]);
    let l = pods
        .list(&ListParams::default().fields("metadata.name=c,spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(names(l), ["c"]);
    let l = pods.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        l.metadata.resource_version,
        Some(api.resource_version().to_string())
    );
    let e = pods
        .list(&ListParams::default().fields("status.foo=x"))
        .await
        .unwrap_err();
    assert_eq!(status_of(e).0, 400);
    // Pagination: a consistent snapshot across pages.
    let p1 = pods.list(&ListParams::default().limit(2)).await.unwrap();
    let token = p1.metadata.continue_.clone().unwrap();
    pods.create(&PostParams::default(), &pod("d", json!({})))
        .await
        .unwrap();
    let p2 = pods
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(p1), ["a", "b"]);
    assert_eq!(names(p2), ["c"]);
}

#[tokio::test]
async fn delete_with_finalizers_marks_then_removing_the_last_one_deletes() {
    let api = ApiServer::start().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(api.client(), "default");
    let l: Lease = serde_json::from_value(
        json!({"metadata": {"name": "l", "finalizers": ["a/b"]}, "spec": {"holderIdentity": "x"}}),
    )
    .unwrap();
    leases.create(&PostParams::default(), &l).await.unwrap();
    let res = leases.delete("l", &DeleteParams::default()).await.unwrap();
    let marked = res.left().expect("object still there");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert!(leases.get("l").await.is_ok());
    // No new finalizers on an object being deleted.
    let e = leases
        .patch(
            "l",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["a/b", "c/d"]}})),
        )
        .await
        .unwrap_err();
    assert_eq!(status_of(e).0, 422);
    leases
        .patch(
            "l",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert_eq!(status_of(leases.get("l").await.unwrap_err()).0, 404);
}

#[tokio::test]
async fn pod_deletion_waits_for_the_kubelet_unless_grace_is_zero() {
    let (api, pods) = setup().await;
    pods.create(&PostParams::default(), &pod("a", json!({})))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("b", json!({})))
        .await
        .unwrap();
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    let a = pods.get("a").await.unwrap();
    assert!(a.metadata.deletion_timestamp.is_some());
    assert_eq!(a.metadata.deletion_grace_period_seconds, Some(30));
    api.finish_pod_deletion("default", "a").unwrap();
    assert_eq!(status_of(pods.get("a").await.unwrap_err()).0, 404);
    pods.delete("b", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert_eq!(status_of(pods.get("b").await.unwrap_err()).0, 404);
    // Delete with a uid precondition that does not match.
    pods.create(&PostParams::default(), &pod("c", json!({})))
        .await
        .unwrap();
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("other".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let e = pods.delete("c", &dp).await.unwrap_err();
    assert_eq!(status_of(e).0, 409);
}

#[tokio::test]
async fn podprobemarker_status_subresource_and_generation() {
    let api = ApiServer::start().await.unwrap();
    let gvk = kube::api::GroupVersionKind::gvk("apps.kruise.io", "v1alpha1", "PodProbeMarker");
    let ar = kube::api::ApiResource::from_gvk(&gvk);
    let ppms: Api<kube::api::DynamicObject> = Api::namespaced_with(api.client(), "default", &ar);
    let obj: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "m"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "probes": []},
        "status": {"observedGeneration": 9}
    }))
    .unwrap();
    let m = ppms.create(&PostParams::default(), &obj).await.unwrap();
    assert!(m.data.get("status").is_none(), "status dropped on create");
    assert_eq!(m.metadata.generation, Some(1));
    // Main endpoint: status ignored, spec change bumps generation.
    let m = ppms
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"probes": [{"name": "p"}]}, "status": {"observedGeneration": 1}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(m.metadata.generation, Some(2));
    assert!(m.data.get("status").is_none());
    // Status endpoint: only status changes; generation unchanged.
    let m = ppms
        .patch_status(
            "m",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"x": "y"}}, "spec": {"probes": []},
                                 "status": {"observedGeneration": 2}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(m.data["status"]["observedGeneration"], 2);
    assert_eq!(m.data["spec"]["probes"][0]["name"], "p");
    assert!(m.metadata.labels.is_none());
    assert_eq!(m.metadata.generation, Some(2));
    // Label changes do not bump generation.
    let m = ppms
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(m.metadata.generation, Some(2));
    // Strategic merge on a custom resource: 415 like the real server.
    let e = ppms
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {}})),
        )
        .await
        .unwrap_err();
    assert_eq!(status_of(e).0, 415);
}

#[tokio::test]
async fn events_through_the_recorder_and_core_v1() {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let (api, pods) = setup().await;
    let p = pods
        .create(&PostParams::default(), &pod("a", json!({})))
        .await
        .unwrap();
    let rec = Recorder::new(api.client(), Reporter::from("podprobe"));
    let ev = Event {
        type_: EventType::Normal,
        reason: "ProbeSucceeded".into(),
        note: Some("ok".into()),
        action: "Probe".into(),
        secondary: None,
    };
    let reference = kube::Resource::object_ref(&p, &());
    rec.publish(&ev, &reference).await.unwrap();
    rec.publish(&ev, &reference).await.unwrap(); // second: a merge patch of the series
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(api.client(), "default");
    let list = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(
        api.journal()
            .count("POST", "events.k8s.io/v1/namespaces/default/events"),
        1
    );
    assert_eq!(api.journal().count("PATCH", "/events"), 1);
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(api.client(), "default");
    let e: k8s_openapi::api::core::v1::Event = serde_json::from_value(json!({
        "metadata": {"name": "e1"}, "involvedObject": {"kind": "Pod", "name": "a", "namespace": "default"},
        "reason": "R", "message": "m", "type": "Normal"
    }))
    .unwrap();
    core.create(&PostParams::default(), &e).await.unwrap();
    let l = core
        .list(&ListParams::default().fields("involvedObject.name=a"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);
}

#[tokio::test]
async fn cluster_scoped_nodes_and_namespaces() {
    let api = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(api.client());
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "n1"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}}))
    .unwrap();
    nodes.create(&PostParams::default(), &n).await.unwrap();
    assert!(nodes.get("n1").await.is_ok());
    let nss: Api<Namespace> = Api::all(api.client());
    let names: Vec<String> = nss
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| n.metadata.name.unwrap())
        .collect();
    assert!(names.contains(&"default".to_string()) && names.contains(&"kube-system".to_string()));
    api.create_namespace("team").unwrap();
    let pods: Api<Pod> = Api::namespaced(api.client(), "team");
    let mut p = pod("a", json!({}));
    p.metadata.namespace = None;
    pods.create(&PostParams::default(), &p).await.unwrap();
    let all: Api<Pod> = Api::all(api.client());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
}

#[tokio::test]
async fn auth_tokens_rules_401_and_403() {
    let (api, pods) = setup().await;
    pods.create(&PostParams::default(), &pod("a", json!({})))
        .await
        .unwrap();
    api.add_token(
        "sidecar-token",
        "system:serviceaccount:default:podprobe",
        BTreeMap::from([(
            "authentication.kubernetes.io/pod-name".to_string(),
            vec!["a".to_string()],
        )]),
    );
    api.allow(
        Rule::new(&["get", "patch"], &["pods/status", "pods"])
            .user("system:serviceaccount:default:podprobe"),
    );
    let sidecar: Api<Pod> = Api::namespaced(api.client_for_token("sidecar-token"), "default");
    assert!(sidecar.get("a").await.is_ok());
    sidecar
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    let e = sidecar
        .delete("a", &DeleteParams::default())
        .await
        .unwrap_err();
    let (code, reason, msg) = status_of(e);
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        msg,
        "pods \"a\" is forbidden: User \"system:serviceaccount:default:podprobe\" cannot delete resource \"pods\" in API group \"\" in the namespace \"default\""
    );
    let unknown: Api<Pod> = Api::namespaced(api.client_for_token("bogus"), "default");
    assert_eq!(status_of(unknown.get("a").await.unwrap_err()).0, 401);
    let e = api.journal().entries();
    assert!(
        e.iter()
            .any(|e| e.user == "system:serviceaccount:default:podprobe")
    );
}

#[tokio::test]
async fn set_object_and_update_pod_status_emit_writes() {
    let (api, pods) = setup().await;
    pods.create(&PostParams::default(), &pod("a", json!({})))
        .await
        .unwrap();
    let rv = api.resource_version();
    let p = api
        .update_pod_status("default", "a", |s| {
            s.pod_ip = Some("10.0.0.7".into());
            s.phase = Some("Running".into());
        })
        .unwrap();
    assert_eq!(p.metadata.resource_version, Some((rv + 1).to_string()));
    let got = pods.get("a").await.unwrap();
    assert_eq!(got.status.unwrap().pod_ip.as_deref(), Some("10.0.0.7"));
    let stored: Pod = api.get("default", "a").unwrap();
    assert_eq!(stored.metadata.uid, got.metadata.uid);
}

#[tokio::test]
async fn more_error_paths() {
    let (api, pods) = setup().await;
    pods.create(&PostParams::default(), &pod("a", json!({})))
        .await
        .unwrap();
    let c = api.client();
    // A verb the resource path does not take.
    let (code, _, body) = raw(
        &c,
        "PUT",
        "/api/v1/namespaces/default/pods",
        "application/json",
        "{}",
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (405, Some("MethodNotAllowed"))
    );
    // An unknown resource.
    let (code, _, _) = raw(&c, "GET", "/api/v1/namespaces/default/widgets", "", "").await;
    assert_eq!(code, 404);
    // The body's namespace differs from the URL's.
    let mut other = pod("b", json!({}));
    other.metadata.namespace = Some("kube-system".into());
    let e = pods
        .create(&PostParams::default(), &other)
        .await
        .unwrap_err();
    assert_eq!(status_of(e).0, 400);
    // dryRun is refused rather than silently persisted.
    let e = pods
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &pod("c", json!({})),
        )
        .await
        .unwrap_err();
    assert_eq!(status_of(e).0, 400);
    assert_eq!(status_of(pods.get("c").await.unwrap_err()).0, 404);
    // A custom resource update without a resourceVersion is 422.
    let (code, _, _) = raw(
        &c,
        "POST",
        "/apis/apps.kruise.io/v1alpha1/namespaces/default/podprobemarkers",
        "application/json",
        r#"{"apiVersion":"apps.kruise.io/v1alpha1","kind":"PodProbeMarker","metadata":{"name":"m"},"spec":{}}"#,
    )
    .await;
    assert_eq!(code, 201);
    let (code, _, body) = raw(
        &c,
        "PUT",
        "/apis/apps.kruise.io/v1alpha1/namespaces/default/podprobemarkers/m",
        "application/json",
        r#"{"apiVersion":"apps.kruise.io/v1alpha1","kind":"PodProbeMarker","metadata":{"name":"m"},"spec":{"x":1}}"#,
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (422, Some("Invalid")));
    // A delete whose resourceVersion precondition is stale.
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: None,
            resource_version: Some("1".into()),
        }),
        ..Default::default()
    };
    let e = pods.delete("a", &dp).await.unwrap_err();
    let (code, _, msg) = status_of(e);
    assert_eq!(code, 409);
    assert!(
        msg.contains("Precondition failed: ResourceVersion in precondition: 1"),
        "{msg}"
    );
    // A body that is not JSON.
    let (code, _, _) = raw(
        &c,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        "{nope",
    )
    .await;
    assert_eq!(code, 400);
}

#[tokio::test]
async fn lease_takeover_race_has_one_winner() {
    let api = ApiServer::start().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(api.client(), "default");
    let l: Lease = serde_json::from_value(json!({"metadata": {"name": "podprobe-manager"},
        "spec": {"holderIdentity": "old", "leaseDurationSeconds": 15,
                 "renewTime": "2026-01-01T00:00:00.000000Z"}}))
    .unwrap();
    leases.create(&PostParams::default(), &l).await.unwrap();
    let seen = leases.get("podprobe-manager").await.unwrap();
    let take = |who: &'static str| {
        let leases = leases.clone();
        let mut mine = seen.clone();
        async move {
            mine.spec.as_mut().unwrap().holder_identity = Some(who.into());
            leases
                .replace("podprobe-manager", &PostParams::default(), &mine)
                .await
        }
    };
    let (a, b) = tokio::join!(take("a"), take("b"));
    assert!(a.is_ok() != b.is_ok(), "exactly one candidate wins");
    let loser = a.err().or(b.err()).unwrap();
    assert_eq!(status_of(loser).0, 409);
    let now = leases.get("podprobe-manager").await.unwrap();
    assert_ne!(now.spec.unwrap().holder_identity.as_deref(), Some("old"));
}

#[tokio::test]
async fn namespace_deletion_terminates_then_goes_when_empty() {
    let api = ApiServer::start().await.unwrap();
    api.create_namespace("team").unwrap();
    let pods: Api<Pod> = Api::namespaced(api.client(), "team");
    let leases: Api<Lease> = Api::namespaced(api.client(), "team");
    let mut p = pod("a", json!({}));
    p.metadata.namespace = None;
    pods.create(&PostParams::default(), &p).await.unwrap();
    let l: Lease = serde_json::from_value(json!({"metadata": {"name": "l"}})).unwrap();
    leases.create(&PostParams::default(), &l).await.unwrap();
    let nss: Api<Namespace> = Api::all(api.client());
    nss.delete("team", &DeleteParams::default()).await.unwrap();
    let ns = nss.get("team").await.unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Terminating"));
    assert_eq!(status_of(leases.get("l").await.unwrap_err()).0, 404);
    assert!(
        pods.get("a")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    let e = leases.create(&PostParams::default(), &l).await.unwrap_err();
    let (code, _, msg) = status_of(e);
    assert_eq!(code, 403);
    assert!(msg.ends_with("because it is being terminated"), "{msg}");
    api.finish_pod_deletion("team", "a").unwrap();
    assert_eq!(status_of(nss.get("team").await.unwrap_err()).0, 404);
}
