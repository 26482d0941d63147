//! `podprobe agent`: the exec agent, run as an app container's main process so the sidecar's
//! exec probes run inside that container (see [`crate::probe::exec::agent`] for the sidecar's
//! side and the wire).
//!
//! As the container's PID 1 it owes the container's own command what an init owes: the command
//! keeps the container's stdio, environment and working directory (nothing is changed before
//! it starts); the signals a runtime or a user sends reach it as they reached it when it was
//! PID 1 itself; every orphan is reaped ([`reaper`]); and the container's exit code is the
//! command's (128 + the signal's number when a signal ended it, as a shell reports it). Serving
//! probes is second to that: if the socket cannot be served, the command runs anyway and the
//! reason is logged. It is done in a process of its own ([`server`]), which the agent starts
//! again when it ends: nothing that serving does can stop PID 1.
//!
//! "As when it was PID 1": the kernel delivers a signal to a namespace's PID 1 only if PID 1
//! handles, ignores or blocks it, so a game server without a SIGTERM handler kept running until
//! the kubelet's SIGKILL; as the agent's child it would die at once. So while the agent is PID
//! 1 it forwards a signal only when the command would have received it ([`signals`]: caught,
//! blocked, or awaited in `sigwait` as tini and dumb-init do); elsewhere (a pod sharing its
//! process namespace, where `pause` is PID 1) it forwards every one.
//!
//! A container that runs its image's entrypoint (no `command` to wrap) gets the agent beside
//! its own process instead, started by its `postStart` hook ([`beside`]).
//!
//! Whoever can reach the socket can run commands as this container's user; the manager gives
//! each wrapped container a socket volume of its own, mounted there and in the sidecar only.

use std::io::{self, ErrorKind};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use nix::unistd::Pid;
use tokio::net::UnixListener;
use tokio::signal::unix::{SignalKind, signal};

use crate::probe::reaper;

mod beside;
mod cli;
mod peer;
mod server;
mod serving;
mod signals;
mod terminal;

pub use beside::detach;
pub use cli::AgentArgs;
pub use server::{ServeFor, serve};

/// Runs `command` as the container's main process and serves exec probes on `socket` until
/// it exits; returns its exit code.
pub async fn run(socket: &Path, termination_log: &Path, command: &[String]) -> ExitCode {
    // Registered before the command starts, so a SIGTERM that comes early is forwarded, not
    // lost (a PID 1 without a handler ignores it).
    let mut streams = Vec::new();
    for sig in signals::forwarded() {
        match signal(SignalKind::from_raw(sig)) {
            Ok(stream) => streams.push((sig, stream)),
            Err(e) => tracing::warn!("podprobe agent: cannot forward {}: {e}", signals::name(sig)),
        }
    }
    let Some((program, args)) = command.split_first() else {
        eprintln!("podprobe agent: no command to run");
        return ExitCode::from(127);
    };
    let mut spawn = Command::new(program);
    // A process group of its own ([`terminal`]).
    spawn.args(args).process_group(0);
    let (child, exit) = match reaper::spawn(&mut spawn) {
        Ok(started) => started,
        Err(e) => {
            let reason = format!("podprobe agent: cannot start {command:?}: {e}");
            eprintln!("{reason}");
            explain_termination(termination_log, &reason);
            // What a shell answers for a missing (127) or unusable (126) command.
            return ExitCode::from(if e.kind() == ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    let pid = Pid::from_raw(child.id() as i32);
    // Never waited on: the reaper owns its status.
    drop(child);
    terminal::hand_over(pid);
    let init = std::process::id() == 1;
    for (sig, mut stream) in streams {
        let program = program.clone();
        tokio::spawn(async move {
            let mut said = false;
            while stream.recv().await.is_some() {
                if !init || signals::received_as_init(pid, sig).await {
                    signals::send(pid, sig);
                } else if !said {
                    // Said, because a container that then ignores SIGTERM until the kubelet's
                    // SIGKILL looks like a fault of the agent's; once per signal, as a
                    // terminal's resizes may come by the hundred.
                    said = true;
                    tracing::info!(
                        "podprobe agent: {} not forwarded: {program} neither handles, blocks nor \
                         waits for it, and as its container's PID 1 it would have ignored it \
                         (said once)",
                        signals::name(sig)
                    );
                }
            }
        });
    }
    tracing::info!(
        "podprobe agent: {program} runs as pid {pid}; exec probes are served on {} by a probe server of their own",
        socket.display()
    );
    // Serving runs in a process of its own: nothing it does can stop this one. The container's
    // first process sees its container as a cgroup of its own, so its server refuses the
    // container's processes. Started by a process of its own container (by hand, a test), it
    // cannot tell where its container ends.
    let first_of_container = init || parent_outside_container();
    let role = if first_of_container {
        server::ServeFor::Init
    } else {
        server::ServeFor::Parent
    };
    tokio::spawn(server::supervise(role, false));
    let status = exit.wait().await;
    match status.map(|s| (s.code(), s.signal())) {
        // The exit code is a byte: the kernel keeps the low 8 bits of the command's.
        Some((Some(code), _)) => ExitCode::from(code as u8),
        // As a shell and tini report a death by a signal, real-time ones included.
        Some((None, Some(signal))) => ExitCode::from(128u8.wrapping_add(signal as u8)),
        _ => {
            eprintln!("podprobe agent: unexpected status of {program}: {status:?}");
            ExitCode::FAILURE
        }
    }
}

/// Whether this process's parent is outside its container, so that this is the container's
/// first process: a parent outside its PID namespace (the runtime, seen as pid 0, in a pod
/// that shares its process namespace, where `pause` is PID 1), or of another cgroup (the
/// runtime's shim, seen in a pod on the host's PID namespace). A parent whose cgroup cannot be
/// read counts as outside: the server then refuses the container's processes rather than
/// answer them.
fn parent_outside_container() -> bool {
    let parent = nix::unistd::getppid().as_raw();
    if parent == 0 {
        return true;
    }
    match (peer::cgroup(&parent.to_string()), peer::cgroup("self")) {
        (Some(theirs), Some(own)) => theirs != own,
        _ => true,
    }
}

/// Writes why the container ends to its termination message file, which the kubelet reads
/// when the container has stopped; said in the log when it cannot be written (a path the
/// container does not have).
fn explain_termination(path: &Path, reason: &str) {
    if let Err(e) = std::fs::write(path, reason) {
        eprintln!(
            "podprobe agent: cannot write the termination message to {}: {e}",
            path.display()
        );
    }
}

/// Binds `socket`, replacing what a previous instance of the container left, readable and
/// writable by the sidecar whatever its user: bound under another name and renamed once its
/// mode is set, so the sidecar never meets it half-made.
fn bind(socket: &Path) -> io::Result<UnixListener> {
    match std::fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(socket)?,
        Ok(_) => {
            return Err(io::Error::new(
                ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way",
            ));
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let partial = socket.with_extension("partial");
    let _ = std::fs::remove_file(&partial);
    let listener = UnixListener::bind(&partial)?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o666))?;
    std::fs::rename(&partial, socket)?;
    Ok(listener)
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("cannot find this binary to copy it: {0}")]
    Locate(#[source] io::Error),
    #[error(
        "cannot copy the agent {source_path} to {dest}: {source} (is the agent volume mounted there?)"
    )]
    Copy {
        source_path: PathBuf,
        dest: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The file name of the exec agent alone (`src/bin/podprobe-agent.rs`), beside the sidecar's
/// binary in its image.
pub const AGENT_ALONE: &str = "podprobe-agent";

/// Copies the exec agent to `dest`, executable by every user; through a temporary name, so a
/// container never starts a half-written agent. The agent is [`AGENT_ALONE`] beside this
/// binary, as the sidecar image has it (a fraction of this binary's size and memory); this
/// binary itself, which has `podprobe agent` too, where it has no such neighbour (a build of
/// its own). Returns which file was copied.
pub fn install(dest: &Path) -> Result<PathBuf, InstallError> {
    let this = std::env::current_exe().map_err(InstallError::Locate)?;
    let source = this
        .parent()
        .map(|dir| dir.join(AGENT_ALONE))
        .filter(|alone| alone.is_file() && *alone != this)
        .unwrap_or(this);
    let copy_error = |error| InstallError::Copy {
        source_path: source.clone(),
        dest: dest.to_owned(),
        source: error,
    };
    let partial = dest.with_extension("partial");
    std::fs::copy(&source, &partial).map_err(copy_error)?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))
        .map_err(copy_error)?;
    std::fs::rename(&partial, dest).map_err(copy_error)?;
    Ok(source)
}
