//! A fleet on a virtual node that runs its pods (a program, not a test): PODS game servers, each
//! injected by the chart's defaults (standalone), placed by kube-scheduler on `vk-cri` (the
//! virtual-kubelet library driving the node's containerd: docs/providers.md) and run there,
//! while the provider writes its own status over each pod's every 5 s, as azure-aci does.
//!
//! Each pod has two probes on its game server: `healthy` (http, every 1 s), which flips every
//! FLIP seconds per pod (the bench writes or removes the server's `unhealthy` file in the pod's
//! `emptyDir`, where the provider keeps it on the node), with a label marker per state; and
//! `accepting` (tcp, every 2 s), which never changes. One watch on the pods records, for each
//! flip, when the condition and when the marker first show it, and how long each pod's steady
//! condition is missing.
//!
//! Last, one JSON line, appended to `docs/perf/virtual_fleet.jsonl`: flips, flip → condition and
//! → marker p50/p99, flips whose condition or marker never showed (lost), the steady condition's
//! presence, and the writes per pod-hour (the sidecars' status patches, the provider's status
//! updates, the manager's marker patches; from the audit log). Run it on an otherwise quiet
//! machine:
//!
//! `cargo run --release -p podprobe-manager --example bench_virtual_fleet -- --pods N
//! [--seconds S] [--flip-every F] [--aci]`

#[path = "../tests/cluster/mod.rs"]
mod cluster;
#[path = "../tests/installed/mod.rs"]
mod installed;
#[path = "../tests/on_node/mod.rs"]
mod on_node;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use podprobe_manager::webhook::Mode;
use serde_json::json;
use testkit::real::node::images::{GAMESERVER_IMAGE, SIDECAR_IMAGE};
use testkit::real::virtual_kubelet::VIRTUAL_KUBELET_USER;
use testkit::real::{ControlPlane, Library, Node, NodeNetwork, NodeOptions, VirtualAgent};

use installed::NS;
use support::{condition_status, label};

const HEALTHY: &str = "game.io/healthy";
const ACCEPTING: &str = "game.io/accepting";
/// Pods created at once.
const CONCURRENCY: usize = 8;

#[derive(Parser, Debug)]
#[command(about = "A fleet on a virtual node that runs its pods (docs/perf/virtual_fleet.jsonl)")]
struct Args {
    /// Game servers.
    #[arg(long, default_value_t = 50)]
    pods: usize,
    /// Length of the measured window, seconds.
    #[arg(long, default_value_t = 120)]
    seconds: u64,
    /// Each pod's healthy probe flips every this many seconds.
    #[arg(long, default_value_t = 20)]
    flip_every: u64,
    /// The node behaves as azure-aci v1.6.4 (its rules, volumes and exec, on the library
    /// v1.11.0); else vk-cri on v1.14.1.
    #[arg(long)]
    aci: bool,
}

/// One flip and when the watch first showed it.
struct Flip {
    pod: String,
    at: Instant,
    healthy: bool,
    condition: Option<Duration>,
    marker: Option<Duration>,
}

/// What the watch has seen of each pod.
#[derive(Default)]
struct Seen {
    flips: Vec<Flip>,
    /// Per pod: since when the steady condition has been missing, if it is.
    missing_since: HashMap<String, Instant>,
    missing_total: Duration,
}

impl Seen {
    fn observe(&mut self, pod: &Pod, now: Instant) {
        let name = pod.metadata.name.clone().unwrap_or_default();
        if condition_status(pod, ACCEPTING).is_some() {
            if let Some(since) = self.missing_since.remove(&name) {
                self.missing_total += now - since;
            }
        } else {
            self.missing_since.entry(name.clone()).or_insert(now);
        }
        let healthy = condition_status(pod, HEALTHY).map(|s| s == "True");
        let marked = label(pod, HEALTHY).map(|v| v == "true");
        for flip in self.flips.iter_mut().filter(|f| f.pod == name) {
            if flip.condition.is_none() && healthy == Some(flip.healthy) {
                flip.condition = Some(now - flip.at);
            }
            if flip.marker.is_none() && marked == Some(flip.healthy) {
                flip.marker = Some(now - flip.at);
            }
        }
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = Args::parse();
    let agent = VirtualAgent {
        library: if args.aci {
            Library::V1_11
        } else {
            Library::V1_14
        },
        aci: args.aci,
        ..VirtualAgent::default()
    };
    let network = NodeNetwork::create().unwrap();
    let mut cp = ControlPlane::start_on(network.host_ip()).await.unwrap();
    let options = NodeOptions {
        virtual_agent: Some(agent),
        controllers: vec!["node-lifecycle-controller"],
        ..NodeOptions::default()
    };
    let node = Node::start(&mut cp, network, options).await.unwrap();
    cp.start_scheduler().unwrap();
    let image = format!("injection.config.image={SIDECAR_IMAGE}");
    let running = installed::install_and_run_with(cp, Mode::Standalone, &["--set", &image]).await;
    let cp = &running.cp;
    Api::<podprobe_manager::crd::PodProbeMarker>::namespaced(cp.client(), NS)
        .create(&PostParams::default(), &fleet_ppm())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    let available_before = mem_available_mib();
    let (uids, up_in) = start_pods(cp, &pods, args.pods).await;
    let host = Host {
        up_in,
        mib_per_pod: (available_before - mem_available_mib()) / args.pods as f64,
        busy: on_node::usage::machine_busy(),
        busy_after: 0.0,
    };

    let seen = Arc::new(Mutex::new(Seen::default()));
    let watching = {
        let seen = seen.clone();
        let pods = pods.clone();
        tokio::spawn(async move {
            let events = watcher(pods, watcher::Config::default()).default_backoff();
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                let now = Instant::now();
                if let Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) = event {
                    seen.lock().unwrap().observe(&pod, now);
                }
            }
        })
    };
    let audit_before = writes(cp);
    let started = Instant::now();
    let window = Duration::from_secs(args.seconds);
    let names: Vec<&String> = uids.keys().collect();
    // Pod i flips at i·F/N + k·F: the fleet flips N/F times a second, evenly.
    let step = Duration::from_secs_f64(args.flip_every as f64 / args.pods as f64);
    let mut unhealthy = vec![false; names.len()];
    let mut next = 0usize;
    let mut ticks = tokio::time::interval(step);
    while started.elapsed() < window {
        ticks.tick().await;
        let name = names[next];
        let file = node
            .dir()
            .join("vk-cri/pods")
            .join(&uids[name])
            .join("volumes/game-state/unhealthy");
        unhealthy[next] = !unhealthy[next];
        if unhealthy[next] {
            std::fs::write(&file, "").unwrap();
        } else {
            std::fs::remove_file(&file).unwrap();
        }
        seen.lock().unwrap().flips.push(Flip {
            pod: name.clone(),
            at: Instant::now(),
            healthy: !unhealthy[next],
            condition: None,
            marker: None,
        });
        next = (next + 1) % names.len();
    }
    let measured = started.elapsed();
    let host = Host {
        busy_after: on_node::usage::machine_busy(),
        ..host
    };
    // The last flips get the time a flip takes to show.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let audit = writes(cp) - audit_before;
    let audited = started.elapsed();
    watching.abort();
    let line = report(
        &args,
        &seen.lock().unwrap(),
        (measured, &host),
        (audit, audited),
    );
    println!("{line}");
    let out =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/perf/virtual_fleet.jsonl");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&out)
        .unwrap();
    use std::io::Write;
    writeln!(file, "{line}").unwrap();
    println!("appended to {}", out.display());
    let leftovers = node.stop(cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn fleet_ppm() -> podprobe_manager::crd::PodProbeMarker {
    support::ppm(&json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "fleet", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "fleet"}}, "probes": [
            {"name": "healthy", "containerName": "game", "podConditionType": HEALTHY,
             "probe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
                       "periodSeconds": 1, "failureThreshold": 1},
             "markerPolicy": [
                {"state": "Succeeded", "labels": {HEALTHY: "true"}},
                {"state": "Failed", "labels": {HEALTHY: "false"}}]},
            {"name": "accepting", "containerName": "game", "podConditionType": ACCEPTING,
             "probe": {"tcpSocket": {"port": 7777}, "periodSeconds": 2}}
        ]}
    }))
}

/// Creates `n` game servers for the virtual node and waits until each shows both conditions
/// True; their uids by name.
async fn start_pods(
    cp: &ControlPlane,
    pods: &Api<Pod>,
    n: usize,
) -> (HashMap<String, String>, Duration) {
    let pod = |i: usize| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("fleet-{i}"), "namespace": NS, "labels": {"app": "fleet"}},
            "spec": {"serviceAccountName": "podprobe-sidecar",
                     "nodeSelector": {"type": "virtual-kubelet"},
                     "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists",
                                      "effect": "NoSchedule"}],
                     "volumes": [{"name": "game-state", "emptyDir": {}}],
                     "containers": [{"name": "game", "image": GAMESERVER_IMAGE,
                        "volumeMounts": [{"name": "game-state", "mountPath": "/var/run/game"}]}]}
        }))
        .unwrap()
    };
    cp.wait_admission(&pod(0), |p| {
        support::annotation(p, support::PODPROBE).is_some()
    })
    .await
    .unwrap();
    let started = Instant::now();
    futures::stream::iter(0..n)
        .for_each_concurrent(CONCURRENCY, |i| {
            let pod = pod(i);
            async move {
                pods.create(&PostParams::default(), &pod).await.unwrap();
            }
        })
        .await;
    let selector = ListParams::default().labels("app=fleet");
    loop {
        let up: HashMap<String, String> = pods
            .list(&selector)
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| {
                [HEALTHY, ACCEPTING]
                    .iter()
                    .all(|c| condition_status(p, c).as_deref() == Some("True"))
            })
            .filter_map(|p| Some((p.metadata.name?, p.metadata.uid?)))
            .collect();
        if up.len() == n {
            eprintln!("{n} pods up in {:.0?}", started.elapsed());
            return (up, started.elapsed());
        }
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "{} of {n} pods up after 15 minutes",
            up.len()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Writes so far, by writer: the sidecars' status patches, the provider's status updates, the
/// manager's pod patches (markers).
#[derive(Debug, Clone, Copy, Default)]
struct Writes {
    sidecars: usize,
    provider: usize,
    markers: usize,
}

impl std::ops::Sub for Writes {
    type Output = Writes;
    fn sub(self, before: Writes) -> Writes {
        Writes {
            sidecars: self.sidecars - before.sidecars,
            provider: self.provider - before.provider,
            markers: self.markers - before.markers,
        }
    }
}

fn writes(cp: &ControlPlane) -> Writes {
    let mut w = Writes::default();
    for e in cp.audit().unwrap() {
        let Some(o) = e.object_ref.as_ref() else {
            continue;
        };
        if o.resource != "pods" || o.namespace != NS {
            continue;
        }
        let user = e.user.username.as_str();
        match (e.verb.as_str(), o.subresource.as_str()) {
            ("patch", "status") if user.ends_with(":podprobe-sidecar") => w.sidecars += 1,
            ("update", "status") if user == VIRTUAL_KUBELET_USER => w.provider += 1,
            ("patch", "") if user.ends_with(":podprobe-manager") => w.markers += 1,
            _ => {}
        }
    }
    w
}

/// `writes`: those of the window and the wait after it (how long that was).
/// What the machine gave the fleet.
struct Host {
    /// From the first pod created to every pod showing both conditions True.
    up_in: Duration,
    /// The machine's `MemAvailable` taken by each running pod (its containers, their shims,
    /// the provider's and the apiserver's share).
    mib_per_pod: f64,
    /// Busy CPU seconds of the machine at the window's start and end.
    busy: f64,
    busy_after: f64,
}

/// `MemAvailable` of the machine, MiB.
fn mem_available_mib() -> f64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib / 1024.0
}

fn report(
    args: &Args,
    seen: &Seen,
    (measured, host): (Duration, &Host),
    (writes, audited): (Writes, Duration),
) -> serde_json::Value {
    let percentile = |mut v: Vec<Duration>, p: f64| -> Option<f64> {
        v.sort();
        let i = ((v.len() as f64 * p).ceil() as usize).checked_sub(1)?;
        v.get(i).map(|d| (d.as_secs_f64() * 1000.0).round())
    };
    let conditions: Vec<Duration> = seen.flips.iter().filter_map(|f| f.condition).collect();
    let markers: Vec<Duration> = seen.flips.iter().filter_map(|f| f.marker).collect();
    let end = Instant::now();
    let still_missing: Duration = seen.missing_since.values().map(|s| end - *s).sum();
    // The watch saw the pods through the window and the wait after it.
    let observed = audited.as_secs_f64() * args.pods as f64;
    let missing = (seen.missing_total + still_missing).as_secs_f64();
    let pod_hours = audited.as_secs_f64() * args.pods as f64 / 3600.0;
    let per_pod_hour = |n: usize| (n as f64 / pod_hours).round();
    json!({
        "date": jiff::Timestamp::now().strftime("%Y-%m-%d").to_string(),
        "command": format!(
            "cargo run --release -p podprobe-manager --example bench_virtual_fleet -- {}",
            std::env::args().skip(1).collect::<Vec<_>>().join(" ")
        ),
        "node": if args.aci { "vk-cri --aci (library v1.11.0)" } else { "vk-cri (library v1.14.1)" },
        "pods": args.pods,
        "seconds": measured.as_secs(),
        "flip_every_s": args.flip_every,
        "flips": seen.flips.len(),
        "flip_to_condition_ms_p50": percentile(conditions.clone(), 0.5),
        "flip_to_condition_ms_p99": percentile(conditions.clone(), 0.99),
        "flip_to_marker_ms_p50": percentile(markers.clone(), 0.5),
        "flip_to_marker_ms_p99": percentile(markers.clone(), 0.99),
        "lost_conditions": seen.flips.len() - conditions.len(),
        "lost_markers": seen.flips.len() - markers.len(),
        "steady_condition_present_pct": ((1.0 - missing / observed) * 10000.0).round() / 100.0,
        "sidecar_writes_per_pod_hour": per_pod_hour(writes.sidecars),
        "provider_writes_per_pod_hour": per_pod_hour(writes.provider),
        "marker_writes_per_pod_hour": per_pod_hour(writes.markers),
        "all_pods_up_s": host.up_in.as_secs(),
        "host_mib_per_pod": host.mib_per_pod.round(),
        "host_cores_busy": ((host.busy_after - host.busy) / measured.as_secs_f64() * 100.0).round() / 100.0,
    })
}
