//! Shared by the manager's tests and benchmark: a self-signed webhook certificate, an HTTPS
//! client for AdmissionReviews, fixtures, and a manager started in-process against a real
//! control plane ([`tv03`]).
#![allow(dead_code)]

pub mod tv03;
#[allow(unused_imports)]
pub use tv03::Tv03Cluster;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionResponse, AdmissionReview};
use podprobe_manager::config::InjectionConfig;
use podprobe_manager::crd::PodProbeMarker;
use podprobe_manager::pods::MarkerScope;
use podprobe_manager::run::{LeaderOptions, Manager, Options};
use podprobe_manager::webhook::Mode;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

/// A self-signed certificate for `localhost`/127.0.0.1, written as PEM files.
pub struct Cert {
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    pub cert_pem: String,
}

pub fn write_cert(dir: &Path, stem: &str) -> Cert {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_pem = ck.cert.pem();
    let cert_path = dir.join(format!("{stem}.crt"));
    let key_path = dir.join(format!("{stem}.key"));
    std::fs::write(&cert_path, &cert_pem).unwrap();
    std::fs::write(&key_path, ck.signing_key.serialize_pem()).unwrap();
    Cert {
        cert_path,
        key_path,
        cert_pem,
    }
}

/// One keep-alive HTTPS connection that trusts exactly `ca_pem`, as the apiserver's webhook
/// client trusts the configured caBundle.
pub struct HttpsClient {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

/// A TLS connection to `addr` that trusts exactly `ca_pem` (server name `localhost`).
pub async fn tls_connect(
    addr: SocketAddr,
    ca_pem: &str,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    tcp.set_nodelay(true).ok();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())
}

impl HttpsClient {
    pub async fn connect(addr: SocketAddr, ca_pem: &str) -> Result<Self, String> {
        let tls = tls_connect(addr, ca_pem).await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(Self { sender })
    }

    pub async fn post(&mut self, path: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
        self.sender.ready().await.unwrap();
        let req = http::Request::post(path)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let resp = self.sender.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec();
        (status, body)
    }

    /// POST an AdmissionReview and decode the response.
    pub async fn review(&mut self, path: &str, review: &Value) -> AdmissionResponse {
        let (status, body) = self.post(path, serde_json::to_vec(review).unwrap()).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let review: AdmissionReview<DynamicObject> = serde_json::from_slice(&body).unwrap();
        review.response.expect("a response")
    }
}

/// An AdmissionReview request as the apiserver sends it.
pub fn review(
    operation: &str,
    kind: (&str, &str, &str),
    resource: &str,
    namespace: &str,
    object: Value,
    old: Value,
) -> Value {
    let (group, version, kind) = kind;
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{}", rand_id()),
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "name": object.pointer("/metadata/name").cloned().unwrap_or(json!("")),
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": object,
            "oldObject": old,
            "dryRun": false
        }
    })
}

pub fn pod_review(pod: &Pod, namespace: &str) -> Value {
    let mut object = serde_json::to_value(pod).unwrap();
    // The apiserver sends the pod before defaulting of the namespace in the object.
    object["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    review(
        "CREATE",
        ("", "v1", "Pod"),
        "pods",
        namespace,
        object,
        Value::Null,
    )
}

pub fn ppm_review(operation: &str, new: &Value, old: Option<&Value>) -> Value {
    review(
        operation,
        ("apps.kruise.io", "v1alpha1", "PodProbeMarker"),
        "podprobemarkers",
        "test",
        new.clone(),
        old.cloned().unwrap_or(Value::Null),
    )
}

/// The pod the apiserver would store after the response's JSON patch.
pub fn patched(pod: &Pod, response: &AdmissionResponse) -> Pod {
    let mut doc = serde_json::to_value(pod).unwrap();
    if let Some(patch) = &response.patch {
        let patch: json_patch::Patch = serde_json::from_slice(patch).unwrap();
        json_patch::patch(&mut doc, &patch).unwrap();
    }
    serde_json::from_value(doc).unwrap()
}

fn rand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}

/// TV-03's PodProbeMarker (namespace `test`).
pub fn tv03_ppm() -> Value {
    json!({
        "apiVersion": "apps.kruise.io/v1alpha1",
        "kind": "PodProbeMarker",
        "metadata": {"name": "ppm-test", "namespace": "test"},
        "spec": {
            "selector": {"matchLabels": {"app": "test"}},
            "probes": [{
                "name": "healthy",
                "containerName": "main",
                "probe": {"exec": {"command": ["/bin/sh", "-c", "/healthy.sh"]},
                          "initialDelaySeconds": 10, "timeoutSeconds": 3, "periodSeconds": 10,
                          "successThreshold": 1, "failureThreshold": 3},
                "podConditionType": "game.kruise.io/healthy",
                "markerPolicy": [
                    {"state": "Succeeded", "labels": {"server-healthy": "true"}},
                    {"state": "Failed", "labels": {"server-healthy": "false"}}
                ]
            }]
        }
    })
}

pub const TV03_PODPROBE: &str = r#"[{"name":"healthy","containerName":"main","probe":{"exec":{"command":["/bin/sh","-c","/healthy.sh"]},"initialDelaySeconds":10,"timeoutSeconds":3,"periodSeconds":10,"successThreshold":1,"failureThreshold":3},"podConditionType":"game.kruise.io/healthy"}]"#;

pub fn ppm(v: &Value) -> PodProbeMarker {
    serde_json::from_value(v.clone()).unwrap()
}

/// A pod in `test` with label app=<app> and container `main`.
pub fn app_pod(name: &str, app: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "test", "labels": {"app": app}},
        "spec": {"containers": [{"name": "main", "image": "game:1"}]}
    }))
    .unwrap()
}

pub fn injection() -> InjectionConfig {
    InjectionConfig::from_yaml("image: podprobe:dev\n", "test").unwrap()
}

pub struct Started {
    pub manager: Manager,
    pub cert: Cert,
}

/// Start a manager in-process with `client`.
pub async fn start_manager(
    client: kube::Client,
    dir: &Path,
    mode: Mode,
    leader: Option<LeaderOptions>,
    injection: Option<InjectionConfig>,
) -> Started {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let cert = write_cert(dir, &format!("webhook-{}", rand_id()));
    let options = Options {
        mode,
        webhook_addr: "127.0.0.1:0".parse().unwrap(),
        tls_cert: cert.cert_path.clone(),
        tls_key: cert.key_path.clone(),
        tls_reload_interval: Duration::from_millis(100),
        injection,
        metrics_addr: Some("127.0.0.1:0".parse().unwrap()),
        leader,
        scope: MarkerScope::default(),
        workers: 16,
    };
    let manager = Manager::start(client, options).await.unwrap();
    Started { manager, cert }
}

#[allow(unused_imports)]
pub use testkit::wait::{until as eventually, watch_pod as watch_until};

/// Plain HTTP GET on the metrics server: (status, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A virtual-kubelet node.
pub fn vk_node(name: &str) -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"type": "virtual-kubelet"}},
        // As the virtual-kubelet library taints its nodes: only pods that tolerate it are
        // scheduled there, so the webhook gives the others the kubelet shape.
        "spec": {"taints": [{"key": "virtual-kubelet.io/provider", "value": "mock",
                             "effect": "NoSchedule"}]}
    }))
    .unwrap()
}

/// A running pod on node `vk-1` as the manager leaves it in steady state: TV-03's
/// annotations, condition `game.kruise.io/healthy` = `healthy`, and the matching marker label.
pub fn steady_pod(i: usize, healthy: bool) -> Pod {
    let status = if healthy { "True" } else { "False" };
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("gs-{i}"), "namespace": "test", "uid": format!("uid-gs-{i}"),
            "labels": {"app": "test", "server-healthy": healthy.to_string()},
            "annotations": {PODPROBE: TV03_PODPROBE, LIST: "ppm-test"}
        },
        "spec": {"nodeName": "vk-1", "containers": [{"name": "main", "image": "game:1"}]},
        "status": {"phase": "Running", "conditions": [
            {"type": "Initialized", "status": "True"},
            {"type": "game.kruise.io/healthy", "status": status}
        ]}
    }))
    .unwrap()
}

pub const PODPROBE: &str = "kruise.io/podprobe";
pub const LIST: &str = "kruise.io/podprobemarker-list";

// Shared with the root package's tests through testkit; not every test binary uses each.
/// The real `podprobe run`, killed when dropped, its log printed when the test failed.
#[allow(unused_imports)]
pub use testkit::child::LoggedChild as Sidecar;
#[allow(unused_imports)]
pub use testkit::pod::{annotation, condition_status, label};

/// Waits (watching, up to a minute) until `check` holds for pod `name`; panics with `what`
/// and the pod as it is then.
pub async fn wait_pod(
    pods: &kube::Api<Pod>,
    name: &str,
    what: &str,
    check: impl Fn(&Pod) -> bool,
) -> Pod {
    testkit::wait::pod(pods, name, what, Duration::from_secs(60), check).await
}

/// `target/<profile>/podprobe`, built if needed (`CARGO_BIN_EXE_podprobe` exists only in the
/// root package's tests).
pub fn sidecar_binary() -> PathBuf {
    testkit::workspace::binary("podprobe", "podprobe")
}

/// A benchmark's `i`-th command-line argument as a number, or `default`.
pub fn bench_arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The Secret a virtual-node pod's token volume names (the issued token's).
pub fn token_secret(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .unwrap()
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.projected.as_ref()?.sources.as_ref())
        .flatten()
        .find_map(|s| Some(s.secret.as_ref()?.name.clone()))
        .expect("a token volume naming a Secret")
}
