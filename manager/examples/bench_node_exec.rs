//! Exec probe cost on a real node (a program, not a test): `procfs` against `pods/exec`
//! through the real apiserver, kubelet, containerd and runc, in one run.
//!
//! One node, the chart installed; then three windows of SECONDS each on the same node:
//! 1. baseline: the same game server pod with the injected sidecar and no probes (what the
//!    kubelet, the runtime and an idle sidecar cost without any attempt);
//! 2. procfs: one pod whose injected sidecar (auto → procfs) runs PROBES exec probes
//!    (`test -f /var/run/game/idle`, period 1 s) in the game container;
//! 3. api: the same probes from a hand-written sidecar with `--exec-mode api`.
//!
//! Per attempt it prints the CPU above the baseline window of everything an attempt can cost:
//! the sidecar's container (cgroup `cpuacct.usage`; procfs runs the command there too) and the
//! node's and control plane's processes (`/proc/<pid>/stat`, children included: apiserver,
//! etcd, kubelet, containerd, the shims, which reap runc and the command `pods/exec` starts).
//! The machine-wide figure (`/proc/stat`) is printed too; it is noisier (everything else on
//! the machine is in it).
//! Attempts are PROBES × SECONDS (one per probe per period). Run it on a quiet machine; the
//! figures go to `docs/perf/node_exec.csv`.
//!
//! `cargo run --release -p podprobe-manager --example bench_node_exec [-- SECONDS PROBES]`

#[path = "../tests/cluster/mod.rs"]
mod cluster;
#[path = "../tests/installed/mod.rs"]
mod installed;
#[path = "../tests/on_node/mod.rs"]
mod on_node;
#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use testkit::real::{Node, NodeOptions};

use installed::NS;
use on_node::usage::{cluster_markers, container_cpu, machine_busy, processes_cpu};
use on_node::{SIDECAR, container_id, wait_for};

struct Window {
    /// Machine busy CPU seconds during the window.
    busy: f64,
    /// CPU seconds of the node's and control plane's processes.
    daemons: f64,
    /// CPU seconds charged to the sidecar's container.
    sidecar: f64,
}

async fn measure(seconds: u64, markers: &[String], node: &Node, sidecar: &str) -> Window {
    let busy0 = machine_busy();
    let (daemons0, side0) = (processes_cpu(markers), container_cpu(node, sidecar));
    tokio::time::sleep(Duration::from_secs(seconds)).await; // the measurement window itself
    Window {
        busy: machine_busy() - busy0,
        daemons: processes_cpu(markers) - daemons0,
        sidecar: container_cpu(node, sidecar) - side0,
    }
}

fn exec_ppm(probes: u64) -> podprobe_manager::crd::PodProbeMarker {
    let probes: Vec<_> = (0..probes)
        .map(|i| {
            json!({"name": format!("e{i}"), "containerName": "game",
            "podConditionType": format!("game.kruise.io/e{i}"),
            "probe": {"exec": {"command": ["sh", "-c", "test -f /var/run/game/idle"]},
                      "periodSeconds": 1, "failureThreshold": 1}})
        })
        .collect();
    support::ppm(&json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "bench", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "game"}}, "probes": probes}
    }))
}

async fn run_pod(pods: &Api<Pod>, pod: Pod, probes: u64) -> String {
    let name = pod.metadata.name.clone().unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let up = wait_for(pods, &name, "running, every exec probe written", |p| {
        container_id(p, SIDECAR).is_some()
            && (0..probes).all(|i| {
                support::condition_status(p, &format!("game.kruise.io/e{i}")).as_deref()
                    == Some("False")
            })
    })
    .await;
    container_id(&up, SIDECAR).unwrap()
}

async fn delete_pod(pods: &Api<Pod>, name: &str) {
    pods.delete(name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    while pods.get_opt(name).await.unwrap().is_some() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let seconds = support::bench_arg(1, 20);
    let probes = support::bench_arg(2, 10);
    let (running, node) = on_node::node_and_chart(NodeOptions::default()).await;
    let cp = &running.cp;
    on_node::allow_pods_exec(cp).await;
    let ppms: Api<podprobe_manager::crd::PodProbeMarker> = Api::namespaced(cp.client(), NS);
    ppms.create(&PostParams::default(), &exec_ppm(probes))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    let probe_pod = on_node::game_pod("bench-procfs", node.name());
    cp.wait_admission(&probe_pod, |p| {
        support::annotation(p, support::PODPROBE).is_some()
    })
    .await
    .unwrap();

    let mut quiet = on_node::game_pod("bench-quiet", node.name());
    quiet.metadata.labels = Some([("app".to_owned(), "quiet".to_owned())].into());
    let quiet_id = run_pod(&pods, quiet, 0).await;
    let markers = cluster_markers(&node, cp);
    let idle = measure(seconds, &markers, &node, &quiet_id).await;
    delete_pod(&pods, "bench-quiet").await;
    let id = run_pod(&pods, probe_pod, probes).await;
    let procfs = measure(seconds, &markers, &node, &id).await;
    delete_pod(&pods, "bench-procfs").await;
    let id = run_pod(
        &pods,
        on_node::pod_with_hand_written_sidecar("bench-api", node.name()),
        probes,
    )
    .await;
    let api = measure(seconds, &markers, &node, &id).await;
    delete_pod(&pods, "bench-api").await;

    let attempts = (probes * seconds) as f64;
    let ms = |s: f64| s * 1000.0 / attempts;
    let cost = |w: &Window| ms(w.sidecar + w.daemons - idle.sidecar - idle.daemons);
    println!(
        "exec probe cost on a real node: {probes} probes × {seconds} s = {attempts} attempts per mode"
    );
    println!(
        "baseline (pod and sidecar without probes): sidecar {:.3}, node + control plane {:.2}, machine {:.2} CPU-s in {seconds} s",
        idle.sidecar, idle.daemons, idle.busy
    );
    println!(
        "{:<8} {:>14} {:>14} {:>14} {:>14}",
        "mode", "cost ms/att", "sidecar ms", "daemons ms", "machine ms"
    );
    for (mode, w) in [("procfs", &procfs), ("api", &api)] {
        println!(
            "{mode:<8} {:>14.2} {:>14.2} {:>14.2} {:>14.2}",
            cost(w),
            ms(w.sidecar - idle.sidecar),
            ms(w.daemons - idle.daemons),
            ms(w.busy - idle.busy)
        );
    }
    println!(
        "pods/exec / procfs, CPU per attempt: {:.1}×",
        cost(&api) / cost(&procfs)
    );
    let csv = format!(
        "mode,cpu_ms_per_attempt,sidecar_ms,daemons_ms,machine_ms\n{}",
        [("procfs", &procfs), ("api", &api)]
            .iter()
            .map(|(mode, w)| format!(
                "{mode},{:.3},{:.3},{:.3},{:.3}\n",
                cost(w),
                ms(w.sidecar - idle.sidecar),
                ms(w.daemons - idle.daemons),
                ms(w.busy - idle.busy)
            ))
            .collect::<String>()
    );
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/perf/node_exec.csv");
    std::fs::write(&out, csv).unwrap();
    println!("wrote {}", out.display());
    let leftovers = node.stop(cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
