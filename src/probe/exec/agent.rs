//! `agent` exec mode: the command runs as a child of podprobe's exec agent in the target
//! container (its main process wrapping the container's command, `podprobe agent -- <command>`,
//! or a process beside the image's entrypoint, started by the container's `postStart` hook;
//! set up by the manager's injection), asked over a Unix socket on a volume the two containers
//! share.
//!
//! The command therefore runs exactly where the kubelet's `ExecSync` runs it: in the target
//! container's mount namespace, cgroup, uid/gid, environment and working directory, with no
//! privilege in the sidecar and no apiserver request. The agent runs it with the same runner
//! as `local` mode ([`super::attempt`]), so every exec rule (output capping, stdout on
//! success, stderr on failure, process-group kill on timeout) is the same code.
//!
//! The wire: one connection per attempt; the sidecar writes one JSON [`Request`] line, the
//! agent answers one JSON [`Response`] line and closes. Sockets are
//! `<dir>/<container>/agent.sock`: in the pod, each container's socket directory is a volume of
//! its own, which the sidecar mounts at `<dir>/<container>`.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::probe::{AttemptError, ExecAction, Observation, Outcome};

/// Where the manager mounts the wrapped containers' socket directories in the sidecar.
pub const DEFAULT_AGENT_DIR: &str = "/podprobe-agent";

/// Longest request or response line read (a response holds at most two capped messages,
/// JSON-escaped).
pub const MAX_LINE_BYTES: u64 = 1 << 20;

/// How much longer than the attempt's timeout the sidecar waits for the agent's answer: the
/// agent itself kills the command at the timeout and may wait up to 2 s for its status.
const ANSWER_GRACE: Duration = Duration::from_secs(5);

/// One exec attempt asked of the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub command: Vec<String>,
    pub timeout_millis: u64,
}

/// The agent's answer: the attempt's result, or why it produced none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Response {
    Observed { outcome: Outcome, message: String },
    Error { message: String },
}

impl Response {
    pub fn of(result: Result<Observation, AttemptError>) -> Self {
        match result {
            Ok(o) => Response::Observed {
                outcome: o.outcome,
                message: o.message,
            },
            Err(e) => Response::Error {
                message: e.to_string(),
            },
        }
    }
}

/// Writes `value` as one JSON line.
pub async fn write_line<T: Serialize>(
    stream: &mut (impl AsyncWrite + Unpin),
    value: &T,
) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line).await?;
    stream.flush().await
}

/// Reads one JSON line of at most [`MAX_LINE_BYTES`].
pub async fn read_line<T: for<'de> Deserialize<'de>>(
    stream: impl AsyncRead + Unpin,
) -> std::io::Result<T> {
    read_line_within(stream, MAX_LINE_BYTES).await
}

/// Reads one JSON line of at most `max` bytes.
pub async fn read_line_within<T: for<'de> Deserialize<'de>>(
    stream: impl AsyncRead + Unpin,
    max: u64,
) -> std::io::Result<T> {
    use tokio::io::AsyncReadExt;
    let mut line = Vec::new();
    BufReader::new(stream.take(max))
        .read_until(b'\n', &mut line)
        .await?;
    if line.last() != Some(&b'\n') {
        return Err(std::io::Error::new(
            ErrorKind::UnexpectedEof,
            format!("the line ended early or was longer than {max} bytes"),
        ));
    }
    serde_json::from_slice(&line).map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))
}

/// The agents of one pod: which containers have one and where their sockets are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentExec {
    pub dir: PathBuf,
    /// Containers whose command the manager wrapped with the agent (`PODPROBE_EXEC_AGENTS`).
    pub containers: Vec<String>,
}

impl AgentExec {
    pub fn socket(&self, container: &str) -> PathBuf {
        socket_path(&self.dir, container)
    }

    /// Whether `container` has an agent (`auto` then always uses it).
    pub(crate) fn check(&self, container: &str) -> Result<String, String> {
        if self.containers.iter().any(|c| c == container) {
            Ok(format!(
                "the container has podprobe's exec agent (socket {})",
                self.socket(container).display()
            ))
        } else {
            Err("the container has no podprobe exec agent".into())
        }
    }

    pub(crate) async fn attempt(
        &self,
        action: &ExecAction,
        container: &str,
        timeout: Duration,
    ) -> Result<Observation, AttemptError> {
        let socket = self.socket(container);
        let asked = async {
            let mut stream = UnixStream::connect(&socket).await.map_err(|e| {
                let hint = match e.kind() {
                    ErrorKind::NotFound | ErrorKind::ConnectionRefused => {
                        " (the container is not running, or has not started its agent yet)"
                    }
                    _ => "",
                };
                format!(
                    "cannot reach the exec agent of container {container:?} at {}: {e}{hint}",
                    socket.display()
                )
            })?;
            let request = Request {
                command: action.command.clone(),
                timeout_millis: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            };
            write_line(&mut stream, &request).await.map_err(|e| {
                format!("cannot ask the exec agent of container {container:?}: {e}")
            })?;
            read_line::<Response>(&mut stream).await.map_err(|e| {
                format!("the exec agent of container {container:?} gave no answer: {e} (did the container stop?)")
            })
        };
        match tokio::time::timeout(timeout + ANSWER_GRACE, asked).await {
            Ok(Ok(Response::Observed { outcome, message })) => Ok(Observation { outcome, message }),
            Ok(Ok(Response::Error { message })) => Err(AttemptError::Other(message)),
            Ok(Err(message)) => Err(AttemptError::Other(message)),
            Err(_) => Err(AttemptError::Other(format!(
                "the exec agent of container {container:?} did not answer within the timeout and {}",
                super::go_duration(ANSWER_GRACE)
            ))),
        }
    }
}

/// The socket of `container`'s agent in `dir`.
pub fn socket_path(dir: &Path, container: &str) -> PathBuf {
    dir.join(container).join("agent.sock")
}
