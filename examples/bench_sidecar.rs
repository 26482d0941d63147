//! Footprint of the real podprobe binary with 10 probes (4 exec, 3 tcp, 3 http, period 1 s):
//! RSS and CPU in `check` mode (no cluster) and in `run` mode against a real kube-apiserver (the
//! fault proxy in front counts the writes), and apiserver writes per transition and per hour at
//! steady state. Then `run` mode with 1 to 40 probes (the
//! same mix), whose RSS and CPU also go to `docs/perf/sidecar.csv` (plotted by
//! `cargo run --example plot_perf`).
//!
//!     cargo build --release && cargo run --release --example bench_sidecar
//!
//! The image's build: `cargo build --profile sidecar --no-default-features --target
//! x86_64-unknown-linux-musl`, then `PODPROBE_BIN=target/x86_64-unknown-linux-musl/sidecar/podprobe`.
//!
//! A program that prints figures, not a test.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::real::{ADMIN_TOKEN, ControlPlane, FaultProxy};

const STEADY: Duration = Duration::from_secs(20);
/// The measuring window of each point of the sweep by number of probes.
const SWEEP_WINDOW: Duration = Duration::from_secs(10);

fn binary() -> PathBuf {
    // PODPROBE_BIN measures another build (e.g. the static musl one the image ships).
    if let Some(bin) = std::env::var_os("PODPROBE_BIN") {
        return PathBuf::from(bin);
    }
    // target/release/examples/bench_sidecar -> target/release/podprobe
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(|p| p.parent()).expect("target dir");
    let bin = dir.join("podprobe");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release` first",
        bin.display()
    );
    bin
}

/// (VmRSS, VmHWM, RssAnon, RssFile) of a process, in KiB.
fn memory(pid: u32) -> (u64, u64, u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (
        field("VmRSS:"),
        field("VmHWM:"),
        field("RssAnon:"),
        field("RssFile:"),
    )
}

/// utime + stime of a process, in clock ticks (100 Hz on Linux).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    // fields[0] is state (field 3); utime is field 14, stime field 15, cutime 16, cstime 17.
    let get = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    get(14) + get(15) + get(16) + get(17)
}

/// `n` probes, period 1 s, in the mix 4 exec : 3 tcp : 3 http; exec probe `i` reads
/// `flag_dir/flag-i`, which is created here.
fn annotation(flag_dir: &std::path::Path, tcp: u16, http: u16, n: usize) -> String {
    const MIX: [&str; 10] = [
        "exec", "exec", "tcp", "http", "exec", "tcp", "http", "exec", "tcp", "http",
    ];
    std::fs::create_dir_all(flag_dir).unwrap();
    let entries: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let mut probe = match MIX[i % MIX.len()] {
                "exec" => {
                    let flag = flag_dir.join(format!("flag-{i}"));
                    std::fs::write(&flag, "up").unwrap();
                    json!({"exec": {"command": ["sh", "-c", format!("cat {}", flag.display())]}})
                }
                "tcp" => json!({"tcpSocket": {"port": tcp}}),
                _ => json!({"httpGet": {"path": "/healthz", "port": http}}),
            };
            probe["periodSeconds"] = json!(1);
            json!({"name": format!("p-{i}"), "containerName": "main", "probe": probe,
                   "podConditionType": format!("bench/p-{i}")})
        })
        .collect();
    serde_json::to_string(&entries).unwrap()
}

struct Measured {
    rss_kib: u64,
    hwm_kib: u64,
    anon_kib: u64,
    file_kib: u64,
    cpu_ms_per_s: f64,
}

fn measure(child: &Child, window: Duration) -> Measured {
    let pid = child.id();
    let t0 = cpu_ticks(pid);
    let start = Instant::now();
    std::thread::sleep(window);
    let cpu_ms = (cpu_ticks(pid) - t0) as f64 * 10.0;
    let (rss, hwm, anon, file) = memory(pid);
    Measured {
        rss_kib: rss,
        hwm_kib: hwm,
        anon_kib: anon,
        file_kib: file,
        cpu_ms_per_s: cpu_ms / start.elapsed().as_secs_f64(),
    }
}

#[tokio::main]
async fn main() {
    let bin = binary();
    let dir = tempfile::tempdir().unwrap();
    let tcp = podprobe::demo::GamePort::open(0).await.unwrap();
    let http = podprobe::demo::serve_health(Arc::new(AtomicBool::new(true)))
        .await
        .unwrap();
    let value = annotation(&dir.path().join("check"), tcp.addr.port(), http.port(), 10);

    // Baseline: the same binary doing nothing but waiting (check of an empty-ish set is not
    // possible, so `podprobe run` before it has a client: it sleeps in its retry loop).
    let mut idle = Command::new(&bin)
        .args(["run", "--pod-name", "x", "--pod-namespace", "y"])
        .env("KUBECONFIG", dir.path().join("missing"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let baseline = measure(&idle, Duration::from_secs(3));
    let _ = idle.kill();
    let _ = idle.wait();

    // check mode: 10 probes, no cluster.
    let file = dir.path().join("probes.json");
    std::fs::write(&file, &value).unwrap();
    let mut check = Command::new(&bin)
        .args(["check", file.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let checked = measure(&check, Duration::from_secs(10));
    let _ = check.kill();
    let _ = check.wait();

    // run mode against a real kube-apiserver (through the fault proxy, which counts the
    // sidecar's writes), 10 probes, then one transition.
    let cp = ControlPlane::start().await.expect("a control plane");
    cp.create_namespace("bench").await.expect("namespace bench");
    let proxy = FaultProxy::start(&cp).await.expect("the fault proxy");
    let api = Lab { cp, proxy };
    let kubeconfig = dir.path().join("kubeconfig");
    api.proxy
        .write_kubeconfig_for_token(&kubeconfig, ADMIN_TOKEN)
        .unwrap();
    let flags = dir.path().join("run-10");
    let value = annotation(&flags, tcp.addr.port(), http.port(), 10);
    let mut run = start_run(&bin, &api, &kubeconfig, "bench-10", &value).await;
    let writes_start = api.journal().count("PATCH", "pods/status");
    let steady = measure(&run, STEADY);
    let writes_steady = api.journal().count("PATCH", "pods/status") - writes_start;

    // One transition.
    std::fs::remove_file(flags.join("flag-0")).unwrap();
    let before = api.journal().count("PATCH", "pods/status");
    api.journal()
        .wait_for_count("PATCH", "pods/status", before + 1, Duration::from_secs(10))
        .await;
    std::thread::sleep(Duration::from_secs(3));
    let per_transition = api.journal().count("PATCH", "pods/status") - before;
    let _ = run.kill();
    let _ = run.wait();

    let per_hour = writes_steady as f64 * 3600.0 / STEADY.as_secs_f64();
    println!("podprobe footprint, 10 probes (4 exec, 3 tcp, 3 http), period 1 s, release build\n");
    println!(
        "{:<34} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "process", "RSS MiB", "peak MiB", "anon MiB", "file MiB", "CPU ms/s"
    );
    for (name, m) in [
        ("baseline: run, no cluster, idle", &baseline),
        ("check (no cluster)", &checked),
        ("run against kube-apiserver (steady)", &steady),
    ] {
        let mib = |kib: u64| kib as f64 / 1024.0;
        println!(
            "{:<34} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
            name,
            mib(m.rss_kib),
            mib(m.hwm_kib),
            mib(m.anon_kib),
            mib(m.file_kib),
            m.cpu_ms_per_s
        );
    }
    println!(
        "\nrun RSS / idle baseline RSS: {:.2}x   (target: ≤ 4 MiB with 10 probes)",
        steady.rss_kib as f64 / baseline.rss_kib.max(1) as f64
    );
    // File-backed pages are the binary's text in the page cache: one copy per node for every
    // pod running the same image. Anonymous memory is what each pod adds on its own.
    println!(
        "per pod, unshared (anon) in run mode: {:.2} MiB; shared text (file): {:.2} MiB",
        steady.anon_kib as f64 / 1024.0,
        steady.file_kib as f64 / 1024.0
    );
    println!(
        "CPU per probe attempt in run mode: {:.3} ms (10 attempts/s, exec children included)",
        steady.cpu_ms_per_s / 10.0
    );
    println!(
        "apiserver writes in {}s of steady state: {writes_steady} (→ {per_hour:.0} per hour; target 0)",
        STEADY.as_secs()
    );
    println!("apiserver writes for one transition: {per_transition} (target 1)");

    // By number of probes.
    println!("\nrun mode by number of probes (same mix):");
    println!(
        "{:>7} {:>9} {:>9} {:>9} {:>10}",
        "probes", "RSS MiB", "anon MiB", "CPU ms/s", "ms/attempt"
    );
    let mut csv =
        String::from("probes,rss_mib,anon_mib,file_mib,cpu_ms_per_s,cpu_ms_per_attempt\n");
    for n in [1, 5, 10, 20, 40] {
        let value = annotation(
            &dir.path().join(format!("sweep-{n}")),
            tcp.addr.port(),
            http.port(),
            n,
        );
        let mut child = start_run(&bin, &api, &kubeconfig, &format!("sweep-{n}"), &value).await;
        let m = measure(&child, SWEEP_WINDOW);
        let _ = child.kill();
        let _ = child.wait();
        let mib = |kib: u64| kib as f64 / 1024.0;
        let per_attempt = m.cpu_ms_per_s / n as f64;
        println!(
            "{n:>7} {:>9.2} {:>9.2} {:>9.2} {per_attempt:>10.3}",
            mib(m.rss_kib),
            mib(m.anon_kib),
            m.cpu_ms_per_s
        );
        csv.push_str(&format!(
            "{n},{:.3},{:.3},{:.3},{:.3},{per_attempt:.4}\n",
            mib(m.rss_kib),
            mib(m.anon_kib),
            mib(m.file_kib),
            m.cpu_ms_per_s
        ));
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/perf/sidecar.csv");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::write(&out, csv).unwrap();
    println!("figures written to {}", out.display());
}

/// Creates pod `name` in namespace `bench` with `value` as its annotation, reports it running,
/// starts `podprobe run` for it and returns once its first status write landed and 3 s passed.
/// The control plane and the proxy the sidecars reach it through.
struct Lab {
    proxy: FaultProxy,
    cp: ControlPlane,
}

impl Lab {
    /// The sidecars' requests.
    fn journal(&self) -> &testkit::Journal {
        self.proxy.journal()
    }
}

async fn start_run(
    bin: &std::path::Path,
    api: &Lab,
    kubeconfig: &std::path::Path,
    name: &str,
    value: &str,
) -> Child {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "bench", "annotations": {"kruise.io/podprobe": value}},
        "spec": {"nodeName": "vk", "containers": [{"name": "main", "image": "x"}]}
    }))
    .unwrap();
    let pods: kube::Api<Pod> = kube::Api::namespaced(api.cp.client(), "bench");
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let status = json!({"status": {"phase": "Running", "podIP": "127.0.0.1",
        "containerStatuses": [{"name": "main", "ready": true, "restartCount": 0, "image": "x", "imageID": "",
            "containerID": "containerd://1", "started": true,
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let before = api.journal().count("PATCH", "pods/status");
    let child = Command::new(bin)
        .args([
            "run",
            "--pod-name",
            name,
            "--pod-namespace",
            "bench",
            "--events=false",
        ])
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let settled = api
        .journal()
        .wait_for_count("PATCH", "pods/status", before + 1, Duration::from_secs(30))
        .await;
    assert!(settled, "the sidecar for {name} wrote nothing");
    std::thread::sleep(Duration::from_secs(3));
    child
}
