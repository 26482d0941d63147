//! One measurement window: the CPU of the node, the control plane and the executor, the
//! attempts that reached the game containers, and the apiserver's writes by writer.

use std::collections::BTreeMap;
use std::time::Duration;

use testkit::real::{ControlPlane, Node};

use super::handler::Handler;
use super::on_node::usage::{self, cluster_markers};

/// Who made a write, as the apiserver's audit log names them.
fn writer(username: &str) -> &'static str {
    if username.ends_with(":kruise-daemon") || username.ends_with(":podprobe-sidecar") {
        "executor"
    } else if username.ends_with(":kruise-manager") {
        "kruise-manager"
    } else {
        "other"
    }
}

/// The writes the apiserver answered so far, by writer.
fn writes(cp: &ControlPlane) -> BTreeMap<&'static str, usize> {
    let mut by_writer = BTreeMap::new();
    for event in cp.audit().unwrap() {
        if matches!(
            event.verb.as_str(),
            "create" | "update" | "patch" | "delete"
        ) {
            *by_writer.entry(writer(&event.user.username)).or_default() += 1;
        }
    }
    by_writer
}

/// What one window cost, and what it did.
#[derive(Debug, Default, Clone)]
pub struct Window {
    /// CPU seconds of the node's and the control plane's processes.
    pub daemons: f64,
    /// CPU seconds of the executor: kruise-daemon, or the sidecars' containers.
    pub executor: f64,
    /// Attempts that reached the game containers.
    pub attempts: u64,
    pub writes: BTreeMap<&'static str, usize>,
}

/// What a window is measured on.
pub struct Subject<'a> {
    pub cp: &'a ControlPlane,
    pub node: &'a Node,
    pub daemon: Option<u32>,
    pub sidecars: Vec<String>,
    /// A host pid in each game container.
    pub games: Vec<u32>,
    pub handler: Option<Handler>,
}

impl Subject<'_> {
    fn executor_cpu(&self) -> f64 {
        self.daemon.map_or(0.0, usage::pid_cpu)
            + self
                .sidecars
                .iter()
                .map(|id| usage::container_cpu(self.node, id))
                .sum::<f64>()
    }

    fn attempts(&self) -> u64 {
        self.handler.map_or(0, |h| {
            self.games.iter().map(|&pid| h.attempts_in(pid)).sum()
        })
    }

    /// kruise-daemon's RSS, or the sum of the sidecars' cgroup RSS, in MiB.
    pub fn memory_mib(&self) -> f64 {
        let bytes = match self.daemon {
            Some(pid) => usage::pid_rss(pid),
            None => self
                .sidecars
                .iter()
                .map(|id| usage::container_rss(self.node, id))
                .sum(),
        };
        bytes as f64 / (1024.0 * 1024.0)
    }

    pub async fn measure(&self, seconds: u64) -> Window {
        let markers = cluster_markers(self.node, self.cp);
        let (d0, e0, a0, w0) = (
            usage::processes_cpu(&markers),
            self.executor_cpu(),
            self.attempts(),
            writes(self.cp),
        );
        tokio::time::sleep(Duration::from_secs(seconds)).await; // the measurement window itself
        let mut written = writes(self.cp);
        for (who, n) in w0 {
            *written.entry(who).or_default() -= n;
        }
        Window {
            daemons: usage::processes_cpu(&markers) - d0,
            executor: self.executor_cpu() - e0,
            attempts: self.attempts() - a0,
            writes: written,
        }
    }
}
