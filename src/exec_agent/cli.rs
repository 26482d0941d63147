//! `podprobe agent`'s command line, shared by the sidecar binary and the agent's own small one
//! (`podprobe-agent`, what the injected init container copies into app containers): the same
//! flags, the same help, the same behaviour, whichever binary a container runs.

use std::path::PathBuf;
use std::process::ExitCode;

use super::ServeFor;

/// Run as the exec agent of an app container, which runs the sidecar's exec probes in that
/// container on request over a Unix socket: as the kubelet would, without an apiserver
/// request. The manager's injection sets it up one of two ways.
///
/// `podprobe agent --socket PATH -- COMMAND…` is the container's command when the pod spec
/// gives one: COMMAND runs as the agent's child with the container's own stdio, environment
/// and working directory; the signals the container receives reach COMMAND as they would
/// have as PID 1 (all but the ones a process sends itself); every orphan is reaped; the
/// container's exit code is COMMAND's (128 + the signal's number when a signal ended it).
/// Probes are served by a child process of the agent's, started again when it ends, so a
/// fault in serving never stops COMMAND. If the socket cannot be served, COMMAND still
/// runs (exec probes then fail with the reason).
///
/// `podprobe agent --socket PATH --detach` is the container's postStart hook when the
/// container runs its image's entrypoint: it starts the agent beside the container's own
/// process and returns once it serves, always with exit code 0 (a failing postStart hook
/// would kill the container); the agent logs to the container's log.
#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// The Unix socket to serve the sidecar's exec probes on (replaced if it exists).
    #[arg(long)]
    socket: PathBuf,

    /// Where a command that cannot start is explained: the container's
    /// `terminationMessagePath`, which the kubelet shows as the container's last termination
    /// message (`kubectl describe pod`), as it showed the runtime's StartError before the agent.
    #[arg(long, default_value = "/dev/termination-log", value_name = "PATH")]
    termination_log: PathBuf,

    /// Start the agent beside the container's own process instead of running COMMAND under
    /// it (for a container's postStart hook); returns once it serves (within 10 s), always 0.
    #[arg(long, conflicts_with_all = ["command", "serve_for"])]
    detach: bool,

    /// Serve exec probes only: the probe server that the agent runs as its child, or that
    /// `--detach` leaves running.
    #[arg(long, hide = true, value_enum, conflicts_with = "command")]
    serve_for: Option<ServeFor>,

    /// The agent that started this probe server.
    #[arg(long, hide = true, requires = "serve_for")]
    parent_pid: Option<u32>,

    /// Supervise probe servers for `--serve-for` instead of serving: what the `--detach` hook
    /// leaves running beside the container's own process.
    #[arg(
        long,
        hide = true,
        requires = "serve_for",
        conflicts_with = "parent_pid"
    )]
    supervise: bool,

    /// The container's own command and arguments.
    #[arg(
        required_unless_present_any = ["detach", "serve_for"],
        last = true,
        value_name = "COMMAND"
    )]
    command: Vec<String>,
}

impl AgentArgs {
    /// Runs the agent these flags ask for, to its exit code.
    pub async fn run(self) -> ExitCode {
        if self.detach {
            return super::detach(&self.socket).await;
        }
        match self.serve_for {
            Some(role) if self.supervise => {
                super::server::supervise(role, true).await;
                ExitCode::SUCCESS
            }
            Some(role) => super::serve(&self.socket, role, self.parent_pid).await,
            None => super::run(&self.socket, &self.termination_log, &self.command).await,
        }
    }
}
