//! The sidecar's tests' support: the cluster (a real control plane, [`cluster`]), the pods they
//! create with the statuses a kubelet would report, the real `podprobe run` binary, and waits.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::Api;
use serde_json::{Value, json};

pub const NS: &str = "games";

pub mod cluster;
#[allow(unused_imports)]
pub use cluster::{Cluster, ProbedPod, SIDECAR_SA};
/// The real `podprobe run`, killed when dropped, its log printed when the test failed.
#[allow(unused_imports)]
pub use testkit::child::LoggedChild as Sidecar;
#[allow(unused_imports)]
pub use testkit::pod::{condition, has_status};

/// A pod in [`NS`] with the game container `main` (ports as given) and the sidecar, on node
/// `vk-1`, carrying `annotation`.
pub fn game_pod(name: &str, annotation: &str, ports: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS,
                     "annotations": {"kruise.io/podprobe": annotation}},
        "spec": {"nodeName": "vk-1", "containers": [
            {"name": "main", "image": "game:1", "ports": ports},
            {"name": "podprobe", "image": "podprobe:dev"}
        ]}
    }))
    .unwrap()
}

/// 2026-01-01T00:00:00Z: a container start long before any test.
pub fn long_ago() -> jiff::Timestamp {
    jiff::Timestamp::from_second(1_767_225_600).unwrap()
}

/// The status a kubelet reports for a running [`game_pod`]: IP, phase, both containers
/// started at `started_at` (`main` with `container_id`), and its four conditions.
pub fn running_status(container_id: &str, started_at: jiff::Timestamp) -> PodStatus {
    let started = podprobe::condition::kube_time(started_at);
    serde_json::from_value(json!({
        "phase": "Running",
        "podIP": "127.0.0.1",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": started},
            {"type": "Initialized", "status": "True", "lastTransitionTime": started},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": started},
            {"type": "Ready", "status": "True", "lastTransitionTime": started}
        ],
        "containerStatuses": [
            {"name": "main", "ready": true, "restartCount": 0, "image": "game:1",
             "imageID": "", "containerID": container_id, "started": true,
             "state": {"running": {"startedAt": started}}},
            {"name": "podprobe", "ready": true, "restartCount": 0, "image": "podprobe:dev",
             "imageID": "", "containerID": "containerd://sidecar", "started": true,
             "state": {"running": {"startedAt": started}}}
        ]
    }))
    .unwrap()
}

/// Starts `podprobe run` for pod `name` in [`NS`] with `extra` flags against the cluster of
/// `kubeconfig`; its log goes to a file in `dir` (printed by [`Sidecar`]'s drop when a test
/// fails).
pub fn start_sidecar(dir: &Path, kubeconfig: &Path, name: &str, extra: &[&str]) -> Sidecar {
    let log = dir.join(format!("{name}-{}.log", rand_suffix()));
    let stderr = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_podprobe"))
        .args(["run", "--pod-name", name, "--pod-namespace", NS])
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "podprobe=debug,info")
        .env_remove("POD_UID")
        .env_remove("POD_IP")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start podprobe run");
    Sidecar::new(child, log)
}

/// Waits (watching the pod, up to `limit`) until `check` holds for it.
pub async fn wait_for_pod(
    pods: &Api<Pod>,
    name: &str,
    limit: Duration,
    check: impl Fn(&Pod) -> bool,
) -> Pod {
    testkit::wait::pod(pods, name, "the awaited state", limit, check).await
}

#[allow(unused_imports)]
pub use testkit::wait::until as wait_until;

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

pub fn file_probe(name: &str, condition_type: &str, flag: &Path) -> String {
    let script = format!(
        "if [ -f {f} ]; then cat {f}; else echo down >&2; exit 1; fi",
        f = flag.display()
    );
    json!({"name": name, "containerName": "main",
           "probe": {"exec": {"command": ["sh", "-c", script]}, "periodSeconds": 1},
           "podConditionType": condition_type})
    .to_string()
}

pub fn array(entries: &[String]) -> String {
    format!("[{}]", entries.join(","))
}

/// A free port for a server the test starts (outside the ephemeral range: see testkit::port).
pub fn free_port() -> u16 {
    testkit::port::free_port().unwrap()
}

/// GET on the sidecar's metrics endpoint.
pub async fn metrics(port: u16) -> Option<String> {
    http_get(port, "/metrics").await
}

/// The HTTP status code of a GET on the sidecar's endpoints (`/readyz`, `/healthz`).
pub async fn status_code(port: u16, path: &str) -> Option<u16> {
    let response = http_get(port, path).await?;
    response.split_whitespace().nth(1)?.parse().ok()
}

/// A plain HTTP/1.1 GET on 127.0.0.1:`port`; the whole response, headers included.
async fn http_get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await.ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    Some(out)
}

/// CPU time (user + system) a process has used so far.
pub fn cpu_time(pid: nix::unistd::Pid) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    // /proc counts in USER_HZ, which the kernel ABI fixes at 100 on x86_64 and arm64.
    Duration::from_millis(ticks * 10)
}

/// The sum of `family`'s series for `condition` in a /metrics text (0 without any).
pub fn condition_metric(text: &str, family: &str, condition: &str) -> f64 {
    let label = format!("condition=\"{condition}\"");
    text.lines()
        .filter(|l| l.starts_with(family) && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Attempts counted so far for a condition type (all results), from /metrics.
pub async fn attempts(port: u16, condition: &str) -> u64 {
    let Some(text) = metrics(port).await else {
        return 0;
    };
    condition_metric(&text, "podprobe_probe_attempts_total", condition) as u64
}

/// Waits until `condition` has had at least `n` attempts (the sidecar's own count).
pub async fn wait_attempts(port: u16, condition: &str, n: u64) {
    let wait = async {
        while attempts(port, condition).await < n {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(n + 30), wait)
        .await
        .unwrap_or_else(|_| panic!("{condition}: fewer than {n} attempts"));
}
