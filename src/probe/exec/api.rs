//! `api` exec mode: the apiserver's `pods/exec` subresource into the target container.
//!
//! A WebSocket through kube-rs (`v5.channel.k8s.io`, else `v4.channel.k8s.io`), on the
//! sidecar's shared client (its connection pool and credentials); no process per probe.
//! stdin is not attached; stdout and stderr are kept up to [`MAX_READ_BYTES`] each, the rest
//! is read and discarded. The exit status comes from the status channel (3): `Success` →
//! Succeeded with stdout; `Failure`/`NonZeroExitCode` → Failed with stderr; any other failure
//! (the runtime could not start the command, ...) → errored. A stream that ends without a status
//! → errored (the outcome is unknown). Timeout → the stream is closed and the attempt is Failed
//! with the same message as `local` (the command may keep running in the container: closing
//! the stream does not kill it — the kubelet's own exec probes behave the same way).
//!
//! "Cannot work here" (→ [`AttemptError::ModeUnavailable`], so `auto` falls back): 403 (RBAC
//! lacks `create pods/exec`), 404/405/501 (no such pod, or the node does not serve exec), and a
//! server that does not switch to WebSocket.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::AttachParams;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::probe::{AttemptError, ExecAction, ExecMode, MAX_READ_BYTES, Observation, go_duration};

/// Buffer between kube's WebSocket task and our reader, per stream.
const STREAM_BUFFER: usize = 64 * 1024;

/// Where `api` mode execs: this pod, through a shared client.
#[derive(Clone)]
pub struct ApiExec {
    pods: Api<Pod>,
    pod: String,
}

impl std::fmt::Debug for ApiExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiExec").field("pod", &self.pod).finish()
    }
}

impl ApiExec {
    /// Execs into pod `namespace/pod` with `client` (clone the sidecar's; they share a pool).
    pub fn new(client: kube::Client, namespace: &str, pod: impl Into<String>) -> Self {
        ApiExec {
            pods: Api::namespaced(client, namespace),
            pod: pod.into(),
        }
    }

    /// One attempt of `action` in `container`.
    pub async fn attempt(
        &self,
        action: &ExecAction,
        container: &str,
        timeout: Duration,
    ) -> Result<Observation, AttemptError> {
        if action.command.is_empty() {
            return Err(AttemptError::Spawn {
                command: action.command.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"),
            });
        }
        match tokio::time::timeout(timeout, self.run(action, container)).await {
            Ok(result) => result,
            // Dropping the attempt drops the AttachedProcess, which aborts its WebSocket task
            // and closes the connection.
            Err(_) => Ok(Observation::failed(format!(
                "command timed out: \"{}\" timed out after {}",
                action.command.join(" "),
                go_duration(timeout)
            ))),
        }
    }

    async fn run(&self, action: &ExecAction, container: &str) -> Result<Observation, AttemptError> {
        let params = AttachParams::default()
            .container(container)
            .stdin(false)
            .stdout(true)
            .stderr(true)
            .max_stdout_buf_size(STREAM_BUFFER)
            .max_stderr_buf_size(STREAM_BUFFER);
        let mut process = self
            .pods
            .exec(&self.pod, action.command.clone(), &params)
            .await
            .map_err(classify)?;
        let (mut stdout, mut stderr) =
            (Capped::new(process.stdout()), Capped::new(process.stderr()));
        let Some(status) = process.take_status() else {
            return Err(AttemptError::Other(
                "the exec stream has no status channel".into(),
            ));
        };
        // Read both streams while waiting for the status. The status resolves to `None` when
        // kube's WebSocket task ends without one; on that path the task may not shut the
        // output pipes down (it only drops them), so EOF must not be waited for.
        let mut status = std::pin::pin!(status);
        let status = loop {
            tokio::select! {
                status = &mut status => break status,
                () = stdout.read_some(), if stdout.open => {}
                () = stderr.read_some(), if stderr.open => {}
            }
        };
        if status.is_some() {
            // After the status the task shuts both pipes down: take what is left up to EOF.
            while stdout.open || stderr.open {
                tokio::select! {
                    () = stdout.read_some(), if stdout.open => {}
                    () = stderr.read_some(), if stderr.open => {}
                }
            }
        }
        drop(process);
        let (stdout, stderr) = (stdout.text(), stderr.text());
        let Some(status) = status else {
            return Err(AttemptError::Other(format!(
                "the exec stream of {:?} ended without an exit status",
                action.command
            )));
        };
        if status.status.as_deref() == Some("Success") {
            return Ok(Observation::succeeded(stdout));
        }
        if status.reason.as_deref() == Some("NonZeroExitCode") {
            return Ok(Observation::failed(stderr));
        }
        Err(AttemptError::Other(format!(
            "exec of {:?} failed: {}",
            action.command,
            status
                .message
                .filter(|m| !m.is_empty())
                .or(status.reason)
                .unwrap_or_else(|| "unknown error".into())
        )))
    }
}

/// One output stream: the first [`MAX_READ_BYTES`] are kept, the rest is read and discarded.
struct Capped<R> {
    stream: Option<R>,
    kept: Vec<u8>,
    buf: Vec<u8>,
    open: bool,
}

impl<R: AsyncRead + Unpin> Capped<R> {
    fn new(stream: Option<R>) -> Self {
        Capped {
            open: stream.is_some(),
            stream,
            kept: Vec::new(),
            buf: vec![0; 16 * 1024],
        }
    }

    /// Reads one chunk (cancel-safe).
    async fn read_some(&mut self) {
        let Some(stream) = self.stream.as_mut() else {
            self.open = false;
            return;
        };
        match stream.read(&mut self.buf).await {
            Ok(0) | Err(_) => self.open = false,
            Ok(n) => {
                let room = MAX_READ_BYTES.saturating_sub(self.kept.len());
                self.kept.extend_from_slice(&self.buf[..n.min(room)]);
            }
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.kept).into_owned()
    }
}

fn classify(error: kube::Error) -> AttemptError {
    let unavailable = |reason: String| AttemptError::ModeUnavailable {
        mode: ExecMode::Api,
        reason,
    };
    match error {
        kube::Error::Api(status) if status.code == 403 => unavailable(format!(
            "the service account may not create pods/exec (RBAC): {}",
            status.message
        )),
        kube::Error::Api(status) if matches!(status.code, 404 | 405 | 501) => unavailable(format!(
            "pods/exec is not served for this pod ({}): {}",
            status.code, status.message
        )),
        kube::Error::UpgradeConnection(e) => unavailable(format!(
            "the apiserver did not open a WebSocket for pods/exec: {e}"
        )),
        other => AttemptError::Other(format!("pods/exec request failed: {other}")),
    }
}
