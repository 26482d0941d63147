//! The CPU of many small processes to the nanosecond, from a cgroup made for them (one exec
//! agent per pod and the commands it runs), where `/proc`'s per-process ticks
//! ([`super::usage`]) round their few milliseconds away.

/// A cgroup that counts, to the nanosecond, the CPU of the processes put in it and of every
/// process they start: for many small processes (one exec agent per pod and the commands it
/// runs) whose `/proc` ticks (10 ms each, counted per process) round their few milliseconds
/// away. The cpuacct controller's hierarchy (cgroup v1) or the unified one (v2). Removed when
/// dropped, with whatever still runs in it killed.
#[derive(Debug)]
pub struct CpuGroup {
    dir: std::path::PathBuf,
    unified: bool,
}

impl CpuGroup {
    /// Where groups are made, and whether it is the unified hierarchy. On cgroup v1 the
    /// cpuacct hierarchy: where it is mounted with the cpu controller (`cpu,cpuacct`) a group
    /// is also a scheduling group, with the default shares.
    fn parent() -> (std::path::PathBuf, bool) {
        let root = std::path::Path::new("/sys/fs/cgroup");
        if root.join("cgroup.controllers").exists() {
            (root.to_path_buf(), true)
        } else {
            (root.join("cpuacct"), false)
        }
    }

    /// Creates the group `name` (unique to the caller: e.g. with its pid).
    pub fn create(name: &str) -> std::io::Result<CpuGroup> {
        let (parent, unified) = CpuGroup::parent();
        let dir = parent.join(name);
        std::fs::create_dir(&dir).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot create the cgroup {}: {e}", dir.display()),
            )
        })?;
        Ok(CpuGroup { dir, unified })
    }

    /// Removes the empty groups whose name starts with `prefix`: those a killed run left (a
    /// group with processes cannot be removed, so a running one stays).
    pub fn remove_stale(prefix: &str) {
        let (parent, _) = CpuGroup::parent();
        let Ok(entries) = std::fs::read_dir(&parent) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(prefix) {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }

    /// Moves process `pid` into the group; what it starts from then on is counted too.
    pub fn add(&self, pid: u32) -> std::io::Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
    }

    /// CPU time of the group's processes, past and present, in nanoseconds.
    pub fn usage_ns(&self) -> u64 {
        if self.unified {
            let stat = std::fs::read_to_string(self.dir.join("cpu.stat")).unwrap_or_default();
            stat.lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map_or(0, |us| us * 1000)
        } else {
            std::fs::read_to_string(self.dir.join("cpuacct.usage"))
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        }
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        // A cgroup with processes cannot be removed: kill them, and wait (bounded) until the
        // kernel has taken them out.
        let procs = self.dir.join("cgroup.procs");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let left = std::fs::read_to_string(&procs).unwrap_or_default();
            if left.trim().is_empty() || std::time::Instant::now() > deadline {
                break;
            }
            for pid in left.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}
