use super::by_node::ServerlessNodes;
use super::written::PENDING_MAX;
use super::*;
use crate::annotate;
use crate::markers::MarkerPatch;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use podprobe_protocol::annotation::{MARKER_LIST_ANNOTATION, PODPROBE_ANNOTATION};
use serde_json::json;

const PODPROBE: &str = PODPROBE_ANNOTATION;
const LIST: &str = MARKER_LIST_ANNOTATION;

fn ppm() -> PodProbeMarker {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1",
        "kind": "PodProbeMarker",
        "metadata": {"name": "ppm-test", "namespace": "test"},
        "spec": {
            "selector": {"matchLabels": {"app": "test"}},
            "probes": [{
                "name": "healthy",
                "containerName": "main",
                "probe": {"exec": {"command": ["/healthy.sh"]}},
                "podConditionType": "game.kruise.io/healthy",
                "markerPolicy": [
                    {"state": "Succeeded", "labels": {"server-healthy": "true"}},
                    {"state": "Failed", "labels": {"server-healthy": "false"}}
                ]
            }]
        }
    }))
    .unwrap()
}

fn node(labels: serde_json::Value) -> Node {
    serde_json::from_value(json!({"metadata": {"name": "n", "labels": labels}})).unwrap()
}

fn vk() -> Node {
    node(json!({"type": "virtual-kubelet"}))
}

/// A running pod `app=<app>` on node `n` with condition healthy=`healthy` (None: no
/// condition), plus `labels` and `annotations`.
fn pod(
    app: &str,
    healthy: Option<&str>,
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> Pod {
    let mut l = BTreeMap::from([("app".to_owned(), app.to_owned())]);
    l.extend(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let a: BTreeMap<String, String> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let conditions: Vec<_> = healthy
        .map(|s| json!({"type": "game.kruise.io/healthy", "status": s}))
        .into_iter()
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "test", "uid": "uid-p", "resourceVersion": "1",
                     "labels": l, "annotations": a},
        "spec": {"nodeName": "n", "containers": [{"name": "main", "image": "game:1"}]},
        "status": {"phase": "Running", "conditions": conditions}
    }))
    .unwrap()
}

/// The two annotations the PPM gives an `app=test` pod.
fn wanted_annotations() -> (String, String) {
    let a = annotate::compute(&pod("test", None, &[], &[]), &[ppm()]).unwrap();
    (a.probes, a.marker_list)
}

fn set(v: &str) -> Option<String> {
    Some(v.to_owned())
}

#[test]
fn one_patch_carries_markers_and_propagated_annotations() {
    let (probes, list) = wanted_annotations();
    let p = pod("test", Some("False"), &[], &[]);
    let patch = desired_patch(&p, &[ppm()], Some(&vk()), &MarkerScope::default()).unwrap();
    assert_eq!(
        patch.metadata.annotations,
        BTreeMap::from([
            (PODPROBE.to_owned(), Some(probes)),
            (LIST.to_owned(), Some(list))
        ])
    );
    assert_eq!(
        patch.metadata.labels,
        BTreeMap::from([("server-healthy".to_owned(), set("false"))])
    );
}

#[test]
fn nothing_differs_no_patch() {
    let (probes, list) = wanted_annotations();
    let p = pod(
        "test",
        Some("True"),
        &[("server-healthy", "true")],
        &[(PODPROBE, &probes), (LIST, &list)],
    );
    assert_eq!(
        desired_patch(&p, &[ppm()], Some(&vk()), &MarkerScope::default()),
        None
    );
}

#[test]
fn markers_only_on_serverless_nodes_or_with_the_sidecar() {
    let (probes, list) = wanted_annotations();
    let p = pod(
        "test",
        Some("True"),
        &[],
        &[(PODPROBE, &probes), (LIST, &list)],
    );
    let scope = MarkerScope::default();
    let plain = node(json!({"type": "normal"}));
    assert_eq!(desired_patch(&p, &[ppm()], Some(&plain), &scope), None);
    assert_eq!(desired_patch(&p, &[ppm()], None, &scope), None);
    let marked = desired_patch(&p, &[ppm()], Some(&vk()), &scope).unwrap();
    assert_eq!(marked.metadata.labels["server-healthy"], set("true"));
    let with = |container: serde_json::Value| {
        let mut p = p.clone();
        let container = serde_json::from_value(container).unwrap();
        p.spec.as_mut().unwrap().containers.push(container);
        p
    };
    let with_sidecar = with(json!({"name": "podprobe", "image": "registry.example/pp:1"}));
    assert!(desired_patch(&with_sidecar, &[ppm()], Some(&plain), &scope).is_some());
    let lookalike = with(json!({"name": "tools", "image": "podprobe:1"}));
    assert_eq!(
        desired_patch(&lookalike, &[ppm()], Some(&plain), &scope),
        None
    );
}

#[test]
fn patch_body_has_the_uid_precondition() {
    let p = pod("test", Some("False"), &[], &[]);
    let patch = desired_patch(&p, &[ppm()], Some(&vk()), &MarkerScope::default()).unwrap();
    let body = patch_body(&p.metadata, &patch);
    assert_eq!(body["metadata"]["uid"], "uid-p");
    assert_eq!(body["metadata"]["labels"]["server-healthy"], "false");
}

#[test]
fn no_ppm_applies_both_annotations_go() {
    let (probes, list) = wanted_annotations();
    // Labels no longer match the PPM; it is still the one named in the list annotation.
    let p = pod(
        "other",
        Some("True"),
        &[],
        &[(PODPROBE, &probes), (LIST, &list)],
    );
    let patch = desired_patch(&p, &[ppm()], Some(&vk()), &MarkerScope::default()).unwrap();
    assert_eq!(
        patch.metadata.annotations,
        BTreeMap::from([(PODPROBE.to_owned(), None), (LIST.to_owned(), None)])
    );
    assert!(patch.metadata.labels.is_empty(), "{patch:?}");
    // PPM deleted: the same.
    let patch = desired_patch(&p, &[], Some(&vk()), &MarkerScope::default()).unwrap();
    assert_eq!(
        patch.metadata.annotations,
        BTreeMap::from([(PODPROBE.to_owned(), None), (LIST.to_owned(), None)])
    );
    assert_eq!(
        patch_body(&p.metadata, &patch)["metadata"]["annotations"][PODPROBE],
        json!(null)
    );
}

#[test]
fn hand_written_podprobe_annotation_is_never_touched() {
    let by_hand = r#"[{"name":"mine","containerName":"main","podConditionType":"x"}]"#;
    for ppms in [vec![ppm()], vec![]] {
        let p = pod("test", None, &[], &[(PODPROBE, by_hand)]);
        assert_eq!(
            desired_patch(&p, &ppms, Some(&vk()), &MarkerScope::default()),
            None
        );
        let p = pod("other", None, &[], &[(PODPROBE, by_hand)]);
        assert_eq!(
            desired_patch(&p, &ppms, Some(&vk()), &MarkerScope::default()),
            None
        );
    }
    // Markers still follow the conditions, the annotation stays.
    let p = pod("test", Some("True"), &[], &[(PODPROBE, by_hand)]);
    let patch = desired_patch(&p, &[ppm()], Some(&vk()), &MarkerScope::default()).unwrap();
    assert!(patch.metadata.annotations.is_empty(), "{patch:?}");
}

#[test]
fn inactive_pods_get_nothing() {
    let mut p = pod("test", Some("True"), &[], &[]);
    p.status.as_mut().unwrap().phase = Some("Succeeded".into());
    assert_eq!(
        desired_patch(&p, &[ppm()], Some(&vk()), &MarkerScope::default()),
        None
    );
}

fn label_patch(v: &str) -> MarkerPatch {
    let mut patch = MarkerPatch::default();
    patch
        .metadata
        .labels
        .insert("server-healthy".into(), set(v));
    patch
}

fn with_rv(p: impl Into<CachedPod>, rv: &str) -> CachedPod {
    let mut p = p.into();
    p.metadata.resource_version = Some(rv.into());
    p
}

#[test]
fn written_patch_is_not_repeated_from_an_older_cached_pod() {
    let written = WrittenPatches::default();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let stale = with_rv(
        pod("test", Some("False"), &[("server-healthy", "true")], &[]),
        "5",
    );
    let r = ObjectRef::from_obj(&stale);
    assert!(!written.is_stale(&r, &stale, Some(&label_patch("false"))));
    written.record(r.clone(), label_patch("false"), Some("6".into()));
    // Same view, same patch: nothing to send, nothing to recheck.
    assert!(written.is_stale(&r, &stale, Some(&label_patch("false"))));
    // The watch delivers the patched version: forgotten, no recheck.
    let fresh = with_rv(
        pod("test", Some("False"), &[("server-healthy", "false")], &[]),
        "6",
    );
    written.observe(&Event::Apply(fresh.clone()), &tx);
    assert!(written.is_empty());
    assert!(rx.try_recv().is_err());
    assert!(!written.is_stale(&r, &fresh, None));
}

#[test]
fn a_different_wish_from_an_older_pod_is_rechecked_once_the_cache_catches_up() {
    let written = WrittenPatches::default();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let stale = with_rv(pod("test", Some("False"), &[], &[]), "5");
    let r = ObjectRef::from_obj(&stale);
    written.record(r.clone(), label_patch("false"), Some("6".into()));
    assert!(written.is_stale(&r, &stale, Some(&label_patch("down"))));
    // An older version passing by changes nothing.
    written.observe(&Event::Apply(with_rv(stale.clone(), "5")), &tx);
    assert!(rx.try_recv().is_err());
    written.observe(&Event::Apply(with_rv(stale.clone(), "6")), &tx);
    assert_eq!(rx.try_recv().unwrap(), r);
    assert!(written.is_empty());
}

#[test]
fn written_patches_end_with_the_pod_a_relist_or_a_cache_already_current() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let p = with_rv(pod("test", None, &[], &[]), "5");
    let r = ObjectRef::from_obj(&p);
    let written = WrittenPatches::default();
    written.record(r.clone(), label_patch("false"), Some("6".into()));
    written.observe(&Event::Delete(p.clone()), &tx);
    assert!(written.is_empty());
    written.record(r.clone(), label_patch("false"), Some("6".into()));
    assert!(written.is_stale(&r, &p, None));
    written.observe(&Event::InitDone, &tx);
    assert!(written.is_empty());
    assert_eq!(
        rx.try_recv().unwrap(),
        r,
        "the stale view wanted something else"
    );
    // A patch that changed nothing keeps the version and has no event.
    written.record(r.clone(), label_patch("false"), Some("5".into()));
    assert!(!written.is_stale(&r, &p, Some(&label_patch("false"))));
    assert!(written.is_empty());
}

/// The race a real node showed once: the watch delivered our own write (6) before its answer
/// was recorded, the pod moved on (7) before any reconcile read it, and version 6 was never seen
/// again; every later reconcile waited for it, and a marker stayed wrong for minutes.
#[test]
fn a_write_seen_before_its_answer_holds_no_later_change_back() {
    let written = WrittenPatches::default();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let patched = with_rv(
        pod("test", Some("False"), &[("server-healthy", "false")], &[]),
        "6",
    );
    let r = ObjectRef::from_obj(&patched);
    written.observe(&Event::Apply(patched.clone()), &tx);
    written.record(r.clone(), label_patch("false"), Some("6".into()));
    let moved_on = with_rv(
        pod("test", Some("True"), &[("server-healthy", "false")], &[]),
        "8",
    );
    assert!(!written.is_stale(&r, &moved_on, Some(&label_patch("true"))));
    assert!(written.is_empty());
    assert!(rx.try_recv().is_err());
}

/// Versions that are not numbers only count when equal; an entry holds its pod back for
/// PENDING_MAX at most.
#[tokio::test(start_paused = true)]
async fn an_unseen_write_holds_its_pod_back_for_a_bounded_time() {
    let written = WrittenPatches::default();
    let p = with_rv(pod("test", None, &[], &[]), "b");
    let r = ObjectRef::from_obj(&p);
    written.record(r.clone(), label_patch("false"), Some("a".into()));
    assert!(written.is_stale(&r, &p, Some(&label_patch("true"))));
    tokio::time::advance(PENDING_MAX - std::time::Duration::from_millis(1)).await;
    assert!(written.is_stale(&r, &p, Some(&label_patch("true"))));
    tokio::time::advance(std::time::Duration::from_millis(1)).await;
    assert!(!written.is_stale(&r, &p, Some(&label_patch("true"))));
    assert!(written.is_empty());
}

fn on_node(name: &str, node: &str) -> CachedPod {
    let mut p = pod("test", None, &[], &[]);
    p.metadata.name = Some(name.into());
    p.spec.as_mut().unwrap().node_name = Some(node.into());
    p.into()
}

fn names(mut refs: Vec<ObjectRef<CachedPod>>) -> Vec<String> {
    refs.sort_by(|a, b| a.name.cmp(&b.name));
    refs.into_iter().map(|r| r.name).collect()
}

#[test]
fn pods_by_node_follows_the_pod_watch() {
    let index = PodsByNode::default();
    index.observe(&Event::Init);
    index.observe(&Event::InitApply(on_node("a", "n1")));
    index.observe(&Event::InitApply(on_node("b", "n1")));
    assert!(index.pods_on("n1").is_empty(), "a relist counts at its end");
    index.observe(&Event::InitDone);
    assert_eq!(names(index.pods_on("n1")), ["a", "b"]);
    index.observe(&Event::Apply(on_node("b", "n2")));
    index.observe(&Event::Apply(on_node("c", "n2")));
    assert_eq!(names(index.pods_on("n1")), ["a"]);
    assert_eq!(names(index.pods_on("n2")), ["b", "c"]);
    index.observe(&Event::Delete(on_node("c", "n2")));
    assert_eq!(names(index.pods_on("n2")), ["b"]);
    index.observe(&Event::Init);
    index.observe(&Event::InitApply(on_node("a", "n2")));
    index.observe(&Event::InitDone);
    assert!(index.pods_on("n1").is_empty());
    assert_eq!(names(index.pods_on("n2")), ["a"]);
}

fn named(name: &str, labels: serde_json::Value) -> Node {
    let mut n = node(labels);
    n.metadata.name = Some(name.into());
    n
}

#[test]
fn only_changes_of_serverlessness_are_node_triggers() {
    let scope = MarkerScope::default();
    let mut nodes = ServerlessNodes::default();
    let vk = json!({"type": "virtual-kubelet"});
    assert!(
        nodes
            .changed(&Event::Apply(named("n1", json!({}))), &scope)
            .is_empty()
    );
    assert_eq!(
        nodes.changed(&Event::Apply(named("n1", vk.clone())), &scope),
        ["n1"]
    );
    let more = json!({"type": "virtual-kubelet", "zone": "a"});
    assert!(
        nodes
            .changed(&Event::Apply(named("n1", more)), &scope)
            .is_empty()
    );
    assert_eq!(
        nodes.changed(&Event::Apply(named("n1", json!({}))), &scope),
        ["n1"]
    );
    assert_eq!(
        nodes.changed(&Event::Apply(named("n2", vk.clone())), &scope),
        ["n2"]
    );
    assert_eq!(
        nodes.changed(&Event::Delete(named("n2", vk.clone())), &scope),
        ["n2"]
    );
    // A relist: n3 new and serverless, n4 plain; decided at its end.
    nodes.changed(&Event::Apply(named("n5", vk.clone())), &scope);
    assert!(nodes.changed(&Event::Init, &scope).is_empty());
    assert!(
        nodes
            .changed(&Event::InitApply(named("n3", vk.clone())), &scope)
            .is_empty()
    );
    assert!(
        nodes
            .changed(&Event::InitApply(named("n4", json!({}))), &scope)
            .is_empty()
    );
    let mut changed = nodes.changed(&Event::InitDone, &scope);
    changed.sort();
    assert_eq!(changed, ["n3", "n5"], "n3 appeared, n5 is gone");
}

#[test]
fn a_patch_backoff_ends_with_its_answer_its_pod_or_a_relist_without_the_pod() {
    let throttled = podprobe_ops::backoff::Failure::Throttled { retry_after: None };
    let (cache, mut writer) = reflector::store::<CachedPod>();
    let (a, b, c) = (on_node("a", "n1"), on_node("b", "n1"), on_node("c", "n1"));
    let retries = crate::retries::Retries::new(podprobe_ops::backoff::Policy::WATCH);
    for p in [&a, &b, &c] {
        writer.apply_watcher_event(&Event::Apply(p.clone()));
        retries.failed(ObjectRef::from_obj(p), throttled);
    }
    // A second failure in a row waits longer than the first could.
    let first = retries.failed(ObjectRef::from_obj(&a), throttled);
    assert!(first >= std::time::Duration::from_secs(1), "{first:?}");
    assert_eq!(retries.len(), 3);

    retries.answered(&ObjectRef::from_obj(&a));
    assert_eq!(retries.len(), 2);

    let deleted = Event::Delete(b.clone());
    writer.apply_watcher_event(&deleted);
    retries.observe(&deleted, &cache);
    assert_eq!(retries.len(), 1);

    // `c` was deleted while the watch was away: the relist does not have it.
    for event in [Event::Init, Event::InitApply(a.clone()), Event::InitDone] {
        writer.apply_watcher_event(&event);
        retries.observe(&event, &cache);
    }
    assert!(retries.is_empty());
}
