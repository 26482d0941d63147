//! Who asks on the agent's socket: the sidecar, or a process of the agent's own container,
//! told apart by something the asker cannot forge, and refused whenever it cannot be told.
//!
//! As its container's first process, or beside the container's own process, the agent sees
//! the pid of every process of its own container and none (0) of one in a PID namespace it
//! does not share, such as the sidecar's; of a process it sees, its cgroup says whether it is
//! of this container (in a namespace the containers share, the sidecar's cgroup is its own).
//!
//! The asker is the process that connected, held by a pidfd (`SO_PEERPIDFD`, Linux 6.5): its
//! pid, read from the pidfd, is -1 once it has been reaped. A process that connects and exits,
//! leaving the socket to another process of the container, is refused, exiting, a zombie or
//! reaped (from its exit on, its cgroup reads as the root's, not its container's); so is any
//! asker whose cgroup cannot be read or that began to exit while it was read. On an older kernel only the pid the
//! socket kept is known (`SO_PEERCRED`): it must still run and its cgroup be readable, or the
//! asker is refused (a pid taken over by another process in between is not told apart).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{getsockopt, sockopt};

/// What may happen to an asker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Answered: a process outside the agent's PID namespace or cgroup.
    Answer,
    /// Refused, and why (said to the asker and, once, in the log).
    Refuse(String),
}

/// The pid of the process a pidfd holds, as the agent's PID namespace numbers it: -1 once it
/// has exited, 0 when it is outside the namespace.
fn pidfd_pid(pidfd: &OwnedFd) -> Result<i32, String> {
    let fdinfo = format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd());
    let text = std::fs::read_to_string(&fdinfo).map_err(|e| format!("{fdinfo}: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|pid| pid.trim().parse().ok())
        .ok_or_else(|| format!("{fdinfo} names no pid"))
}

/// The cgroups of `pid` (`self`, or a number), as `/proc` gives them.
pub(super) fn cgroup(pid: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()
}

/// The kernel's flag on a task that has begun to exit (`PF_EXITING`), set before it leaves
/// its cgroup and never cleared.
const PF_EXITING: u64 = 0x4;

/// Whether `pid` runs and has not begun to exit: from then on its cgroup reads as the root's,
/// whatever container it was of (first while it still runs, then as a zombie).
fn running(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The fields after the command's name, which may hold any character but ends at the last
    // `)`: state, ppid, pgrp, session, tty_nr, tpgid, flags.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().take(7).collect())
        .unwrap_or_default();
    let (Some(state), Some(flags)) = (fields.first(), fields.get(6)) else {
        return false;
    };
    let exiting = flags.parse::<u64>().map_or(true, |f| f & PF_EXITING != 0);
    !matches!(*state, "Z" | "X" | "x") && !exiting
}

const SIDECAR_ONLY: &str = "it runs commands for the podprobe sidecar only";

/// The verdict on the process connected to `stream`.
pub(super) fn verdict(stream: &impl AsFd) -> Verdict {
    let Some(own) = cgroup("self") else {
        return Verdict::Refuse(format!(
            "the exec agent cannot read its own cgroup, so it cannot tell its container's \
             processes from the sidecar: refused; {SIDECAR_ONLY}"
        ));
    };
    match getsockopt(stream, sockopt::PeerPidfd) {
        Ok(pidfd) => by_pidfd(&pidfd, &own),
        // A kernel before 6.5: the pid the socket kept.
        Err(Errno::ENOPROTOOPT | Errno::EINVAL) => by_pid(stream, &own),
        Err(e) => Verdict::Refuse(format!(
            "the exec agent cannot tell who asks ({e}): refused; {SIDECAR_ONLY}"
        )),
    }
}

fn by_pidfd(pidfd: &OwnedFd, own: &str) -> Verdict {
    let pid = match pidfd_pid(pidfd) {
        Ok(pid) => pid,
        Err(e) => {
            return Verdict::Refuse(format!(
                "the exec agent cannot tell who asks ({e}): refused; {SIDECAR_ONLY}"
            ));
        }
    };
    match pid {
        0 => Verdict::Answer,
        pid if pid < 0 => Verdict::Refuse(format!(
            "the exec agent refused a process that ended before it could be told apart from \
             its own container's; {SIDECAR_ONLY}"
        )),
        pid => {
            let read = cgroup(&pid.to_string());
            // Running after the read (nothing comes back once ended), so the read was of it
            // while it ran, not of its zombie nor of a process that took its pid.
            if !running(pid) || pidfd_pid(pidfd) != Ok(pid) {
                return Verdict::Refuse(format!(
                    "the exec agent refused pid {pid}, which ended while it was told apart \
                     from its own container's processes; {SIDECAR_ONLY}"
                ));
            }
            judge_cgroup(pid, read.as_deref(), own)
        }
    }
}

fn by_pid(stream: &impl AsFd, own: &str) -> Verdict {
    let cred = match getsockopt(stream, sockopt::PeerCredentials) {
        Ok(cred) => cred,
        Err(e) => {
            return Verdict::Refuse(format!(
                "the exec agent cannot tell who asks ({e}): refused; {SIDECAR_ONLY}"
            ));
        }
    };
    match cred.pid() {
        0 => Verdict::Answer,
        pid => {
            let read = cgroup(&pid.to_string());
            if !running(pid) {
                return Verdict::Refuse(format!(
                    "the exec agent refused pid {pid}, which has ended; {SIDECAR_ONLY}"
                ));
            }
            judge_cgroup(pid, read.as_deref(), own)
        }
    }
}

/// A visible asker: answered only if its cgroup was read and is not the agent's.
fn judge_cgroup(pid: i32, asker: Option<&str>, own: &str) -> Verdict {
    match asker {
        Some(cgroup) if cgroup != own => Verdict::Answer,
        Some(_) => Verdict::Refuse(format!(
            "the exec agent refused pid {pid} of its own container: {SIDECAR_ONLY}"
        )),
        None => Verdict::Refuse(format!(
            "the exec agent refused pid {pid}, whose cgroup it cannot read (it may have \
             ended): {SIDECAR_ONLY}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_visible_asker_is_answered_only_from_another_cgroup_read_in_full() {
        let own = "0::/kubepods/pod1/game\n";
        assert_eq!(
            judge_cgroup(7, Some("0::/kubepods/pod1/sidecar\n"), own),
            Verdict::Answer
        );
        for (asker, why) in [(Some(own), "own container"), (None, "cannot read")] {
            let Verdict::Refuse(message) = judge_cgroup(7, asker, own) else {
                panic!("{asker:?} answered");
            };
            assert!(
                message.contains(why) && message.contains("pid 7"),
                "{message}"
            );
        }
    }

    #[test]
    fn a_pidfd_names_a_live_process_and_not_an_ended_one() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let pidfd = getsockopt(&ours, sockopt::PeerPidfd).expect("SO_PEERPIDFD (Linux 6.5)");
        assert_eq!(pidfd_pid(&pidfd), Ok(std::process::id() as i32));
        drop(theirs);
        // A process of this test's own cgroup, alive: its own container.
        let Verdict::Refuse(message) = verdict(&ours) else {
            panic!("this process was answered");
        };
        assert!(message.contains("own container"), "{message}");
    }
}
