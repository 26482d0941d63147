//! HTTP connection handling: every request is read, journaled, put through the
//! fault rules and authentication, then handed to `pods/exec` or to routing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::auth::{Attributes, Auth, User};
use crate::error::ApiError;
use crate::exec;
use crate::faults::Faults;
use crate::journal::{Entry, Journal};
use crate::response::{Body, error_response};
use crate::store::Store;
use injection::Injected;

mod control;
mod injection;
mod routing;
mod verbs;
mod watch;

/// Everything the server shares with the handle; survives restarts.
#[derive(Debug)]
pub(crate) struct Shared {
    pub store: Store,
    pub journal: Journal,
    pub faults: Faults,
    pub auth: Auth,
    pub bookmark_interval: Duration,
    pub address: String,
    pub exec: crate::exec::ExecState,
}

/// The error a handler returns to make hyper drop the connection.
#[derive(Debug, thiserror::Error)]
#[error("testkit: connection reset by an injected fault")]
pub(crate) struct Reset;

/// Accept connections until `shutdown` turns true; then drop every
/// connection (and with it every watch).
pub(crate) async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|s| *s) => break,
        };
        let Ok((stream, _)) = accepted else {
            continue;
        };
        let shared = shared.clone();
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
            let stop_for_handler = stop.clone();
            let svc = service_fn(move |req| handle(shared.clone(), req, stop_for_handler.clone()));
            let conn = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), svc)
                .with_upgrades();
            tokio::select! {
                _ = conn => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        });
    }
}

/// Parsed query parameters (last value wins).
fn query_map(q: &str) -> HashMap<String, String> {
    form_urlencoded::parse(q.as_bytes()).into_owned().collect()
}

fn is_true(q: &HashMap<String, String>, k: &str) -> bool {
    matches!(q.get(k).map(String::as_str), Some("true" | "1"))
}

/// An authenticated API request, as routing and the verbs see it.
struct Req {
    method: Method,
    path: String,
    q: HashMap<String, String>,
    content_type: String,
    accept: String,
    body: Bytes,
    user: User,
}

/// The URI and the headers a request is judged by (a missing header reads as `""`).
struct Head {
    path: String,
    query: String,
    content_type: String,
    accept: String,
    authorization: Option<String>,
}

impl Head {
    fn read(parts: &http::request::Parts) -> Self {
        let header = |h: header::HeaderName| parts.headers.get(h).and_then(|v| v.to_str().ok());
        Self {
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or("").to_string(),
            content_type: header(header::CONTENT_TYPE).unwrap_or("").to_string(),
            accept: header(header::ACCEPT).unwrap_or("").to_string(),
            authorization: header(header::AUTHORIZATION).map(str::to_string),
        }
    }
}

/// The journal's record of a request, before it is answered.
fn journal_entry(method: &Method, head: &Head, user: Option<&User>, body: &[u8]) -> Entry {
    Entry {
        seq: 0,
        time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        method: method.to_string(),
        path: head.path.clone(),
        query: head.query.clone(),
        content_type: head.content_type.clone(),
        user: user.map(|u| u.name.clone()).unwrap_or_default(),
        body: String::from_utf8_lossy(body).into_owned(),
        status: 0,
        fault: false,
    }
}

/// One request: a control endpoint (neither journaled nor faulted), or an
/// API request.
async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Response<Body>, Reset> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let head = Head::read(&parts);
    if head.path.starts_with("/testkit/") {
        return Ok(control::control(&shared, &parts.method, &head.path, &body));
    }
    api_request(&shared, parts, head, body, stop).await
}

/// An API request, journaled with its status: the fault rules, then
/// authentication, then `pods/exec` or routing.
async fn api_request(
    shared: &Arc<Shared>,
    mut parts: http::request::Parts,
    head: Head,
    body: Bytes,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Response<Body>, Reset> {
    let q = query_map(&head.query);
    let user = shared.auth.authenticate(head.authorization.as_deref());
    let mut entry = journal_entry(&parts.method, &head, user.as_ref(), &body);
    let actions = shared.faults.take(
        parts.method.as_str(),
        &head.path,
        &head.query,
        &head.content_type,
        is_true(&q, "watch"),
    );
    let later = match injection::injected(actions).await {
        Injected::Later(later) => later,
        Injected::Reset => return faulted(shared, entry, None),
        Injected::Answer(e) => return faulted(shared, entry, Some(e)),
    };

    let Some(user) = user else {
        let e = ApiError::unauthorized();
        entry.status = e.code;
        shared.journal.record(entry);
        return Ok(error_response(&e));
    };
    if let Some((ns, name)) = exec::parse_path(&head.path) {
        let drop_after = later.drop_exec_after;
        let resp = exec_request(
            shared,
            &ns,
            &name,
            &mut parts,
            &head.query,
            &user,
            drop_after,
            stop,
        )
        .unwrap_or_else(|e| error_response(&e));
        entry.status = resp.status().as_u16();
        entry.fault |= drop_after.is_some() && entry.status == 101;
        shared.journal.record(entry);
        return Ok(resp);
    }
    let req = Req {
        method: parts.method,
        path: head.path,
        q,
        content_type: head.content_type,
        accept: head.accept,
        body,
        user,
    };
    let resp = routing::route(shared, &req, later.end_watch_after)
        .await
        .unwrap_or_else(|e| error_response(&e));
    entry.status = resp.status().as_u16();
    shared.journal.record(entry);
    Ok(resp)
}

/// Journal a request the fault rules answered (`Some`) or reset (`None`) as
/// a fault, and answer it so.
fn faulted(
    shared: &Shared,
    mut entry: Entry,
    answer: Option<ApiError>,
) -> Result<Response<Body>, Reset> {
    entry.fault = true;
    if let Some(e) = &answer {
        entry.status = e.code;
    }
    shared.journal.record(entry);
    answer.map(|e| error_response(&e)).ok_or(Reset)
}

/// `pods/exec`: authorization (`create pods/exec`), then the endpoint.
#[allow(clippy::too_many_arguments)]
fn exec_request(
    shared: &Arc<Shared>,
    ns: &str,
    name: &str,
    parts: &mut http::request::Parts,
    query: &str,
    user: &User,
    drop_after: Option<u64>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Response<Body>, ApiError> {
    let attrs = Attributes {
        verb: "create",
        group: "",
        resource: "pods",
        subresource: "exec",
        namespace: ns,
        name,
    };
    if !shared.auth.authorize(user, &attrs) {
        return Err(ApiError::forbidden(
            &user.name, "create", "", "pods", "exec", ns, name,
        ));
    }
    let incoming = exec::Incoming {
        method: &parts.method,
        headers: &parts.headers,
        query,
        upgrade: parts.extensions.remove::<hyper::upgrade::OnUpgrade>(),
        user: user.name.clone(),
    };
    exec::handle(
        &shared.store,
        &shared.exec,
        ns,
        name,
        incoming,
        drop_after,
        stop,
    )
}
