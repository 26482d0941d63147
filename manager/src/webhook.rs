//! The admission webhooks and their HTTPS server.
//!
//! - `POST /mutate-pods` (pods, CREATE): the `kruise.io/podprobe` and
//!   `kruise.io/podprobemarker-list` annotations exactly as OpenKruise writes them (standalone
//!   mode), plus the sidecar and readiness gates per the injection config (both modes).
//!   Internal errors never block a pod: the pod is admitted unchanged with a warning, and the
//!   `error` result is counted. Only a request that is not an AdmissionReview gets an HTTP 400,
//!   which the apiserver handles per the webhook's `failurePolicy`.
//! - `POST /validate-podprobemarkers` (CREATE/UPDATE): [`validate::validate`]; a denial carries
//!   code 400 and the field errors as message (OpenKruise: `admission.Errored(400, ...)`).
//!
//! Every pod can reach the server, so nothing a client sends may hold it: the TLS handshake
//! and the headers get 10 s each (the latter in [`podprobe_ops::connection`], also between
//! keep-alive requests), the body 10 s and [`MAX_BODY`] bytes, and at most [`MAX_IN_FLIGHT`]
//! bodies are read at once.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::runtime::reflector::Store;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::admission::{self, Injection, Mutation};
use crate::cache::{PpmCache, namespace_labels};
use crate::config::InjectionConfig;
use crate::crd::PodProbeMarker;
use crate::inject::placement::VirtualNode;
use crate::metrics::Metrics;
use crate::patch::to_json_patch;
use crate::validate;

pub use crate::routes::{MUTATE_PODS_PATH, VALIDATE_PPM_PATH};
/// Largest AdmissionReview accepted: a pod is at most ~1.5 MiB (etcd's request limit), and a
/// review carries one (CREATE) or a PodProbeMarker twice (UPDATE).
const MAX_BODY: usize = 4 << 20;
/// How long a request's body may take to arrive once its headers have (the apiserver sends it
/// at once; its own webhook timeout is 10 s by default).
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests whose bodies are read and answered at once; the rest wait for a turn. With
/// [`MAX_BODY`] this bounds what a flood of large requests can make the manager hold (64 MiB),
/// inside the chart's memory limit.
const MAX_IN_FLIGHT: usize = 16;

/// Who owns PodProbeMarkers, the pod annotations and the markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No OpenKruise: podprobe writes the annotations, runs markers, status and propagation.
    Standalone,
    /// OpenKruise owns PPMs, annotations and markers; podprobe only injects the sidecar.
    Companion,
}

/// Everything the webhooks read.
#[derive(Debug)]
pub struct Webhooks {
    pub mode: Mode,
    pub injection: Option<InjectionConfig>,
    /// Learnt from the apiserver's `/version` at start.
    pub native_sidecars_supported: bool,
    pub ppms: Arc<PpmCache>,
    /// Namespace labels for the injection opt-in; `None` without injection.
    pub namespaces: Option<Store<Namespace>>,
    /// The cluster's nodes, for the injected pod's shape; `None` without injection.
    pub nodes: Option<Store<Node>>,
    /// This replica, as the label value naming the issuer of the pods it admits
    /// ([`crate::sidecar_token::issuer_value`]).
    pub issuer: String,
    pub metrics: Arc<Metrics>,
}

/// An answer and the result label it is counted under.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Vec<u8>,
    pub result: &'static str,
}

fn review_body(response: AdmissionResponse) -> Vec<u8> {
    serde_json::to_vec(&response.into_review()).unwrap_or_default()
}

/// The request of an `admission.k8s.io/v1` AdmissionReview; a 400 answer for anything else
/// (the answer echoes the review's apiVersion and kind, so they must be the real ones).
fn decode_review(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, Answer> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body)
        .map_err(|e| bad_request(format!("not an AdmissionReview: {e}")))?;
    if review.types.api_version != "admission.k8s.io/v1" || review.types.kind != "AdmissionReview" {
        return Err(bad_request(format!(
            "not an admission.k8s.io/v1 AdmissionReview: apiVersion {:?}, kind {:?}",
            review.types.api_version, review.types.kind
        )));
    }
    review
        .try_into()
        .map_err(|_| bad_request("AdmissionReview without a request".into()))
}

fn bad_request(message: String) -> Answer {
    Answer {
        status: StatusCode::BAD_REQUEST,
        body: message.into_bytes(),
        result: "bad_request",
    }
}

impl Webhooks {
    /// Answer one HTTP request body for `path`.
    pub fn handle(&self, path: &str, body: &[u8]) -> Answer {
        match path {
            MUTATE_PODS_PATH => self.handle_mutate(body),
            VALIDATE_PPM_PATH => self.handle_validate(body),
            _ => Answer {
                status: StatusCode::NOT_FOUND,
                body: b"not found\n".to_vec(),
                result: "not_found",
            },
        }
    }

    fn handle_mutate(&self, body: &[u8]) -> Answer {
        let req = match decode_review(body) {
            Ok(req) => req,
            Err(answer) => return answer,
        };
        let (response, result) = match self.mutate(&req) {
            Ok(m) if m.ops.is_empty() => (AdmissionResponse::from(&req), "allowed"),
            Ok(m) => match to_json_patch(&m.ops)
                .map_err(|e| e.to_string())
                .and_then(|p| {
                    AdmissionResponse::from(&req)
                        .with_patch(p)
                        .map_err(|e| e.to_string())
                }) {
                Ok(mut r) => {
                    if !m.warnings.is_empty() {
                        let pod = admitted_name(&req);
                        for w in &m.warnings {
                            tracing::warn!(namespace = ?req.namespace, pod, uid = %req.uid, "{w}");
                        }
                        r.warnings = Some(m.warnings);
                    }
                    (r, "patched")
                }
                Err(e) => (internal_error(&req, &e), "error"),
            },
            Err(e) => (internal_error(&req, &e), "error"),
        };
        Answer {
            status: StatusCode::OK,
            body: review_body(response),
            result,
        }
    }

    /// The mutation of an admitted pod (no ops: unchanged). `Err` is an internal error.
    pub fn mutate(&self, req: &AdmissionRequest<DynamicObject>) -> Result<Mutation, String> {
        if req.operation != Operation::Create || req.sub_resource.is_some() {
            return Ok(Mutation::default());
        }
        let Some(object) = &req.object else {
            return Ok(Mutation::default());
        };
        let pod: Pod = serde_json::to_value(object)
            .and_then(serde_json::from_value)
            .map_err(|e| format!("cannot decode the pod: {e}"))?;
        let namespace = req
            .namespace
            .clone()
            .or_else(|| pod.metadata.namespace.clone())
            .unwrap_or_else(|| "default".into());
        let ppms = self.ppms.namespace(&namespace);
        let labels: Option<BTreeMap<String, String>> = self
            .namespaces
            .as_ref()
            .and_then(|s| namespace_labels(s, &namespace));
        let virtual_nodes: Vec<VirtualNode> = match (&self.injection, &self.nodes) {
            (Some(config), Some(nodes)) => nodes
                .state()
                .iter()
                .filter_map(|n| VirtualNode::of(n, &config.virtual_node_taints))
                .collect(),
            _ => vec![],
        };
        let injection = self.injection.as_ref().map(|config| Injection {
            config,
            namespace_labels: labels.as_ref(),
            native_sidecars_supported: self.native_sidecars_supported,
            request_uid: &req.uid,
            companion: self.mode == Mode::Companion,
            virtual_nodes: &virtual_nodes,
            issuer: &self.issuer,
        });
        Ok(admission::mutate(
            &pod,
            &ppms,
            self.mode == Mode::Standalone,
            injection,
        ))
    }

    fn handle_validate(&self, body: &[u8]) -> Answer {
        let req = match decode_review(body) {
            Ok(req) => req,
            Err(answer) => return answer,
        };
        let response = validate_review(&req);
        let result = if response.allowed {
            "allowed"
        } else {
            "denied"
        };
        Answer {
            status: StatusCode::OK,
            body: review_body(response),
            result,
        }
    }
}

/// The admitted pod's name for a log line: a pod created with `generateName` has none yet at
/// admission, so its prefix stands in (`game-` becomes `game-*`).
fn admitted_name(req: &AdmissionRequest<DynamicObject>) -> String {
    if !req.name.is_empty() {
        return req.name.clone();
    }
    req.object
        .as_ref()
        .and_then(|o| o.metadata.generate_name.as_deref())
        .map_or_else(String::new, |prefix| format!("{prefix}*"))
}

/// Admit unchanged, with a warning: a bug or a cache problem must not stop pod creation.
fn internal_error(req: &AdmissionRequest<DynamicObject>, error: &str) -> AdmissionResponse {
    let name = admitted_name(req);
    tracing::error!(uid = %req.uid, %name, "pod admitted unchanged: {error}");
    let mut r = AdmissionResponse::from(req);
    r.warnings = Some(vec![format!(
        "podprobe-manager admitted the pod unchanged: {error}"
    )]);
    r
}

fn decode_ppm(object: Option<&DynamicObject>) -> Result<Option<PodProbeMarker>, String> {
    object
        .map(|o| {
            serde_json::to_value(o)
                .and_then(serde_json::from_value::<PodProbeMarker>)
                .map_err(|e| e.to_string())
        })
        .transpose()
}

/// Deny with HTTP-style code 400, as OpenKruise's `admission.Errored(http.StatusBadRequest, err)`.
fn deny_400(req: &AdmissionRequest<DynamicObject>, message: String) -> AdmissionResponse {
    let mut r = AdmissionResponse::from(req).deny(message);
    r.result.code = 400;
    r
}

/// The PodProbeMarker validating webhook's answer.
pub fn validate_review(req: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return AdmissionResponse::from(req);
    }
    let new = match decode_ppm(req.object.as_ref()) {
        Ok(Some(p)) => p,
        Ok(None) => return deny_400(req, "the request carries no object".into()),
        Err(e) => return deny_400(req, format!("cannot decode the PodProbeMarker: {e}")),
    };
    let old = match decode_ppm(req.old_object.as_ref()) {
        Ok(o) => o,
        Err(e) => return deny_400(req, format!("cannot decode the old PodProbeMarker: {e}")),
    };
    match validate::validate(&new, old.as_ref()) {
        Ok(()) => AdmissionResponse::from(req),
        Err(errors) => deny_400(req, errors.to_string()),
    }
}

fn response(answer: Answer) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(answer.body)));
    *r.status_mut() = answer.status;
    if answer.status == StatusCode::OK {
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
    }
    r
}

async fn route(
    hooks: Arc<Webhooks>,
    turns: Arc<Semaphore>,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let start = Instant::now();
    let path = req.uri().path().to_owned();
    if req.method() != Method::POST {
        return response(Answer {
            status: StatusCode::METHOD_NOT_ALLOWED,
            body: b"POST only\n".to_vec(),
            result: "bad_request",
        });
    }
    let too_large = || {
        response(Answer {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            body: format!("the body is over {MAX_BODY} bytes\n").into_bytes(),
            result: "bad_request",
        })
    };
    let declared = req.headers().get(http::header::CONTENT_LENGTH);
    let declared = declared.and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|length| length > MAX_BODY) {
        return too_large();
    }
    // The semaphore is never closed, so this waits for a turn and never fails.
    let Ok(_turn) = turns.acquire().await else {
        return response(bad_request("the webhook server is shutting down".into()));
    };
    let read = Limited::new(req.into_body(), MAX_BODY).collect();
    let body = match tokio::time::timeout(BODY_READ_TIMEOUT, read).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) if e.is::<LengthLimitError>() => return too_large(),
        Ok(Err(e)) => return response(bad_request(format!("cannot read the body: {e}"))),
        Err(_) => {
            return response(Answer {
                status: StatusCode::REQUEST_TIMEOUT,
                body: format!("the body took over {BODY_READ_TIMEOUT:?}\n").into_bytes(),
                result: "bad_request",
            });
        }
    };
    let answer = hooks.handle(&path, &body);
    if answer.status != StatusCode::NOT_FOUND {
        hooks
            .metrics
            .webhook(&path, answer.result, start.elapsed().as_secs_f64());
    }
    response(answer)
}

/// Serve the webhooks over HTTPS on `listener` until `shutdown`; open connections finish their
/// current request.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    hooks: Arc<Webhooks>,
    shutdown: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(tls);
    let turns = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("webhook listener: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let hooks = hooks.clone();
        let turns = turns.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, "TLS handshake failed: {e}");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
            let service = hyper::service::service_fn(move |req| {
                let (hooks, turns) = (hooks.clone(), turns.clone());
                async move { Ok::<_, Infallible>(route(hooks, turns, req).await) }
            });
            podprobe_ops::connection::serve(tls, service, shutdown).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hooks() -> Webhooks {
        Webhooks {
            mode: Mode::Standalone,
            injection: None,
            native_sidecars_supported: true,
            ppms: Arc::new(PpmCache::default()),
            namespaces: None,
            nodes: None,
            issuer: "manager-0".into(),
            metrics: Arc::new(Metrics::default()),
        }
    }

    fn review(api_version: &str, kind: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": api_version, "kind": kind,
            "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "games", "operation": "CREATE", "userInfo": {"username": "admin"},
                "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                    "spec": {"containers": [{"name": "main"}]}}}
        }))
        .unwrap()
    }

    /// Found by the `admission_review` fuzz target: the answer echoed a misspelt kind.
    #[test]
    fn only_a_real_admission_review_is_answered() {
        let hooks = hooks();
        for path in [MUTATE_PODS_PATH, VALIDATE_PPM_PATH] {
            let answer = hooks.handle(path, &review("admission.k8s.io/v1", "AdmissionReview"));
            assert_eq!(answer.status, StatusCode::OK, "{path}");
            for (api_version, kind) in [
                ("admission.k8s.io/v1", "AdmissIonReview"),
                ("admission.k8s.io/v1beta1", "AdmissionReview"),
            ] {
                let answer = hooks.handle(path, &review(api_version, kind));
                assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{path} {kind}");
                let message = String::from_utf8(answer.body).unwrap();
                assert!(
                    message.contains("not an admission.k8s.io/v1 AdmissionReview"),
                    "{message}"
                );
            }
        }
    }

    /// A pod created with `generateName` has no name at admission; its log lines name its
    /// prefix rather than nothing.
    #[test]
    fn a_generated_pod_is_named_by_its_prefix() {
        let request = |metadata: serde_json::Value, name: &str| {
            let review: AdmissionReview<DynamicObject> =
                serde_json::from_value(serde_json::json!({
                    "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                    "request": {"uid": "u", "name": name,
                        "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "namespace": "games", "operation": "CREATE", "userInfo": {},
                        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": metadata}}
                }))
                .unwrap();
            review.try_into().unwrap()
        };
        let named = request(serde_json::json!({"name": "gs-0"}), "gs-0");
        assert_eq!(admitted_name(&named), "gs-0");
        let generated = request(serde_json::json!({"generateName": "gs-"}), "");
        assert_eq!(admitted_name(&generated), "gs-*");
    }
}
