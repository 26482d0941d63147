//! `podprobe agent --detach`: the agent beside the container's own process, for a container
//! that runs its image's entrypoint (no `command` in the pod spec, so there is nothing to wrap).
//!
//! The manager's injection runs it as the container's `postStart` hook, as openkruise/agents
//! starts its in-container daemon: the container's PID 1, signals, exit code and process tree
//! stay the image's own; the agent is one more process in the container, in its own process
//! group, adopted by the container's PID 1 once the hook returns.
//!
//! The hook must never fail: the kubelet kills a container whose `postStart` hook fails, and
//! a game server must not die because its probes cannot be served. So the hook process starts
//! the agent's supervisor (the same binary, `--serve-for hook --supervise`), which runs the
//! probe server and starts it again whenever it ends ([`super::server::supervise`]), as the
//! agent wrapping a command does; the hook waits until the first server serves or ended
//! without serving (at most [`READY_WITHIN`]), and exits 0 either way. The agent writes its
//! log to the container's own log (PID 1's stderr, where `kubectl logs` reads), as the agent
//! wrapping a command does; the hook's own output is read by nobody when it succeeds. Its
//! standard streams are not the hook's: the runtime's exec waits until every holder of those
//! pipes has closed them.

use std::fs::OpenOptions;
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use super::server::{READY, agent_command, first_line, supervisor_args};
use crate::probe::reaper;

/// How long the hook waits for the agent to serve: a bind on an `emptyDir` takes
/// milliseconds; a hung filesystem must not hold the container's start (the kubelet starts
/// the pod's next container only after this hook).
const READY_WITHIN: Duration = Duration::from_secs(10);

/// Where the agent logs: its container's log. A process that may not open PID 1's stderr (a
/// PID 1 that changed its user) logs nowhere rather than into the hook's pipes.
const CONTAINER_LOG: &str = "/proc/1/fd/2";

/// The `postStart` hook's part: starts the agent beside the container's process and returns
/// once it serves on `socket`; always 0 (see the module's documentation).
pub async fn detach(socket: &Path) -> ExitCode {
    let log = OpenOptions::new()
        .append(true)
        .open(CONTAINER_LOG)
        .map_or_else(|_| Stdio::null(), Stdio::from);
    let mut agent = match agent_command(supervisor_args()) {
        Ok(command) => command,
        Err(e) => {
            eprintln!("podprobe agent: cannot find this binary to start the agent: {e}");
            return ExitCode::SUCCESS;
        }
    };
    agent.stdout(Stdio::piped()).stderr(log);
    let (mut child, _exit) = match reaper::spawn(&mut agent) {
        Ok(started) => started,
        Err(e) => {
            eprintln!("podprobe agent: cannot start the agent: {e}");
            return ExitCode::SUCCESS;
        }
    };
    let pid = child.id();
    match tokio::time::timeout(READY_WITHIN, first_line(child.stdout.take())).await {
        Ok(Some(line)) if line.trim_end() == READY => {
            eprintln!(
                "podprobe agent: pid {pid} serves exec probes on {}",
                socket.display()
            );
        }
        Ok(_) => eprintln!(
            "podprobe agent: the agent (pid {pid}) does not serve yet: see the container's log; the container starts, and the agent tries again"
        ),
        Err(_) => eprintln!(
            "podprobe agent: the agent (pid {pid}) does not serve after {READY_WITHIN:?}; the container starts, and the agent goes on trying"
        ),
    }
    ExitCode::SUCCESS
}
