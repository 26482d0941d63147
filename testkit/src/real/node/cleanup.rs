//! Leaving nothing behind: a node's containers outlive its daemons unless removed (containerd's
//! shims are daemons of their own), and the kubelet's volumes and runc's cgroups stay until
//! someone unmounts and removes them.

use std::path::Path;
use std::process::Command;

use super::super::Error;

const CGROUP_V1: &str = "/sys/fs/cgroup";

/// What had to be removed by force after the node's daemons stopped.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Leftovers {
    /// containerd tasks still present (killed and deleted).
    pub tasks: Vec<String>,
    /// Shim processes of the node's containerd still running (killed).
    pub shims: Vec<u32>,
    /// Mount points under the node's directory (unmounted).
    pub mounts: Vec<String>,
    /// Cgroups under the node's cgroup root that still held processes.
    pub cgroups: Vec<String>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
            && self.shims.is_empty()
            && self.mounts.is_empty()
            && self.cgroups.is_empty()
    }
}

/// The v1 hierarchies this machine mounts (`cpu`, `memory`, ..., `systemd`).
fn hierarchies() -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(CGROUP_V1) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists() && !p.ends_with("unified"))
        .collect()
}

/// Creates `root` in every hierarchy (the kubelet refuses a cgroup root that does not
/// exist); a new cpuset starts without CPUs or memory nodes, so it gets its parent's.
pub fn create_cgroup_root(root: &str) -> Result<(), Error> {
    for hierarchy in hierarchies() {
        let dir = hierarchy.join(root.trim_start_matches('/'));
        std::fs::create_dir_all(&dir)?;
        if hierarchy.ends_with("cpuset") {
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let parent = std::fs::read_to_string(hierarchy.join(file))?;
                std::fs::write(dir.join(file), parent.trim())?;
            }
        }
    }
    Ok(())
}

/// Kills and deletes every task and container of the CRI namespace.
pub fn remove_tasks(ctr: impl Fn() -> Command) -> Vec<String> {
    let list = |what: &str| -> Vec<String> {
        ctr()
            .args([what, "ls", "-q"])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let tasks = list("tasks");
    for task in &tasks {
        // `rm -f` kills the task first.
        let _ = ctr().args(["tasks", "rm", "-f", task]).output();
    }
    for container in list("containers") {
        let _ = ctr().args(["containers", "rm", &container]).output();
    }
    tasks
}

/// Kills the `containerd-shim-runc-v2` processes started for `socket`'s containerd.
pub fn kill_shims(socket: &Path) -> Vec<u32> {
    let needle = socket.display().to_string();
    let mut killed = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return killed;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains("containerd-shim") && cmdline.contains(&needle) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            killed.push(pid);
        }
    }
    killed
}

/// Unmounts everything mounted under `dir` (deepest first); returns the mount points other
/// than `expected` (the kubelet bind-mounts its root directory onto itself, shared, and
/// leaves that as it is on exit).
pub fn unmount_under(dir: &Path, expected: &[&Path]) -> Vec<String> {
    let mut points = mounts_under(dir);
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in &points {
        let _ = Command::new("umount").args(["-l", point]).status();
    }
    points.retain(|p| !expected.iter().any(|e| Path::new(p) == *e));
    points
}

/// The mount points at or under `dir`.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| point.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}

/// Removes the node's cgroups in every hierarchy, deepest first; returns those that still
/// held processes (their processes are killed first).
pub fn remove_cgroups(root: &str) -> Vec<String> {
    let mut busy = Vec::new();
    for hierarchy in hierarchies() {
        let top = hierarchy.join(root.trim_start_matches('/'));
        let mut dirs = Vec::new();
        collect_dirs(&top, &mut dirs);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in dirs {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            if !procs.trim().is_empty() {
                busy.push(dir.display().to_string());
                for pid in procs.lines() {
                    let _ = Command::new("kill").args(["-KILL", pid]).status();
                }
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }
    busy
}

fn collect_dirs(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&entry.path(), out);
            }
        }
    }
    out.push(dir.to_path_buf());
}
