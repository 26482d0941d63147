//! exec probes: where the command runs ([`ExecMode`]) and the shared runner.
//!
//! Modes (`--exec-mode`, docs/protocol.md §3):
//! - `local`: the command runs as a child of podprobe, in the sidecar's own container;
//! - `agent` ([`agent`]): a child of podprobe's exec agent, the target container's own main
//!   process (the manager wraps the container's command), asked over a Unix socket;
//! - `procfs` ([`procfs`]): chrooted into the target container's main process' root, with its
//!   environment, working directory and ids (needs `shareProcessNamespace`, `CAP_SYS_CHROOT`);
//! - `api` ([`api`]): the apiserver's `pods/exec` into the target container;
//! - `auto`: per target container, the first of agent → procfs → api → local that can work
//!   (see [`Executor`]).
//!
//! The runner ([`run`], used by `local` and `procfs`):
//!
//! - argv is executed verbatim: no shell, no `$(VAR)` expansion (OpenKruise passes the command
//!   as is, unlike kubelet).
//! - The command gets its own process group and a null stdin; on timeout the whole group is
//!   SIGKILLed.
//! - Exit 0 → Succeeded with stdout as message; non-zero → Failed with stderr as message. This
//!   follows OpenKruise's daemon (OpenKruise Game matches results on stdout), not kubelet, which
//!   reports stdout followed by stderr.
//! - At most [`MAX_READ_BYTES`] of each stream is kept; the rest is read and discarded so a
//!   chatty command never blocks on a full pipe and memory stays bounded.
//! - The child is waited for through [`reaper`], never with `Child::wait`.
use std::io::{self, ErrorKind};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;

use super::{AttemptError, ExecAction, MAX_READ_BYTES, Observation, go_duration, reaper};

pub mod agent;
pub mod api;
mod auto;
mod enter;
pub mod procfs;

pub use agent::AgentExec;
pub use api::ApiExec;
pub(crate) use auto::Executor;

/// Where exec probes run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ExecMode {
    /// Per target container: agent when it has podprobe's exec agent, else
    /// procfs when its process is visible and chroot is permitted, else api when configured
    /// and allowed, else local. Logged once per container.
    Auto,
    /// Through podprobe's exec agent, the target container's main process.
    Agent,
    /// chroot into the target container's main process (`shareProcessNamespace: true`).
    Procfs,
    /// The apiserver's `pods/exec` into the target container.
    Api,
    /// In the sidecar's own container.
    #[default]
    Local,
}

impl std::fmt::Display for ExecMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ExecMode::Auto => "auto",
            ExecMode::Agent => "agent",
            ExecMode::Procfs => "procfs",
            ExecMode::Api => "api",
            ExecMode::Local => "local",
        })
    }
}

/// How exec probes are run.
#[derive(Debug, Clone, Default)]
pub struct ExecConfig {
    pub mode: ExecMode,
    /// For `api` (and `auto`): the pod to exec into. `None` → `api` is unavailable.
    pub api: Option<ApiExec>,
    /// For `agent` (and `auto`): the containers with an agent and where their sockets are.
    pub agent: AgentExec,
}

/// After SIGKILL, how long to wait for the status before giving up on it (the reaper still
/// collects it later). Only a process stuck in uninterruptible sleep takes this long.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// After the main process has exited, at most this much already-buffered output is drained
/// (non-blocking) per stream. Bounds the work when a background grandchild keeps writing.
const FINAL_DRAIN_LIMIT: usize = 1 << 20;

const SCRATCH_BYTES: usize = 32 * 1024;

pub async fn attempt(action: &ExecAction, timeout: Duration) -> Result<Observation, AttemptError> {
    let spawn_error = |source: io::Error| AttemptError::Spawn {
        command: action.command.clone(),
        source,
    };
    let Some((program, args)) = action.command.split_first() else {
        return Err(spawn_error(io::Error::new(
            ErrorKind::InvalidInput,
            "empty command",
        )));
    };
    let mut command = Command::new(program);
    command.args(args);
    run(command, &action.command, timeout).await
}

/// Runs a prepared `command` (program, args, and for `procfs` its environment and pre-exec
/// steps) with the exec contract: null stdin, piped and capped output, its own process group,
/// `timeout`, group kill, reaping. `argv` is the probe's command, for messages.
pub(crate) async fn run(
    mut command: Command,
    argv: &[String],
    timeout: Duration,
) -> Result<Observation, AttemptError> {
    let spawn_error = |source: io::Error| AttemptError::Spawn {
        command: argv.to_vec(),
        source,
    };
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let (mut child, exit) = reaper::spawn(&mut command).map_err(spawn_error)?;
    let pid = Pid::from_raw(child.id() as i32);
    // If this attempt is abandoned (its future dropped) before the command exits, the group
    // is killed rather than left running unobserved.
    let mut group_guard = KillGroupOnDrop(Some(pid));
    let pipes = (child.stdout.take(), child.stderr.take());
    // Never waited on: the reaper owns the status. Dropping a std Child does not kill it.
    drop(child);

    let (mut stdout, mut stderr) = match capture_output(pipes) {
        Ok(captures) => captures,
        Err(e) => {
            let _ = killpg(pid, Signal::SIGKILL);
            return Err(AttemptError::Other(format!(
                "cannot read the output of {argv:?}: {e}"
            )));
        }
    };

    let deadline = tokio::time::Instant::now() + timeout;
    let mut exit = std::pin::pin!(exit.wait());
    let status = loop {
        tokio::select! {
            status = &mut exit => break Some(status),
            () = stdout.read_some(), if stdout.open => {}
            () = stderr.read_some(), if stderr.open => {}
            () = tokio::time::sleep_until(deadline) => break None,
        }
    };

    if status.is_some() {
        // The main process has exited: what it left in the background may live on.
        group_guard.0 = None;
    }
    let Some(status) = status else {
        // Timed out: kill the whole group (grandchildren included), then collect the status.
        let _ = killpg(pid, Signal::SIGKILL);
        let _ = tokio::time::timeout(KILL_GRACE, exit).await;
        return Ok(Observation::failed(format!(
            "command timed out: \"{}\" timed out after {}",
            argv.join(" "),
            go_duration(timeout)
        )));
    };
    let Some(status) = status else {
        return Err(AttemptError::Other("the process reaper is gone".into()));
    };

    // The main process has exited, so everything it wrote is already in the pipes. A
    // background grandchild may hold the write ends open indefinitely, so we do not wait for
    // EOF: take what is buffered now (non-blocking) and finish.
    stdout.drain_buffered();
    stderr.drain_buffered();

    observe(status, &stdout, &stderr, argv)
}

/// Starts non-blocking capture of the child's stdout and stderr pipes.
fn capture_output(
    pipes: (Option<ChildStdout>, Option<ChildStderr>),
) -> io::Result<(Capture, Capture)> {
    match pipes {
        (Some(out), Some(err)) => Ok((
            Capture::new(OwnedFd::from(out))?,
            Capture::new(OwnedFd::from(err))?,
        )),
        _ => Err(io::Error::other("child has no stdout/stderr pipe")),
    }
}

/// The kubelet's reading of an exited command: exit 0 succeeds with stdout as message, any
/// other exit fails with stderr, a signal fails naming it.
fn observe(
    status: ExitStatus,
    stdout: &Capture,
    stderr: &Capture,
    argv: &[String],
) -> Result<Observation, AttemptError> {
    Ok(match (status.code(), status.signal()) {
        (Some(0), _) => Observation::succeeded(stdout.text()),
        (Some(_), _) => Observation::failed(stderr.text()),
        (None, Some(signal)) => {
            let stderr = stderr.text();
            let mut message = format!("command terminated by signal {}", signal_name(signal));
            if !stderr.is_empty() {
                message.push_str(": ");
                message.push_str(&stderr);
            }
            Observation::failed(message)
        }
        (None, None) => {
            return Err(AttemptError::Other(format!(
                "unexpected wait status {status:?} for {argv:?}"
            )));
        }
    })
}

/// A signal's name as `kill -l` and the kubelet's `stopSignal` give it: `SIGTERM`, or
/// `SIGRTMIN+3` for a real-time one (numbered from the C library's SIGRTMIN, as the exec agent
/// and users number them).
pub fn signal_name(signal: i32) -> String {
    let (min, max) = (nix::libc::SIGRTMIN(), nix::libc::SIGRTMAX());
    match nix::sys::signal::Signal::try_from(signal) {
        Ok(named) => named.as_str().to_owned(),
        Err(_) if signal == min => "SIGRTMIN".to_owned(),
        Err(_) if signal == max => "SIGRTMAX".to_owned(),
        Err(_) if signal > min && signal < max => format!("SIGRTMIN+{}", signal - min),
        Err(_) => format!("signal {signal}"),
    }
}

/// SIGKILLs the process group when dropped while armed.
struct KillGroupOnDrop(Option<Pid>);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

/// One output stream: the first [`MAX_READ_BYTES`] are kept, the rest is discarded.
struct Capture {
    pipe: pipe::Receiver,
    kept: Vec<u8>,
    scratch: Vec<u8>,
    open: bool,
}

impl Capture {
    fn new(fd: OwnedFd) -> io::Result<Capture> {
        Ok(Capture {
            pipe: pipe::Receiver::from_owned_fd(fd)?,
            kept: Vec::new(),
            scratch: vec![0; SCRATCH_BYTES],
            open: true,
        })
    }

    fn keep(&mut self, n: usize) {
        let room = MAX_READ_BYTES.saturating_sub(self.kept.len());
        let take = n.min(room);
        self.kept.extend_from_slice(&self.scratch[..take]);
    }

    /// Reads one chunk (cancel-safe: a cancelled read consumed nothing).
    async fn read_some(&mut self) {
        match self.pipe.read(&mut self.scratch).await {
            Ok(0) => self.open = false,
            Ok(n) => self.keep(n),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => self.open = false,
        }
    }

    /// Takes what is already in the pipe without waiting for more.
    fn drain_buffered(&mut self) {
        let mut drained = 0;
        while self.open && drained < FINAL_DRAIN_LIMIT {
            // A real read(2) on the (non-blocking) fd: tokio's `try_read` would answer
            // WouldBlock from its cached readiness before the driver has seen the data.
            match nix::unistd::read(self.pipe.as_fd(), &mut self.scratch) {
                Ok(0) => self.open = false,
                Ok(n) => {
                    drained += n;
                    self.keep(n);
                }
                Err(nix::errno::Errno::EINTR) => {}
                // EAGAIN: nothing buffered right now.
                Err(_) => break,
            }
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.kept).into_owned()
    }
}
