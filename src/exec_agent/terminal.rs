//! The command's process group and the terminal, as tini isolates its child.
//!
//! The command runs in a process group of its own, so what it sends its own group (`kill(0,
//! …)`, a shell script's `kill 0` when it ends) does not reach the agent, which would forward it
//! back. In a container with a terminal (`tty: true`, `kubectl attach -it`) that group is made
//! the terminal's foreground group: Ctrl-C, Ctrl-\ and Ctrl-Z then reach the command alone,
//! once, from the terminal, as they reached it before the agent; sharing the agent's group,
//! a command that catches Ctrl-C got it twice (from the terminal and forwarded).

use std::io::IsTerminal;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};

/// Makes the command's group (`command`: its pid, the group's id) the foreground group of the
/// agent's terminal, if its stdin is one and the agent's group holds it; says why not at
/// debug level (a container without a terminal is the rule).
pub(super) fn hand_over(command: Pid) {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return;
    }
    // Only the foreground group may give the terminal away: a background one would be
    // stopped by SIGTTOU for trying.
    match tcgetpgrp(&stdin) {
        Ok(foreground) if foreground == getpgrp() => {}
        other => {
            tracing::debug!("podprobe agent: the terminal is not the agent's ({other:?})");
            return;
        }
    }
    if let Err(e) = tcsetpgrp(&stdin, command) {
        tracing::warn!("podprobe agent: cannot give the terminal to the command: {e}");
        return;
    }
    // A command that read the terminal before it was its own was stopped (SIGTTIN): let it
    // go on, now that it may read.
    if stopped(command) {
        let _ = killpg(command, Signal::SIGCONT);
    }
}

/// Whether `pid` is stopped by a signal (state `T` in `/proc/<pid>/stat`).
fn stopped(pid: Pid) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    state == Some("T")
}
