//! The fault proxy in front of a real kube-apiserver: injected answers, resets, delays, ended
//! watches and an outage, while everything else is the apiserver's own answer.

mod common;

use std::time::{Duration, Instant};

use common::{raw, status_of};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use testkit::Fault;
use testkit::real::{ClientSide, ControlPlane, FaultProxy};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::timeout;

const T: Duration = Duration::from_secs(30);
const NS: &str = "proxied";

/// A control plane with pod `a` in [`NS`], and a proxy in front of it.
async fn setup(client_side: ClientSide) -> (ControlPlane, FaultProxy, Api<Pod>) {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.create_namespace(NS).await.expect("namespace");
    let proxy = FaultProxy::start_with(&cp, client_side)
        .await
        .expect("proxy");
    let pods: Api<Pod> = Api::namespaced(proxy.client(), NS);
    let pod = serde_json::from_value(json!({
        "metadata": {"name": "a"},
        "spec": {"nodeName": "n1", "containers": [{"name": "app", "image": "app:1"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    (cp, proxy, pods)
}

/// A kube-rs watcher of pod `a` (with its default backoff), sending each version it sees.
fn watch_a(pods: &Api<Pod>) -> (tokio::task::JoinHandle<()>, UnboundedReceiver<Pod>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let config = watcher::Config::default().fields("metadata.name=a");
    let watching = tokio::spawn(
        watcher(pods.clone(), config)
            .default_backoff()
            .applied_objects()
            .for_each(move |p| {
                if let Ok(p) = p {
                    let _ = tx.send(p);
                }
                async {}
            }),
    );
    (watching, rx)
}

fn status_patch() -> Patch<serde_json::Value> {
    Patch::Strategic(json!({"status": {"conditions": [{"type": "x.io/ready", "status": "True"}]}}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_codes_with_retry_after_then_the_apiservers_own_answers() {
    let (_cp, proxy, pods) = setup(ClientSide::Plain).await;
    proxy.faults().add(
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
    // What passes is the apiserver's answer: it validates what the proxy forwards.
    let refused =
        Patch::Strategic(json!({"status": {"conditions": [{"type": "x.io/", "status": "True"}]}}));
    let e = pods
        .patch_status("a", &PatchParams::default(), &refused)
        .await
        .unwrap_err();
    assert_eq!(status_of(e).0, 422);
    let journal: Vec<(u16, bool)> = proxy
        .journal()
        .matching("PATCH", "pods/status")
        .iter()
        .map(|e| (e.status, e.fault))
        .collect();
    assert_eq!(
        journal,
        [
            (500, true),
            (500, true),
            (500, true),
            (200, false),
            (422, false)
        ]
    );
    let ok = &proxy.journal().matching("PATCH", "pods/status")[3];
    assert_eq!(ok.content_type, "application/strategic-merge-patch+json");
    assert!(ok.json()["status"]["conditions"].is_array());

    // Without kube's retry layer the 429 and its header are visible.
    let mut config = proxy.config_for_token(testkit::real::ADMIN_TOKEN);
    config.default_retry = false;
    let plain = kube::Client::try_from(config).unwrap();
    proxy
        .faults()
        .add(Fault::too_many_requests(1).method("GET").times(1));
    let uri = format!("/api/v1/namespaces/{NS}/pods/a");
    let (code, headers, body) = raw(&plain, "GET", &uri, "", "").await;
    assert_eq!(code, 429);
    assert_eq!(headers.get("retry-after").unwrap(), "1");
    assert_eq!(body["reason"], "TooManyRequests");
    assert_eq!(body["details"]["retryAfterSeconds"], 1);
    // kube's default client retries a 429 by itself.
    proxy.journal().clear();
    proxy
        .faults()
        .add(Fault::too_many_requests(1).method("GET").times(2));
    pods.get("a").await.unwrap();
    let codes: Vec<u16> = proxy
        .journal()
        .matching("GET", "pods")
        .iter()
        .map(|e| e.status)
        .collect();
    assert_eq!(codes, [429, 429, 200]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_delays_content_types_and_ended_watches() {
    let (_cp, proxy, pods) = setup(ClientSide::Plain).await;
    proxy.faults().add(Fault::reset().method("GET").times(1));
    let e = pods.get("a").await.unwrap_err();
    assert!(
        !matches!(e, kube::Error::Api(_)),
        "a transport error: {e:?}"
    );
    assert_eq!(proxy.journal().entries().last().unwrap().status, 0);
    assert!(pods.get("a").await.is_ok());

    proxy.faults().add(
        Fault::delay(Duration::from_millis(300))
            .method("GET")
            .times(1),
    );
    let started = Instant::now();
    pods.get("a").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));

    proxy.faults().add(
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

    // A watch that ends after its first event: the watcher watches again and misses nothing.
    proxy.faults().add(Fault::end_watch_after(1).times(1));
    let (watching, mut rx) = watch_a(&pods);
    timeout(T, rx.recv()).await.unwrap().unwrap();
    for value in ["one", "two"] {
        let label = Patch::Merge(json!({"metadata": {"labels": {"step": value}}}));
        pods.patch("a", &PatchParams::default(), &label)
            .await
            .unwrap();
        loop {
            let pod = timeout(T, rx.recv()).await.unwrap().unwrap();
            if pod
                .metadata
                .labels
                .unwrap_or_default()
                .get("step")
                .map(String::as_str)
                == Some(value)
            {
                break;
            }
        }
    }
    watching.abort();
    let watches: Vec<bool> = proxy
        .journal()
        .entries()
        .iter()
        .filter(|e| e.is_watch())
        .map(|e| e.fault)
        .collect();
    assert!(
        watches.len() >= 2 && watches[0] && !watches[1],
        "an ended watch, then a new one: {watches:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_closes_the_port_and_watchers_recover_after_it() {
    let (cp, proxy, pods) = setup(ClientSide::Tls).await;
    assert!(proxy.url().starts_with("https://"), "{proxy:?}");
    let port = proxy.port();
    let (watching, mut rx) = watch_a(&pods);
    timeout(T, rx.recv()).await.unwrap().unwrap();
    proxy.stop().await;
    assert!(!proxy.is_running());
    let refused = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
    assert!(refused.is_err(), "the port is closed during the outage");
    // Meanwhile the kubelet (straight to the apiserver) reports an IP.
    let direct: Api<Pod> = Api::namespaced(cp.client(), NS);
    let ip = Patch::Merge(json!({"status": {"podIP": "10.1.2.3"}}));
    direct
        .patch_status("a", &PatchParams::default(), &ip)
        .await
        .unwrap();
    proxy.restart().await.unwrap();
    assert_eq!(proxy.port(), port);
    loop {
        let pod = timeout(T, rx.recv()).await.unwrap().unwrap();
        if pod.status.unwrap().pod_ip.as_deref() == Some("10.1.2.3") {
            break;
        }
    }
    watching.abort();
}
