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
//! Beside an image's entrypoint the server is what the `postStart` hook leaves running
//! ([`super::beside`]); it announces on its stdout when it serves.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use clap::ValueEnum;
use tokio::time::Instant;

use crate::probe::reaper;

/// For whom the server serves, which says how it starts and whom it refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ServeFor {
    /// Started by a `postStart` hook, beside the container's own process: announces itself
    /// on stdout ([`READY`]), outlives the hook, refuses its container's processes.
    Hook,
    /// Started by the agent that is the container's PID 1: dies with it, refuses its
    /// container's processes.
    Init,
    /// Started by an agent that is not PID 1 (a pod sharing its process namespace): dies with
    /// it, and cannot tell its container's processes from others.
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

/// This process's own flags (before `--` and the command), for the server it starts: global
/// flags (the log's level and format) and `--socket` kept, `--detach` left out.
pub(super) fn server_args(role: ServeFor) -> Vec<OsString> {
    let mut args: Vec<OsString> = std::env::args_os()
        .skip(1)
        .take_while(|arg| arg != "--")
        .filter(|arg| arg != "--detach")
        .collect();
    let name = role.to_possible_value().map(|v| v.get_name().to_owned());
    args.extend([SERVE_FLAG.into(), name.unwrap_or_default().into()]);
    if role != ServeFor::Hook {
        args.extend([PARENT_FLAG.into(), std::process::id().to_string().into()]);
    }
    args
}

/// The server's command: this binary with `args`, out of the caller's process group.
pub(super) fn server_command(args: Vec<OsString>) -> std::io::Result<Command> {
    let mut command = Command::new(std::env::current_exe()?);
    command.args(args).stdin(Stdio::null()).process_group(0);
    Ok(command)
}

/// PID 1's side: runs the server as a child until the process ends, starting it again after
/// a backoff whenever it ends.
pub(super) async fn supervise(role: ServeFor) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let started = Instant::now();
        let spawned = server_command(server_args(role)).and_then(|mut server| {
            server.stdout(Stdio::null());
            reaper::spawn(&mut server)
        });
        let why = match spawned {
            Ok((child, exit)) => {
                let pid = child.id();
                drop(child);
                format!(
                    "the probe server (pid {pid}) ended ({:?})",
                    exit.wait().await
                )
            }
            Err(e) => format!("cannot start the probe server: {e}"),
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

/// The server's side: serves exec probes on `socket` until the process ends; `parent`: the
/// agent that started it (not for [`ServeFor::Hook`]).
pub async fn serve(socket: &Path, role: ServeFor, parent: Option<u32>) -> ExitCode {
    if role != ServeFor::Hook && !bound_to(parent) {
        return ExitCode::FAILURE;
    }
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
    if role == ServeFor::Hook {
        use std::io::Write;
        // The hook's pipe: the hook returns on this line (and may be gone already, its wait
        // over, so a failed write is nothing to act on).
        let _ = writeln!(std::io::stdout(), "{READY}");
    }
    // Beside the container's process, or as its PID 1's child, the server sees every process
    // of its container in its PID namespace, whether or not the pod shares it (then the
    // sidecar is there too, in a cgroup of its own): a process of its own container can be
    // told apart, and is refused.
    super::serving::serve(listener, role != ServeFor::Parent).await;
    ExitCode::SUCCESS
}

/// Dies with the agent that started it: asks the kernel for SIGKILL when the parent ends, then
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
