//! `pods/exec`: the WebSocket remotecommand endpoint, with the command run
//! locally by a pluggable [`ExecRunner`].
//!
//! `GET`/`POST /api/v1/namespaces/{ns}/pods/{name}/exec?command=…&command=…
//! &container=…&stdin=…&stdout=…&stderr=…&tty=…` with a WebSocket upgrade.
//! Before the upgrade, as the real apiserver: authorization (`create` on
//! `pods/exec`, the rule since Kubernetes 1.35 for WebSocket upgrades; older
//! servers wanted `get` for a WebSocket `GET`), 404 for a missing pod, 400 for
//! an unknown container, a missing container name in a multi-container pod,
//! no command, or a request without a WebSocket upgrade.
//!
//! Subprotocols, negotiated as the real server does: if the client offers
//! `v5.channel.k8s.io` anywhere in its list, the apiserver's stream translator
//! takes the request (v5); otherwise the kubelet's handler picks the first
//! protocol *in the client's order* it supports (`v4.channel.k8s.io`,
//! `channel.k8s.io`, or none offered → `channel.k8s.io` semantics without a
//! `Sec-WebSocket-Protocol` answer). A list with nothing supported → 403 with
//! an empty body (what golang.org/x/net/websocket answers to a failed
//! handshake).
//!
//! Framing: every binary message starts with the channel byte (0 stdin, 1
//! stdout, 2 stderr, 3 error/status, 4 resize, 255 close in v5). After the
//! upgrade an empty message goes to the lowest writable channel (stdout if
//! asked, else stderr, else 3), as the kubelet does. When the command ends
//! and its output has been forwarded, the status goes on channel 3 — v4/v5:
//! a `metav1.Status` JSON (`Success`; `Failure`/`NonZeroExitCode` with
//! `details.causes[{reason: ExitCode, message: "<n>"}]`; `InternalError` when
//! the command could not be started); v1: nothing on success, the status
//! message as plain text otherwise — then the server closes the WebSocket.

use std::collections::HashMap;
use std::fmt;
use std::process::Stdio;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{SinkExt, StreamExt};
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, header};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::error::ApiError;
use crate::response::{Body, empty};
use crate::store::Store;

/// `v5.channel.k8s.io`: v4 plus the CLOSE signal (channel 255).
pub const V5: &str = "v5.channel.k8s.io";
/// `v4.channel.k8s.io`: the status channel carries a `metav1.Status` JSON.
pub const V4: &str = "v4.channel.k8s.io";
/// `channel.k8s.io` (v1): the status channel carries plain error text.
pub const V1: &str = "channel.k8s.io";

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const STATUS: u8 = 3;
const CLOSE: u8 = 255;

/// Bytes read from the command per output message.
const CHUNK: usize = 32 * 1024;

/// One exec request, as the runner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecRequest {
    /// Namespace of the pod.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container (defaulted when the pod has one container).
    pub container: String,
    /// argv.
    pub command: Vec<String>,
    /// `stdin=true`.
    pub stdin: bool,
    /// `stdout=true`.
    pub stdout: bool,
    /// `stderr=true`.
    pub stderr: bool,
    /// `tty=true` (accepted; no terminal is allocated).
    pub tty: bool,
    /// The negotiated subprotocol (`""` when the client offered none).
    pub protocol: String,
    /// Who asked.
    pub user: String,
}

/// The command's streams. Output senders are `None` for streams the client
/// did not ask for (discard that output). Sending fails once the client is
/// gone: keep reading the command's output anyway, and let it run to its end.
#[derive(Debug)]
pub struct ExecIo {
    /// What the client writes on channel 0; ends (recv → `None`) when the
    /// client closes stdin (v5 CLOSE) or goes away. `None` without `stdin=true`.
    pub stdin: Option<mpsc::Receiver<Bytes>>,
    /// To channel 1.
    pub stdout: Option<mpsc::Sender<Bytes>>,
    /// To channel 2.
    pub stderr: Option<mpsc::Sender<Bytes>>,
}

/// How the command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecExit {
    /// Exited with this code (128 + n for a signal, as container runtimes report).
    Code(i32),
    /// Could not be run (the runtime's error text, e.g. executable not found).
    Error(String),
}

/// Runs exec commands for the endpoint. The future returned by [`run`](Self::run)
/// is driven on its own task until it completes: the endpoint does not drop it
/// when the client goes away (as a container runtime lets the exec'd process
/// run on), only when the server's runtime shuts down.
pub trait ExecRunner: Send + Sync + fmt::Debug {
    /// Run `req.command` with `io`; resolve when the command has exited and
    /// its output has been read to EOF.
    fn run(&self, req: ExecRequest, io: ExecIo) -> BoxFuture<'static, ExecExit>;
}

fn not_found_message(program: &str, e: &std::io::Error) -> String {
    format!(
        "failed to exec in container: failed to start exec: OCI runtime exec failed: exec failed: unable to start container process: exec: \"{program}\": {e}"
    )
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

/// The default runner: spawns the command on this machine with
/// `tokio::process` (killed if the server's runtime drops it).
///
/// Do not use it in a process where something else reaps every child (for
/// podprobe: a test binary that runs exec probes in-process owns its children
/// through `podprobe::probe::reaper`); use [`SpawnRunner`] with that spawner.
#[derive(Debug, Default, Clone, Copy)]
pub struct TokioRunner;

impl ExecRunner for TokioRunner {
    fn run(&self, req: ExecRequest, io: ExecIo) -> BoxFuture<'static, ExecExit> {
        Box::pin(async move {
            let Some((program, args)) = req.command.split_first() else {
                return ExecExit::Error("no command".into());
            };
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args)
                .stdin(if io.stdin.is_some() {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true);
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => return ExecExit::Error(not_found_message(program, &e)),
            };
            let (stdin, stdout, stderr) =
                (child.stdin.take(), child.stdout.take(), child.stderr.take());
            let (_, _, _, status) = tokio::join!(
                feed(io.stdin, stdin),
                pump(stdout, io.stdout),
                pump(stderr, io.stderr),
                child.wait()
            );
            match status {
                Ok(s) => ExecExit::Code(exit_code(s)),
                Err(e) => ExecExit::Error(format!("waiting for the command: {e}")),
            }
        })
    }
}

/// What a [`SpawnRunner`]'s spawner returns: the started child (its stdio
/// pipes are taken; it is never waited on) and a future of its exit code.
pub type Spawned = (std::process::Child, BoxFuture<'static, Option<i32>>);

/// A runner that starts commands with a caller-supplied spawner, for
/// processes where something else owns child reaping. The spawner gets a
/// `std::process::Command` with argv and piped stdio set, and must return the
/// child and a future of its exit code (128 + n for signal n).
pub struct SpawnRunner<F> {
    spawn: F,
}

impl<F> fmt::Debug for SpawnRunner<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SpawnRunner")
    }
}

impl<F> SpawnRunner<F>
where
    F: Fn(&mut std::process::Command) -> std::io::Result<Spawned> + Send + Sync + 'static,
{
    /// A runner spawning with `spawn`.
    pub fn new(spawn: F) -> Self {
        Self { spawn }
    }
}

/// SIGKILLs the child when dropped before it has exited.
struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
        }
    }
}

impl<F> ExecRunner for SpawnRunner<F>
where
    F: Fn(&mut std::process::Command) -> std::io::Result<Spawned> + Send + Sync + 'static,
{
    fn run(&self, req: ExecRequest, io: ExecIo) -> BoxFuture<'static, ExecExit> {
        let Some((program, args)) = req.command.split_first() else {
            return Box::pin(async { ExecExit::Error("no command".into()) });
        };
        let mut cmd = std::process::Command::new(program);
        cmd.args(args)
            .stdin(if io.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let spawned = (self.spawn)(&mut cmd);
        let program = program.clone();
        Box::pin(async move {
            let (mut child, exit) = match spawned {
                Ok(s) => s,
                Err(e) => return ExecExit::Error(not_found_message(&program, &e)),
            };
            let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
            let guard = KillOnDrop(Some(child));
            let stdin = pipes.0.and_then(|p| {
                tokio::net::unix::pipe::Sender::from_owned_fd(std::os::fd::OwnedFd::from(p)).ok()
            });
            let out = |p: Option<std::os::fd::OwnedFd>| {
                p.and_then(|fd| tokio::net::unix::pipe::Receiver::from_owned_fd(fd).ok())
            };
            let stdout = out(pipes.1.map(Into::into));
            let stderr = out(pipes.2.map(Into::into));
            let (_, _, _, code) = tokio::join!(
                feed(io.stdin, stdin),
                pump(stdout, io.stdout),
                pump(stderr, io.stderr),
                exit
            );
            let mut guard = guard;
            guard.0 = None;
            match code {
                Some(c) => ExecExit::Code(c),
                None => ExecExit::Error("the command's exit status was lost".into()),
            }
        })
    }
}

/// Client stdin → the command's stdin, closed at the end.
async fn feed<W: AsyncWrite + Unpin>(rx: Option<mpsc::Receiver<Bytes>>, w: Option<W>) {
    let (Some(mut rx), Some(mut w)) = (rx, w) else {
        return;
    };
    while let Some(b) = rx.recv().await {
        if w.write_all(&b).await.is_err() {
            return;
        }
    }
    let _ = w.shutdown().await;
}

/// The command's output → the client, read to EOF even when nobody listens.
async fn pump<R: AsyncRead + Unpin>(r: Option<R>, tx: Option<mpsc::Sender<Bytes>>) {
    let Some(mut r) = r else { return };
    let mut tx = tx;
    let mut buf = vec![0; CHUNK];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if let Some(t) = &tx
                    && t.send(Bytes::copy_from_slice(&buf[..n])).await.is_err()
                {
                    tx = None;
                }
            }
        }
    }
}

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
pub(crate) fn negotiate(offered: &[String], v5: bool) -> Option<&'static str> {
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
    let mut params: HashMap<String, Vec<String>> = HashMap::new();
    for (k, v) in form_urlencoded::parse(req.query.as_bytes()).into_owned() {
        params.entry(k).or_default().push(v);
    }
    let one = |k: &str| params.get(k).and_then(|v| v.last()).cloned();
    let flag = |k: &str| matches!(one(k).as_deref(), Some("true" | "1"));
    let container = container_for(&pod, name, one("container").unwrap_or_default())?;
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
    let is_ws = header_has(req.headers, header::CONNECTION, "upgrade")
        && header_has(req.headers, header::UPGRADE, "websocket");
    if !is_ws {
        return Err(ApiError::bad_request(
            "Upgrade request required (testkit serves pods/exec over WebSocket only, not SPDY)",
        ));
    }
    let key = req
        .headers
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|k| k.as_bytes().to_vec())
        .ok_or_else(|| ApiError::bad_request("missing Sec-WebSocket-Key"))?;
    let Some(protocol) = negotiate(&offered_protocols(req.headers), exec.v5()) else {
        // x/net/websocket's answer to a failed handshake: 403, no body.
        let mut resp = Response::new(empty());
        *resp.status_mut() = StatusCode::FORBIDDEN;
        return Ok(resp);
    };
    let Some(upgrade) = req.upgrade else {
        return Err(ApiError::internal("the connection cannot be upgraded"));
    };
    let request = ExecRequest {
        namespace: ns.to_string(),
        pod: name.to_string(),
        container,
        command,
        stdin,
        stdout,
        stderr,
        tty,
        protocol: protocol.to_string(),
        user: req.user,
    };
    exec.record(request.clone());
    let runner = exec.runner();
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        session(ws, request, runner, drop_after, stop).await;
    });
    let mut resp = Response::new(empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(&key);
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if !protocol.is_empty() {
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(protocol),
        );
    }
    Ok(resp)
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

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(channel);
    v.extend_from_slice(data);
    Message::binary(v)
}

/// The channel-3 payload for `exit` in `protocol`; `None`: nothing is sent.
pub(crate) fn status_payload(
    protocol: &str,
    command: &[String],
    exit: &ExecExit,
) -> Option<Vec<u8>> {
    let status = match exit {
        ExecExit::Code(0) => json!({"metadata": {}, "status": "Success"}),
        ExecExit::Code(code) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!(
                "command terminated with non-zero exit code: command '{}' exited with {code}: ",
                command.join(" ")
            ),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}
        }),
        ExecExit::Error(e) => {
            let inner = format!("error executing command in container: {e}");
            json!({
                "metadata": {},
                "status": "Failure",
                "message": format!("Internal error occurred: {inner}"),
                "reason": "InternalError",
                "details": {"causes": [{"message": inner}]},
                "code": 500
            })
        }
    };
    if protocol == V4 || protocol == V5 {
        return serde_json::to_vec(&status).ok();
    }
    // v1: the error text only, nothing on success.
    match exit {
        ExecExit::Code(0) => None,
        _ => status
            .get("message")
            .and_then(Value::as_str)
            .map(|m| m.as_bytes().to_vec()),
    }
}

/// Resolves when the server stops (the watch guard is not held across awaits).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

type Ws = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

async fn session(
    ws: Ws,
    req: ExecRequest,
    runner: Arc<dyn ExecRunner>,
    drop_after: Option<u64>,
    mut stop: watch::Receiver<bool>,
) {
    let (mut sink, mut source) = ws.split();
    let first = if req.stdout {
        STDOUT
    } else if req.stderr {
        STDERR
    } else {
        STATUS
    };
    if sink.send(frame(first, &[])).await.is_err() {
        return;
    }
    let mut budget = drop_after;
    if budget == Some(0) {
        return; // dropped: no close frame, no status
    }
    let (out_tx, mut out_rx) = mpsc::channel::<Bytes>(8);
    let (err_tx, mut err_rx) = mpsc::channel::<Bytes>(8);
    let (mut in_tx, in_rx) = if req.stdin {
        let (t, r) = mpsc::channel::<Bytes>(8);
        (Some(t), Some(r))
    } else {
        (None, None)
    };
    let io = ExecIo {
        stdin: in_rx,
        stdout: req.stdout.then_some(out_tx),
        stderr: req.stderr.then_some(err_tx),
    };
    let (protocol, command) = (req.protocol.clone(), req.command.clone());
    let run = tokio::spawn(runner.run(req, io));
    let (mut out_open, mut err_open) = (true, true);
    while out_open || err_open {
        let (channel, data) = tokio::select! {
            d = out_rx.recv(), if out_open => match d {
                Some(d) => (STDOUT, d),
                None => { out_open = false; continue }
            },
            d = err_rx.recv(), if err_open => match d {
                Some(d) => (STDERR, d),
                None => { err_open = false; continue }
            },
            m = source.next() => {
                match m {
                    Some(Ok(Message::Binary(b))) => match b.first() {
                        Some(&STDIN) => {
                            if let Some(t) = &in_tx {
                                let _ = t.send(b.slice(1..)).await;
                            }
                        }
                        Some(&CLOSE) if protocol == V5 && b.get(1) == Some(&STDIN) => in_tx = None,
                        _ => {}
                    },
                    // The client is gone: the command runs on, unobserved.
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                    Some(Ok(_)) => {}
                }
                continue;
            }
            () = stopped(&mut stop) => return,
        };
        let data = match budget.as_mut() {
            Some(left) => {
                let n = (data.len() as u64).min(*left) as usize;
                *left -= n as u64;
                data.slice(..n)
            }
            None => data,
        };
        if !data.is_empty() && sink.send(frame(channel, &data)).await.is_err() {
            return;
        }
        if budget == Some(0) {
            return; // the injected drop: the connection goes without a status
        }
    }
    let exit = match run.await {
        Ok(e) => e,
        Err(e) => ExecExit::Error(format!("the exec runner failed: {e}")),
    };
    if let Some(payload) = status_payload(&protocol, &command, &exit) {
        let _ = sink.send(frame(STATUS, &payload)).await;
    }
    let _ = sink.close().await;
}

/// The endpoint's shared state: the runner and the requests seen.
#[derive(Debug)]
pub(crate) struct ExecState {
    runner: std::sync::Mutex<Arc<dyn ExecRunner>>,
    seen: std::sync::Mutex<Vec<ExecRequest>>,
    no_v5: std::sync::atomic::AtomicBool,
}

impl Default for ExecState {
    fn default() -> Self {
        Self {
            runner: std::sync::Mutex::new(Arc::new(TokioRunner)),
            seen: std::sync::Mutex::default(),
            no_v5: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl ExecState {
    pub(crate) fn runner(&self) -> Arc<dyn ExecRunner> {
        self.runner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_runner(&self, r: Arc<dyn ExecRunner>) {
        *self.runner.lock().unwrap_or_else(|e| e.into_inner()) = r;
    }

    pub(crate) fn v5(&self) -> bool {
        !self.no_v5.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn set_v5(&self, on: bool) {
        self.no_v5.store(!on, std::sync::atomic::Ordering::SeqCst);
    }

    fn record(&self, r: ExecRequest) {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).push(r);
    }

    pub(crate) fn requests(&self) -> Vec<ExecRequest> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
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

    #[test]
    fn status_payloads() {
        let cmd = s(&["sh", "-c", "exit 3"]);
        let v: Value =
            serde_json::from_slice(&status_payload(V4, &cmd, &ExecExit::Code(3)).unwrap()).unwrap();
        assert_eq!(v["reason"], "NonZeroExitCode");
        assert_eq!(v["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(v["details"]["causes"][0]["message"], "3");
        assert!(status_payload(V1, &cmd, &ExecExit::Code(0)).is_none());
        let text = status_payload(V1, &cmd, &ExecExit::Code(3)).unwrap();
        assert!(
            String::from_utf8(text)
                .unwrap()
                .starts_with("command terminated with non-zero exit code")
        );
        let ok: Value =
            serde_json::from_slice(&status_payload(V5, &cmd, &ExecExit::Code(0)).unwrap()).unwrap();
        assert_eq!(ok["status"], "Success");
    }
}
