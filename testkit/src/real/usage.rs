//! What a process costs, read from /proc: CPU time (utime + stime) and resident memory; and,
//! for many small processes, their CPU to the nanosecond from a cgroup ([`CpuGroup`]). For
//! the benchmarks that put a figure on a daemon, a sidecar or a fleet of them.

/// Clock ticks per second of /proc's utime and stime (USER_HZ: 100 on Linux).
pub const TICKS_PER_SECOND: f64 = 100.0;

/// utime + stime of process `pid`, in ticks; 0 when it is gone.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces) start after ") ".
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest)
        .unwrap_or("")
        .split(' ')
        .collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// VmRSS of process `pid`, in KiB; 0 when it is gone.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One established TCP connection of a process, as the kernel lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Connection {
    pub local: std::net::SocketAddr,
    pub remote: std::net::SocketAddr,
}

/// The kernel's established TCP connections (IPv4 and IPv6) at one moment, to tell which
/// process holds which: read once for several processes, they are counted at the same moment.
#[derive(Debug)]
pub struct ConnectionTable(Vec<procfs::net::TcpNetEntry>);

impl ConnectionTable {
    /// This process' network namespace's tables, which are the other processes' too in the
    /// tests and benchmarks.
    pub fn read() -> ConnectionTable {
        let mut table = procfs::net::tcp().unwrap_or_default();
        table.extend(procfs::net::tcp6().unwrap_or_default());
        table.retain(|e| e.state == procfs::net::TcpState::Established);
        ConnectionTable::once_each(table)
    }

    /// Each connection once. The kernel hands out its text table a page at a time and resumes
    /// by position, so while other processes open and close connections a line can come twice
    /// in one reading (a CI run saw a test's one connection listed twice). A connection is one
    /// line per address pair, so dropping the repeats loses nothing.
    fn once_each(mut table: Vec<procfs::net::TcpNetEntry>) -> ConnectionTable {
        let mut seen = std::collections::HashSet::new();
        table.retain(|e| seen.insert((e.local_address, e.remote_address)));
        ConnectionTable(table)
    }

    /// The connections process `pid` holds a descriptor of; empty when it is gone.
    pub fn held_by(&self, pid: u32) -> Vec<Connection> {
        use procfs::process::{FDTarget, Process};
        let Ok(fds) = Process::new(pid as i32).and_then(|p| p.fd()) else {
            return Vec::new();
        };
        let inodes: std::collections::HashSet<u64> = fds
            .filter_map(|fd| match fd.ok()?.target {
                FDTarget::Socket(inode) => Some(inode),
                _ => None,
            })
            .collect();
        self.0
            .iter()
            .filter(|e| inodes.contains(&e.inode))
            .map(|e| Connection {
                local: e.local_address,
                remote: e.remote_address,
            })
            .collect()
    }
}

/// The established TCP connections process `pid` holds now ([`ConnectionTable::held_by`]).
pub fn connections(pid: u32) -> Vec<Connection> {
    ConnectionTable::read().held_by(pid)
}

/// The cores `pids` used together between two readings of [`cpu_ticks`] `seconds` apart.
pub fn cores(before: u64, after: u64, seconds: f64) -> f64 {
    after.saturating_sub(before) as f64 / TICKS_PER_SECOND / seconds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let pid = std::process::id();
        let start = cpu_ticks(pid);
        // Spin until the kernel has charged at least one tick to this process.
        let mut spins = 0u64;
        while cpu_ticks(pid) == start {
            spins = std::hint::black_box(spins + 1);
        }
        assert!(cpu_ticks(pid) > start);
        assert!(rss_kib(pid) > 0);
        assert_eq!(cpu_ticks(u32::MAX), 0, "no such process");
        assert!((cores(0, 200, 2.0) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_connection_is_listed_for_the_process_that_holds_it_until_closed() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(server).unwrap();
        let ours = |c: &Connection| c.remote == server;
        let held = connections(std::process::id());
        assert_eq!(held.iter().filter(|c| ours(c)).count(), 1, "{held:?}");
        let held = held.into_iter().find(|c| ours(c)).unwrap();
        assert_eq!(held.local, client.local_addr().unwrap());
        drop(client);
        assert!(!connections(std::process::id()).iter().any(ours));
        assert!(connections(u32::MAX).is_empty(), "no such process");
    }

    /// A reading that listed a line twice, as the kernel's paged table can while connections
    /// come and go (here: every line of a real reading twice), lists each connection once.
    #[test]
    fn a_line_listed_twice_is_one_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let mut lines = procfs::net::tcp().unwrap();
        lines.retain(|e| e.state == procfs::net::TcpState::Established);
        lines.extend(lines.clone());
        let held = ConnectionTable::once_each(lines).held_by(std::process::id());
        let ours: Vec<_> = held
            .iter()
            .filter(|c| c.local == client.local_addr().unwrap())
            .collect();
        assert_eq!(ours.len(), 1, "{held:?}");
    }
}

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
