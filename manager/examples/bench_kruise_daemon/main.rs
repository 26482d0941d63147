//! kruise-daemon against podprobe on one real node (a program, not a test): what running
//! PodProbeMarker probes costs a node per attempt, per handler, per-node daemon against
//! per-pod sidecar.
//!
//! For each side, on a fresh control plane and node:
//! - **kruise-daemon**: an ordinary node; kruise-manager, kruise-daemon (CRI `ExecSync`, the
//!   kubelet's tcp and http probers, NodePodProbe);
//! - **podprobe**: the node labelled `type=virtual-kubelet`; kruise-manager (serverless path)
//!   and the chart in companion mode injecting the sidecar for procfs exec.
//!
//! PODS game pods run first with no probes (the baseline window). Then, one handler at a
//! time, a PodProbeMarker with one probe at period 1 s: exec `echo >> /var/run/game/attempts;
//! test -f /var/run/game/players`, tcp 7777, http `/healthz` (podprobe's pods are created
//! again for each, as the serverless annotation is written at creation), and a window of
//! SECONDS for each.
//!
//! **Attempts are counted where they land**, not assumed: the bytes the exec command appended
//! in each game container, and the TCP connections each game pod's network namespace
//! accepted (`PassiveOpens`; both executors close each HTTP connection). An executor that
//! falls behind shows as fewer attempts than PODS × SECONDS ("kept up").
//!
//! Per counted attempt, above the baseline, it prints the CPU of everything involved:
//! - the node's and the control plane's processes, with their reaped children (`/proc`):
//!   containerd, the shims and the runc they reap for `ExecSync`, the kubelet, the apiserver,
//!   etcd and kruise-manager;
//! - kruise-daemon itself;
//! - the sidecars' containers (`cpuacct.usage`; procfs runs the command there).
//!
//! It also prints memory (kruise-daemon's RSS against the sum of the sidecars' cgroup RSS) and
//! the apiserver's writes per minute above the baseline, by writer (audit log): the executor
//! (kruise-daemon's NodePodProbe status, or the sidecars' pod status), kruise-manager, and the
//! rest (the kubelet, leases). Run it on a quiet machine; the figures go to
//! `docs/perf/kruise_daemon.csv` (one row per side, handler and pod count, appended).
//!
//! `cargo run --release -p podprobe-manager --example bench_kruise_daemon [-- PODS SECONDS]`

#[path = "../../tests/cluster/mod.rs"]
mod cluster;
#[path = "../../tests/installed/mod.rs"]
mod installed;
#[path = "../../tests/on_node/mod.rs"]
mod on_node;
#[path = "../../tests/support/mod.rs"]
mod support;

mod handler;
mod window;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams,
};
use podprobe_manager::webhook::Mode;
use testkit::real::{ControlPlane, Node, NodeNetwork, NodeOptions};

use handler::Handler;
use installed::NS;
use on_node::usage;
use on_node::{SIDECAR, container_id};
use window::{Subject, Window};

async fn create_pods(pods: &Api<Pod>, node: &Node, count: usize) {
    for i in 0..count {
        let pod = on_node::game_pod(&format!("game-{i}"), node.name());
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
}

/// Waits until `count` game pods run (with their sidecar when `sidecar`) and, with `handler`,
/// show its probe's condition. Returns the pods by name.
async fn wait_pods(
    pods: &Api<Pod>,
    count: usize,
    sidecar: bool,
    handler: Option<Handler>,
) -> BTreeMap<String, Pod> {
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
                handler.is_none_or(|h| support::condition_status(p, &h.condition_type()).is_some())
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

/// Deletes the PodProbeMarker and waits until it is gone and, on an ordinary node, until the
/// node's NodePodProbe holds no probe: kruise-daemon then stops the handler's workers, which
/// would otherwise be counted in the next handler's window.
async fn delete_ppm(cp: &ControlPlane, node: &Node) {
    let ppms: Api<podprobe_manager::crd::PodProbeMarker> = Api::namespaced(cp.client(), NS);
    ppms.delete("bench", &DeleteParams::default())
        .await
        .unwrap();
    let gvk = GroupVersionKind::gvk("apps.kruise.io", "v1alpha1", "NodePodProbe");
    let npps: Api<DynamicObject> = Api::all_with(cp.client(), &ApiResource::from_gvk(&gvk));
    let limit = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let npp = npps.get_opt(node.name()).await.unwrap();
        let probes = npp
            .as_ref()
            .and_then(|n| n.data["spec"]["podProbes"].as_array())
            .map_or(0, |pods| {
                pods.iter()
                    .filter_map(|p| p["probes"].as_array())
                    .map(Vec::len)
                    .sum()
            });
        if probes == 0 && ppms.get_opt("bench").await.unwrap().is_none() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < limit,
            "PodProbeMarker or NodePodProbe probes still there after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One side's figures for one handler.
struct Row {
    side: &'static str,
    handler: Handler,
    pods: usize,
    seconds: u64,
    baseline: Window,
    probing: Window,
    memory_mib: f64,
}

impl Row {
    fn nominal_attempts(&self) -> u64 {
        self.pods as u64 * self.seconds
    }
    fn ms(&self, s: f64) -> f64 {
        s * 1000.0 / self.probing.attempts as f64
    }
    fn executor_ms(&self) -> f64 {
        self.ms(self.probing.executor - self.baseline.executor)
    }
    fn node_cp_ms(&self) -> f64 {
        self.ms(self.probing.daemons - self.baseline.daemons)
    }
    fn total_ms(&self) -> f64 {
        self.executor_ms() + self.node_cp_ms()
    }
    /// Writes per minute by `who` above the baseline window's.
    fn writes_per_minute(&self, who: &str) -> f64 {
        let n = |w: &Window| *w.writes.get(who).unwrap_or(&0) as f64;
        (n(&self.probing) - n(&self.baseline)) * 60.0 / self.seconds as f64
    }
}

/// The pods with no probes (the baseline), then each handler's PodProbeMarker in turn.
async fn bench(
    cp: &ControlPlane,
    node: &Node,
    daemon: Option<u32>,
    side: &'static str,
    count: usize,
    seconds: u64,
) -> Vec<Row> {
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    let ppms: Api<podprobe_manager::crd::PodProbeMarker> = Api::namespaced(cp.client(), NS);
    let sidecar = daemon.is_none();
    create_pods(&pods, node, count).await;
    wait_pods(&pods, count, false, None).await;
    let mut subject = Subject {
        cp,
        node,
        daemon,
        sidecars: vec![],
        games: vec![],
        handler: None,
    };
    let baseline = subject.measure(seconds).await;
    let mut rows = vec![];
    for handler in Handler::ALL {
        ppms.create(&PostParams::default(), &handler.ppm())
            .await
            .unwrap();
        if sidecar {
            delete_pods(&pods).await;
            create_pods(&pods, node, count).await;
        }
        let running = wait_pods(&pods, count, sidecar, Some(handler)).await;
        subject.handler = Some(handler);
        subject.sidecars = running
            .values()
            .filter_map(|p| container_id(p, SIDECAR))
            .collect();
        subject.games = running
            .values()
            .map(|p| usage::container_pid(node, &container_id(p, "game").unwrap()))
            .collect();
        let probing = subject.measure(seconds).await;
        // No attempt counted means the counter broke (no attempts file, no accepted
        // connection), not a free executor: a figure divided by it would be meaningless.
        assert!(
            probing.attempts > 0,
            "{side}, {}: no attempt reached the game containers in {seconds} s \
             (exec counts bytes in {}, tcp/http the pods' TCP PassiveOpens)",
            handler.name(),
            handler::EXEC_ATTEMPTS
        );
        rows.push(Row {
            side,
            handler,
            pods: count,
            seconds,
            baseline: baseline.clone(),
            probing,
            memory_mib: subject.memory_mib(),
        });
        delete_ppm(cp, node).await;
    }
    delete_pods(&pods).await;
    rows
}

async fn kruise_daemon_side(count: usize, seconds: u64) -> Vec<Row> {
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
    let rows = bench(
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
    rows
}

async fn podprobe_side(count: usize, seconds: u64) -> Vec<Row> {
    let options = NodeOptions {
        labels: [("type".to_owned(), "virtual-kubelet".to_owned())].into(),
        ..NodeOptions::default()
    };
    let (running, node) = on_node::node_and_chart_in(options, Mode::Companion).await;
    let rows = bench(&running.cp, &node, None, "podprobe", count, seconds).await;
    let leftovers = node.stop(&running.cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    rows
}

const CSV_HEADER: &str = "executor,handler,pods,seconds,attempts,nominal_attempts,cpu_ms_per_attempt,executor_ms,node_cp_ms,memory_mib,executor_writes_per_min,kruise_manager_writes_per_min,other_writes_per_min\n";

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let count = support::bench_arg(1, 10) as usize;
    let seconds = support::bench_arg(2, 30);
    let mut rows = kruise_daemon_side(count, seconds).await;
    rows.extend(podprobe_side(count, seconds).await);
    println!("{count} pods, one probe at period 1 s per handler, {seconds} s windows");
    println!(
        "{:<14} {:<5} {:>9} {:>8} {:>11} {:>11} {:>10} {:>8} {:>22}",
        "executor",
        "probe",
        "attempts",
        "kept up",
        "total ms/att",
        "executor ms",
        "node+cp ms",
        "MiB",
        "writes/min exec/km/other"
    );
    let mut csv = String::new();
    for r in &rows {
        let [e, k, o] = ["executor", "kruise-manager", "other"].map(|w| r.writes_per_minute(w));
        println!(
            "{:<14} {:<5} {:>9} {:>7.0}% {:>11.3} {:>11.3} {:>10.3} {:>8.1} {:>8.0}/{:.0}/{:.0}",
            r.side,
            r.handler.name(),
            r.probing.attempts,
            100.0 * r.probing.attempts as f64 / r.nominal_attempts() as f64,
            r.total_ms(),
            r.executor_ms(),
            r.node_cp_ms(),
            r.memory_mib,
            e,
            k,
            o
        );
        csv.push_str(&format!(
            "{},{},{},{},{},{},{:.4},{:.4},{:.4},{:.2},{e:.1},{k:.1},{o:.1}\n",
            r.side,
            r.handler.name(),
            r.pods,
            r.seconds,
            r.probing.attempts,
            r.nominal_attempts(),
            r.total_ms(),
            r.executor_ms(),
            r.node_cp_ms(),
            r.memory_mib,
        ));
    }
    for handler in Handler::ALL {
        let cost = |side: &str| {
            rows.iter()
                .find(|r| r.side == side && r.handler == handler)
                .map_or(f64::NAN, Row::total_ms)
        };
        println!(
            "{}: podprobe / kruise-daemon, CPU per attempt: {:.2}×",
            handler.name(),
            cost("podprobe") / cost("kruise-daemon")
        );
    }
    let out =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/perf/kruise_daemon.csv");
    // A file of an earlier layout is started over: its columns mean something else.
    let existing = std::fs::read_to_string(&out)
        .ok()
        .filter(|text| text.starts_with(CSV_HEADER))
        .unwrap_or_else(|| CSV_HEADER.to_owned());
    std::fs::write(&out, existing + &csv).unwrap();
    println!("appended to {}", out.display());
}
