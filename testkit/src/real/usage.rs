//! What a process costs, read from /proc: CPU time (utime + stime), resident memory and its
//! TCP connections. For the benchmarks that put a figure on a daemon, a sidecar or a fleet of
//! them; for many small processes, whose ticks round their CPU away, see
//! [`super::cpu_group`].

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
