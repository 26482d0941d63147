//! Helpers shared by the integration tests.
#![allow(dead_code)]

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

/// A pod bound to node `n1` with one container.
pub fn pod(name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"nodeName": "n1", "containers": [{"name": "app", "image": "app:1"}]}
    }))
    .unwrap()
}

/// (code, reason, message) of an API error.
pub fn status_of(e: kube::Error) -> (u16, String, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason.clone(), s.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A raw request through the kube client; returns (status, headers, body).
pub async fn raw(
    client: &kube::Client,
    method: &str,
    uri: &str,
    content_type: &str,
    body: &str,
) -> (u16, http::HeaderMap, Value) {
    use http_body_util::BodyExt;
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", content_type)
        .body(kube::client::Body::from(body.as_bytes().to_vec()))
        .unwrap();
    let resp = client.send(req).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        headers,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}
