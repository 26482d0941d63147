//! The probe server: the process that serves the sidecar's exec probes, apart from the process
//! that owes the container its init duties.
//!
//! Wrapping a command, the agent is the container's PID 1, and nothing that serving does may
//! stop it: a bug that ends the process (the shipped build aborts on a panic), or an exec that
//! hangs in `fork`/`exec` on a hung filesystem while holding the reaper's lock, would end the
//! game server or stop its signals and reaping. So PID 1 only starts the command, forwards its
//! signals, reaps and waits; it runs the server as a child ([`supervise`]) and starts it again
//! when it ends, after a backoff. The server dies with the agent (`PR_SET_PDEATHSIG`), is in a
//! process group of its own (a terminal's Ctrl-C is not for it), and adopts the orphans of
//! the commands it runs.
//!
//! Beside an image's entrypoint the `postStart` hook leaves a supervisor running
//! ([`super::beside`]), which does for its servers what PID 1 does when wrapping: starts them,
//! starts them again when they end, and reaps. A server announces on its stdout when it
//! serves; the supervisor passes its first server's announcement (or that it ended without
//! serving) on to the hook, which waits for it.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{ChildStdout, Command, ExitCode, Stdio};
use std::time::Duration;

use clap::ValueEnum;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::unix::pipe;
use tokio::time::Instant;

use crate::probe::reaper;

/// For whom the server serves, which says how it starts and whom it refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ServeFor {
    /// Beside the container's own process, under the supervisor that the `postStart` hook
    /// leaves running: refuses its container's processes.
    Hook,
    /// Started by the agent that is its container's first process (its PID 1, or in a pod
    /// sharing its process namespace, started from outside the namespace): refuses its
    /// container's processes.
    Init,
    /// Started by an agent that a process of its own namespace started (by hand, a test): cannot
    /// tell its container's processes from others.
    Parent,
}

/// What the server prints on its stdout once it serves, for the hook that waits for it.
pub(super) const READY: &str = "serving";

/// The flag by which the server knows its agent, to die with it (an argument, not the
/// environment: the probes' commands get the container's environment as it is).
pub(super) const PARENT_FLAG: &str = "--parent-pid";

/// Waits before starting the server again, after it ended: doubled each time, reset once a
/// server has run for [`STEADY`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
const STEADY: Duration = Duration::from_secs(60);

/// The flag that runs this binary as the server.
pub(super) const SERVE_FLAG: &str = "--serve-for";

/// The flag that runs this binary as the supervisor of servers beside the container's own
/// process.
pub(super) const SUPERVISE_FLAG: &str = "--supervise";

/// What the supervisor tells the hook when its first server ended without serving.
const NOT_SERVING: &str = "not serving";

/// This process's own flags (before `--` and the command), for a process it starts: global
/// flags (the log's level and format) and `--socket` kept; `--detach` and the internal flags
/// (the serving role, the parent, supervising) left out, for the caller to add its own.
fn own_flags() -> Vec<OsString> {
    let mut args = Vec::new();
    let mut own = std::env::args_os().skip(1).take_while(|arg| arg != "--");
    while let Some(arg) = own.next() {
        if arg == SERVE_FLAG || arg == PARENT_FLAG {
            own.next();
        } else if arg != "--detach" && arg != SUPERVISE_FLAG {
            args.push(arg);
        }
    }
    args
}

fn role_name(role: ServeFor) -> OsString {
    let name = role.to_possible_value().map(|v| v.get_name().to_owned());
    name.unwrap_or_default().into()
}

/// The flags of a server that this process starts and supervises.
fn server_args(role: ServeFor) -> Vec<OsString> {
    let mut args = own_flags();
    args.extend([SERVE_FLAG.into(), role_name(role)]);
    args.extend([PARENT_FLAG.into(), std::process::id().to_string().into()]);
    args
}

/// The flags of the supervisor that the `postStart` hook starts beside the container's own
/// process.
pub(super) fn supervisor_args() -> Vec<OsString> {
    let mut args = own_flags();
    args.extend([SERVE_FLAG.into(), role_name(ServeFor::Hook)]);
    args.push(SUPERVISE_FLAG.into());
    args
}

/// A command of this binary with `args`, out of the caller's process group.
pub(super) fn agent_command(args: Vec<OsString>) -> std::io::Result<Command> {
    let mut command = Command::new(std::env::current_exe()?);
    command.args(args).stdin(Stdio::null()).process_group(0);
    Ok(command)
}

/// Runs servers for `role` as children until the process ends, starting one again after a
/// backoff whenever it ends. `announce`: the first server's announcement is passed on to this
/// process's stdout (the `postStart` hook's pipe), as [`READY`] or [`NOT_SERVING`].
pub(super) async fn supervise(role: ServeFor, mut announce: bool) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let started = Instant::now();
        let output = if announce {
            Stdio::piped()
        } else {
            Stdio::null()
        };
        let spawned = agent_command(server_args(role)).and_then(|mut server| {
            server.stdout(output);
            reaper::spawn(&mut server)
        });
        let why = match spawned {
            Ok((mut child, exit)) => {
                let pid = child.id();
                if std::mem::take(&mut announce) {
                    let line = first_line(child.stdout.take()).await;
                    tell_hook(line.as_deref().map(str::trim_end) == Some(READY));
                }
                drop(child);
                let status = exit.wait().await;
                let ended = status.map_or("status unknown".into(), |s| s.to_string());
                format!("the probe server (pid {pid}) ended ({ended})")
            }
            Err(e) => {
                if std::mem::take(&mut announce) {
                    tell_hook(false);
                }
                format!("cannot start the probe server: {e}")
            }
        };
        if started.elapsed() >= STEADY {
            backoff = FIRST_BACKOFF;
        }
        tracing::warn!(
            "podprobe agent: {why}; the container's command runs on, and exec probes are served again in {backoff:?}"
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The first line a child writes on `stdout`; `None` when it closes it first.
pub(super) async fn first_line(stdout: Option<ChildStdout>) -> Option<String> {
    let pipe = pipe::Receiver::from_owned_fd(stdout?.into()).ok()?;
    let mut line = String::new();
    match BufReader::new(pipe).read_line(&mut line).await {
        Ok(1..) => Some(line),
        _ => None,
    }
}

/// The supervisor's one line to the hook. The hook may be gone already (its wait over): a
/// failed write is nothing to act on.
fn tell_hook(served: bool) {
    use std::io::Write;
    let line = if served { READY } else { NOT_SERVING };
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// The server's side: serves exec probes on `socket` until the process ends; `parent`: the
/// agent or supervisor that started it, with which it dies.
pub async fn serve(socket: &Path, role: ServeFor, parent: Option<u32>) -> ExitCode {
    if !bound_to(parent) {
        return ExitCode::FAILURE;
    }
    first_to_go();
    let listener = match super::bind(socket) {
        Ok(listener) => listener,
        Err(e) => {
            tracing::warn!(
                "podprobe agent: cannot serve exec probes on {}: {e}; the container runs on, and its exec probes fail",
                socket.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let place = match role {
        ServeFor::Hook => " beside the container's own process",
        ServeFor::Init | ServeFor::Parent => "",
    };
    tracing::info!(
        "podprobe agent: pid {} serving exec probes on {}{place}",
        std::process::id(),
        socket.display()
    );
    {
        use std::io::Write;
        // For the supervisor, which waits for it when the hook does (else stdout is null).
        let _ = writeln!(std::io::stdout(), "{READY}");
    }
    // Beside the container's process, or as the child of its first process, the server sees
    // every process of its container in its PID namespace, whether or not the pod shares it
    // (then the sidecar is there too, in a cgroup of its own): a process of its own container
    // can be told apart, and is refused.
    super::serving::serve(listener, role != ServeFor::Parent).await;
    ExitCode::SUCCESS
}

/// The most an OOM score may be raised: the first process the kernel kills.
const OOM_SCORE_ADJ_MAX: &str = "1000";

/// The server, and the probe commands it starts (they inherit it), go first when the container
/// runs out of memory: a probe that leaks ends, not the game server the container is for. A
/// process may raise its own score without privilege.
fn first_to_go() {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", OOM_SCORE_ADJ_MAX) {
        tracing::warn!(
            "podprobe agent: cannot make the probe server the first to go when the container runs out of memory ({e}); it shares the game server's OOM score"
        );
    }
}

/// Dies with the agent or supervisor that started it: asks the kernel for SIGKILL when the parent ends, then
/// checks the parent is still the one that started it (it may have ended before the ask).
fn bound_to(expected: Option<u32>) -> bool {
    if let Err(e) = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL) {
        tracing::warn!("podprobe agent: the probe server cannot follow its agent: {e}");
    }
    let parent = u32::try_from(nix::unistd::getppid().as_raw()).ok();
    if expected.is_none() || parent != expected {
        tracing::warn!(
            "podprobe agent: the probe server's agent ({expected:?}) is gone; not serving"
        );
        return false;
    }
    true
}
