//! kruise-daemon against podprobe on one real node (a program, not a test): what running
//! PodProbeMarker probes costs a node per attempt, per-node daemon against per-pod sidecar.
//!
//! For each side, on a fresh control plane and node:
//! - **kruise-daemon**: an ordinary node; kruise-manager, kruise-daemon (CRI `ExecSync`, the
//!   kubelet's tcp and http probers, NodePodProbe);
//! - **podprobe**: the node labelled `type=virtual-kubelet`; kruise-manager (serverless path)
//!   and the chart in companion mode injecting the sidecar for procfs exec.
//!
//! PODS game pods run first with no probes (the baseline window), then with one PodProbeMarker
//! of three probes: exec `test -f /var/run/game/players`, tcp 7777, http `/healthz`, each at
//! period 1 s. Then the measured window of SECONDS. Attempts are PODS × 3 × SECONDS.
//!
//! Per attempt, above the baseline, it prints the CPU of everything involved:
//! - the node's and the control plane's processes, with their reaped children (`/proc`):
//!   containerd, the shims and the runc they reap for `ExecSync`, the kubelet, the apiserver,
//!   etcd and kruise-manager;
//! - kruise-daemon itself;
//! - the sidecars' containers (`cpuacct.usage`; procfs runs the command there).
//!
//! It also prints memory (kruise-daemon's RSS against the sum of the sidecars' cgroup RSS) and
//! the apiserver's status writes per minute (audit log: `pods/status` and
//! `nodepodprobes/status` patches and updates). Run it on a quiet machine; the figures go to
//! `docs/perf/kruise_daemon.csv` (one row per side and pod count, appended).
//!
//! `cargo run --release -p podprobe-manager --example bench_kruise_daemon [-- PODS SECONDS]`

#[path = "../tests/cluster/mod.rs"]
mod cluster;
#[path = "../tests/installed/mod.rs"]
mod installed;
#[path = "../tests/on_node/mod.rs"]
mod on_node;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use podprobe_manager::webhook::Mode;
use serde_json::json;
use testkit::real::{ControlPlane, Node, NodeNetwork, NodeOptions};

use installed::NS;
use on_node::{SIDECAR, container_id};

const TYPES: [&str; 3] = [
    "game.kruise.io/players",
    "game.kruise.io/port",
    "game.kruise.io/healthy",
];
/// USER_HZ on Linux.
const HZ: f64 = 100.0;

fn ppm() -> podprobe_manager::crd::PodProbeMarker {
    support::ppm(&json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "bench", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "game"}}, "probes": [
            {"name": "players", "containerName": "game", "podConditionType": TYPES[0],
             "probe": {"exec": {"command": ["sh", "-c", "test -f /var/run/game/players"]},
                       "periodSeconds": 1}},
            {"name": "port", "containerName": "game", "podConditionType": TYPES[1],
             "probe": {"tcpSocket": {"port": 7777}, "periodSeconds": 1}},
            {"name": "healthy", "containerName": "game", "podConditionType": TYPES[2],
             "probe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
                       "periodSeconds": 1}}
        ]}
    }))
}

/// `/proc/<pid>/stat`'s utime, stime, cutime and cstime, in CPU seconds.
fn pid_cpu(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
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
fn processes_cpu(markers: &[String]) -> f64 {
    let mut total = 0.0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline);
        if !markers.iter().any(|m| cmdline.contains(m.as_str())) {
            continue;
        }
        if let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()) {
            total += pid_cpu(pid);
        }
    }
    total
}

/// CPU seconds charged to a container's cgroup (`cpuacct.usage`).
fn container_cpu(node: &Node, id: &str) -> f64 {
    let memory = on_node::memory_cgroup(node, id);
    let relative = memory.strip_prefix("/sys/fs/cgroup/memory").unwrap();
    let usage = std::path::Path::new("/sys/fs/cgroup/cpuacct")
        .join(relative)
        .join("cpuacct.usage");
    let ns: u64 = std::fs::read_to_string(usage)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    ns as f64 / 1e9
}

/// Status writes the apiserver answered so far.
fn status_writes(cp: &ControlPlane) -> usize {
    cp.audit()
        .unwrap()
        .iter()
        .filter(|e| matches!(e.verb.as_str(), "patch" | "update"))
        .filter(|e| {
            e.object_ref.as_ref().is_some_and(|r| {
                r.subresource == "status" && matches!(r.resource.as_str(), "pods" | "nodepodprobes")
            })
        })
        .count()
}

/// CPU seconds spent in a window, and the status writes answered.
#[derive(Debug, Default, Clone, Copy)]
struct Window {
    /// The node's and the control plane's processes.
    daemons: f64,
    /// The executor: kruise-daemon, or the sidecars' containers.
    executor: f64,
    writes: usize,
}

/// The executor's CPU seconds so far: kruise-daemon's process, or every sidecar container.
fn executor_cpu(node: &Node, daemon: Option<u32>, sidecars: &[String]) -> f64 {
    daemon.map_or(0.0, pid_cpu)
        + sidecars
            .iter()
            .map(|id| container_cpu(node, id))
            .sum::<f64>()
}

async fn measure(
    cp: &ControlPlane,
    node: &Node,
    daemon: Option<u32>,
    sidecars: &[String],
    seconds: u64,
) -> Window {
    let markers = [
        node.dir().display().to_string(),
        cp.dir().display().to_string(),
    ];
    let (d0, e0, w0) = (
        processes_cpu(&markers),
        executor_cpu(node, daemon, sidecars),
        status_writes(cp),
    );
    tokio::time::sleep(Duration::from_secs(seconds)).await; // the measurement window itself
    Window {
        daemons: processes_cpu(&markers) - d0,
        executor: executor_cpu(node, daemon, sidecars) - e0,
        writes: status_writes(cp) - w0,
    }
}

/// Creates `count` game pods and waits until each runs (with its sidecar when `sidecar`) and,
/// when `probed`, shows every probe's condition. Returns the pods by name.
async fn run_pods(
    pods: &Api<Pod>,
    node: &Node,
    count: usize,
    sidecar: bool,
    probed: bool,
) -> BTreeMap<String, Pod> {
    for i in 0..count {
        let pod = on_node::game_pod(&format!("game-{i}"), node.name());
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let limit = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        let list = pods
            .list(&ListParams::default().labels("app=game"))
            .await
            .unwrap();
        let ready: BTreeMap<String, Pod> = list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| container_id(p, "game").is_some())
            .filter(|p| !sidecar || container_id(p, SIDECAR).is_some())
            .filter(|p| {
                !probed
                    || TYPES
                        .iter()
                        .all(|t| support::condition_status(p, t).is_some())
            })
            .map(|p| (p.metadata.name.clone().unwrap(), p))
            .collect();
        if ready.len() == count {
            return ready;
        }
        assert!(
            tokio::time::Instant::now() < limit,
            "{} of {count} pods ready after 300 s",
            ready.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn delete_pods(pods: &Api<Pod>) {
    pods.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default().labels("app=game"),
    )
    .await
    .unwrap();
    while !pods
        .list(&ListParams::default().labels("app=game"))
        .await
        .unwrap()
        .items
        .is_empty()
    {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One side's figures.
struct Row {
    side: &'static str,
    pods: usize,
    seconds: u64,
    baseline: Window,
    probing: Window,
    /// kruise-daemon's RSS, or the sum of the sidecars' cgroup RSS (MiB).
    memory_mib: f64,
}

impl Row {
    fn attempts(&self) -> f64 {
        (self.pods * TYPES.len()) as f64 * self.seconds as f64
    }
    fn ms(&self, s: f64) -> f64 {
        s * 1000.0 / self.attempts()
    }
    fn total_ms(&self) -> f64 {
        self.ms(self.probing.daemons + self.probing.executor
            - self.baseline.daemons
            - self.baseline.executor)
    }
    fn writes_per_minute(&self) -> f64 {
        self.probing.writes as f64 * 60.0 / self.seconds as f64
    }
}

/// The pods with no probes, then with the PodProbeMarker; `recreate`: the pods are created
/// again after it (the serverless annotation is written at creation).
async fn bench(
    cp: &ControlPlane,
    node: &Node,
    daemon: Option<u32>,
    side: &'static str,
    count: usize,
    seconds: u64,
) -> Row {
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    run_pods(&pods, node, count, false, false).await;
    let baseline = measure(cp, node, daemon, &[], seconds).await;
    let ppms: Api<podprobe_manager::crd::PodProbeMarker> = Api::namespaced(cp.client(), NS);
    ppms.create(&PostParams::default(), &ppm()).await.unwrap();
    let sidecar = daemon.is_none();
    let running = if sidecar {
        delete_pods(&pods).await;
        run_pods(&pods, node, count, true, true).await
    } else {
        let limit = tokio::time::Instant::now() + Duration::from_secs(300);
        loop {
            let list = pods
                .list(&ListParams::default().labels("app=game"))
                .await
                .unwrap();
            if list.items.iter().all(|p| {
                TYPES
                    .iter()
                    .all(|t| support::condition_status(p, t).is_some())
            }) {
                break list
                    .items
                    .into_iter()
                    .map(|p| (p.metadata.name.clone().unwrap(), p))
                    .collect();
            }
            assert!(
                tokio::time::Instant::now() < limit,
                "conditions after 300 s"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let sidecars: Vec<String> = running
        .values()
        .filter_map(|p| container_id(p, SIDECAR))
        .collect();
    let probing = measure(cp, node, daemon, &sidecars, seconds).await;
    let memory_mib = match daemon {
        Some(pid) => {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            let kib: f64 = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap();
            kib / 1024.0
        }
        None => {
            sidecars
                .iter()
                .map(|id| {
                    on_node::memory_stat(&on_node::memory_cgroup(node, id), "total_rss") as f64
                })
                .sum::<f64>()
                / (1024.0 * 1024.0)
        }
    };
    delete_pods(&pods).await;
    Row {
        side,
        pods: count,
        seconds,
        baseline,
        probing,
        memory_mib,
    }
}

async fn kruise_daemon_side(count: usize, seconds: u64) -> Row {
    let network = NodeNetwork::create().unwrap();
    let mut cp = ControlPlane::start_on(network.host_ip()).await.unwrap();
    let node = Node::start(&mut cp, network, NodeOptions::default())
        .await
        .unwrap();
    cp.start_kruise_manager().await.unwrap();
    installed::prepare_test_namespace(&cp).await;
    cp.create_service_account(NS, "podprobe-sidecar")
        .await
        .unwrap();
    let daemon = node.start_kruise_daemon(&cp).await.unwrap();
    let row = bench(
        &cp,
        &node,
        Some(daemon.pid()),
        "kruise-daemon",
        count,
        seconds,
    )
    .await;
    drop(daemon);
    let leftovers = node.stop(&cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    row
}

async fn podprobe_side(count: usize, seconds: u64) -> Row {
    let options = NodeOptions {
        labels: [("type".to_owned(), "virtual-kubelet".to_owned())].into(),
        ..NodeOptions::default()
    };
    let (running, node) = on_node::node_and_chart_in(options, Mode::Companion).await;
    let row = bench(&running.cp, &node, None, "podprobe", count, seconds).await;
    let leftovers = node.stop(&running.cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    row
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let count = support::bench_arg(1, 10) as usize;
    let seconds = support::bench_arg(2, 30);
    let rows = [
        kruise_daemon_side(count, seconds).await,
        podprobe_side(count, seconds).await,
    ];
    println!(
        "{count} pods × {} probes (exec, tcp, http) at period 1 s, {seconds} s windows",
        TYPES.len()
    );
    println!(
        "{:<14} {:>10} {:>14} {:>14} {:>14} {:>12} {:>12}",
        "executor",
        "attempts",
        "total ms/att",
        "executor ms",
        "node+cp ms",
        "memory MiB",
        "writes/min"
    );
    let mut csv = String::new();
    for r in &rows {
        println!(
            "{:<14} {:>10} {:>14.3} {:>14.3} {:>14.3} {:>12.1} {:>12.1}",
            r.side,
            r.attempts(),
            r.total_ms(),
            r.ms(r.probing.executor - r.baseline.executor),
            r.ms(r.probing.daemons - r.baseline.daemons),
            r.memory_mib,
            r.writes_per_minute()
        );
        csv.push_str(&format!(
            "{},{},{},{:.4},{:.4},{:.4},{:.2},{:.1}\n",
            r.side,
            r.pods,
            r.seconds,
            r.total_ms(),
            r.ms(r.probing.executor - r.baseline.executor),
            r.ms(r.probing.daemons - r.baseline.daemons),
            r.memory_mib,
            r.writes_per_minute()
        ));
    }
    println!(
        "podprobe / kruise-daemon, CPU per attempt: {:.2}×",
        rows[1].total_ms() / rows[0].total_ms()
    );
    let out =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/perf/kruise_daemon.csv");
    let header = "executor,pods,seconds,cpu_ms_per_attempt,executor_ms,node_cp_ms,memory_mib,status_writes_per_min\n";
    let existing = std::fs::read_to_string(&out).unwrap_or_else(|_| header.to_owned());
    std::fs::write(&out, existing + &csv).unwrap();
    println!("appended to {}", out.display());
}
