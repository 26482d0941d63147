//! What a process costs, read from /proc: CPU time (utime + stime) and resident memory, for
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
}
