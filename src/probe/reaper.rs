//! Process reaper: the one place that waits for child processes.
//!
//! podprobe may run as PID 1 of its container, so it inherits every orphaned grandchild of the
//! exec probes it runs (`sh -c "sleep 5 &"` leaves `sleep` behind). Nobody else would collect
//! their exit statuses, so they would pile up as zombies. To make tests behave like PID 1, the
//! process marks itself a *child subreaper* (`PR_SET_CHILD_SUBREAPER`) the first time the reaper
//! is used: orphaned descendants are then re-parented to podprobe wherever it runs.
//!
//! The reaper collects statuses with `waitpid(-1, WNOHANG)` on a dedicated thread, woken by
//! SIGCHLD (through tokio's signal stream, on a runtime owned by that thread so the signal
//! registration never dies with some other runtime). Statuses of pids registered by [`spawn`]
//! are handed to the waiting attempt; all others are orphans and are dropped (counted).
//!
//! A status is kept raw, as the kernel gives it (`std::process::ExitStatus`), and decoded by
//! whoever reads it, as tini and catatonit do: a decoder that knows only the named signals
//! refuses a death by a real-time one after the zombie is gone, and the command's waiter then
//! never hears of its end.
//!
//! **Invariant: podprobe spawns children only through [`spawn`].** The reaper waits for *any*
//! child, so `tokio::process`, `std::process::Child::wait`/`output`/`status` must not be used
//! anywhere in the process: their `waitpid(pid)` would race with ours and either lose the status
//! (ECHILD) or hang. Tests in a binary that uses exec probes must run their servers in-process.
//!
//! Registration happens under the same lock the reaper holds while calling `waitpid`, and
//! [`spawn`] holds it across `fork/exec`: a child that exits instantly cannot be reaped before
//! its pid is registered. (std's spawn reaps a child whose `exec` failed itself, with
//! `waitpid(pid)`, also while we hold the lock, so that case cannot race either.)

use std::collections::HashMap;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use rustix::io::Errno;
use rustix::process::{WaitOptions, wait};
use tokio::sync::{oneshot, watch};

/// How often to look for exited children when SIGCHLD cannot be listened to. When it can, the
/// thread sleeps until one arrives: tokio's signal stream loses none once registered (it
/// coalesces them, and every wake-up drains all pending statuses), and the first pass after
/// registering collects what exited before. No timer wakes it: an exec agent, one per pod,
/// waits days for its command with no CPU spent.
const POLL_WITHOUT_SIGCHLD: Duration = Duration::from_millis(20);

#[derive(Debug)]
struct Reaper {
    waiters: Mutex<HashMap<i32, oneshot::Sender<ExitStatus>>>,
    orphans: watch::Sender<u64>,
}

static REAPER: OnceLock<Reaper> = OnceLock::new();
static STARTED: OnceLock<()> = OnceLock::new();

/// The exit status of a child started by [`spawn`].
#[derive(Debug)]
pub struct ExitStatusFuture {
    rx: oneshot::Receiver<ExitStatus>,
}

impl ExitStatusFuture {
    /// Waits for the child to terminate. `None` only if the reaper is gone (it never is).
    pub async fn wait(self) -> Option<ExitStatus> {
        self.rx.await.ok()
    }
}

impl Reaper {
    fn get() -> &'static Reaper {
        let reaper = REAPER.get_or_init(|| Reaper {
            waiters: Mutex::new(HashMap::new()),
            orphans: watch::Sender::new(0),
        });
        STARTED.get_or_init(|| {
            if let Err(err) = nix::sys::prctl::set_child_subreaper(true) {
                tracing::warn!(%err, "cannot become a child subreaper; orphans of exec probes are reaped only when podprobe is PID 1");
            }
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("podprobe-reaper".into())
                .spawn(move || reaper_thread(reaper, ready_tx))
                .expect("cannot start the reaper thread");
            // Wait until SIGCHLD is being listened to: statuses pending before that are
            // collected by the first pass the thread makes after registering.
            let _ = ready_rx.recv();
        });
        reaper
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<i32, oneshot::Sender<ExitStatus>>> {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Collects every pending exit status.
    fn reap_all(&self) {
        let mut waiters = self.lock();
        let mut orphans = 0u64;
        loop {
            match wait(WaitOptions::NOHANG) {
                Ok(None) => break,
                Ok(Some((pid, status))) => {
                    let status = ExitStatus::from_raw(status.as_raw());
                    let delivered = match waiters.remove(&pid.as_raw_nonzero().get()) {
                        Some(tx) => tx.send(status).is_ok(),
                        None => false,
                    };
                    if !delivered {
                        orphans += 1;
                    }
                }
                Err(Errno::INTR) => continue,
                // ECHILD: no children at all.
                Err(_) => break,
            }
        }
        drop(waiters);
        if orphans > 0 {
            self.orphans.send_modify(|n| *n += orphans);
        }
    }
}

fn reaper_thread(reaper: &'static Reaper, ready: std::sync::mpsc::Sender<()>) {
    // A launcher may start podprobe with SIGCHLD blocked (the mask survives exec, and threads
    // inherit it): then no thread would take it and this one would sleep forever. Let this
    // thread take it.
    let mut chld = nix::sys::signal::SigSet::empty();
    chld.add(nix::sys::signal::Signal::SIGCHLD);
    if let Err(err) = chld.thread_unblock() {
        tracing::warn!(%err, "cannot unblock SIGCHLD for the reaper");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build();
    let Ok(runtime) = runtime else {
        let _ = ready.send(());
        // No runtime: fall back to polling.
        loop {
            reaper.reap_all();
            std::thread::sleep(POLL_WITHOUT_SIGCHLD);
        }
    };
    runtime.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut sigchld = signal(SignalKind::child()).ok();
        if sigchld.is_none() {
            tracing::warn!("cannot listen for SIGCHLD; polling for exited children");
        }
        let _ = ready.send(());
        loop {
            reaper.reap_all();
            match sigchld.as_mut() {
                Some(s) => {
                    if s.recv().await.is_none() {
                        tracing::warn!("SIGCHLD stream ended; polling for exited children");
                        sigchld = None;
                    }
                }
                None => tokio::time::sleep(POLL_WITHOUT_SIGCHLD).await,
            }
        }
    });
}

/// Starts `command` and registers its pid with the reaper. The returned `Child` must never be
/// waited on (its stdio handles may be taken); use the [`ExitStatusFuture`] instead.
pub fn spawn(command: &mut Command) -> io::Result<(Child, ExitStatusFuture)> {
    let reaper = Reaper::get();
    let mut waiters = reaper.lock();
    let child = command.spawn()?;
    let (tx, rx) = oneshot::channel();
    let pid = i32::try_from(child.id()).map_err(io::Error::other)?;
    waiters.insert(pid, tx);
    Ok((child, ExitStatusFuture { rx }))
}

/// Number of exit statuses reaped that nobody waited for: orphaned descendants (unregistered
/// pids) and children of abandoned attempts. A watch so callers (tests, metrics) can wait for
/// it to move instead of sleeping.
pub fn orphans_reaped() -> watch::Receiver<u64> {
    Reaper::get().orphans.subscribe()
}

/// Makes this process a child subreaper and starts the reaper thread, if not done yet.
/// Called implicitly by [`spawn`]; the binary may call it at start-up.
pub fn init() {
    Reaper::get();
}
