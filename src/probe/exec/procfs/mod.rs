//! `procfs` exec mode: run the command inside the target container's filesystem.
//!
//! With `shareProcessNamespace: true` the sidecar sees the target container's processes. We
//! find its main process, then run the command chrooted into `/proc/<pid>/root` with the
//! target's environment (`/proc/<pid>/environ`), working directory (`/proc/<pid>/cwd`) and
//! uid/gid/supplementary groups (`/proc/<pid>/status`), through the same runner as `local`
//! (timeout, process-group kill, output caps, reaper). The command never holds more than the
//! target: its capability sets are cut to the target's, its bounding set too (or, without
//! `CAP_SETPCAP` to drop entries, `no_new_privs` is set), and `no_new_privs` when the target
//! has it ([`super::enter`]). Every file of the target is read through one descriptor of its
//! `/proc/<pid>` directory, so a pid reused by another process mid-attempt fails the attempt
//! instead of reaching that process.
//!
//! Finding the main process:
//! 1. by `containerID`: the processes whose `/proc/<pid>/cgroup` names the container's id
//!    (containerd, CRI-O and Docker all put it in the cgroup path); the main one is the match
//!    whose parent is not a match (lowest pid on ties);
//! 2. heuristic, when the id is unknown or no cgroup shows it (cgroup namespaces that hide
//!    paths, sandboxed runtimes): the processes whose parent is outside the pod's PID namespace
//!    (`PPid: 0`, i.e. each container's init), minus the `pause` process, minus the init of our
//!    own container, minus kernel threads. Exactly one left → that one; none or several → the
//!    mode is unavailable (several app containers cannot be told apart this way).
//!
//! Access: `/proc/<pid>/{root,cwd,environ}` are guarded by the ptrace access check, made with
//! the caller's *filesystem* ids. When a plain open fails with `EACCES`/`EPERM` and podprobe
//! runs as root, it retries on the same thread with `setfsuid/setfsgid` set to the target's ids
//! (then switches back), which passes the check without `CAP_SYS_PTRACE` for a dumpable target
//! whose permitted capabilities the sidecar also holds (the kernel's capability half of the
//! check: a sidecar that dropped ALL is refused a root target that kept the runtime's defaults;
//! seen on a real node).
//! The root and cwd are held as `O_PATH` descriptors; the child `fchdir`s to them, so it never
//! needs ptrace access itself (see [`super::enter`]).
//!
//! Needs: a shared PID namespace, `CAP_SYS_CHROOT` (in Pod Security Baseline), and
//! `CAP_SETUID`/`CAP_SETGID` when the target's ids differ from the sidecar's.

use std::collections::HashMap;
use std::io::{self, ErrorKind};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat};
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid, getgid, getgroups, getuid, setfsgid, setfsuid};

use super::enter::{Confine, Enter, Ids};
use crate::probe::{AttemptError, ExecAction, ExecMode, Observation};

mod status;
pub use status::{CapSets, ProcIds, ProcStatus, parse_environ};

const CAP_SETGID: u32 = 6;
const CAP_SETUID: u32 = 7;
const CAP_SETPCAP: u32 = 8;
const CAP_SYS_CHROOT: u32 = 18;

/// How the main process was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoundBy {
    /// Its `/proc/<pid>/cgroup` names the container id.
    ContainerId,
    /// The only other container's init process in the shared PID namespace.
    Heuristic,
}

/// The target container's main process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located {
    pub pid: i32,
    pub found_by: FoundBy,
}

impl std::fmt::Display for Located {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.found_by {
            FoundBy::ContainerId => write!(f, "pid {} (containerID in its cgroup)", self.pid),
            FoundBy::Heuristic => write!(
                f,
                "pid {} (the only other container's init process; containerID not visible in cgroups)",
                self.pid
            ),
        }
    }
}

/// What `/proc/<pid>` tells about one process (only world-readable files).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    pub comm: String,
    pub cgroup: String,
    /// `/proc/<pid>/cmdline` is empty: a kernel thread (or a zombie).
    pub kernel_thread: bool,
}

/// The hex id of a `containerID` (`containerd://<hex>` → `<hex>`).
pub fn container_id_hex(id: &str) -> &str {
    id.rsplit_once("://").map_or(id, |(_, hex)| hex)
}

/// Reads every process under `proc` (vanishing ones are skipped).
pub fn scan(proc: &Path) -> io::Result<Vec<ProcInfo>> {
    let mut procs = Vec::new();
    for entry in std::fs::read_dir(proc)?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(info) = read_info(proc, pid) {
            procs.push(info);
        }
    }
    procs.sort_by_key(|p| p.pid);
    Ok(procs)
}

fn read_info(proc: &Path, pid: i32) -> io::Result<ProcInfo> {
    let dir = proc.join(pid.to_string());
    let status = ProcStatus::parse(&std::fs::read_to_string(dir.join("status"))?);
    Ok(ProcInfo {
        pid,
        ppid: status.ppid.unwrap_or(-1),
        comm: status.name,
        cgroup: std::fs::read_to_string(dir.join("cgroup")).unwrap_or_default(),
        kernel_thread: std::fs::read(dir.join("cmdline")).map_or(true, |c| c.is_empty()),
    })
}

/// Picks the target container's main process among `procs` (see the module docs).
/// `self_pid` is podprobe's own pid, to rule out its own container in the heuristic.
pub fn locate_in(
    procs: &[ProcInfo],
    self_pid: i32,
    container_id: Option<&str>,
) -> Result<Located, String> {
    let by_pid: HashMap<i32, &ProcInfo> = procs.iter().map(|p| (p.pid, p)).collect();
    let mut why_not_id = "the pod status gives no containerID".to_owned();
    if let Some(id) = container_id {
        let hex = container_id_hex(id);
        if hex.len() >= 12 {
            let matched: Vec<&ProcInfo> = procs.iter().filter(|p| p.cgroup.contains(hex)).collect();
            let main = matched
                .iter()
                .filter(|p| !matched.iter().any(|m| m.pid == p.ppid))
                .map(|p| p.pid)
                .min();
            if let Some(pid) = main {
                return Ok(Located {
                    pid,
                    found_by: FoundBy::ContainerId,
                });
            }
            why_not_id = format!("no process' cgroup names containerID {id}");
        } else {
            why_not_id = format!("containerID {id:?} is too short to match cgroups");
        }
    }
    // Our own container's init: walk up from ourselves to the process whose parent is outside.
    let mut own_init = self_pid;
    let mut hops = 0;
    while let Some(p) = by_pid.get(&own_init) {
        if p.ppid <= 0 || !by_pid.contains_key(&p.ppid) || hops > 1024 {
            break;
        }
        own_init = p.ppid;
        hops += 1;
    }
    let candidates: Vec<&ProcInfo> = procs
        .iter()
        .filter(|p| p.ppid == 0 && p.pid != own_init && p.comm != "pause" && !p.kernel_thread)
        .collect();
    match candidates.as_slice() {
        [one] => Ok(Located {
            pid: one.pid,
            found_by: FoundBy::Heuristic,
        }),
        [] => Err(format!(
            "{why_not_id}, and no other container's process is visible (is shareProcessNamespace: true set on the pod?)"
        )),
        many => Err(format!(
            "{why_not_id}, and {} other containers' init processes are visible ({}), which cannot be told apart",
            many.len(),
            many.iter()
                .map(|p| format!("{} {}", p.pid, p.comm))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// This thread's status (`/proc/thread-self/status`): the capabilities a forked child starts
/// with.
fn own_status() -> Option<ProcStatus> {
    let status = std::fs::read_to_string("/proc/thread-self/status")
        .or_else(|_| std::fs::read_to_string("/proc/self/status"))
        .ok()?;
    Some(ProcStatus::parse(&status))
}

/// This thread's capability sets, read once per attempt for both checks that need them.
fn own_caps() -> Result<CapSets, String> {
    own_status()
        .and_then(|s| s.caps)
        .ok_or_else(|| "cannot read this process' capabilities".to_owned())
}

fn read_ids(proc: &Path, pid: i32) -> io::Result<ProcIds> {
    let status = std::fs::read_to_string(proc.join(pid.to_string()).join("status"))?;
    status_ids(&ProcStatus::parse(&status), pid)
}

fn status_ids(status: &ProcStatus, pid: i32) -> io::Result<ProcIds> {
    status.ids.clone().ok_or_else(|| {
        io::Error::new(
            ErrorKind::InvalidData,
            format!("no Uid/Gid lines in /proc/{pid}/status"),
        )
    })
}

/// What the command may hold: the target's capability sets and `no_new_privs`, and the
/// bounding-set entries of ours that the target lacks. Without `CAP_SETPCAP` those cannot be
/// dropped; `no_new_privs` then keeps the command from gaining them through a set-uid or
/// file-capability binary.
fn confine(target: &ProcStatus, ours: &CapSets, pid: i32) -> Result<Confine, String> {
    let theirs = target
        .caps
        .ok_or_else(|| format!("cannot read the capabilities in /proc/{pid}/status"))?;
    let extra = ours.bounding & !theirs.bounding;
    let can_drop = ours.effective & (1 << CAP_SETPCAP) != 0;
    Ok(Confine {
        drop_bounding: if can_drop { extra } else { 0 },
        inheritable: theirs.inheritable,
        permitted: theirs.permitted,
        effective: theirs.effective,
        no_new_privs: target.no_new_privs || (extra != 0 && !can_drop),
    })
}

/// Runs `f`; if it fails with EACCES/EPERM and we are root, runs it again with this thread's
/// filesystem ids set to the target's (the ptrace access check on `/proc/<pid>/*` compares
/// them with the target's ids), then restores them. `setfsuid` is per thread and nothing else
/// runs on this thread in between.
fn with_target_fsids<T>(ids: &ProcIds, f: impl Fn() -> io::Result<T>) -> io::Result<T> {
    let denied = |e: &io::Error| matches!(e.raw_os_error(), Some(n) if n == Errno::EACCES as i32 || n == Errno::EPERM as i32);
    match f() {
        Err(e) if denied(&e) && nix::unistd::geteuid().is_root() => {
            let old_gid = setfsgid(Gid::from_raw(ids.gid));
            let old_uid = setfsuid(Uid::from_raw(ids.uid));
            let again = f();
            setfsuid(old_uid);
            setfsgid(old_gid);
            again
        }
        other => other,
    }
}

fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// `name` in the process directory `dir` (a `/proc/<pid>` descriptor), as an `O_PATH`
/// directory descriptor.
fn open_dir_at(dir: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    openat(dir, name, flags, Mode::empty()).map_err(io::Error::from)
}

/// The contents of `name` in the process directory `dir`.
fn read_at(dir: &OwnedFd, name: &str) -> io::Result<Vec<u8>> {
    let fd = openat(dir, name, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())?;
    let mut contents = Vec::new();
    std::io::Read::read_to_end(&mut std::fs::File::from(fd), &mut contents)?;
    Ok(contents)
}

fn vanished(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(n) if n == Errno::ENOENT as i32 || n == Errno::ESRCH as i32)
}

/// The procfs executor: locates target processes (cached per container instance) and runs
/// commands in them.
#[derive(Debug)]
pub struct Procfs {
    proc: PathBuf,
    /// containerID (or container name when the id is unknown) → last main pid found.
    cache: Mutex<HashMap<String, Located>>,
}

impl Default for Procfs {
    fn default() -> Self {
        Procfs::new("/proc")
    }
}

fn unavailable(reason: impl Into<String>) -> AttemptError {
    AttemptError::ModeUnavailable {
        mode: ExecMode::Procfs,
        reason: reason.into(),
    }
}

impl Procfs {
    pub fn new(proc: impl Into<PathBuf>) -> Self {
        Procfs {
            proc: proc.into(),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Finds the main process of the target container (`container_id` when known).
    pub fn locate(&self, container: &str, container_id: Option<&str>) -> Result<Located, String> {
        let key = container_id.unwrap_or(container).to_owned();
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .copied();
        if let Some(located) = cached {
            // Still the same process? (Its cgroup still names the id; for the heuristic, it is
            // still alive with a parent outside the namespace.)
            if let Ok(info) = read_info(&self.proc, located.pid) {
                let same = match (located.found_by, container_id) {
                    (FoundBy::ContainerId, Some(id)) => info.cgroup.contains(container_id_hex(id)),
                    _ => info.ppid == 0 && !info.kernel_thread,
                };
                if same {
                    return Ok(located);
                }
            }
        }
        let procs =
            scan(&self.proc).map_err(|e| format!("cannot list {}: {e}", self.proc.display()))?;
        let located = locate_in(&procs, std::process::id() as i32, container_id)?;
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, located);
        Ok(located)
    }

    /// Whether the mode can work for this container, and why (for `auto`'s decision).
    pub fn check(&self, container: &str, container_id: Option<&str>) -> Result<String, String> {
        let located = self.locate(container, container_id)?;
        let ids = read_ids(&self.proc, located.pid)
            .map_err(|e| format!("cannot read /proc/{}/status: {e}", located.pid))?;
        missing_caps(&ids, &own_caps()?)?;
        Ok(format!("target process {located}, uid {}", ids.uid))
    }

    /// One attempt of `action` in the target container's main process.
    pub async fn attempt(
        &self,
        action: &ExecAction,
        container: &str,
        container_id: Option<&str>,
        timeout: Duration,
    ) -> Result<Observation, AttemptError> {
        let located = self.locate(container, container_id).map_err(unavailable)?;
        attempt_in(&self.proc, located.pid, action, timeout).await
    }
}

fn missing_caps(ids: &ProcIds, ours: &CapSets) -> Result<(), String> {
    let has = |cap: u32| ours.effective & (1 << cap) != 0;
    if !has(CAP_SYS_CHROOT) {
        return Err(
            "podprobe lacks CAP_SYS_CHROOT (add it to the sidecar's securityContext.capabilities)"
                .into(),
        );
    }
    let same_ids = ids.uid == getuid().as_raw() && ids.gid == getgid().as_raw();
    let can_switch = has(CAP_SETUID) && has(CAP_SETGID);
    if !same_ids && !can_switch {
        return Err(format!(
            "the target runs as uid {} gid {}; switching to it needs CAP_SETUID and CAP_SETGID",
            ids.uid, ids.gid
        ));
    }
    Ok(())
}

/// Runs `action` chrooted into `/proc/<pid>/root` with the process' environment, working
/// directory and ids. Public for tests and benchmarks (the runner goes through
/// [`Procfs::attempt`], which also locates the process).
pub async fn attempt_in(
    proc: &Path,
    pid: i32,
    action: &ExecAction,
    timeout: Duration,
) -> Result<Observation, AttemptError> {
    let Some(program) = action.command.first() else {
        return Err(AttemptError::Spawn {
            command: action.command.clone(),
            source: io::Error::new(ErrorKind::InvalidInput, "empty command"),
        });
    };
    let gone = |e: io::Error| AttemptError::Other(format!("target process {pid} is gone: {e}"));
    // Everything below is read through this one descriptor of the process' directory: if the
    // process exits meanwhile, every read through it fails (ESRCH) instead of reaching a new
    // process that was given the same pid.
    let dir = open_dir(&proc.join(pid.to_string())).map_err(|e| {
        if vanished(&e) {
            gone(e)
        } else {
            unavailable(format!("cannot open /proc/{pid}: {e}"))
        }
    })?;
    let status = read_at(&dir, "status")
        .and_then(|raw| {
            let status = ProcStatus::parse(&String::from_utf8_lossy(&raw));
            Ok((status_ids(&status, pid)?, status))
        })
        .map_err(|e| {
            if vanished(&e) {
                gone(e)
            } else {
                unavailable(format!("cannot read /proc/{pid}/status: {e}"))
            }
        });
    let (ids, status) = status?;
    let ours = own_caps().map_err(unavailable)?;
    missing_caps(&ids, &ours).map_err(unavailable)?;
    let confine = confine(&status, &ours, pid).map_err(unavailable)?;
    let no_access = |what: &str, e: io::Error| {
        if vanished(&e) {
            return gone(e);
        }
        unavailable(format!(
            "cannot open /proc/{pid}/{what}: {e} (needs CAP_SYS_PTRACE, or the target's uid/gid, a dumpable target and every capability the target holds: a root sidecar that keeps the runtime's default capabilities has them for a default root target)"
        ))
    };
    let root =
        with_target_fsids(&ids, || open_dir_at(&dir, "root")).map_err(|e| no_access("root", e))?;
    let cwd = with_target_fsids(&ids, || open_dir_at(&dir, "cwd")).ok();
    let environ = with_target_fsids(&ids, || read_at(&dir, "environ"))
        .map_err(|e| no_access("environ", e))?;

    let switch = ids.uid != getuid().as_raw()
        || ids.gid != getgid().as_raw()
        || getgroups().map_or(true, |g| {
            let mut mine: Vec<u32> = g.iter().map(|g| g.as_raw()).collect();
            let mut theirs = ids.groups.clone();
            mine.sort_unstable();
            theirs.sort_unstable();
            mine != theirs
        });
    let mut command = Command::new(program);
    command
        .args(&action.command[1..])
        .env_clear()
        .envs(parse_environ(&environ));
    super::enter::on_exec(
        &mut command,
        Enter {
            root,
            cwd,
            ids: switch.then(|| Ids {
                uid: Uid::from_raw(ids.uid),
                gid: Gid::from_raw(ids.gid),
                groups: ids.groups.iter().map(|g| Gid::from_raw(*g)).collect(),
            }),
            confine,
        },
    );
    match super::run(command, &action.command, timeout).await {
        // EPERM from the pre-exec steps (chroot, setgroups, setuid): this mode cannot work
        // here (seccomp, user namespace limits). A missing or non-executable command is
        // ENOENT/EACCES and stays a normal errored attempt.
        Err(AttemptError::Spawn { source, .. })
            if source.raw_os_error() == Some(Errno::EPERM as i32) =>
        {
            Err(unavailable(format!(
                "entering pid {pid}'s root and ids was refused: {source}"
            )))
        }
        other => other,
    }
}

#[cfg(test)]
mod tests;
