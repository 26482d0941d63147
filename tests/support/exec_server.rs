//! A stand-in for the apiserver's `pods/exec` WebSocket endpoint, for `api` exec mode tests
//! and benchmarks (until testkit serves it): accepts
//! `GET /api/v1/namespaces/{ns}/pods/{pod}/exec?command=…&container=…&stdout=true&stderr=true`,
//! negotiates `v5.channel.k8s.io`, `v4.channel.k8s.io` or `channel.k8s.io` (the first the
//! client offers that the server supports, as the apiserver does), runs the command locally
//! (through podprobe's reaper) and streams stdout (channel 1) and stderr (2), then the exit
//! status on channel 3: a `metav1.Status` JSON in v4/v5, plain error text (nothing on
//! success) in v1.
//!
//! Special commands: `drop-stream` writes "partial" on stdout and closes the connection
//! without a status.
#![allow(dead_code)]
// tungstenite's handshake callback signature returns its (large) ErrorResponse by value.
#![allow(clippy::result_large_err)]

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use futures::{SinkExt, StreamExt};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use podprobe::probe::reaper;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};

pub const V5: &str = "v5.channel.k8s.io";
pub const V4: &str = "v4.channel.k8s.io";
pub const V1: &str = "channel.k8s.io";

/// What one exec request asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub path: String,
    pub container: Option<String>,
    pub command: Vec<String>,
    pub protocol: String,
}

#[derive(Debug, Clone)]
pub struct ExecServer {
    pub url: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Protocols served, in no particular order (the client's preference decides).
    protocols: Arc<Mutex<Vec<&'static str>>>,
    /// When set, every request is refused with this HTTP status (e.g. 403 for RBAC).
    refuse: Arc<Mutex<Option<u16>>>,
    refused: Arc<std::sync::atomic::AtomicUsize>,
}

impl ExecServer {
    pub async fn start() -> ExecServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = ExecServer {
            url: format!("http://{}", listener.local_addr().unwrap()),
            seen: Arc::default(),
            protocols: Arc::new(Mutex::new(vec![V5, V4, V1])),
            refuse: Arc::default(),
            refused: Arc::default(),
        };
        let s = server.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(s.clone().serve(stream));
            }
        });
        server
    }

    pub fn refuse_with(&self, status: Option<u16>) {
        *self.refuse.lock().unwrap() = status;
    }

    pub fn serve_protocols(&self, protocols: &[&'static str]) {
        *self.protocols.lock().unwrap() = protocols.to_vec();
    }

    /// A kube client for this server (no auth, plain HTTP).
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url.parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    /// How many requests were refused (see [`ExecServer::refuse_with`]).
    pub fn refused(&self) -> usize {
        self.refused.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    async fn serve(self, stream: tokio::net::TcpStream) {
        let picked: Arc<Mutex<Option<Seen>>> = Arc::default();
        let callback = {
            let picked = picked.clone();
            let served = self.protocols.lock().unwrap().clone();
            let refuse = *self.refuse.lock().unwrap();
            let refused = self.refused.clone();
            move |req: &Request, mut resp: Response| -> Result<Response, ErrorResponse> {
                if let Some(code) = refuse {
                    refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let body = format!(
                        r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"pods \"p\" is forbidden: cannot create resource \"pods/exec\"","reason":"Forbidden","code":{code}}}"#
                    );
                    let mut e = ErrorResponse::new(Some(body));
                    *e.status_mut() = StatusCode::from_u16(code).unwrap();
                    e.headers_mut()
                        .insert("content-type", HeaderValue::from_static("application/json"));
                    return Err(e);
                }
                let offered = req
                    .headers()
                    .get("sec-websocket-protocol")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                let Some(protocol) = offered
                    .split(',')
                    .map(str::trim)
                    .find(|p| served.contains(p))
                else {
                    let mut e = ErrorResponse::new(Some("no supported protocol".into()));
                    *e.status_mut() = StatusCode::BAD_REQUEST;
                    return Err(e);
                };
                let mut seen = Seen {
                    path: req.uri().path().to_owned(),
                    container: None,
                    command: Vec::new(),
                    protocol: protocol.to_owned(),
                };
                for pair in req.uri().query().unwrap_or_default().split('&') {
                    let Some((k, v)) = pair.split_once('=') else {
                        continue;
                    };
                    let v = percent_decode(v);
                    match k {
                        "command" => seen.command.push(v),
                        "container" => seen.container = Some(v),
                        _ => {}
                    }
                }
                resp.headers_mut().insert(
                    "sec-websocket-protocol",
                    HeaderValue::from_str(protocol).unwrap(),
                );
                *picked.lock().unwrap() = Some(seen);
                Ok(resp)
            }
        };
        let Ok(ws) = tokio_tungstenite::accept_hdr_async(stream, callback).await else {
            return;
        };
        let Some(seen) = picked.lock().unwrap().clone() else {
            return;
        };
        self.seen.lock().unwrap().push(seen.clone());
        let (mut tx, mut rx) = ws.split();
        let frame = |channel: u8, data: &[u8]| {
            let mut v = Vec::with_capacity(data.len() + 1);
            v.push(channel);
            v.extend_from_slice(data);
            Message::binary(v)
        };
        // The apiserver opens each channel with a bare channel-number frame.
        for channel in [1u8, 2, 3] {
            let _ = tx.send(frame(channel, &[])).await;
        }
        if seen.command.first().map(String::as_str) == Some("drop-stream") {
            let _ = tx.send(frame(1, b"partial")).await;
            drop(tx);
            drop(rx);
            return;
        }
        let mut command = Command::new(&seen.command[0]);
        command
            .args(&seen.command[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let (mut child, exit) = match reaper::spawn(&mut command) {
            Ok(spawned) => spawned,
            Err(e) => {
                let message = format!(
                    "failed to exec in container: exec: \"{}\": {e}",
                    seen.command[0]
                );
                let status = if seen.protocol == V1 {
                    message.into_bytes()
                } else {
                    serde_json::to_vec(&serde_json::json!({
                        "metadata": {}, "status": "Failure", "message": message, "reason": "InternalError"
                    }))
                    .unwrap()
                };
                let _ = tx.send(frame(3, &status)).await;
                let _ = tx.close().await;
                return;
            }
        };
        let pgid = Pid::from_raw(child.id() as i32);
        let (out_tx, mut out_rx) = tokio::sync::mpsc::channel::<(u8, Vec<u8>)>(16);
        for (channel, pipe) in [
            (
                1u8,
                child
                    .stdout
                    .take()
                    .map(|p| Box::new(p) as Box<dyn Read + Send>),
            ),
            (
                2u8,
                child
                    .stderr
                    .take()
                    .map(|p| Box::new(p) as Box<dyn Read + Send>),
            ),
        ] {
            let out_tx = out_tx.clone();
            let mut pipe = pipe.unwrap();
            std::thread::spawn(move || {
                let mut buf = vec![0; 32 * 1024];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 || out_tx.blocking_send((channel, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            });
        }
        drop(out_tx);
        drop(child);
        // Forward output until both pipes end; a client that goes away kills the command.
        loop {
            tokio::select! {
                chunk = out_rx.recv() => match chunk {
                    Some((channel, data)) => {
                        if tx.send(frame(channel, &data)).await.is_err() {
                            let _ = killpg(pgid, Signal::SIGKILL);
                            return;
                        }
                    }
                    None => break,
                },
                msg = rx.next() => {
                    if matches!(msg, None | Some(Err(_)) | Some(Ok(Message::Close(_)))) {
                        let _ = killpg(pgid, Signal::SIGKILL);
                        return;
                    }
                }
            }
        }
        let code = match exit.wait().await {
            Some(nix::sys::wait::WaitStatus::Exited(_, code)) => code,
            _ => 137,
        };
        let status = match (seen.protocol.as_str(), code) {
            (V1, 0) => None,
            (V1, code) => Some(format!("command terminated with non-zero exit code: exit status {code}").into_bytes()),
            (_, 0) => Some(br#"{"metadata":{},"status":"Success"}"#.to_vec()),
            (_, code) => Some(
                serde_json::to_vec(&serde_json::json!({
                    "metadata": {},
                    "status": "Failure",
                    "message": format!("command terminated with non-zero exit code: error executing command {:?}, exit code {code}", seen.command),
                    "reason": "NonZeroExitCode",
                    "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}
                }))
                .unwrap(),
            ),
        };
        if let Some(status) = status {
            let _ = tx.send(frame(3, &status)).await;
        }
        let _ = tx.close().await;
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
