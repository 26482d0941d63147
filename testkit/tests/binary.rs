//! Black-box: the `testkit-apiserver` binary, used through the kubeconfig it
//! writes (as a podprobe subprocess would), plus its control endpoints.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;
use tokio::process::Command;

#[tokio::test]
async fn binary_serves_the_api_journal_and_faults() {
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    // A free port: bind, read it, release it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_testkit-apiserver"))
        .args(["--port", &port.to_string(), "--kubeconfig"])
        .arg(&kc)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !kc.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "no kubeconfig written"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cfg = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kc).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(cfg.cluster_url.port_u16(), Some(port));
    let client = kube::Client::try_from(cfg).unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "a"},
        "spec": {"containers": [{"name": "c", "image": "i"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();

    let rule = json!({"action": {"type": "status", "code": 500}, "method": "GET", "times": 1});
    let req = http::Request::post("/testkit/faults")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&rule).unwrap())
        .unwrap();
    client.request_text(req).await.unwrap();
    match pods.get("a").await.unwrap_err() {
        kube::Error::Api(s) => assert_eq!(s.code, 500),
        e => panic!("{e:?}"),
    }
    pods.get("a").await.unwrap();

    let req = http::Request::get("/testkit/journal")
        .body(Vec::new())
        .unwrap();
    let journal = client.request_text(req).await.unwrap();
    let codes: Vec<(String, u64)> = journal
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| {
            (
                v["method"].as_str().unwrap().to_string(),
                v["status"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        codes,
        [
            ("POST".to_string(), 201),
            ("GET".into(), 500),
            ("GET".into(), 200)
        ]
    );
    child.kill().await.unwrap();
}
