//! The `pods/exec` request up to the WebSocket upgrade: the checks the
//! apiserver makes, subprotocol negotiation, and the 101 that starts a session.

use std::collections::HashMap;

use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, header};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::sync::watch;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::session::session;
use super::{ExecRequest, ExecState, V1, V4, V5};
use crate::error::ApiError;
use crate::response::{Body, empty};
use crate::store::Store;

/// `/api/v1/namespaces/{ns}/pods/{name}/exec` → (ns, name).
pub(crate) fn parse_path(path: &str) -> Option<(String, String)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", name, "exec"] => {
            Some((ns.to_string(), name.to_string()))
        }
        _ => None,
    }
}

/// The subprotocol the real server would pick for `offered` (in the client's
/// order), `Some("")` when none was offered, `None` when nothing fits.
/// `v5`: whether the apiserver's v5 stream translator is on (1.30+ default).
fn negotiate(offered: &[String], v5: bool) -> Option<&'static str> {
    if offered.is_empty() {
        return Some("");
    }
    if v5 && offered.iter().any(|p| p == V5) {
        return Some(V5);
    }
    offered.iter().find_map(|p| match p.as_str() {
        V4 => Some(V4),
        V1 => Some(V1),
        _ => None,
    })
}

fn offered_protocols(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn header_has(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Everything the exec handler needs from the request.
pub(crate) struct Incoming<'a> {
    pub method: &'a Method,
    pub headers: &'a HeaderMap,
    pub query: &'a str,
    pub upgrade: Option<OnUpgrade>,
    pub user: String,
}

/// Checks done before the upgrade; on success returns the 101 response and
/// starts the session on the upgraded connection.
pub(crate) fn handle(
    store: &Store,
    exec: &ExecState,
    ns: &str,
    name: &str,
    req: Incoming<'_>,
    drop_after: Option<u64>,
    stop: watch::Receiver<bool>,
) -> Result<Response<Body>, ApiError> {
    if !matches!(*req.method, Method::GET | Method::POST) {
        return Err(ApiError::method_not_allowed());
    }
    let r = crate::resources::find("", "v1", "pods").ok_or_else(ApiError::no_route)?;
    let pod = store.get(r, ns, name)?;
    let mut request = requested(&pod, ns, name, req.query, req.user)?;
    let key = websocket_key(req.headers)?;
    let Some(protocol) = negotiate(&offered_protocols(req.headers), exec.v5()) else {
        return Ok(handshake_refused());
    };
    let Some(upgrade) = req.upgrade else {
        return Err(ApiError::internal("the connection cannot be upgraded"));
    };
    request.protocol = protocol.to_string();
    exec.record(request.clone());
    let runner = exec.runner();
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        session(ws, request, runner, drop_after, stop).await;
    });
    Ok(switching_protocols(&key, protocol))
}

/// The exec the query asks for, checked as the apiserver does (400: a
/// container not in the pod, no command, no stream). Its protocol is left
/// for the negotiation.
fn requested(
    pod: &Value,
    ns: &str,
    name: &str,
    query: &str,
    user: String,
) -> Result<ExecRequest, ApiError> {
    let mut params: HashMap<String, Vec<String>> = HashMap::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()).into_owned() {
        params.entry(k).or_default().push(v);
    }
    let one = |k: &str| params.get(k).and_then(|v| v.last()).cloned();
    let flag = |k: &str| matches!(one(k).as_deref(), Some("true" | "1"));
    let container = container_for(pod, name, one("container").unwrap_or_default())?;
    let command = params.get("command").cloned().unwrap_or_default();
    if command.is_empty() {
        return Err(ApiError::bad_request("you must specify at least 1 command"));
    }
    let (stdin, stdout, stderr, tty) = (flag("stdin"), flag("stdout"), flag("stderr"), flag("tty"));
    if !stdin && !stdout && !stderr {
        return Err(ApiError::bad_request(
            "you must specify at least 1 of stdin, stdout, stderr",
        ));
    }
    Ok(ExecRequest {
        namespace: ns.to_string(),
        pod: name.to_string(),
        container,
        command,
        stdin,
        stdout,
        stderr,
        tty,
        protocol: String::new(),
        user,
    })
}

/// The `Sec-WebSocket-Key` of a WebSocket upgrade request; 400 for anything else.
fn websocket_key(headers: &HeaderMap) -> Result<Vec<u8>, ApiError> {
    let is_ws = header_has(headers, header::CONNECTION, "upgrade")
        && header_has(headers, header::UPGRADE, "websocket");
    if !is_ws {
        return Err(ApiError::bad_request(
            "Upgrade request required (testkit serves pods/exec over WebSocket only, not SPDY)",
        ));
    }
    headers
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|k| k.as_bytes().to_vec())
        .ok_or_else(|| ApiError::bad_request("missing Sec-WebSocket-Key"))
}

/// x/net/websocket's answer to a failed handshake: 403, no body.
fn handshake_refused() -> Response<Body> {
    let mut resp = Response::new(empty());
    *resp.status_mut() = StatusCode::FORBIDDEN;
    resp
}

/// The 101 that completes the WebSocket handshake for `key`, naming the
/// negotiated `protocol` unless the client offered none.
fn switching_protocols(key: &[u8], protocol: &'static str) -> Response<Body> {
    let mut resp = Response::new(empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key);
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if !protocol.is_empty() {
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(protocol),
        );
    }
    resp
}

/// The container to exec in: the one asked for, or the only one.
fn container_for(pod: &Value, name: &str, asked: String) -> Result<String, ApiError> {
    let names = |key: &str| -> Vec<String> {
        pod.pointer(&format!("/spec/{key}"))
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| c.get("name").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let containers = names("containers");
    if asked.is_empty() {
        return match containers.as_slice() {
            [only] => Ok(only.clone()),
            _ => Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                containers.join(" ")
            ))),
        };
    }
    let all = [
        containers,
        names("initContainers"),
        names("ephemeralContainers"),
    ]
    .concat();
    if all.contains(&asked) {
        Ok(asked)
    } else {
        Err(ApiError::bad_request(format!(
            "container {asked} is not valid for pod {name}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn negotiation_follows_the_real_server() {
        assert_eq!(negotiate(&s(&[V5, V4]), true), Some(V5));
        assert_eq!(
            negotiate(&s(&[V4, V5]), true),
            Some(V5),
            "the v5 translator wins"
        );
        assert_eq!(negotiate(&s(&[V5, V4]), false), Some(V4), "kubelet only");
        assert_eq!(negotiate(&s(&[V1, V4]), true), Some(V1), "client order");
        assert_eq!(negotiate(&s(&[V4, V1]), true), Some(V4));
        assert_eq!(negotiate(&s(&[]), true), Some(""));
        assert_eq!(negotiate(&s(&["v2.channel.k8s.io"]), true), None);
    }
}
