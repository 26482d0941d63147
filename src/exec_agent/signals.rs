//! Which signals the agent passes on to its command, and when.
//!
//! Every signal that is a message is forwarded, real-time ones included (an image's
//! `STOPSIGNAL` or a pod's `lifecycle.stopSignal` may be one), as tini and dumb-init do. Not
//! forwarded: SIGKILL and SIGSTOP (they cannot be caught), SIGCHLD (the reaper's), the signals
//! raised for a fault or an `abort` of the agent's own (SIGSEGV, SIGBUS, SIGILL, SIGFPE,
//! SIGTRAP, SIGSYS, SIGABRT), the terminal's to a background reader or writer (SIGTTIN,
//! SIGTTOU; tini keeps these too), SIGPIPE (the Rust runtime ignores it, so that a closed
//! socket is an error, not a signal), and the real-time numbers the C library keeps for itself.
//!
//! As its container's PID 1 the agent forwards a signal only when the command, had it been
//! PID 1 itself, would have received it. The kernel drops a signal sent to a namespace's init
//! when its handler is the default and it is not blocked, so the command receives it when it
//! catches it (`SigCgt`), ignores it (`SigIgn`, where forwarding changes nothing), blocks it
//! (`SigBlk`, for longer than a shell's `fork` blocks it: a signal pending while blocked is
//! dropped at the unblocking unless then caught), or is waiting for signals in
//! `sigtimedwait`/`sigwait`, as tini, dumb-init and many C and C++ servers do: while it waits,
//! the kernel unblocks the awaited signals and `/proc` shows none of them blocked, so the wait
//! itself (the process's `wchan`, or its current system call) is what says so. Whatever cannot
//! be read counts as received: a signal is never lost for want of a reading.

use nix::libc;
use nix::unistd::Pid;
use rustix::process::{Signal, kill_process};
use rustix_libc_wrappers::process::SignalExt;

/// Never forwarded, as the module says.
const KEPT: [i32; 13] = [
    libc::SIGKILL,
    libc::SIGSTOP,
    libc::SIGCHLD,
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGTRAP,
    libc::SIGSYS,
    libc::SIGABRT,
    libc::SIGTTIN,
    libc::SIGTTOU,
    libc::SIGPIPE,
];

/// The signals forwarded to the command, as raw numbers.
pub(super) fn forwarded() -> Vec<i32> {
    (1..=libc::SIGRTMAX())
        .filter(|sig| !KEPT.contains(sig) && Signal::from_raw(*sig).is_some())
        .collect()
}

/// Sends `sig` to `pid`; a command already gone is not an error worth saying.
pub(super) fn send(pid: Pid, sig: i32) {
    let (Some(pid), Some(sig)) = (
        rustix::process::Pid::from_raw(pid.as_raw()),
        Signal::from_raw(sig),
    ) else {
        return;
    };
    let _ = kill_process(pid, sig);
}

/// `SIGTERM`, `SIGRTMIN+3`: as `kill -l` and the kubelet's `stopSignal` name them.
pub(super) fn name(sig: i32) -> String {
    crate::probe::exec::signal_name(sig)
}

/// Whether `pid`, as its namespace's PID 1, would receive `sig` (the module's rule).
pub(super) async fn received_as_init(pid: Pid, sig: i32) -> bool {
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        match reading(pid, sig) {
            Some(received) => return received,
            None if tokio::time::Instant::now() >= deadline => return true,
            None => tokio::time::sleep(SETTLE_STEP).await,
        }
    }
}

/// How long a signal that is only blocked waits for the block to settle: a shell blocks every
/// signal for the microseconds of a `fork`, after which the kernel would have dropped a
/// pending signal it does not catch; catatonit blocks them for good and reads a `signalfd`.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(100);
const SETTLE_STEP: std::time::Duration = std::time::Duration::from_millis(2);

/// Whether `pid`, as PID 1, receives `sig` now: `Some(true)` it does (caught, ignored, awaited,
/// or unreadable), `Some(false)` the kernel drops it, `None` it is only blocked (pending until
/// unblocked, then received or dropped as the process then says).
fn reading(pid: Pid, sig: i32) -> Option<bool> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Some(true);
    };
    let mask = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
    };
    let (Some(caught), Some(ignored), Some(blocked)) =
        (mask("SigCgt:"), mask("SigIgn:"), mask("SigBlk:"))
    else {
        return Some(true);
    };
    let bit = 1u64 << (sig - 1);
    if (caught | ignored) & bit != 0 || waits_for_signals(pid) {
        Some(true)
    } else if blocked & bit != 0 {
        None
    } else {
        Some(false)
    }
}

/// Whether `pid` sleeps in `rt_sigtimedwait` (`sigwait`, `sigwaitinfo`, `sigtimedwait`).
/// `wchan` names the kernel function; where symbols are hidden, the current system call's
/// number says it. Unreadable (another user's process without `CAP_SYS_PTRACE`): `true`.
fn waits_for_signals(pid: Pid) -> bool {
    let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
    if wchan.contains("sigtimedwait") {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/syscall")) {
        // "running", or the number of the system call it sleeps in and its arguments.
        Ok(syscall) => syscall
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<libc::c_long>().ok())
            .is_some_and(|n| n == libc::SYS_rt_sigtimedwait),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_signal_is_forwarded_and_no_fault_or_child_signal() {
        let forwarded = forwarded();
        for sig in [
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGCONT,
            libc::SIGALRM,
        ] {
            assert!(forwarded.contains(&sig), "{}", name(sig));
        }
        for sig in [libc::SIGPWR, libc::SIGRTMIN() + 3, libc::SIGRTMAX() - 1] {
            assert!(forwarded.contains(&sig), "{}", name(sig));
        }
        for sig in KEPT {
            assert!(!forwarded.contains(&sig), "{}", name(sig));
        }
    }

    #[test]
    fn real_time_signals_are_named_as_kill_names_them() {
        assert_eq!(name(libc::SIGTERM), "SIGTERM");
        assert_eq!(name(libc::SIGRTMIN()), "SIGRTMIN");
        assert_eq!(name(libc::SIGRTMIN() + 3), "SIGRTMIN+3");
        assert_eq!(name(libc::SIGRTMAX()), "SIGRTMAX");
    }
}
