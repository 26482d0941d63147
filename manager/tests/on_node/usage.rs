//! What the node benchmarks read off the host: CPU seconds of processes and containers, memory,
//! and the counters that tell how many probe attempts reached a game container.

use std::path::{Path, PathBuf};

use testkit::real::{ControlPlane, Node};

/// USER_HZ on Linux.
const HZ: f64 = 100.0;

/// `/proc/<pid>/stat`'s utime, stime, cutime and cstime (own and reaped children's), in CPU
/// seconds; 0 for a process that has gone.
pub fn pid_cpu(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // After the parenthesised command: utime stime cutime cstime are fields 14-17.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    fields[11..15]
        .iter()
        .map(|f| f.parse::<u64>().unwrap_or(0))
        .sum::<u64>() as f64
        / HZ
}

/// CPU seconds of the processes whose command line names one of `markers` (the node's and
/// the control plane's directories), children included.
pub fn processes_cpu(markers: &[String]) -> f64 {
    processes_cpu_by_name(markers).values().sum()
}

/// [`processes_cpu`] by process name (`comm`: kubelet, containerd, containerd-shim, ...).
pub fn processes_cpu_by_name(markers: &[String]) -> std::collections::BTreeMap<String, f64> {
    let mut by_name = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline);
        if !markers.iter().any(|m| cmdline.contains(m.as_str())) {
            continue;
        }
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        *by_name.entry(name.trim().to_owned()).or_insert(0.0) += pid_cpu(pid);
    }
    by_name
}

/// The node's and the control plane's directories, which every one of their processes'
/// command lines names: what [`processes_cpu`] selects by.
pub fn cluster_markers(node: &Node, cp: &ControlPlane) -> [String; 2] {
    [
        node.dir().display().to_string(),
        cp.dir().display().to_string(),
    ]
}

/// Busy CPU seconds of the whole machine (`/proc/stat`, first line: all but idle and iowait).
pub fn machine_busy() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap())
        .collect();
    (fields.iter().sum::<u64>() - fields[3] - fields[4]) as f64 / HZ
}

/// A container's cgroup directory under the v1 hierarchy `controller` (`memory`, `cpuacct`).
fn container_cgroup(node: &Node, controller: &str, id: &str) -> PathBuf {
    let memory = super::memory_cgroup(node, id);
    let relative = memory.strip_prefix("/sys/fs/cgroup/memory").unwrap();
    Path::new("/sys/fs/cgroup").join(controller).join(relative)
}

/// CPU seconds charged to a container's cgroup (`cpuacct.usage`).
pub fn container_cpu(node: &Node, id: &str) -> f64 {
    let usage = container_cgroup(node, "cpuacct", id).join("cpuacct.usage");
    let ns: u64 = std::fs::read_to_string(&usage)
        .unwrap_or_else(|e| panic!("{}: {e}", usage.display()))
        .trim()
        .parse()
        .unwrap();
    ns as f64 / 1e9
}

/// A container's resident memory (its cgroup's `total_rss`), in bytes.
pub fn container_rss(node: &Node, id: &str) -> u64 {
    super::memory_stat(&super::memory_cgroup(node, id), "total_rss")
}

/// A process's resident memory (`VmRSS`), in bytes.
pub fn pid_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"));
    kib * 1024
}

/// A host pid of one of a container's processes (its cgroup's first).
pub fn container_pid(node: &Node, id: &str) -> u32 {
    let procs = super::memory_cgroup(node, id).join("cgroup.procs");
    std::fs::read_to_string(&procs)
        .unwrap()
        .lines()
        .next()
        .and_then(|l| l.parse().ok())
        .unwrap_or_else(|| panic!("no process in {}", procs.display()))
}

/// TCP connections accepted so far in the network namespace of process `pid` (`Tcp:
/// PassiveOpens` of `/proc/<pid>/net/snmp`): one per tcpSocket attempt, and one per httpGet
/// attempt, as both executors' HTTP probers close each connection.
pub fn passive_opens(pid: u32) -> u64 {
    let snmp = std::fs::read_to_string(format!("/proc/{pid}/net/snmp")).unwrap();
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next().unwrap(), tcp.next().unwrap());
    let column = names
        .split_whitespace()
        .position(|n| n == "PassiveOpens")
        .unwrap();
    values
        .split_whitespace()
        .nth(column)
        .unwrap()
        .parse()
        .unwrap()
}

/// The size in bytes of a file as process `pid` sees it (`/proc/<pid>/root`); 0 when absent.
pub fn file_len_in(pid: u32, path: &str) -> u64 {
    std::fs::metadata(format!("/proc/{pid}/root{path}")).map_or(0, |m| m.len())
}

/// What the exec agent takes in a game container: its processes there (the agent wrapping
/// the command and its probe server, or the probe server beside the entrypoint), their
/// anonymous memory (`RssAnon`: what they charge to the container's memory cgroup beyond the
/// binary's file pages) and the size of the binary they run (the copy on the pod's volume).
#[derive(Debug, Clone, Copy, Default)]
pub struct AgentCost {
    pub processes: u64,
    pub anon_bytes: u64,
    pub file_bytes: u64,
}

/// [`AgentCost`] of the container `id`: its processes that run `binary` (the agent's path as
/// the container sees it).
pub fn agent_cost(node: &Node, id: &str, binary: &str) -> AgentCost {
    let procs = super::memory_cgroup(node, id).join("cgroup.procs");
    let procs =
        std::fs::read_to_string(&procs).unwrap_or_else(|e| panic!("{}: {e}", procs.display()));
    let mut cost = AgentCost::default();
    for pid in procs.lines() {
        let exe = PathBuf::from(format!("/proc/{pid}/exe"));
        // A process may end meanwhile (a probe's command): it is not the agent then.
        if std::fs::read_link(&exe).ok().as_deref() != Some(Path::new(binary)) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no RssAnon in /proc/{pid}/status"));
        cost.processes += 1;
        cost.anon_bytes += kib * 1024;
        cost.file_bytes = std::fs::metadata(&exe).map_or(0, |m| m.len());
    }
    cost
}
