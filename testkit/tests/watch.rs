//! Watches: resume without loss or duplicates, 410 after compaction,
//! bookmarks, timeouts, selector transitions; kube-rs watcher, reflector
//! and Controller unchanged.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::pod;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;
use testkit::{ApiServer, Fault};
use tokio::time::timeout;

const T: Duration = Duration::from_secs(10);

fn rv_of(p: &Pod) -> u64 {
    p.metadata
        .resource_version
        .as_ref()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn resumed_watch_loses_and_duplicates_nothing() {
    let api = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(api.client(), "default");
    let start = pods.list(&ListParams::default()).await.unwrap();
    let mut last = start.metadata.resource_version.unwrap();
    // Every watch ends after 3 events.
    api.faults().add(Fault::end_watch_after(3));
    let writer = {
        let pods = pods.clone();
        tokio::spawn(async move {
            for i in 0..10 {
                pods.create(&PostParams::default(), &pod(&format!("p{i}"), json!({})))
                    .await
                    .unwrap();
                pods.patch(
                    &format!("p{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"n": i.to_string()}}})),
                )
                .await
                .unwrap();
            }
        })
    };
    let mut seen: Vec<(String, u64)> = Vec::new();
    let mut watches = 0;
    while seen.len() < 20 {
        watches += 1;
        let mut s = pods
            .watch(&WatchParams::default().timeout(5), &last)
            .await
            .unwrap()
            .boxed();
        while let Some(ev) = timeout(T, s.next()).await.unwrap() {
            match ev.unwrap() {
                WatchEvent::Added(p) => seen.push(("ADDED".into(), rv_of(&p))),
                WatchEvent::Modified(p) => seen.push(("MODIFIED".into(), rv_of(&p))),
                WatchEvent::Bookmark(_) => continue,
                other => panic!("unexpected {other:?}"),
            }
            last = seen.last().unwrap().1.to_string();
            if seen.len() == 20 {
                break;
            }
        }
    }
    writer.await.unwrap();
    assert!(
        watches >= 7,
        "the fault split the stream ({watches} watches)"
    );
    assert_eq!(seen.len(), 20);
    let rvs: Vec<u64> = seen.iter().map(|s| s.1).collect();
    let mut sorted = rvs.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(rvs, sorted, "in order, no duplicates");
    assert_eq!(rvs.last().copied(), Some(api.resource_version()));
    let kinds: Vec<&str> = seen.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "ADDED").count(), 10);
}

#[tokio::test]
async fn watch_from_a_compacted_version_is_410_expired() {
    let api = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(api.client(), "default");
    let old = pods
        .create(&PostParams::default(), &pod("a", json!({})))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("b", json!({})))
        .await
        .unwrap();
    api.compact();
    let mut s = pods
        .watch(&WatchParams::default(), &rv_of(&old).to_string())
        .await
        .unwrap()
        .boxed();
    match timeout(T, s.next()).await.unwrap().unwrap().unwrap() {
        WatchEvent::Error(st) => {
            assert_eq!((st.code, st.reason.as_str()), (410, "Expired"));
            assert!(
                st.message.starts_with("too old resource version"),
                "{}",
                st.message
            );
        }
        other => panic!("expected 410, got {other:?}"),
    }
    assert!(timeout(T, s.next()).await.unwrap().is_none());
    // The bounded history compacts by itself.
    let small = ApiServer::builder().history_limit(3).start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(small.client(), "default");
    let first = pods
        .create(&PostParams::default(), &pod("a", json!({})))
        .await
        .unwrap();
    for n in ["b", "c", "d"] {
        pods.create(&PostParams::default(), &pod(n, json!({})))
            .await
            .unwrap();
    }
    let mut s = pods
        .watch(&WatchParams::default(), &(rv_of(&first) - 1).to_string())
        .await
        .unwrap()
        .boxed();
    assert!(matches!(
        timeout(T, s.next()).await.unwrap().unwrap().unwrap(),
        WatchEvent::Error(st) if st.code == 410
    ));
}

#[tokio::test]
async fn bookmarks_carry_progress_and_timeout_ends_the_watch() {
    let api = ApiServer::builder()
        .bookmark_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(api.client(), "default");
    let rv = api.resource_version().to_string();
    let mut s = pods
        .watch(&WatchParams::default().timeout(2), &rv)
        .await
        .unwrap()
        .boxed();
    // A write to another resource moves the resourceVersion.
    let leases: Api<Lease> = Api::namespaced(api.client(), "default");
    let l: Lease = serde_json::from_value(json!({"metadata": {"name": "l"}})).unwrap();
    leases.create(&PostParams::default(), &l).await.unwrap();
    let want = api.resource_version().to_string();
    let started = std::time::Instant::now();
    let mut got_bookmark = false;
    while let Some(ev) = timeout(T, s.next()).await.unwrap() {
        match ev.unwrap() {
            WatchEvent::Bookmark(b) => {
                assert_eq!(b.metadata.resource_version, want);
                got_bookmark = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(got_bookmark);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

#[tokio::test]
async fn label_selector_watch_sees_objects_leave_and_enter() {
    let api = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(api.client(), "default");
    pods.create(&PostParams::default(), &pod("a", json!({"app": "web"})))
        .await
        .unwrap();
    let rv = api.resource_version().to_string();
    let mut s = pods
        .watch(&WatchParams::default().labels("app=web"), &rv)
        .await
        .unwrap()
        .boxed();
    let relabel = |v: &'static str| {
        let pods = pods.clone();
        async move {
            pods.patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"app": v}}})),
            )
            .await
            .unwrap()
        }
    };
    let left = relabel("db").await;
    relabel("web").await;
    match timeout(T, s.next()).await.unwrap().unwrap().unwrap() {
        WatchEvent::Deleted(p) => {
            assert_eq!(rv_of(&p), rv_of(&left));
            assert_eq!(
                p.metadata.labels.unwrap()["app"],
                "web",
                "last matching state"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        timeout(T, s.next()).await.unwrap().unwrap().unwrap(),
        WatchEvent::Added(_)
    ));
}

#[tokio::test]
async fn kube_watcher_on_one_pod_by_field_selector() {
    let api = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(api.client(), "default");
    pods.create(&PostParams::default(), &pod("me", json!({})))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("other", json!({})))
        .await
        .unwrap();
    let cfg = watcher::Config::default().fields("metadata.name=me");
    let mut s = watcher(pods.clone(), cfg).applied_objects().boxed();
    let first = timeout(T, s.try_next()).await.unwrap().unwrap().unwrap();
    assert_eq!(first.metadata.name.as_deref(), Some("me"));
    api.update_pod_status("default", "other", |st| st.phase = Some("Running".into()))
        .unwrap();
    api.update_pod_status("default", "me", |st| {
        st.container_statuses = Some(
            serde_json::from_value(json!([{"name": "app", "ready": true, "restartCount": 0,
                "image": "app:1", "imageID": "", "started": true}]))
            .unwrap(),
        )
    })
    .unwrap();
    let next = timeout(T, s.try_next()).await.unwrap().unwrap().unwrap();
    assert_eq!(next.metadata.name.as_deref(), Some("me"));
    assert!(next.status.unwrap().container_statuses.is_some());
    // kube's default watcher asks for bookmarks.
    let watches = api.journal().matching("GET", "pods");
    let w = watches.iter().find(|e| e.is_watch()).unwrap();
    assert!(w.query.contains("allowWatchBookmarks=true"), "{}", w.query);
    assert!(
        w.query.contains("fieldSelector=metadata.name%3Dme"),
        "{}",
        w.query
    );
}

#[tokio::test]
async fn kube_watcher_with_streaming_lists_uses_send_initial_events() {
    let api = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(api.client(), "default");
    for n in ["a", "b"] {
        pods.create(&PostParams::default(), &pod(n, json!({})))
            .await
            .unwrap();
    }
    let (reader, writer) = reflector::store();
    let cfg = watcher::Config::default().streaming_lists();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let drain = tokio::spawn(
        reflector(writer, watcher(pods.clone(), cfg))
            .applied_objects()
            .for_each(move |p| {
                let _ = tx.send(p.map(|p| p.metadata.name.unwrap_or_default()));
                async {}
            }),
    );
    timeout(T, reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reader.state().len(), 2);
    pods.create(&PostParams::default(), &pod("c", json!({})))
        .await
        .unwrap();
    loop {
        let name = timeout(T, rx.recv()).await.unwrap().unwrap().unwrap();
        if name == "c" {
            break;
        }
    }
    drain.abort();
    assert_eq!(reader.state().len(), 3);
    let entries = api.journal().entries();
    assert!(
        entries
            .iter()
            .any(|e| e.query.contains("sendInitialEvents=true"))
    );
    assert!(
        !entries
            .iter()
            .any(|e| e.method == "GET" && !e.is_watch() && e.path.ends_with("/pods"))
    );
}

#[tokio::test]
async fn send_initial_events_needs_not_older_than() {
    let api = ApiServer::start().await.unwrap();
    let (code, _, body) = common::raw(
        &api.client(),
        "GET",
        "/api/v1/namespaces/default/pods?watch=true&sendInitialEvents=true&allowWatchBookmarks=true",
        "",
        "",
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(body["reason"], "Invalid");
}

#[tokio::test]
async fn controller_reconciles_podprobemarkers_and_owned_pods() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    use kube::runtime::controller::{Action, Controller};
    let api = ApiServer::start().await.unwrap();
    let client = api.client();
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "apps.kruise.io",
        "v1alpha1",
        "PodProbeMarker",
    ));
    let ppms: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "m"}, "spec": {"selector": {"matchLabels": {"app": "web"}}}
    }))
    .unwrap();
    ppms.create(&PostParams::default(), &obj).await.unwrap();
    let reconciles = Arc::new(AtomicUsize::new(0));
    let ctx = Arc::new((ppms.clone(), reconciles.clone()));
    let ctrl = Controller::new_with(ppms.clone(), watcher::Config::default(), ar.clone())
        .run(
            |o: Arc<DynamicObject>, ctx: Arc<(Api<DynamicObject>, Arc<AtomicUsize>)>| async move {
                ctx.1.fetch_add(1, Ordering::SeqCst);
                let gen_ = o.metadata.generation.unwrap_or(0);
                ctx.0
                    .patch_status(
                        o.metadata.name.as_deref().unwrap(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {"observedGeneration": gen_}})),
                    )
                    .await?;
                Ok::<_, kube::Error>(Action::await_change())
            },
            |_, _, _| Action::requeue(Duration::from_secs(1)),
            ctx,
        )
        .for_each(|_| async {});
    let handle = tokio::spawn(ctrl);
    let deadline = std::time::Instant::now() + T;
    loop {
        let m = ppms.get("m").await.unwrap();
        if m.data["status"]["observedGeneration"] == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "controller never reconciled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ppms.patch(
        "m",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"probes": [{"name": "x"}]}})),
    )
    .await
    .unwrap();
    loop {
        let m = ppms.get("m").await.unwrap();
        if m.data["status"]["observedGeneration"] == 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no reconcile after spec change"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(reconciles.load(Ordering::SeqCst) >= 2);
    handle.abort();
}

#[tokio::test]
async fn kube_watcher_relists_after_410_and_misses_nothing() {
    let api = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(api.client(), "default");
    pods.create(&PostParams::default(), &pod("a", json!({})))
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let w = tokio::spawn(
        watcher(pods.clone(), watcher::Config::default())
            .default_backoff()
            .touched_objects()
            .for_each(move |p| {
                if let Ok(p) = p {
                    let _ = tx.send(p.metadata.name.unwrap_or_default());
                }
                async {}
            }),
    );
    assert_eq!(timeout(T, rx.recv()).await.unwrap().unwrap(), "a");
    // Down; meanwhile a pod appears and the history is compacted, so the
    // resumed watch gets 410 and the watcher must relist to see "b".
    api.stop().await;
    api.create(&pod("b", json!({}))).unwrap();
    api.compact();
    api.restart().await.unwrap();
    loop {
        if timeout(T, rx.recv()).await.unwrap().unwrap() == "b" {
            break;
        }
    }
    assert!(
        api.journal()
            .wait_for_count("GET", "pods", 3, Duration::from_secs(1))
            .await
    );
    let lists = api
        .journal()
        .matching("GET", "pods")
        .into_iter()
        .filter(|e| !e.is_watch())
        .count();
    assert_eq!(lists, 2, "an initial list and a relist after 410");
    w.abort();
}
