//! An upgraded `pods/exec` session: the channel framing, relaying the
//! command's streams and the client's stdin, and the closing status.

use std::ops::ControlFlow::{self, Break, Continue};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::{self, Message};

use super::{ExecExit, ExecIo, ExecRequest, ExecRunner, V4, V5};

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const STATUS: u8 = 3;
const CLOSE: u8 = 255;

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(channel);
    v.extend_from_slice(data);
    Message::binary(v)
}

/// The channel-3 payload for `exit` in `protocol`; `None`: nothing is sent.
fn status_payload(protocol: &str, command: &[String], exit: &ExecExit) -> Option<Vec<u8>> {
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

/// Run `req` on an upgraded connection: the kubelet's first empty message,
/// the command's output and the client's stdin relayed until the output
/// ends, then the status and the close. The injected `drop_after` cuts the
/// connection after that many output bytes, without a status.
pub(super) async fn session(
    ws: Ws,
    req: ExecRequest,
    runner: Arc<dyn ExecRunner>,
    drop_after: Option<u64>,
    mut stop: watch::Receiver<bool>,
) {
    let (mut sink, source) = ws.split();
    if sink.send(frame(first_channel(&req), &[])).await.is_err() {
        return;
    }
    if drop_after == Some(0) {
        return; // dropped: no close frame, no status
    }
    let (out_tx, out_rx) = mpsc::channel::<Bytes>(8);
    let (err_tx, err_rx) = mpsc::channel::<Bytes>(8);
    let (in_tx, in_rx) = if req.stdin {
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
    let command = req.command.clone();
    let mut relay = Relay {
        sink,
        source,
        stdout: out_rx,
        stderr: err_rx,
        stdin: in_tx,
        protocol: req.protocol.clone(),
        budget: drop_after,
    };
    let run = tokio::spawn(runner.run(req, io));
    if relay.output(&mut stop).await.is_break() {
        return;
    }
    let exit = match run.await {
        Ok(e) => e,
        Err(e) => ExecExit::Error(format!("the exec runner failed: {e}")),
    };
    if let Some(payload) = status_payload(&relay.protocol, &command, &exit) {
        let _ = relay.sink.send(frame(STATUS, &payload)).await;
    }
    let _ = relay.sink.close().await;
}

/// Where the kubelet sends its first, empty message: the lowest writable channel.
fn first_channel(req: &ExecRequest) -> u8 {
    if req.stdout {
        STDOUT
    } else if req.stderr {
        STDERR
    } else {
        STATUS
    }
}

/// A session's two ends: the client's WebSocket and the command's pipes.
/// `Break` from its methods: the session is over, without a status.
struct Relay {
    sink: SplitSink<Ws, Message>,
    source: SplitStream<Ws>,
    stdout: mpsc::Receiver<Bytes>,
    stderr: mpsc::Receiver<Bytes>,
    /// `None` without `stdin=true`, or once the client closed stdin.
    stdin: Option<mpsc::Sender<Bytes>>,
    protocol: String,
    /// Output bytes left before the injected drop.
    budget: Option<u64>,
}

impl Relay {
    /// Relay until the command's stdout and stderr have both ended (or the
    /// client goes, or the server stops).
    async fn output(&mut self, stop: &mut watch::Receiver<bool>) -> ControlFlow<()> {
        let (mut out_open, mut err_open) = (true, true);
        while out_open || err_open {
            let (channel, data) = tokio::select! {
                d = self.stdout.recv(), if out_open => match d {
                    Some(d) => (STDOUT, d),
                    None => { out_open = false; continue }
                },
                d = self.stderr.recv(), if err_open => match d {
                    Some(d) => (STDERR, d),
                    None => { err_open = false; continue }
                },
                m = self.source.next() => {
                    self.client_message(m).await?;
                    continue;
                }
                () = stopped(stop) => return Break(()),
            };
            self.send_output(channel, data).await?;
        }
        Continue(())
    }

    /// A client message: stdin for the command, or (v5) the CLOSE of stdin.
    async fn client_message(
        &mut self,
        m: Option<Result<Message, tungstenite::Error>>,
    ) -> ControlFlow<()> {
        match m {
            Some(Ok(Message::Binary(b))) => match b.first() {
                Some(&STDIN) => {
                    if let Some(t) = &self.stdin {
                        let _ = t.send(b.slice(1..)).await;
                    }
                }
                Some(&CLOSE) if self.protocol == V5 && b.get(1) == Some(&STDIN) => {
                    self.stdin = None
                }
                _ => {}
            },
            // The client is gone: the command runs on, unobserved.
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return Break(()),
            Some(Ok(_)) => {}
        }
        Continue(())
    }

    /// Output on `channel`, cut to what is left of the injected budget.
    async fn send_output(&mut self, channel: u8, data: Bytes) -> ControlFlow<()> {
        let data = match self.budget.as_mut() {
            Some(left) => {
                let n = (data.len() as u64).min(*left) as usize;
                *left -= n as u64;
                data.slice(..n)
            }
            None => data,
        };
        if !data.is_empty() && self.sink.send(frame(channel, &data)).await.is_err() {
            return Break(());
        }
        if self.budget == Some(0) {
            return Break(()); // the injected drop: the connection goes without a status
        }
        Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::V1;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
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
