//! Soak: the real podprobe binary with 20 probes (5 each of exec, tcp, http, grpc, period 1 s)
//! for at least 10 000 attempts against a real kube-apiserver, while targets flip, the fault
//! proxy in front of it injects faults (5xx, 429 with Retry-After, connection resets, ended
//! watches, a 30 s outage) and
//! another writer removes conditions now and then. Prints the process' RSS, open fds, threads
//! and zombie children at start, middle and end, flips vs status writes, and how many
//! conditions are wrong once everything settles (must be 0).
//!
//!     cargo build --release && cargo run --release --example soak_sidecar
//!
//! A program that prints figures, not a test (about 9 minutes).

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use podprobe::demo::{GamePort, serve_health};
use serde_json::json;
use testkit::faults::Fault;
use testkit::real::{ADMIN_TOKEN, ControlPlane, FaultProxy};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

const PER_KIND: usize = 5;
const ATTEMPTS: u64 = 10_000;
const NS: &str = "soak";
const POD: &str = "soak";

/// RSS (KiB), open fds, threads and zombie children of `pid`.
fn footprint(pid: u32) -> (u64, usize, u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let zombies = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            let after: Vec<&str> = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect();
            after.first() == Some(&"Z") && after.get(1) == Some(&pid.to_string().as_str())
        })
        .count();
    (field("VmRSS:"), fds, field("Threads:"), zombies)
}

/// The local targets; each probe's target can be flipped up or down.
struct Targets {
    dir: tempfile::TempDir,
    tcp: Vec<GamePort>,
    http: Vec<(Arc<AtomicBool>, u16)>,
    grpc: HealthReporter,
    grpc_port: u16,
    /// Condition type → expected status ("True"/"False").
    expected: BTreeMap<String, &'static str>,
}

impl Targets {
    async fn start() -> Targets {
        let dir = tempfile::tempdir().unwrap();
        let mut tcp = Vec::new();
        let mut http = Vec::new();
        for i in 0..PER_KIND {
            std::fs::write(dir.path().join(format!("flag-{i}")), "up").unwrap();
            tcp.push(GamePort::open(0).await.unwrap());
            let up = Arc::new(AtomicBool::new(true));
            http.push((up.clone(), serve_health(up).await.unwrap().port()));
        }
        let (grpc, service) = tonic_health::server::health_reporter();
        for i in 0..PER_KIND {
            grpc.set_service_status(format!("g{i}"), ServingStatus::Serving)
                .await;
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc_port = listener.local_addr().unwrap().port();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        let mut expected = BTreeMap::new();
        for kind in ["exec", "tcp", "http", "grpc"] {
            for i in 0..PER_KIND {
                expected.insert(format!("soak/{kind}-{i}"), "True");
            }
        }
        Targets {
            dir,
            tcp,
            http,
            grpc,
            grpc_port,
            expected,
        }
    }

    fn annotation(&self) -> String {
        let mut entries = Vec::new();
        for i in 0..PER_KIND {
            let flag = self.dir.path().join(format!("flag-{i}"));
            let probes = [
                json!({"exec": {"command": ["cat", flag]}}),
                json!({"tcpSocket": {"port": self.tcp[i].addr.port()}}),
                json!({"httpGet": {"path": "/healthz", "port": self.http[i].1}}),
                json!({"grpc": {"port": self.grpc_port, "service": format!("g{i}")}}),
            ];
            for (kind, mut probe) in ["exec", "tcp", "http", "grpc"].into_iter().zip(probes) {
                probe["periodSeconds"] = json!(1);
                entries.push(
                    json!({"name": format!("{kind}-{i}"), "containerName": "main",
                    "probe": probe, "podConditionType": format!("soak/{kind}-{i}")}),
                );
            }
        }
        serde_json::to_string(&entries).unwrap()
    }

    /// Flips the target of probe `n` (round-robin over all 20); returns its condition type.
    async fn flip(&mut self, n: usize) -> String {
        let (kind, i) = (["exec", "tcp", "http", "grpc"][n % 4], (n / 4) % PER_KIND);
        let condition = format!("soak/{kind}-{i}");
        let up = self.expected[&condition] == "False";
        match kind {
            "exec" => {
                let flag = self.dir.path().join(format!("flag-{i}"));
                if up {
                    std::fs::write(flag, "up").unwrap();
                } else {
                    std::fs::remove_file(flag).unwrap();
                }
            }
            "tcp" if up => self.tcp[i] = GamePort::open(self.tcp[i].addr.port()).await.unwrap(),
            "tcp" => self.tcp[i].close(),
            "http" => self.http[i].0.store(up, Ordering::Relaxed),
            _ => {
                let status = if up {
                    ServingStatus::Serving
                } else {
                    ServingStatus::NotServing
                };
                self.grpc.set_service_status(format!("g{i}"), status).await;
            }
        }
        self.expected
            .insert(condition.clone(), if up { "True" } else { "False" });
        condition
    }
}

/// The control plane and the proxy the sidecar reaches it through (faults and its requests).
struct Lab {
    proxy: FaultProxy,
    cp: ControlPlane,
}

impl Lab {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.cp.client(), NS)
    }

    /// Another writer drops every tcp condition, as an UpdateStatus without them would.
    async fn drop_tcp_conditions(&self) {
        let Ok(mut pod) = self.pods().get_status(POD).await else {
            return;
        };
        if let Some(conditions) = pod.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            conditions.retain(|c| !c.type_.starts_with("soak/tcp"));
        }
        // A conflict with the sidecar's write loses this round, as it would that writer's.
        let _ = self
            .pods()
            .replace_status(POD, &PostParams::default(), &pod)
            .await;
    }
}

async fn wrong_conditions(api: &Lab, expected: &BTreeMap<String, &str>) -> Vec<String> {
    let pod: Pod = api.pods().get(POD).await.expect("the pod");
    let conditions = pod.status.and_then(|s| s.conditions).unwrap_or_default();
    expected
        .iter()
        .filter(|(t, status)| {
            !conditions
                .iter()
                .any(|c| &c.type_ == *t && c.status == **status)
        })
        .map(|(t, status)| format!("{t} (want {status})"))
        .collect()
}

#[tokio::main]
async fn main() {
    let bin = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("podprobe");
    assert!(bin.exists(), "run `cargo build --release` first");
    let mut targets = Targets::start().await;
    let cp = ControlPlane::start().await.expect("a control plane");
    cp.create_namespace(NS).await.expect("the namespace");
    let proxy = FaultProxy::start(&cp).await.expect("the fault proxy");
    let api = Lab { proxy, cp };
    let kubeconfig = targets.dir.path().join("kubeconfig");
    api.proxy
        .write_kubeconfig_for_token(&kubeconfig, ADMIN_TOKEN)
        .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": POD, "namespace": NS, "annotations": {"kruise.io/podprobe": targets.annotation()}},
        "spec": {"nodeName": "vk", "containers": [{"name": "main", "image": "x"}]}
    }))
    .unwrap();
    api.pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let status = json!({"status": {"phase": "Running", "podIP": "127.0.0.1",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "main", "ready": true, "restartCount": 0, "image": "x",
            "imageID": "", "containerID": "containerd://1", "started": true,
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}});
    api.pods()
        .patch_status(POD, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let mut sidecar = Command::new(&bin)
        .args([
            "run",
            "--pod-name",
            POD,
            "--pod-namespace",
            NS,
            "--events=false",
            "--exec-mode=local",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = sidecar.id();
    let probes = (4 * PER_KIND) as u64;
    let duration = Duration::from_secs(ATTEMPTS / probes + 5);
    // "start" is once every probe has published: the first patch carries all 20.
    let written = api
        .proxy
        .journal()
        .wait_for_count("PATCH", "pods/status", 1, Duration::from_secs(30))
        .await;
    assert!(written, "the sidecar wrote nothing");
    let start = Instant::now();
    let mut samples = vec![("start", footprint(pid))];
    let (mut flips, mut overwrites) = (0usize, 0usize);
    let mut second = 0u64;
    while start.elapsed() < duration {
        tokio::time::sleep(Duration::from_secs(1)).await;
        second += 1;
        if second.is_multiple_of(3) {
            targets.flip(flips).await;
            flips += 1;
        }
        let faults = api.proxy.faults();
        match second {
            30 => faults.add(Fault::status(500).method("PATCH").times(3)),
            60 => faults.add(Fault::too_many_requests(2).method("PATCH").times(2)),
            90 => faults.add(Fault::reset().times(3)),
            120 => faults.add(Fault::end_watch_after(1).watch().times(3)),
            150 => api.proxy.stop().await,
            180 => api.proxy.restart().await.unwrap(),
            _ => {}
        }
        if second.is_multiple_of(45) && api.proxy.is_running() {
            api.drop_tcp_conditions().await;
            overwrites += 1;
        }
        if second == duration.as_secs() / 2 {
            samples.push(("middle", footprint(pid)));
        }
    }
    // Settle: everything flipped so far must be on the pod, as it is now.
    let settle = Instant::now();
    let mut wrong = wrong_conditions(&api, &targets.expected).await;
    while !wrong.is_empty() && settle.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        wrong = wrong_conditions(&api, &targets.expected).await;
    }
    samples.push(("end", footprint(pid)));
    let patches = api.proxy.journal().count("PATCH", "pods/status");
    let _ = sidecar.kill();
    let _ = sidecar.wait();

    println!(
        "podprobe soak: {probes} probes (5 exec, 5 tcp, 5 http, 5 grpc), period 1 s, {:?}",
        duration
    );
    println!(
        "≈ {} attempts; faults: 3×500, 2×429 Retry-After 2 s, 3 resets, 3 ended watches, 30 s outage",
        probes * duration.as_secs()
    );
    println!(
        "\n{:<8} {:>9} {:>8} {:>8} {:>8}",
        "sample", "RSS MiB", "open fds", "threads", "zombies"
    );
    for (name, (rss, fds, threads, zombies)) in &samples {
        println!(
            "{name:<8} {:>9.2} {fds:>8} {threads:>8} {zombies:>8}",
            *rss as f64 / 1024.0
        );
    }
    println!(
        "\ntarget flips: {flips} (one condition each); another writer's removals: {overwrites} (5 conditions each)"
    );
    println!("PATCH pods/status requests (faulted ones included): {patches}");
    println!(
        "settled in {:?}; conditions lost or out of order: {} {wrong:?}",
        settle.elapsed(),
        wrong.len()
    );
}
