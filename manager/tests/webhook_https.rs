//! AdmissionReview round trips through the real HTTPS server of a manager started against a
//! real kube-apiserver: allowed, patched (TV-03 byte for byte, plus the injected native sidecar), denied with
//! the field-naming reason (TV-13), certificate reload, metrics and readiness.

mod support;

use std::time::Duration;

use podprobe_manager::webhook::{MUTATE_PODS_PATH, Mode, VALIDATE_PPM_PATH};
use podprobe_protocol::annotation::{MARKER_LIST_ANNOTATION, PODPROBE_ANNOTATION};
use serde_json::json;
use support::*;

async fn setup(mode: Mode) -> (Tv03Cluster, tempfile::TempDir, Started) {
    let cluster = Tv03Cluster::with_tv03().await;
    let dir = tempfile::tempdir().unwrap();
    let client = cluster.manager_client();
    let started = start_manager(client, dir.path(), mode, None, Some(injection())).await;
    let ppms = started.manager.ppms.clone();
    eventually(Duration::from_secs(10), "PPM cache synced", || {
        !ppms.namespace("test").is_empty()
    })
    .await;
    (cluster, dir, started)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_admission_is_patched_with_tv03_annotations_and_the_sidecar() {
    let (_api, _dir, s) = setup(Mode::Standalone).await;
    let mut client = HttpsClient::connect(s.manager.webhook_addr, &s.cert.cert_pem)
        .await
        .unwrap();

    let mut pod = app_pod("pod-1", "test");
    pod.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("podprobe.io/inject".into(), "enabled".into());
    let response = client
        .review(MUTATE_PODS_PATH, &pod_review(&pod, "test"))
        .await;
    assert!(response.allowed);
    assert!(response.patch.is_some(), "a JSONPatch");
    let out = patched(&pod, &response);
    let annotations = out.metadata.annotations.clone().unwrap();
    assert_eq!(annotations[PODPROBE_ANNOTATION], TV03_PODPROBE);
    assert_eq!(annotations[MARKER_LIST_ANNOTATION], "ppm-test");
    // The apiserver is Kubernetes 1.37: the sidecar is a restartable init container.
    // After it, the exec agent's install container: the exec probe's container gives no
    // command, so its postStart hook starts the agent beside its entrypoint.
    let init = out.spec.as_ref().unwrap().init_containers.clone().unwrap();
    let names: Vec<&str> = init.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["podprobe-agent-install", "podprobe"]);
    assert_eq!(init[1].restart_policy.as_deref(), Some("Always"));
    let containers = &out.spec.as_ref().unwrap().containers;
    assert_eq!(containers.len(), 1);
    let hook = containers[0]
        .lifecycle
        .as_ref()
        .and_then(|l| l.post_start.as_ref());
    assert!(hook.is_some(), "{:?}", containers[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmatched_pod_is_allowed_without_patch_and_companion_mode_writes_no_annotations() {
    let (_api, _dir, s) = setup(Mode::Standalone).await;
    let mut client = HttpsClient::connect(s.manager.webhook_addr, &s.cert.cert_pem)
        .await
        .unwrap();
    let pod = app_pod("pod-2", "other");
    let response = client
        .review(MUTATE_PODS_PATH, &pod_review(&pod, "test"))
        .await;
    assert!(response.allowed);
    assert_eq!(response.patch, None);

    let (_api2, _dir2, c) = setup(Mode::Companion).await;
    let mut client = HttpsClient::connect(c.manager.webhook_addr, &c.cert.cert_pem)
        .await
        .unwrap();
    let pod = app_pod("pod-3", "test");
    let response = client
        .review(MUTATE_PODS_PATH, &pod_review(&pod, "test"))
        .await;
    assert!(response.allowed);
    assert_eq!(
        response.patch, None,
        "companion: OpenKruise writes annotations"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_podprobemarker_is_denied_with_code_400_and_the_field() {
    let (_api, _dir, s) = setup(Mode::Standalone).await;
    let mut client = HttpsClient::connect(s.manager.webhook_addr, &s.cert.cert_pem)
        .await
        .unwrap();

    let valid = tv03_ppm();
    let response = client
        .review(VALIDATE_PPM_PATH, &ppm_review("CREATE", &valid, None))
        .await;
    assert!(response.allowed, "{:?}", response.result);

    // TV-13 test7: a policy label key `server-/$healthy` → 2 errors.
    let mut bad = valid.clone();
    bad["spec"]["probes"][0]["markerPolicy"][0]["labels"] = json!({"server-/$healthy": "true"});
    let response = client
        .review(VALIDATE_PPM_PATH, &ppm_review("CREATE", &bad, None))
        .await;
    assert!(!response.allowed);
    assert_eq!(response.result.code, 400);
    let message = &response.result.message;
    assert!(
        message.contains("spec.probes[0].markerPolicy[0].labels"),
        "{message}"
    );
    assert!(message.contains("server-/$healthy"), "{message}");

    // TV-13 test8: probe name `Initialized`.
    let mut bad = valid.clone();
    bad["spec"]["probes"][0]["name"] = json!("Initialized");
    let response = client
        .review(VALIDATE_PPM_PATH, &ppm_review("CREATE", &bad, None))
        .await;
    assert!(!response.allowed);
    assert!(
        response.result.message.contains("spec.probes[0].name"),
        "{}",
        response.result.message
    );

    // UPDATE: the selector is immutable.
    let mut moved = valid.clone();
    moved["spec"]["selector"] = json!({"matchLabels": {"app": "other"}});
    let response = client
        .review(
            VALIDATE_PPM_PATH,
            &ppm_review("UPDATE", &moved, Some(&valid)),
        )
        .await;
    assert!(!response.allowed);
    assert!(
        response
            .result
            .message
            .contains("selector must be immutable"),
        "{}",
        response.result.message
    );

    // Not an AdmissionReview at all: HTTP 400 (the apiserver applies failurePolicy).
    let (status, _) = client.post(VALIDATE_PPM_PATH, b"{]".to_vec()).await;
    assert_eq!(status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_without_restart() {
    let (_api, dir, s) = setup(Mode::Standalone).await;
    let old_ca = s.cert.cert_pem.clone();
    assert!(
        HttpsClient::connect(s.manager.webhook_addr, &old_ca)
            .await
            .is_ok()
    );
    let rotated = write_cert(dir.path(), "rotated");
    std::fs::copy(&rotated.key_path, &s.cert.key_path).unwrap();
    std::fs::copy(&rotated.cert_path, &s.cert.cert_path).unwrap();
    let addr = s.manager.webhook_addr;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if HttpsClient::connect(addr, &rotated.cert_pem).await.is_ok() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "new certificate not served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        HttpsClient::connect(addr, &old_ca).await.is_err(),
        "the old certificate is no longer served"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_certificate_is_counted_and_the_previous_one_kept() {
    let (_api, _dir, s) = setup(Mode::Standalone).await;
    let metrics = s.manager.metrics_addr.unwrap();
    let errors = |body: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix("podprobe_manager_cert_reload_errors_total "))
            .map(|v| v.parse::<f64>().unwrap())
            .unwrap_or_else(|| panic!("no reload error counter: {body}"))
    };
    assert_eq!(errors(&http_get(metrics, "/metrics").await.1), 0.0);
    std::fs::write(&s.cert.cert_path, "not a certificate").unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while errors(&http_get(metrics, "/metrics").await.1) == 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the failed reload is not counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        HttpsClient::connect(s.manager.webhook_addr, &s.cert.cert_pem)
            .await
            .is_ok(),
        "the previous certificate is still served"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_health_and_readiness_are_served() {
    let (_api, _dir, s) = setup(Mode::Standalone).await;
    let addr = s.manager.metrics_addr.unwrap();
    let mut client = HttpsClient::connect(s.manager.webhook_addr, &s.cert.cert_pem)
        .await
        .unwrap();
    client
        .review(
            MUTATE_PODS_PATH,
            &pod_review(&app_pod("pod-m", "test"), "test"),
        )
        .await;
    assert_eq!(http_get(addr, "/healthz").await.0, 200);
    let mut ready = false;
    for _ in 0..100 {
        if http_get(addr, "/readyz").await.0 == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ready, "/readyz once the caches synced");
    let (status, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        body.contains(
            r#"podprobe_manager_webhook_requests_total{path="/mutate-pods",result="patched"} 1"#
        ),
        "{body}"
    );
    assert!(body.contains("podprobe_manager_webhook_duration_seconds_bucket"));
}

/// What the server answers on one raw TLS connection after `request` is sent (and nothing
/// more), up to when it closes the connection.
async fn answer_to(addr: std::net::SocketAddr, ca_pem: &str, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tls = tls_connect(addr, ca_pem).await.unwrap();
    tls.write_all(request).await.unwrap();
    tls.flush().await.unwrap();
    let mut answer = Vec::new();
    let read = tls.read_to_end(&mut answer);
    match tokio::time::timeout(Duration::from_secs(60), read).await {
        Ok(_) => String::from_utf8_lossy(&answer).into_owned(),
        Err(_) => panic!("the connection is still open after 60 s"),
    }
}

/// Any pod can reach the webhook server: a request that is too large, or whose body never
/// arrives, is answered and its connection closed instead of being held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_or_stalled_requests_are_refused_not_held() {
    let (_api, _dir, s) = setup(Mode::Standalone).await;
    let (addr, ca) = (s.manager.webhook_addr, s.cert.cert_pem.as_str());
    let headers = |length: usize| {
        format!(
            "POST {MUTATE_PODS_PATH} HTTP/1.1\r\nHost: localhost\r\n\
             Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        )
    };

    // Declared over the limit: refused before a byte of the body is read.
    let answer = answer_to(addr, ca, headers(5 << 20).as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // Declared within it, then only part of it sent: refused once the body's time is up.
    let started = std::time::Instant::now();
    let stalled = format!("{}{{\"apiVersion\":", headers(1000));
    let answer = answer_to(addr, ca, stalled.as_bytes()).await;
    println!("a stalled body answered after {:?}", started.elapsed());
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");

    // The server still answers a real review meanwhile.
    let mut client = HttpsClient::connect(addr, ca).await.unwrap();
    let pod = app_pod("pod-after", "other");
    assert!(
        client
            .review(MUTATE_PODS_PATH, &pod_review(&pod, "test"))
            .await
            .allowed
    );
}
