//! Fault injection, the journal, stop/restart, and the control endpoints.

mod common;

use std::time::{Duration, Instant};

use common::{pod, raw, status_of};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use testkit::{ApiServer, Fault};
use tokio::time::timeout;

const T: Duration = Duration::from_secs(15);

async fn setup() -> (ApiServer, Api<Pod>) {
    let api = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(api.client(), "default");
    pods.create(&PostParams::default(), &pod("a", json!({})))
        .await
        .unwrap();
    (api, pods)
}

fn status_patch() -> Patch<serde_json::Value> {
    Patch::Strategic(json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}))
}

#[tokio::test]
async fn status_code_n_times_then_normal() {
    let (api, pods) = setup().await;
    api.faults().add(
        Fault::status(500)
            .method("PATCH")
            .path_contains("/status")
            .times(3),
    );
    for _ in 0..3 {
        let e = pods
            .patch_status("a", &PatchParams::default(), &status_patch())
            .await
            .unwrap_err();
        assert_eq!(status_of(e).0, 500);
    }
    pods.patch_status("a", &PatchParams::default(), &status_patch())
        .await
        .unwrap();
    // Other requests were never affected.
    pods.patch("a", &PatchParams::default(), &Patch::Merge(json!({})))
        .await
        .unwrap();
    assert_eq!(api.journal().count("PATCH", "pods/status"), 4);
    assert_eq!(api.journal().count(http::Method::PATCH, "pods/status"), 4);
    let faulted: Vec<bool> = api
        .journal()
        .matching("PATCH", "pods/status")
        .iter()
        .map(|e| e.fault)
        .collect();
    assert_eq!(faulted, [true, true, true, false]);
    let last = api
        .journal()
        .matching("PATCH", "pods/status")
        .pop()
        .unwrap();
    assert_eq!(last.status, 200);
    assert_eq!(last.content_type, "application/strategic-merge-patch+json");
    assert!(last.json()["status"]["conditions"].is_array());
}

#[tokio::test]
async fn too_many_requests_with_retry_after() {
    let (api, pods) = setup().await;
    // Without kube's retry layer the 429 and its header are visible.
    let mut cfg = api.config();
    cfg.default_retry = false;
    let plain = kube::Client::try_from(cfg).unwrap();
    api.faults()
        .add(Fault::too_many_requests(1).method("GET").times(1));
    let (code, headers, body) =
        raw(&plain, "GET", "/api/v1/namespaces/default/pods/a", "", "").await;
    assert_eq!(code, 429);
    assert_eq!(headers.get("retry-after").unwrap(), "1");
    assert_eq!(body["reason"], "TooManyRequests");
    assert_eq!(body["details"]["retryAfterSeconds"], 1);
    // kube 5's default client retries 429/503/504 by itself.
    api.journal().clear();
    api.faults()
        .add(Fault::too_many_requests(1).method("GET").times(2));
    pods.get("a").await.unwrap();
    let codes: Vec<u16> = api
        .journal()
        .matching("GET", "pods")
        .iter()
        .map(|e| e.status)
        .collect();
    assert_eq!(codes, [429, 429, 200]);
}

#[tokio::test]
async fn reset_delay_and_content_type_match() {
    let (api, pods) = setup().await;
    api.faults().add(Fault::reset().method("GET").times(1));
    let e = pods.get("a").await.unwrap_err();
    assert!(
        !matches!(e, kube::Error::Api(_)),
        "a transport error: {e:?}"
    );
    assert_eq!(api.journal().entries().last().unwrap().status, 0);
    assert!(pods.get("a").await.is_ok());

    api.faults().add(
        Fault::delay(Duration::from_millis(300))
            .method("GET")
            .times(1),
    );
    let t = Instant::now();
    pods.get("a").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300));

    api.faults().add(
        Fault::status(409)
            .content_type("application/merge-patch")
            .times(1),
    );
    pods.patch("a", &PatchParams::default(), &Patch::Strategic(json!({})))
        .await
        .unwrap();
    let e = pods
        .patch("a", &PatchParams::default(), &Patch::Merge(json!({})))
        .await
        .unwrap_err();
    assert_eq!(status_of(e).0, 409);
}

#[tokio::test]
async fn control_endpoints_install_faults_and_serve_the_journal() {
    let (api, pods) = setup().await;
    let client = api.client();
    let rule = r#"{"action":{"type":"status","code":500},"method":"GET","pathContains":"/pods/a","times":1}"#;
    let (code, _, _) = raw(&client, "POST", "/testkit/faults", "application/json", rule).await;
    assert_eq!(code, 201);
    assert_eq!(status_of(pods.get("a").await.unwrap_err()).0, 500);
    let req = http::Request::get("/testkit/journal")
        .body(Vec::new())
        .unwrap();
    let text = client.request_text(req).await.unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = lines.last().unwrap();
    assert_eq!(last["status"], 500);
    assert_eq!(last["fault"], true);
    assert_eq!(last["path"], "/api/v1/namespaces/default/pods/a");
}

#[tokio::test]
async fn stop_and_restart_on_the_same_port_keeps_objects_and_watchers_recover() {
    let (api, pods) = setup().await;
    let port = api.port();
    let cfg = watcher::Config::default().fields("metadata.name=a");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let w = tokio::spawn(
        watcher(pods.clone(), cfg)
            .default_backoff()
            .applied_objects()
            .for_each(move |p| {
                if let Ok(p) = p {
                    let _ = tx.send(p);
                }
                async {}
            }),
    );
    let first = timeout(T, rx.recv()).await.unwrap().unwrap();
    assert!(first.status.unwrap().pod_ip.is_none());
    api.stop().await;
    assert!(!api.is_running());
    assert!(!matches!(
        pods.get("a").await.unwrap_err(),
        kube::Error::Api(_)
    ));
    // The kubelet keeps writing while the apiserver is down... (directly)
    api.update_pod_status("default", "a", |s| s.pod_ip = Some("10.1.2.3".into()))
        .unwrap();
    api.restart().await.unwrap();
    assert_eq!(api.port(), port);
    assert!(pods.get("a").await.is_ok());
    loop {
        let p = timeout(T, rx.recv()).await.unwrap().unwrap();
        if p.status.unwrap().pod_ip.as_deref() == Some("10.1.2.3") {
            break;
        }
    }
    w.abort();
}
