//! What an idle sidecar costs, per pod source and, with `--source file`, per layout of the
//! annotations file: N real `podprobe run` processes, one per pod, each with its own pod-bound
//! token, client and connection, against a real kube-apiserver and etcd (`testkit::real`), with
//! one tcp probe (period 10 s) that stays Succeeded. Once every pod shows its condition, the
//! sidecars' CPU (utime + stime from /proc) and RSS are read over a window and printed per
//! sidecar and per 1 000 pods; a line per layout goes to `docs/perf/idle.csv`.
//!
//!     cargo build --release && cargo run --release --example bench_idle -- [PODS] [SECONDS] [LAYOUT...]
//!
//! LAYOUT (default: all four):
//! - `api`: `--source api`, a watch on the pod;
//! - `kubelet`: the kubelet's atomic writer (`annotations -> ..data/annotations`,
//!   `..data -> ..<timestamp>/`), a directory per pod;
//! - `own-dir`: a plain file in a directory of its own per pod;
//! - `shared-dir`: every pod's plain file in one directory.
//!
//! `PODPROBE_BIN=path` measures another build (e.g. the one before a change); `BUILD=name` labels
//! it in the CSV. A program that prints figures, not a test.

use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::real::ControlPlane;
use testkit::real::usage::{cores, cpu_ticks, rss_kib};

const CONDITION: &str = "game.io/accepting";
const SETTLE: Duration = Duration::from_secs(5);

fn binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("PODPROBE_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("current exe");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("podprobe");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release` first",
        bin.display()
    );
    bin
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    Api,
    Kubelet,
    OwnDir,
    SharedDir,
}

impl Layout {
    fn parse(name: &str) -> Layout {
        match name {
            "api" => Layout::Api,
            "kubelet" => Layout::Kubelet,
            "own-dir" => Layout::OwnDir,
            "shared-dir" => Layout::SharedDir,
            other => panic!("unknown layout {other:?}: api, kubelet, own-dir or shared-dir"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Layout::Api => "api",
            Layout::Kubelet => "kubelet",
            Layout::OwnDir => "own-dir",
            Layout::SharedDir => "shared-dir",
        }
    }

    /// Writes pod `i`'s annotations file in this layout and returns the path the sidecar reads.
    fn write_file(self, root: &Path, i: usize, text: &str) -> Option<PathBuf> {
        let dir = root.join(self.name());
        match self {
            Layout::Api => None,
            Layout::Kubelet => {
                let pod_dir = dir.join(format!("pod-{i}"));
                let data = pod_dir.join("..2026_11_24_00_00_00.1");
                std::fs::create_dir_all(&data).unwrap();
                std::fs::write(data.join("annotations"), text).unwrap();
                symlink("..2026_11_24_00_00_00.1", pod_dir.join("..data")).unwrap();
                symlink("..data/annotations", pod_dir.join("annotations")).unwrap();
                Some(pod_dir.join("annotations"))
            }
            Layout::OwnDir => {
                let pod_dir = dir.join(format!("pod-{i}"));
                std::fs::create_dir_all(&pod_dir).unwrap();
                std::fs::write(pod_dir.join("annotations"), text).unwrap();
                Some(pod_dir.join("annotations"))
            }
            Layout::SharedDir => {
                std::fs::create_dir_all(&dir).unwrap();
                let path = dir.join(format!("pod-{i}.annotations"));
                std::fs::write(&path, text).unwrap();
                Some(path)
            }
        }
    }
}

struct Sidecars(Vec<Child>);

impl Drop for Sidecars {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct Figures {
    cores: f64,
    rss_mib: f64,
}

async fn run_layout(
    cp: &ControlPlane,
    work: &Path,
    layout: Layout,
    pods: usize,
    window: Duration,
    port: u16,
) -> Figures {
    let ns = "games";
    let api: Api<Pod> = Api::namespaced(cp.client(), ns);
    let annotation =
        json!([{"containerName": "main", "name": "accepting", "podConditionType": CONDITION,
        "probe": {"tcpSocket": {"port": port}, "periodSeconds": 10}}])
        .to_string();
    let file_text = format!(
        "kruise.io/podprobe={}\n",
        podprobe::annotation::go_quote(&annotation)
    );
    let mut sidecars = Sidecars(Vec::new());
    for i in 0..pods {
        let name = format!("{}-{i}", layout.name());
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": {"kruise.io/podprobe": annotation}},
            "spec": {"nodeName": "vk-1", "serviceAccountName": "podprobe-sidecar", "containers": [
                {"name": "main", "image": "game:1", "ports": [{"containerPort": port}]},
                {"name": "podprobe", "image": "podprobe:dev"}]}
        }))
        .unwrap();
        let pod = api
            .create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
        let status = json!({"status": {"phase": "Running", "podIP": "127.0.0.1",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"}],
            "containerStatuses": [{"name": "main", "ready": true, "restartCount": 0, "image": "game:1", "imageID": "",
                "containerID": "containerd://main", "started": true, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("pod status");
        let token = cp
            .pod_token("podprobe-sidecar", &pod)
            .await
            .expect("pod-bound token");
        let kubeconfig = work.join(format!("{name}.kubeconfig"));
        cp.write_kubeconfig_for_token(&kubeconfig, &token)
            .expect("kubeconfig");
        let mut command = Command::new(binary());
        command
            .args([
                "run",
                "--pod-name",
                &name,
                "--pod-namespace",
                ns,
                "--pod-uid",
            ])
            .arg(pod.metadata.uid.as_deref().unwrap())
            .args(["--pod-ip", "127.0.0.1"])
            .env("KUBECONFIG", &kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(work.join(format!("{name}.log"))).unwrap());
        match layout.write_file(work, i, &file_text) {
            None => command.args(["--source", "api"]),
            Some(path) => command
                .args(["--source", "file", "--annotations-file"])
                .arg(path),
        };
        sidecars
            .0
            .push(command.spawn().expect("start podprobe run"));
    }
    wait_all_conditions(&api, layout, pods).await;
    // Start-up (TLS, watches, first writes) is over; let stragglers settle before measuring.
    tokio::time::sleep(SETTLE).await;
    let pids: Vec<u32> = sidecars.0.iter().map(Child::id).collect();
    for child in &mut sidecars.0 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "a sidecar exited during start-up"
        );
    }
    let before: u64 = pids.iter().map(|&p| cpu_ticks(p)).sum();
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let after: u64 = pids.iter().map(|&p| cpu_ticks(p)).sum();
    let seconds = started.elapsed().as_secs_f64();
    let rss: u64 = pids.iter().map(|&p| rss_kib(p)).sum();
    Figures {
        cores: cores(before, after, seconds),
        rss_mib: rss as f64 / 1024.0 / pods as f64,
    }
}

async fn wait_all_conditions(api: &Api<Pod>, layout: Layout, pods: usize) {
    let deadline = Instant::now() + Duration::from_secs(300);
    let prefix = format!("{}-", layout.name());
    loop {
        let list = api.list(&ListParams::default()).await.expect("list pods");
        let done = list
            .items
            .iter()
            .filter(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&prefix))
            })
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == CONDITION && c.status == "True"))
            })
            .count();
        if done == pods {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{layout:?}: only {done} of {pods} pods got their condition"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let pods: usize = args
        .first()
        .map_or(100, |a| a.parse().expect("PODS: a number"));
    let seconds: u64 = args
        .get(1)
        .map_or(20, |a| a.parse().expect("SECONDS: a number"));
    let layouts: Vec<Layout> = if args.len() > 2 {
        args[2..].iter().map(|a| Layout::parse(a)).collect()
    } else {
        vec![
            Layout::Api,
            Layout::Kubelet,
            Layout::OwnDir,
            Layout::SharedDir,
        ]
    };
    let build = std::env::var("BUILD").unwrap_or_else(|_| "this".into());
    let binary = binary();
    println!(
        "bench_idle: {pods} sidecars per layout, {seconds} s window, binary {}",
        binary.display()
    );

    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || for _ in listener.incoming() {});
    let cp = ControlPlane::start().await.expect("real control plane");
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "games"}})).unwrap();
    Api::<Namespace>::all(cp.client())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace");
    testkit::real::sidecar_rbac::apply(&cp)
        .await
        .expect("the by-hand example's RBAC");
    let work = tempfile::tempdir().unwrap();

    let csv_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/perf/idle.csv");
    let new_file = !csv_path.exists();
    let mut csv = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&csv_path)
        .unwrap();
    if new_file {
        writeln!(
            csv,
            "build,layout,pods,window_s,cores_all,cores_per_1000_pods,rss_mib_per_sidecar"
        )
        .unwrap();
    }
    // Cores per 1 000 pods is also the sidecar's CPU in ms per second.
    println!(
        "{:<8} {:<11} {:>6} {:>12} {:>16} {:>14}",
        "build", "layout", "pods", "cores (all)", "cores/1000 pods", "RSS/sidecar"
    );
    for layout in layouts {
        let f = run_layout(
            &cp,
            work.path(),
            layout,
            pods,
            Duration::from_secs(seconds),
            port,
        )
        .await;
        let per_thousand = f.cores * 1000.0 / pods as f64;
        println!(
            "{build:<8} {:<11} {pods:>6} {:>12.3} {per_thousand:>16.3} {:>10.2} MiB",
            layout.name(),
            f.cores,
            f.rss_mib
        );
        writeln!(
            csv,
            "{build},{},{pods},{seconds},{:.4},{per_thousand:.4},{:.2}",
            layout.name(),
            f.cores,
            f.rss_mib
        )
        .unwrap();
    }
}
