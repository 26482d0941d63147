//! The command side of `pods/exec`: what a runner is given and returns, and
//! the two runners that start the command as a process on this machine.

use std::fmt;
use std::process::Stdio;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

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

/// The request's command with its stdio piped (stdin only when the client streams it), and
/// the program's name for messages; `None` for an empty command.
fn command(req: &ExecRequest, io: &ExecIo) -> Option<(String, std::process::Command)> {
    let (program, args) = req.command.split_first()?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .stdin(if io.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Some((program.clone(), cmd))
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
            let Some((program, cmd)) = command(&req, &io) else {
                return ExecExit::Error("no command".into());
            };
            let mut cmd = tokio::process::Command::from(cmd);
            cmd.kill_on_drop(true);
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => return ExecExit::Error(not_found_message(&program, &e)),
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
        let Some((program, mut cmd)) = command(&req, &io) else {
            return Box::pin(async { ExecExit::Error("no command".into()) });
        };
        let spawned = (self.spawn)(&mut cmd);
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
