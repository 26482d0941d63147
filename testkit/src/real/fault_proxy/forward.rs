//! One request through the proxy: the faults that match it, then the apiserver's own answer.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{
    CONNECTION, CONTENT_TYPE, HOST, RETRY_AFTER, SEC_WEBSOCKET_PROTOCOL, TRANSFER_ENCODING, UPGRADE,
};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpStream;

use super::{Serving, Shared, Upstream, upgrade, watch};
use crate::{Action, Entry};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type ProxyBody = BoxBody<Bytes, BoxError>;

/// Returned to hyper to close the client's connection without an answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Dropped {
    #[error("connection reset by an injected fault")]
    Reset,
    #[error("reading the client's request body: {0}")]
    Body(hyper::Error),
}

/// Headers that describe one hop's connection, not the request (RFC 9110 §7.6.1); an upgrade
/// keeps `Connection` and `Upgrade`, which are what it asks the apiserver for.
const HOP_BY_HOP: [&str; 6] = [
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "proxy-authorization",
];

pub(crate) async fn handle(
    shared: Arc<Shared>,
    serving: Serving,
    link: Link,
    mut req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Dropped> {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let mut entry = Entry {
        seq: 0,
        time: chrono::Utc::now().to_rfc3339(),
        method: req.method().to_string(),
        content_type: header(req.headers(), CONTENT_TYPE.as_str()),
        body: String::new(),
        status: 0,
        fault: false,
        path,
        query,
    };
    let upgrading = req.headers().contains_key(UPGRADE);
    let client_upgrade = upgrading.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    let body = body.collect().await.map_err(Dropped::Body)?.to_bytes();
    entry.body = String::from_utf8_lossy(&body).into_owned();

    let is_watch = entry.is_watch();
    let actions = shared.faults.take(
        &entry.method,
        &entry.path,
        &entry.query,
        &entry.content_type,
        is_watch,
    );
    let (mut end_watch_after, mut drop_exec_after, mut delay_events) = (None, None, None);
    for action in actions {
        match action {
            Action::Delay { millis } => tokio::time::sleep(Duration::from_millis(millis)).await,
            Action::Status {
                code,
                retry_after,
                message,
            } => {
                entry.status = code;
                entry.fault = true;
                shared.journal.record(entry);
                return Ok(status_response(code, message, retry_after));
            }
            Action::Reset => {
                entry.fault = true;
                shared.journal.record(entry);
                return Err(Dropped::Reset);
            }
            Action::WatchExpired if is_watch => {
                entry.status = 200;
                entry.fault = true;
                shared.journal.record(entry);
                return Ok(expired_watch_response());
            }
            Action::WatchExpired => {}
            Action::EndWatchAfter { events } => end_watch_after = Some(events),
            Action::DelayWatchEvents { millis } => {
                entry.fault = true;
                delay_events = Some(Duration::from_millis(millis));
            }
            Action::DropExecStreamAfter { bytes } => drop_exec_after = Some(bytes),
            Action::WithoutSubprotocol { protocol } => {
                entry.fault = true;
                without_subprotocol(&mut parts.headers, &protocol);
            }
        }
    }

    strip_hop_by_hop(&mut parts.headers, upgrading);
    let request = Request::from_parts(parts, Full::new(body));
    let mut response = match send(&shared.upstream, &link, request, upgrading).await {
        Ok(response) => response,
        Err(e) => {
            entry.status = StatusCode::BAD_GATEWAY.as_u16();
            shared.journal.record(entry);
            let message = format!("the fault proxy cannot reach the apiserver: {e}");
            return Ok(status_response(502, Some(message), None));
        }
    };
    entry.status = response.status().as_u16();
    entry.fault |= end_watch_after.is_some() || drop_exec_after.is_some();
    shared.journal.record(entry);

    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = client_upgrade
    {
        let apiserver_upgrade = hyper::upgrade::on(&mut response);
        serving.tasks.spawn(upgrade::splice(
            client_upgrade,
            apiserver_upgrade,
            drop_exec_after,
            serving.outage.clone(),
        ));
        let (parts, _) = response.into_parts();
        return Ok(Response::from_parts(parts, empty()));
    }
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    let body = match (end_watch_after, delay_events) {
        (Some(events), _) if is_watch => watch::end_after(body, events),
        (None, Some(delay)) if is_watch => watch::delay_events(body, delay),
        _ => body.map_err(BoxError::from).boxed(),
    };
    Ok(Response::from_parts(parts, body))
}

/// The apiserver side of one client connection: kept alive between requests, as the client's
/// own connection is, so a client's connection pattern reaches the apiserver unchanged.
pub(crate) type Link = Arc<tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>>;

/// Sends `request` to the apiserver: on the client connection's link, or (an upgrade, which
/// takes the connection over) on a connection of its own.
async fn send(
    upstream: &Upstream,
    link: &Link,
    mut request: Request<Full<Bytes>>,
    upgrading: bool,
) -> Result<Response<Incoming>, BoxError> {
    request
        .headers_mut()
        .insert(HOST, HeaderValue::from_str(&upstream.authority)?);
    if upgrading {
        return Ok(connect(upstream).await?.send_request(request).await?);
    }
    request.headers_mut().remove(CONNECTION);
    let mut link = link.lock().await;
    let reusable = match link.as_mut() {
        Some(sender) => sender.ready().await.is_ok(),
        None => false,
    };
    if !reusable {
        *link = Some(connect(upstream).await?);
    }
    let sender = link.as_mut().expect("a connection to the apiserver");
    Ok(sender.send_request(request).await?)
}

/// A new TLS connection to the apiserver.
async fn connect(upstream: &Upstream) -> Result<SendRequest<Full<Bytes>>, BoxError> {
    let tcp = TcpStream::connect(&upstream.addr).await?;
    tcp.set_nodelay(true)?;
    let tls = upstream
        .tls
        .connect(upstream.server_name.clone(), tcp)
        .await?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(async move {
        // Ends when the link is dropped (or the upgraded stream ends); its errors are the
        // requests'.
        let _ = connection.with_upgrades().await;
    });
    Ok(sender)
}

/// Takes `protocol` out of the `Sec-WebSocket-Protocol` offer (one header, comma-separated,
/// or several).
fn without_subprotocol(headers: &mut HeaderMap, protocol: &str) {
    let offered: Vec<String> = headers
        .get_all(SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty() && *p != protocol)
        .map(str::to_owned)
        .collect();
    headers.remove(SEC_WEBSOCKET_PROTOCOL);
    if let Ok(value) = HeaderValue::from_str(&offered.join(", "))
        && !offered.is_empty()
    {
        headers.insert(SEC_WEBSOCKET_PROTOCOL, value);
    }
}

fn strip_hop_by_hop(headers: &mut HeaderMap, upgrading: bool) {
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    if !upgrading {
        headers.remove(CONNECTION);
        headers.remove(UPGRADE);
    }
    headers.remove(TRANSFER_ENCODING);
}

/// A watch whose only event is a 410 `Expired` error, as the watch cache sends when asked to
/// resume from a resourceVersion older than it holds.
fn expired_watch_response() -> Response<ProxyBody> {
    let event = json!({"type": "ERROR", "object": {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "injected fault: too old resource version",
        "reason": "Expired",
        "code": 410,
    }});
    let mut response = Response::new(full(Bytes::from(format!("{event}\n"))));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A `metav1.Status` answer, as kube-apiserver writes one for `code`.
fn status_response(
    code: u16,
    message: Option<String>,
    retry_after: Option<u64>,
) -> Response<ProxyBody> {
    let reason = reason(code);
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message.unwrap_or_else(|| format!("injected fault: {code} {reason}")),
        "reason": reason,
        "code": code,
    });
    if let Some(seconds) = retry_after {
        status["details"] = json!({"retryAfterSeconds": seconds});
    }
    let mut response = Response::new(full(Bytes::from(status.to_string())));
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(seconds) = retry_after {
        headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// `metav1.StatusReason` for a code, as the apiserver pairs them.
fn reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "",
    }
}

fn header(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

fn full(bytes: Bytes) -> ProxyBody {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

fn empty() -> ProxyBody {
    full(Bytes::new())
}
