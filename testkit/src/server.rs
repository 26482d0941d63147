//! HTTP: connection handling, routing, verbs, watch streaming, and the
//! `/testkit/*` control endpoints.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::auth::{Attributes, Auth, User};
use crate::discovery;
use crate::error::ApiError;
use crate::exec;
use crate::faults::{Action, Fault, Faults};
use crate::journal::{Entry, Journal};
use crate::openapi;
use crate::patch::{self, PatchType};
use crate::resources::{self, ResourceDef};
use crate::response::{Body, error_response, full, json_response};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{DeleteOpts, Endpoint, EventType, Store, WatchRecord};
use crate::table;

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
    mut shutdown: watch::Receiver<bool>,
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

struct Req {
    method: Method,
    path: String,
    q: HashMap<String, String>,
    content_type: String,
    accept: String,
    body: Bytes,
    user: User,
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    stop: watch::Receiver<bool>,
) -> Result<Response<Body>, Reset> {
    let (mut parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or("").to_string();
    let hdr = |h: header::HeaderName| {
        parts
            .headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let content_type = hdr(header::CONTENT_TYPE);
    let accept = hdr(header::ACCEPT);
    let authz = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);

    if path.starts_with("/testkit/") {
        return Ok(control(&shared, &parts.method, &path, &body));
    }

    let q = query_map(&query);
    let is_watch = is_true(&q, "watch");
    let user = shared.auth.authenticate(authz.as_deref());
    let mut entry = Entry {
        seq: 0,
        time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        method: parts.method.to_string(),
        path: path.clone(),
        query: query.clone(),
        content_type: content_type.clone(),
        user: user.as_ref().map(|u| u.name.clone()).unwrap_or_default(),
        body: String::from_utf8_lossy(&body).into_owned(),
        status: 0,
        fault: false,
    };

    let actions = shared.faults.take(
        parts.method.as_str(),
        &path,
        &query,
        &content_type,
        is_watch,
    );
    let Later {
        end_watch_after,
        drop_exec_after,
    } = match injected(actions).await {
        Injected::Later(later) => later,
        Injected::Reset => {
            entry.fault = true;
            shared.journal.record(entry);
            return Err(Reset);
        }
        Injected::Answer(e) => {
            entry.fault = true;
            entry.status = e.code;
            shared.journal.record(entry);
            return Ok(error_response(&e));
        }
    };

    let Some(user) = user else {
        let e = ApiError::unauthorized();
        entry.status = e.code;
        shared.journal.record(entry);
        return Ok(error_response(&e));
    };
    if let Some((ns, name)) = exec::parse_path(&path) {
        let resp = exec_request(
            &shared,
            &ns,
            &name,
            &mut parts,
            &query,
            &user,
            drop_exec_after,
            stop,
        )
        .unwrap_or_else(|e| error_response(&e));
        entry.status = resp.status().as_u16();
        entry.fault |= drop_exec_after.is_some() && entry.status == 101;
        shared.journal.record(entry);
        return Ok(resp);
    }
    let req = Req {
        method: parts.method,
        path,
        q,
        content_type,
        accept,
        body,
        user,
    };
    let resp = route(&shared, &req, end_watch_after)
        .await
        .unwrap_or_else(|e| error_response(&e));
    entry.status = resp.status().as_u16();
    shared.journal.record(entry);
    Ok(resp)
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
    stop: watch::Receiver<bool>,
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

/// Faults that act later in the request: on its watch or its exec stream.
#[derive(Default)]
struct Later {
    end_watch_after: Option<usize>,
    drop_exec_after: Option<u64>,
}

/// What the matching fault rules do to a request.
enum Injected {
    /// The connection is dropped.
    Reset,
    /// The request is answered with this error instead.
    Answer(ApiError),
    /// It is served, with these faults to come.
    Later(Later),
}

/// Applies delays in order; the first reset or status answers the request.
async fn injected(actions: Vec<Action>) -> Injected {
    let mut later = Later::default();
    for action in actions {
        match action {
            Action::Delay { millis } => tokio::time::sleep(Duration::from_millis(millis)).await,
            Action::Reset => return Injected::Reset,
            Action::Status {
                code,
                retry_after,
                message,
            } => {
                let mut e = ApiError::from_code(code, message);
                e.retry_after = retry_after;
                if code == 429 && e.details.is_none() {
                    e.details = Some(json!({"retryAfterSeconds": retry_after.unwrap_or(1)}));
                }
                return Injected::Answer(e);
            }
            Action::EndWatchAfter { events } => later.end_watch_after = Some(events),
            Action::DropExecStreamAfter { bytes } => later.drop_exec_after = Some(bytes),
        }
    }
    Injected::Later(later)
}

/// Discovery, OpenAPI and health: the GETs that name no resource.
fn non_resource(shared: &Shared, segs: &[&str]) -> Option<Response<Body>> {
    let doc = match segs {
        ["version"] => Some(discovery::version()),
        ["api"] => Some(discovery::api(&shared.address)),
        ["apis"] => Some(discovery::apis()),
        ["api", v] => discovery::resource_list("", v),
        ["apis", g] => discovery::group(g),
        ["apis", g, v] => discovery::resource_list(g, v),
        ["openapi", "v3"] => Some(openapi::index()),
        ["openapi", "v3", rest @ ..] => openapi::document(&rest.join("/")),
        ["healthz" | "readyz" | "livez"] => return Some(Response::new(full("ok"))),
        _ => None,
    };
    doc.map(|d| json_response(200, &d))
}

/// The authorization verb of a request, as the apiserver's request info names it.
fn verb_of(method: &Method, named: bool, watch: bool) -> Result<&'static str, ApiError> {
    Ok(match (method, named) {
        (&Method::GET, _) if watch => "watch",
        (&Method::GET, false) => "list",
        (&Method::GET, true) => "get",
        (&Method::POST, false) => "create",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => return Err(ApiError::method_not_allowed()),
    })
}

/// `/testkit/journal` (GET: JSON lines; DELETE: clear), `/testkit/faults`
/// (POST: add a rule; GET: list; DELETE: clear), `/testkit/compact` (POST).
fn control(shared: &Shared, method: &Method, path: &str, body: &[u8]) -> Response<Body> {
    match (method.as_str(), path) {
        ("GET", "/testkit/journal") => {
            let mut r = Response::new(full(shared.journal.to_json_lines()));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-ndjson"),
            );
            r
        }
        ("DELETE", "/testkit/journal") => {
            shared.journal.clear();
            json_response(200, &json!({}))
        }
        ("POST", "/testkit/faults") => match serde_json::from_slice::<Fault>(body) {
            Ok(f) => {
                shared.faults.add(f.clone());
                json_response(201, &serde_json::to_value(f).unwrap_or_default())
            }
            Err(e) => error_response(&ApiError::bad_request(format!("bad fault rule: {e}"))),
        },
        ("GET", "/testkit/faults") => json_response(
            200,
            &serde_json::to_value(shared.faults.rules()).unwrap_or_default(),
        ),
        ("DELETE", "/testkit/faults") => {
            shared.faults.clear();
            json_response(200, &json!({}))
        }
        ("POST", "/testkit/compact") => {
            let rv = shared.store.compact();
            json_response(200, &json!({"compactedTo": rv.to_string()}))
        }
        _ => error_response(&ApiError::no_route()),
    }
}

/// A request for a resource, after routing.
struct Target {
    r: &'static ResourceDef,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn resolve(segs: &[&str]) -> Result<Option<Target>, ApiError> {
    let (group, version, rest) = match segs {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Ok(None),
    };
    if rest.is_empty() {
        return Ok(None);
    }
    let namespaced_path = rest[0] == "namespaces"
        && rest.len() >= 3
        && resources::find(group, version, rest[2]).is_some_and(|r| r.namespaced);
    let (ns, rest) = if namespaced_path {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    let Some(r) = resources::find(group, version, rest[0]) else {
        return Err(ApiError::no_route());
    };
    if !r.namespaced && ns.is_some() {
        return Err(ApiError::no_route());
    }
    let name = rest.get(1).map(|s| s.to_string());
    let sub = rest.get(2).map(|s| s.to_string());
    if rest.len() > 3 {
        return Err(ApiError::no_route());
    }
    if let Some(s) = &sub
        && !(s == "status" && r.status_subresource)
    {
        return Err(ApiError::no_route());
    }
    if r.namespaced && ns.is_none() && name.is_some() {
        return Err(ApiError::no_route());
    }
    Ok(Some(Target { r, ns, name, sub }))
}

async fn route(
    shared: &Arc<Shared>,
    req: &Req,
    end_watch_after: Option<usize>,
) -> Result<Response<Body>, ApiError> {
    let segs: Vec<&str> = req
        .path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    if req.method == Method::GET
        && let Some(response) = non_resource(shared, &segs)
    {
        return Ok(response);
    }
    let Some(t) = resolve(&segs)? else {
        return Err(ApiError::no_route());
    };
    let verb = verb_of(&req.method, t.name.is_some(), is_true(&req.q, "watch"))?;
    let ns = t.ns.clone().unwrap_or_default();
    let name = t.name.clone().unwrap_or_default();
    let sub = t.sub.clone().unwrap_or_default();
    let attrs = Attributes {
        verb,
        group: t.r.group,
        resource: t.r.plural,
        subresource: &sub,
        namespace: &ns,
        name: &name,
    };
    if !shared.auth.authorize(&req.user, &attrs) {
        return Err(ApiError::forbidden(
            &req.user.name,
            verb,
            t.r.group,
            t.r.plural,
            &sub,
            &ns,
            &name,
        ));
    }
    if req.q.contains_key("dryRun") {
        return Err(ApiError::bad_request(
            "testkit: dryRun is not supported (the real server would evaluate the request without persisting it)",
        ));
    }
    let r = t.r;
    let store = &shared.store;
    let endpoint = if sub == "status" {
        Endpoint::Status
    } else {
        Endpoint::Main
    };
    let as_table = req.accept.contains("as=Table");
    match verb {
        "get" => {
            let obj = store.get(r, &ns, &name)?;
            Ok(json_response(
                200,
                &if as_table {
                    table::table(r, &[obj], None)
                } else {
                    obj
                },
            ))
        }
        "list" => list(shared, r, t.ns.as_deref(), req, as_table),
        "watch" => {
            let mut fields = req.q.get("fieldSelector").cloned().unwrap_or_default();
            if t.name.is_some() {
                if !fields.is_empty() {
                    fields.push(',');
                }
                fields.push_str(&format!("metadata.name={name}"));
            }
            watch_stream(
                shared.clone(),
                r,
                t.ns.clone(),
                req,
                &fields,
                end_watch_after,
                as_table,
            )
        }
        "create" => {
            let body = parse_body(&req.body)?;
            let obj = store.create(r, &ns, body)?;
            Ok(json_response(201, &obj))
        }
        "update" => {
            let body = parse_body(&req.body)?;
            Ok(json_response(
                200,
                &store.update(r, &ns, &name, body, endpoint)?,
            ))
        }
        "patch" => {
            let pt = PatchType::from_content_type(r, &req.content_type)?;
            let obj = store.patch(r, &ns, &name, endpoint, |cur| {
                patch::apply(r, pt, cur, &req.body)
            })?;
            Ok(json_response(200, &obj))
        }
        "delete" => {
            let opts = delete_opts(req)?;
            Ok(json_response(200, &store.delete(r, &ns, &name, &opts)?))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

fn parse_body(b: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(b).map_err(|e| {
        ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type JSON): {e}"
        ))
    })
}

fn delete_opts(req: &Req) -> Result<DeleteOpts, ApiError> {
    let mut opts = DeleteOpts::default();
    if !req.body.is_empty() {
        let b = parse_body(&req.body)?;
        opts.grace = b.get("gracePeriodSeconds").and_then(Value::as_i64);
        opts.uid = b
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
        opts.rv = b
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    if let Some(g) = req.q.get("gracePeriodSeconds") {
        opts.grace = Some(
            g.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds: {g}")))?,
        );
    }
    Ok(opts)
}

fn selectors(
    r: &ResourceDef,
    q: &HashMap<String, String>,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let l = LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?;
    let f = FieldSelector::parse(r, q.get("fieldSelector").map(String::as_str).unwrap_or(""))?;
    Ok((l, f))
}

fn list(
    shared: &Shared,
    r: &ResourceDef,
    ns: Option<&str>,
    req: &Req,
    as_table: bool,
) -> Result<Response<Body>, ApiError> {
    let limit = match req.q.get("limit") {
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit: {l}")))?,
        None => 0,
    };
    let (items, rv) = match req.q.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let (rv, items) = shared.store.take_continue(token)?;
            (items, rv)
        }
        None => {
            let (l, f) = selectors(r, &req.q)?;
            let (items, rv) = shared.store.list(r, ns, &l, &f);
            // A list at an exact, compacted version cannot be served.
            if req.q.get("resourceVersionMatch").map(String::as_str) == Some("Exact")
                && let Some(v) = req.q.get("resourceVersion")
                && let Ok(v) = v.parse::<u64>()
                && v != rv
            {
                if v < shared.store.compacted() {
                    return Err(ApiError::expired(format!(
                        "too old resource version: {v} ({})",
                        shared.store.compacted() + 1
                    )));
                }
                return Err(ApiError::bad_request(
                    "testkit: resourceVersionMatch=Exact for a past version is not supported",
                ));
            }
            (items, rv)
        }
    };
    let mut meta = json!({"resourceVersion": rv.to_string()});
    let items = if limit > 0 && items.len() > limit {
        let mut items = items;
        let rest = items.split_off(limit);
        meta["remainingItemCount"] = json!(rest.len());
        meta["continue"] = json!(shared.store.save_continue(rv, rest));
        items
    } else {
        items
    };
    if as_table {
        return Ok(json_response(200, &table::table(r, &items, Some(meta))));
    }
    Ok(json_response(
        200,
        &json!({
            "kind": format!("{}List", r.kind),
            "apiVersion": r.api_version(),
            "metadata": meta,
            "items": items,
        }),
    ))
}

fn event_line(kind: &str, obj: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn bookmark(r: &ResourceDef, rv: u64, initial_end: bool) -> Value {
    let mut b = json!({
        "kind": r.kind,
        "apiVersion": r.api_version(),
        "metadata": {"resourceVersion": rv.to_string()},
    });
    if initial_end {
        b["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    b
}

/// A watch request's options, checked as the apiserver checks `ListOptions` for a watch.
struct WatchParams {
    labels: LabelSelector,
    fields: FieldSelector,
    bookmarks: bool,
    send_initial: bool,
    timeout: Duration,
    /// `None`: start from a snapshot (resourceVersion unset or "0").
    start_rv: Option<u64>,
}

impl WatchParams {
    fn parse(r: &ResourceDef, q: &HashMap<String, String>, fields: &str) -> Result<Self, ApiError> {
        let labels =
            LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?;
        let fields = FieldSelector::parse(r, fields)?;
        let bookmarks = is_true(q, "allowWatchBookmarks");
        let send_initial = is_true(q, "sendInitialEvents");
        let rv_match = q.get("resourceVersionMatch").map_or("", String::as_str);
        if send_initial && (rv_match != "NotOlderThan" || !bookmarks) {
            return Err(ApiError::invalid(
                "meta.k8s.io",
                "ListOptions",
                "",
                if rv_match != "NotOlderThan" {
                    "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
                } else {
                    "allowWatchBookmarks: Required value: allowWatchBookmarks must be set to true when sendInitialEvents is set"
                },
            ));
        }
        if !send_initial && !rv_match.is_empty() {
            return Err(ApiError::invalid(
                "meta.k8s.io",
                "ListOptions",
                "",
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
        let timeout = match q.get("timeoutSeconds") {
            Some(t) => Duration::from_secs(
                t.parse()
                    .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {t}")))?,
            ),
            None => Duration::from_secs(1800),
        };
        let start_rv =
            match q.get("resourceVersion").map_or("", String::as_str) {
                "" | "0" => None,
                rv => Some(rv.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid resource version: {rv}"))
                })?),
            };
        Ok(WatchParams {
            labels,
            fields,
            bookmarks,
            send_initial,
            timeout,
            start_rv,
        })
    }
}

/// What a watcher whose selection is `matches` sees of one stored change: an object that
/// enters the selection is ADDED, one that leaves it is DELETED (at the change's version).
fn watch_event(
    rec: WatchRecord,
    matches: impl Fn(&Value) -> bool,
) -> Option<(&'static str, Value)> {
    let now = matches(&rec.obj);
    let before = rec.prev.as_ref().is_some_and(&matches);
    match (rec.kind, before, now) {
        (EventType::Added, _, true) => Some(("ADDED", rec.obj)),
        (EventType::Deleted, _, true) => Some(("DELETED", rec.obj)),
        (EventType::Modified, true, true) => Some(("MODIFIED", rec.obj)),
        (EventType::Modified, false, true) => Some(("ADDED", rec.obj)),
        (EventType::Modified, true, false) => {
            let mut prev = rec.prev.unwrap_or_default();
            prev["metadata"]["resourceVersion"] = json!(rec.rv.to_string());
            Some(("DELETED", prev))
        }
        _ => None,
    }
}

fn watch_stream(
    shared: Arc<Shared>,
    r: &'static ResourceDef,
    ns: Option<String>,
    req: &Req,
    fields: &str,
    end_after: Option<usize>,
    as_table: bool,
) -> Result<Response<Body>, ApiError> {
    let WatchParams {
        labels,
        fields,
        bookmarks,
        send_initial,
        timeout,
        start_rv,
    } = WatchParams::parse(r, &req.q, fields)?;
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let store = &shared.store;
        let mut changes = store.subscribe();
        let res = resources::storage_key(r);
        let matches = |o: &Value| {
            ns.as_deref()
                .is_none_or(|n| o.pointer("/metadata/namespace").and_then(Value::as_str) == Some(n))
                && labels.matches(o)
                && fields.matches(r, o)
        };
        let wrap = |o: Value| {
            if as_table {
                table::table(r, &[o], None)
            } else {
                o
            }
        };
        let mut sent = 0usize;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(shared.bookmark_interval);
        ticker.tick().await;
        // Where to start: a snapshot (synthetic ADDED events) or a version.
        let mut last = match start_rv {
            Some(v) if !send_initial => v,
            _ => {
                let (items, rv) = store.list(r, ns.as_deref(), &labels, &fields);
                for o in items {
                    if tx.send(event_line("ADDED", &wrap(o))).await.is_err() {
                        return;
                    }
                    sent += 1;
                }
                if send_initial
                    && tx
                        .send(event_line("BOOKMARK", &bookmark(r, rv, true)))
                        .await
                        .is_err()
                {
                    return;
                }
                rv
            }
        };
        let mut last_bookmark = last;
        loop {
            if end_after.is_some_and(|k| sent >= k) {
                return;
            }
            match store.events_after(last) {
                Err(e) => {
                    let _ = tx.send(event_line("ERROR", &e.to_status())).await;
                    return;
                }
                Ok(records) => {
                    for rec in records {
                        last = rec.rv;
                        if rec.res != res {
                            continue;
                        }
                        if let Some((kind, obj)) = watch_event(rec, matches) {
                            if tx.send(event_line(kind, &wrap(obj))).await.is_err() {
                                return;
                            }
                            sent += 1;
                            if end_after.is_some_and(|k| sent >= k) {
                                return;
                            }
                        }
                    }
                }
            }
            tokio::select! {
                c = changes.changed() => if c.is_err() { return },
                _ = ticker.tick() => {
                    if bookmarks && last > last_bookmark {
                        last_bookmark = last;
                        if tx.send(event_line("BOOKMARK", &bookmark(r, last, false))).await.is_err() {
                            return;
                        }
                    }
                }
                _ = &mut deadline => {
                    if bookmarks && last > last_bookmark {
                        let _ = tx.send(event_line("BOOKMARK", &bookmark(r, last, false))).await;
                    }
                    return;
                }
                _ = tx.closed() => return,
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut resp = Response::new(StreamBody::new(stream).boxed_unsync());
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}
