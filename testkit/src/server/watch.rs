//! Watch streaming: a watch request's options, what a watcher sees of each
//! stored change, and the task that streams its events and bookmarks.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{Req, Shared, is_true};
use crate::error::ApiError;
use crate::resources::{self, ResourceDef};
use crate::response::Body;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{EventType, WatchRecord};
use crate::table;

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

/// The watch ended before its timeout: the client went away, an injected
/// fault cut it, or its version was compacted away.
struct Ended;

/// One watch: its selection, and how far its stream has got.
struct Watcher {
    shared: Arc<Shared>,
    r: &'static ResourceDef,
    ns: Option<String>,
    params: WatchParams,
    /// The storage key of `r`: the history's records of other resources are skipped.
    res: String,
    /// The injected `EndWatchAfter`: the stream ends after this many object events.
    end_after: Option<usize>,
    as_table: bool,
    tx: mpsc::Sender<Bytes>,
    /// Object events sent (bookmarks do not count).
    sent: usize,
    /// The resourceVersion the watcher has seen the history up to.
    last: u64,
    last_bookmark: u64,
}

impl Watcher {
    /// Stream from the start version until the timeout, following the store's
    /// changes and sending a bookmark every bookmark interval the version moved.
    async fn run(mut self) -> Result<(), Ended> {
        let mut changes = self.shared.store.subscribe();
        let deadline = tokio::time::sleep(self.params.timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(self.shared.bookmark_interval);
        ticker.tick().await;
        self.start().await?;
        loop {
            if self.cut() {
                return Err(Ended);
            }
            self.forward_changes().await?;
            tokio::select! {
                c = changes.changed() => if c.is_err() { return Err(Ended) },
                _ = ticker.tick() => self.bookmark_if_moved().await?,
                _ = &mut deadline => {
                    let _ = self.bookmark_if_moved().await;
                    return Ok(());
                }
                _ = self.tx.closed() => return Err(Ended),
            }
        }
    }

    /// Where the watch starts: at the version asked for, or at a snapshot sent as
    /// ADDED events (then, for `sendInitialEvents`, the initial-events-end bookmark).
    async fn start(&mut self) -> Result<(), Ended> {
        self.last = match self.params.start_rv {
            Some(v) if !self.params.send_initial => v,
            _ => {
                let (items, rv) = self.shared.store.list(
                    self.r,
                    self.ns.as_deref(),
                    &self.params.labels,
                    &self.params.fields,
                );
                for o in items {
                    self.send_object("ADDED", o).await?;
                }
                if self.params.send_initial {
                    self.send_line("BOOKMARK", &bookmark(self.r, rv, true))
                        .await?;
                }
                rv
            }
        };
        self.last_bookmark = self.last;
        Ok(())
    }

    /// Send what this watcher sees of the stored changes after `last`; a version
    /// compacted away ends the watch with an ERROR event (410 Gone).
    async fn forward_changes(&mut self) -> Result<(), Ended> {
        let records = match self.shared.store.events_after(self.last) {
            Ok(records) => records,
            Err(e) => {
                let _ = self.send_line("ERROR", &e.to_status()).await;
                return Err(Ended);
            }
        };
        for rec in records {
            self.last = rec.rv;
            if rec.res != self.res {
                continue;
            }
            if let Some((kind, obj)) = watch_event(rec, |o| self.matches(o)) {
                self.send_object(kind, obj).await?;
                if self.cut() {
                    return Err(Ended);
                }
            }
        }
        Ok(())
    }

    /// A bookmark at `last`, if bookmarks were asked for and the version has
    /// moved since the previous one.
    async fn bookmark_if_moved(&mut self) -> Result<(), Ended> {
        if self.params.bookmarks && self.last > self.last_bookmark {
            self.last_bookmark = self.last;
            self.send_line("BOOKMARK", &bookmark(self.r, self.last, false))
                .await?;
        }
        Ok(())
    }

    fn matches(&self, o: &Value) -> bool {
        self.ns
            .as_deref()
            .is_none_or(|n| o.pointer("/metadata/namespace").and_then(Value::as_str) == Some(n))
            && self.params.labels.matches(o)
            && self.params.fields.matches(self.r, o)
    }

    /// Has the injected `EndWatchAfter` been reached?
    fn cut(&self) -> bool {
        self.end_after.is_some_and(|k| self.sent >= k)
    }

    /// An object event (as a one-row table if asked for one).
    async fn send_object(&mut self, kind: &str, obj: Value) -> Result<(), Ended> {
        let obj = if self.as_table {
            table::table(self.r, &[obj], None)
        } else {
            obj
        };
        self.send_line(kind, &obj).await?;
        self.sent += 1;
        Ok(())
    }

    async fn send_line(&self, kind: &str, obj: &Value) -> Result<(), Ended> {
        self.tx.send(event_line(kind, obj)).await.map_err(|_| Ended)
    }
}

/// Start a watch: its options are checked now; its events stream from a task
/// of their own into the response body.
pub(super) fn watch_stream(
    shared: Arc<Shared>,
    r: &'static ResourceDef,
    ns: Option<String>,
    req: &Req,
    fields: &str,
    end_after: Option<usize>,
    as_table: bool,
) -> Result<Response<Body>, ApiError> {
    let params = WatchParams::parse(r, &req.q, fields)?;
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let watcher = Watcher {
        shared,
        r,
        ns,
        params,
        res: resources::storage_key(r),
        end_after,
        as_table,
        tx,
        sent: 0,
        last: 0,
        last_bookmark: 0,
    };
    tokio::spawn(async move {
        let _ = watcher.run().await;
    });
    Ok(streaming_response(rx))
}

/// A JSON response whose body is the lines from `rx`, each sent as it comes.
fn streaming_response(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
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
    resp
}
