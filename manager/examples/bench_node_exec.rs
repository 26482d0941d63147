//! Exec probe cost on a real node, per path and pod count (a program, not a test): the idle
//! recipe's probe (`/idle.sh` in the game container every 2 s, `examples/recipes/
//! idle-deletion-cost.yaml`) on PODS game servers, each with its injected sidecar, through the
//! real apiserver, kubelet, containerd and runc.
//!
//! Paths (`--path`, repeatable; default all four, each on a node and control plane of its own):
//! - `agent`: the chart's defaults, and game containers that give their command: injection
//!   wraps it with podprobe's exec agent, which runs the probe in
//!   the game container. The default install's path for such pods, marked `"default": true`.
//! - `beside`: the chart's defaults, and game containers without a command (their image's
//!   entrypoint): their postStart hook starts the exec agent beside the game server. The
//!   default install's path for such pods on kubelet nodes, also marked `"default": true`.
//! - `api`: the chart's defaults (no shared process namespace, a non-root sidecar without
//!   capabilities), and game containers without a command whose pods opt out of the exec
//!   agent (`podprobe.io/exec-agent: disabled`), so the sidecar runs the command through
//!   `pods/exec`. The default install's path for such pods on virtual nodes (`"default"`
//!   there).
//! - `procfs`: `injection.config.shareProcessNamespace=true` and a root sidecar that keeps the
//!   runtime's default capabilities (docs/sidecar.md): the sidecar runs the command itself,
//!   chrooted into the game container.
//!
//! Each path measures two windows of SECONDS: PODS game servers injected as the probed ones
//! are (the same probe, so the same sidecar, agent and pod shape) whose probe never runs in
//! the window (its initial delay is an hour: the baseline), then PODS others with the probe.
//! Each window starts once containerd is done with the pods started or deleted before it. Per
//! attempt, above the baseline: the CPU of the sidecars' and the game containers' cgroups, of
//! the control plane's processes (kube-apiserver, etcd) and of the node's (kubelet,
//! containerd, the shims with the runc and the commands they reap: in `api` the game
//! container's figure is the command, already in its shim's, and is left out of the total);
//! the apiserver's requests (`apiserver_request_total`, all of them above the baseline's, and
//! `pods/exec`'s); the attempts the sidecars counted (`podprobe_probe_attempts_total`, scraped
//! from inside the node's network namespace, with `injection.config.metricsPort` on) against
//! one per pod per period (`kept_up`, 1 when every attempt kept its period). The machine's
//! busy CPU is printed beside them as a check.
//!
//! With `--node virtual` the node is a virtual node that runs the pods (`vk-cri`, the
//! virtual-kubelet library v1.14.1 driving the node's containerd: docs/providers.md), the pods
//! placed there by kube-scheduler as users' pods for virtual nodes are (a toleration of the
//! node's taint and a `type: virtual-kubelet` node selector), so they get the virtual-node
//! shape: in `api`, `pods/exec` goes through the library to the provider's CRI exec; the
//! provider's CPU is in the node's figure.
//!
//! After the probed window, the exec agent's processes in each game container are counted,
//! with their anonymous memory (`RssAnon`, charged to the game container's memory cgroup) and
//! the size of the agent's binary on the pod's volume.
//!
//! Last, one JSON line per path; the lines are appended to `docs/perf/node_exec.jsonl`. Run it
//! on an otherwise quiet machine:
//!
//! `cargo run --release -p podprobe-manager --example bench_node_exec -- --pods N [--seconds S]
//! [--path agent|api|procfs]... [--node kubelet|virtual]`

#[path = "../tests/cluster/mod.rs"]
mod cluster;
#[path = "../tests/installed/mod.rs"]
mod installed;
#[path = "../tests/on_node/mod.rs"]
mod on_node;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use podprobe_manager::webhook::Mode;
use serde_json::json;
use testkit::real::metrics::{RequestCounts, request_counts, request_delta};
use testkit::real::{ControlPlane, Node, NodeOptions, VirtualAgent};

use installed::NS;
use on_node::usage::{
    AgentCost, agent_cost, cluster_markers, container_cpu, machine_busy, processes_cpu,
    processes_cpu_by_name,
};
use on_node::{PROCFS_INJECTION, SIDECAR, container_id};
use podprobe_manager::inject::agent::AGENT_BINARY;

/// The idle recipe's probe period.
const PERIOD_SECONDS: u64 = 2;
const CONDITION: &str = "game.kruise.io/idle";
const METRICS_PORT: u16 = 9102;
/// Pods created or scraped at once.
const CONCURRENCY: usize = 8;

#[derive(Parser, Debug)]
#[command(about = "Exec probe cost on a real node, per path (docs/perf/node_exec.jsonl)")]
struct Args {
    /// Game servers probed (and as many without a probe for the baseline).
    #[arg(long, default_value_t = 10)]
    pods: usize,
    /// Length of each measured window, seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// The exec paths to measure (repeatable; default: every one).
    #[arg(long = "path", value_enum)]
    paths: Vec<ExecPath>,
    /// The node: a kubelet, or a virtual node whose provider runs the pods (vk-cri).
    #[arg(long, value_enum, default_value_t = NodeKind::Kubelet)]
    node: NodeKind,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum NodeKind {
    Kubelet,
    Virtual,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ExecPath {
    /// The chart's defaults, game containers that give their command: the exec agent.
    Agent,
    /// The chart's defaults, game containers without a command: the agent from their
    /// postStart hook, beside the image's entrypoint.
    Beside,
    /// The chart's defaults, game containers without a command, the pods opted out of the
    /// agent: `pods/exec`.
    Api,
    /// A shared process namespace and a root sidecar: the command runs from the sidecar.
    Procfs,
}

impl ExecPath {
    fn name(self) -> &'static str {
        match self {
            ExecPath::Agent => "agent",
            ExecPath::Beside => "beside",
            ExecPath::Api => "api",
            ExecPath::Procfs => "procfs",
        }
    }

    fn helm_args(self) -> Vec<&'static str> {
        let mut args = vec![
            "--set",
            // Only to count attempts; the port changes nothing in how a probe runs.
            "injection.config.metricsPort=9102",
        ];
        if self == ExecPath::Procfs {
            args.extend(PROCFS_INJECTION);
        }
        args
    }
}

/// What one window cost.
#[derive(Debug, Default)]
struct Window {
    seconds: f64,
    sidecars: f64,
    games: f64,
    control_plane: f64,
    node: f64,
    /// The node's share by process name (kubelet, containerd, shims).
    node_by_process: BTreeMap<String, f64>,
    machine: f64,
    /// Attempts the sidecars counted.
    attempts: f64,
    requests: RequestCounts,
}

struct Bench<'a> {
    cp: &'a ControlPlane,
    node: &'a Node,
    pods: Api<Pod>,
    /// What selects the node's processes (kubelet, containerd, shims) and the control plane's.
    node_marker: [String; 1],
    control_plane_marker: [String; 1],
    /// The game containers' command, if they give one (the game server image's entrypoint).
    command: Option<&'static str>,
    /// The pods opt out of the exec agent.
    opted_out: bool,
    /// Pods for a virtual node: left to the scheduler, which places them there.
    virtual_node: bool,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let mut args = Args::parse();
    if args.paths.is_empty() {
        args.paths = vec![
            ExecPath::Agent,
            ExecPath::Beside,
            ExecPath::Api,
            ExecPath::Procfs,
        ];
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/perf/node_exec.jsonl");
    let mut lines = Vec::new();
    for path in &args.paths {
        let line = measure_path(*path, &args).await;
        // Kept as each path ends: a later path's failure loses nothing measured.
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&out)
            .unwrap();
        use std::io::Write;
        writeln!(file, "{line}").unwrap();
        eprintln!("{line}");
        lines.push(line);
    }
    println!("appended to {}", out.display());
    for line in &lines {
        println!("{line}");
    }
}

async fn measure_path(path: ExecPath, args: &Args) -> serde_json::Value {
    let virtual_node = args.node == NodeKind::Virtual;
    let options = if virtual_node {
        NodeOptions {
            virtual_agent: Some(VirtualAgent::default()),
            controllers: vec!["node-lifecycle-controller"],
            ..NodeOptions::default()
        }
    } else {
        NodeOptions::default()
    };
    let (mut running, node) =
        on_node::node_and_chart_with(options, Mode::Standalone, &path.helm_args()).await;
    if virtual_node {
        running.cp.start_scheduler().unwrap();
    }
    let cp = &running.cp;
    let ppms: Api<podprobe_manager::crd::PodProbeMarker> = Api::namespaced(cp.client(), NS);
    for (app, initial_delay) in [("game", 0), ("quiet", 3600)] {
        ppms.create(&PostParams::default(), &idle_ppm(app, initial_delay))
            .await
            .unwrap();
    }
    let [node_marker, control_plane_marker] = cluster_markers(&node, cp);
    let bench = Bench {
        cp,
        node: &node,
        pods: Api::namespaced(cp.client(), NS),
        node_marker: [node_marker],
        control_plane_marker: [control_plane_marker],
        command: (path == ExecPath::Agent).then_some("/usr/local/bin/gameserver"),
        opted_out: path == ExecPath::Api && !virtual_node,
        virtual_node,
    };
    let n = args.pods;
    eprintln!("{}: {n} game servers whose probe waits", path.name());
    let quiet = bench.start_pods("quiet", n, false).await;
    let idle = bench.measure(&quiet, args.seconds).await;
    bench.delete_pods("quiet").await;
    eprintln!("{}: {n} game servers with the idle probe", path.name());
    let probed = bench.start_pods("game", n, true).await;
    let busy = bench.measure(&probed, args.seconds).await;
    // After the probed window: what serving the probes has made the agents allocate is in.
    let agents: Vec<AgentCost> = probed
        .iter()
        .map(|p| agent_cost(&node, &p.game, AGENT_BINARY))
        .collect();
    bench.delete_pods("game").await;
    let leftovers = node.stop(cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let mut line = report(path, n, &idle, &busy);
    let args: Vec<String> = std::env::args().skip(1).collect();
    line["command"] = json!(format!(
        "cargo run --release -p podprobe-manager --example bench_node_exec -- {}",
        args.join(" ")
    ));
    // What the chart does with such pods there: on a virtual node a container without a
    // command keeps pods/exec (providers run no postStart hook).
    line["default"] = json!(match path {
        ExecPath::Agent => true,
        ExecPath::Beside => !virtual_node,
        ExecPath::Api => virtual_node,
        ExecPath::Procfs => false,
    });
    line["node"] = json!(if virtual_node { "vk-cri" } else { "kubelet" });
    let per_pod = |total: u64| total as f64 / agents.len().max(1) as f64;
    line["agent_processes_per_pod"] = json!(per_pod(agents.iter().map(|a| a.processes).sum()));
    line["agent_anon_kib_per_pod"] =
        json!((per_pod(agents.iter().map(|a| a.anon_bytes).sum()) / 1024.0).round());
    line["agent_file_bytes"] = json!(agents.iter().map(|a| a.file_bytes).max());
    line
}

/// The probe of the idle recipe, on the game servers labelled `app: <app>`, first run
/// `initial_delay` seconds after the container started.
fn idle_ppm(app: &str, initial_delay: u64) -> podprobe_manager::crd::PodProbeMarker {
    support::ppm(&json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": format!("{app}-idle"), "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": app}}, "probes": [{
            "name": "idle", "containerName": "game", "podConditionType": CONDITION,
            "probe": {"exec": {"command": ["/idle.sh"]}, "periodSeconds": PERIOD_SECONDS,
                      "initialDelaySeconds": initial_delay, "failureThreshold": 1}
        }]}
    }))
}

/// A started pod: its IP and the container ids the window reads.
struct Started {
    ip: String,
    sidecar: String,
    game: String,
}

impl Bench<'_> {
    /// Creates `n` game servers labelled `app: <app>` and waits until each runs its sidecar
    /// and, when `probed`, shows the probe's condition.
    async fn start_pods(&self, app: &str, n: usize, probed: bool) -> Vec<Started> {
        let node = self.node.name();
        let pod = |i: usize| {
            let mut pod = on_node::game_pod(&format!("{app}-{i}"), node);
            pod.metadata.labels = Some([("app".to_owned(), app.to_owned())].into());
            if self.opted_out {
                let opt_out = ("podprobe.io/exec-agent".to_owned(), "disabled".to_owned());
                pod.metadata.annotations = Some([opt_out].into());
            }
            let spec = pod.spec.as_mut().unwrap();
            if let Some(command) = self.command {
                spec.containers[0].command = Some(vec![command.into()]);
            }
            if self.virtual_node {
                spec.node_name = None;
                spec.node_selector =
                    Some([("type".to_owned(), "virtual-kubelet".to_owned())].into());
                spec.tolerations = Some(vec![serde_json::from_value(json!({
                    "key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"
                }))
                .unwrap()]);
            }
            pod
        };
        // Once the webhook's cache has the pods' PodProbeMarker: every pod gets its probe.
        self.cp
            .wait_admission(&pod(0), |p| {
                support::annotation(p, support::PODPROBE).is_some()
            })
            .await
            .unwrap();
        futures::stream::iter(0..n)
            .for_each_concurrent(CONCURRENCY, |i| {
                let pod = pod(i);
                async move {
                    self.pods
                        .create(&PostParams::default(), &pod)
                        .await
                        .unwrap();
                }
            })
            .await;
        let started = Instant::now();
        let selector = ListParams::default().labels(&format!("app={app}"));
        loop {
            let pods = self.pods.list(&selector).await.unwrap().items;
            let ready: Vec<Started> = pods
                .iter()
                .filter(|p| !probed || support::condition_status(p, CONDITION).is_some())
                .filter_map(|p| {
                    Some(Started {
                        ip: p.status.as_ref()?.pod_ip.clone()?,
                        sidecar: container_id(p, SIDECAR)?,
                        game: container_id(p, "game")?,
                    })
                })
                .collect();
            if ready.len() == n {
                eprintln!("{n} pods `{app}` up in {:.0?}", started.elapsed());
                return ready;
            }
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "{} of {n} pods `{app}` up after 10 minutes",
                ready.len()
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    async fn delete_pods(&self, app: &str) {
        let selector = ListParams::default().labels(&format!("app={app}"));
        self.pods
            .delete_collection(&DeleteParams::default().grace_period(0), &selector)
            .await
            .unwrap();
        while !self.pods.list(&selector).await.unwrap().items.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// One window of `seconds` over `pods`: CPU read around the sleep, attempts and requests
    /// counted around the CPU readings (the scrapes take a moment; the attempts are scaled to
    /// the CPU window).
    async fn measure(&self, pods: &[Started], seconds: u64) -> Window {
        self.settle().await;
        let counted = Instant::now();
        let (attempts0, requests0) = (self.attempts(pods).await, self.requests().await);
        let read = |pods: &[Started]| {
            (
                pods.iter()
                    .map(|p| container_cpu(self.node, &p.sidecar))
                    .sum::<f64>(),
                pods.iter()
                    .map(|p| container_cpu(self.node, &p.game))
                    .sum::<f64>(),
                processes_cpu(&self.control_plane_marker),
                processes_cpu_by_name(&self.node_marker),
                machine_busy(),
            )
        };
        let t0 = Instant::now();
        let before = read(pods);
        tokio::time::sleep(Duration::from_secs(seconds)).await; // the window itself
        let after = read(pods);
        let cpu_window = t0.elapsed().as_secs_f64();
        let (attempts1, requests1) = (self.attempts(pods).await, self.requests().await);
        let counted_window = counted.elapsed().as_secs_f64();
        Window {
            seconds: cpu_window,
            sidecars: after.0 - before.0,
            games: after.1 - before.1,
            control_plane: after.2 - before.2,
            node: after.3.values().sum::<f64>() - before.3.values().sum::<f64>(),
            node_by_process: after
                .3
                .iter()
                .map(|(name, t)| (name.clone(), t - before.3.get(name).copied().unwrap_or(0.0)))
                .collect(),
            machine: after.4 - before.4,
            attempts: (attempts1 - attempts0) * cpu_window / counted_window,
            requests: scale(
                &request_delta(&requests0, &requests1),
                cpu_window / counted_window,
            ),
        }
    }

    /// Waits until containerd is done with the pods started or deleted before (its native
    /// snapshotter copies a rootfs per container and removes it after the pod is gone, for
    /// tens of seconds at 100 pods): at most 3 minutes, until it used under 5 % of a core
    /// over 5 s. Without it the probed window carried the baseline's teardown (containerd
    /// was most of the agent path's "node" figure).
    async fn settle(&self) {
        const QUIET: f64 = 0.05;
        let started = Instant::now();
        let containerd = || {
            let by_name = processes_cpu_by_name(&self.node_marker);
            by_name.get("containerd").copied().unwrap_or(0.0)
        };
        loop {
            let before = containerd();
            tokio::time::sleep(Duration::from_secs(5)).await; // the sample itself
            let share = (containerd() - before) / 5.0;
            if share < QUIET {
                eprintln!(
                    "containerd quiet ({:.1} % of a core) after {:.0?}",
                    share * 100.0,
                    started.elapsed()
                );
                return;
            }
            if started.elapsed() > Duration::from_secs(180) {
                eprintln!(
                    "containerd still at {:.0} % of a core after 3 minutes: measuring anyway",
                    share * 100.0
                );
                return;
            }
        }
    }

    /// Probe attempts every sidecar of `pods` has counted.
    async fn attempts(&self, pods: &[Started]) -> f64 {
        let netns = self.node.network().netns().to_owned();
        futures::stream::iter(pods)
            .map(|p| {
                let netns = netns.clone();
                let url = format!("http://{}:{METRICS_PORT}/metrics", p.ip);
                tokio::task::spawn_blocking(move || scrape_in(&netns, &url))
            })
            .buffer_unordered(CONCURRENCY)
            .map(|text| attempts_in(&text.unwrap()))
            .fold(0.0, |sum, n| async move { sum + n })
            .await
    }

    async fn requests(&self) -> RequestCounts {
        request_counts(&self.cp.metrics().await.unwrap())
    }
}

/// `curl` inside the node's network namespace, where the pods' addresses are.
fn scrape_in(netns: &str, url: &str) -> String {
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            netns,
            "curl",
            "-sSf",
            "--max-time",
            "10",
            url,
        ])
        .output()
        .expect("run ip netns exec curl");
    assert!(
        out.status.success(),
        "{url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The sum of `podprobe_probe_attempts_total` over results.
fn attempts_in(metrics: &str) -> f64 {
    testkit::real::metrics::sum(metrics, "podprobe_probe_attempts_total", &[])
}

fn scale(counts: &RequestCounts, factor: f64) -> RequestCounts {
    counts
        .iter()
        .map(|(k, n)| (k.clone(), (*n as f64 * factor).round() as u64))
        .collect()
}

fn report(path: ExecPath, pods: usize, idle: &Window, busy: &Window) -> serde_json::Value {
    // The baseline per second, over the probed window's length.
    let above = |probed: f64, quiet: f64| probed - quiet * busy.seconds / idle.seconds;
    let attempts = busy.attempts.max(1.0);
    let ms = |s: f64| (s * 1000.0 / attempts * 1000.0).round() / 1000.0;
    let sidecars = above(busy.sidecars, idle.sidecars);
    let games = above(busy.games, idle.games);
    let control_plane = above(busy.control_plane, idle.control_plane);
    let node = above(busy.node, idle.node);
    // In `api` the command runs in the game container and its shim reaps it, so the node's
    // figure holds it already (runc's start of it included); elsewhere it is the sidecar's
    // child (procfs) or the agent's (agent, in the game container's cgroup), not run by the
    // node at all.
    let games_not_in_node = if path == ExecPath::Api { 0.0 } else { games };
    // The control plane's own requests (leases, the manager's and the kubelet's) per second
    // of the baseline, over the probed window's length.
    let background = idle.requests.values().sum::<u64>() as f64;
    let requests = above(busy.requests.values().sum::<u64>() as f64, background).max(0.0);
    let exec_requests: u64 = busy
        .requests
        .iter()
        .filter(|((_, resource, sub), _)| resource == "pods" && sub == "exec")
        .map(|(_, n)| n)
        .sum();
    let expected = pods as f64 * busy.seconds / PERIOD_SECONDS as f64;
    let by_request: BTreeMap<String, u64> = busy
        .requests
        .iter()
        .map(|((verb, resource, sub), n)| (format!("{verb} {resource}/{sub}"), *n))
        .collect();
    eprintln!(
        "{}: requests in the probed window {by_request:?}",
        path.name()
    );
    json!({
        "path": path.name(),
        "game_container_gives_command": path == ExecPath::Agent,
        "pods": pods,
        "date": jiff::Timestamp::now().strftime("%Y-%m-%d").to_string(),
        "seconds": (busy.seconds * 10.0).round() / 10.0,
        "attempts": busy.attempts.round(),
        "kept_up": ((busy.attempts / expected).min(1.0) * 1000.0).round() / 1000.0,
        "cpu_ms_per_attempt": ms(sidecars + control_plane + node + games_not_in_node),
        "sidecar_ms": ms(sidecars),
        "game_container_ms": ms(games),
        "control_plane_ms": ms(control_plane),
        "node_ms": ms(node),
        "node_ms_by_process": busy
            .node_by_process
            .iter()
            .map(|(name, t)| {
                let quiet = idle.node_by_process.get(name).copied().unwrap_or(0.0);
                (name.clone(), ms(above(*t, quiet)))
            })
            .collect::<BTreeMap<String, f64>>(),
        "machine_ms": ms(above(busy.machine, idle.machine)),
        "apiserver_requests_per_attempt": (requests / attempts * 1000.0).round() / 1000.0,
        "exec_requests_per_attempt": (exec_requests as f64 / attempts * 1000.0).round() / 1000.0,
    })
}
