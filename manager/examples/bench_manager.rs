//! Manager benchmark (a program, not a test): prints figures.
//!
//! 1. Webhook latency: AdmissionReviews for `/mutate-pods` (TV-03 PPM + injection, so every
//!    answer carries a patch) at a fixed rate over keep-alive HTTPS connections, as the
//!    apiserver sends them; p50/p99/max. Target p99 ≤ 5 ms.
//! 2. Marker throughput: N serverless pods on a real kube-apiserver (etcd, the chart's CRD; the
//!    manager in-process, through the fault proxy that journals its patches) in steady state;
//!    flip one condition on each as fast as the sidecars would (CONCURRENT_FLIPS at a time),
//!    and time until every marker patch landed. Target ≥ 2 000 changes/s, exactly one patch
//!    per change. Run for 500, 2 000, 5 000 and PODS pods; the figures also go to
//!    `docs/perf/manager_markers.csv` (plotted by `cargo run --example plot_perf`). The
//!    apiserver, etcd and the manager share this machine's cores.
//!
//! `cargo run --release -p podprobe-manager --example bench_manager [-- RATE SECONDS PODS]`

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use podprobe_manager::webhook::{MUTATE_PODS_PATH, Mode};
use support::*;

/// Pods created, and conditions flipped, at once: as many sidecars writing together.
const CONCURRENT_FLIPS: usize = 32;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let rate = support::bench_arg(1, 500);
    let seconds = support::bench_arg(2, 5);
    let pods = support::bench_arg(3, 10_000) as usize;

    // ---- webhook latency ----
    let cluster = Tv03Cluster::with_tv03().await;
    let dir = tempfile::tempdir().unwrap();
    let client = cluster.manager_client();
    let s = start_manager(
        client,
        dir.path(),
        Mode::Standalone,
        None,
        Some(injection()),
    )
    .await;
    while s.manager.ppms.namespace("test").is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut pod = app_pod("bench", "test");
    pod.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("podprobe.io/inject".into(), "enabled".into());
    let body = serde_json::to_vec(&pod_review(&pod, "test")).unwrap();
    // 4 connections, round robin, like an apiserver's small pool.
    let conns = 4;
    let total = (rate * seconds) as usize;
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let mut handles = Vec::new();
    let start = Instant::now() + Duration::from_millis(100);
    for c in 0..conns {
        let addr = s.manager.webhook_addr;
        let ca = s.cert.cert_pem.clone();
        let body = body.clone();
        handles.push(tokio::spawn(async move {
            let mut client = HttpsClient::connect(addr, &ca).await.unwrap();
            // Warm-up.
            for _ in 0..20 {
                client.post(MUTATE_PODS_PATH, body.clone()).await;
            }
            let mut lat = Vec::new();
            let mut i = c;
            while i < total {
                let at = start + interval * i as u32;
                tokio::time::sleep_until(at.into()).await;
                let t = Instant::now();
                let (status, _) = client.post(MUTATE_PODS_PATH, body.clone()).await;
                assert_eq!(status, 200);
                lat.push(t.elapsed());
                i += conns;
            }
            lat
        }));
    }
    let mut lat: Vec<Duration> = Vec::new();
    for h in handles {
        lat.extend(h.await.unwrap());
    }
    lat.sort();
    println!(
        "webhook /mutate-pods: {} requests at {rate}/s over HTTPS keep-alive: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms (target p99 <= 5 ms)",
        lat.len(),
        percentile(&lat, 0.50).as_secs_f64() * 1e3,
        percentile(&lat, 0.99).as_secs_f64() * 1e3,
        lat.last().unwrap().as_secs_f64() * 1e3,
    );
    s.manager.shutdown().await;
    drop(cluster);

    // ---- marker throughput, by number of pods ----
    let mut csv = String::from("pods,changes,seconds,changes_per_s,pod_patches\n");
    for n in [500, 2_000, 5_000, pods] {
        let (elapsed, patches) = marker_throughput(n, dir.path()).await;
        csv.push_str(&format!(
            "{n},{n},{:.3},{:.0},{patches}\n",
            elapsed.as_secs_f64(),
            n as f64 / elapsed.as_secs_f64()
        ));
    }
    let out =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/perf/manager_markers.csv");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::write(&out, csv).unwrap();
    println!("figures written to {}", out.display());
}

/// `pods` serverless pods in steady state, one condition flipped on each: how long until every
/// marker patch landed, and how many pod patches were sent.
async fn marker_throughput(pods: usize, dir: &std::path::Path) -> (Duration, usize) {
    let cluster = Tv03Cluster::with_tv03().await;
    futures::stream::iter(0..pods)
        .map(|i| cluster.create_steady_pod(i, true))
        .buffer_unordered(CONCURRENT_FLIPS)
        .collect::<Vec<_>>()
        .await;
    let s = cluster.start_manager(dir).await;
    while s.manager.metrics.pod_reconciles.get() < pods as u64 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let journal = cluster.proxy.journal();
    journal.clear();
    let t = Instant::now();
    let names: Vec<String> = (0..pods).map(|i| format!("gs-{i}")).collect();
    futures::stream::iter(&names)
        .map(|name| cluster.set_healthy(name, false))
        .buffer_unordered(CONCURRENT_FLIPS)
        .collect::<Vec<_>>()
        .await;
    let flipped = t.elapsed();
    let done = journal
        .wait_for_count("PATCH", "pods", pods, Duration::from_secs(120))
        .await;
    let elapsed = t.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let patches = journal.count("PATCH", "pods");
    println!(
        "markers: {pods} condition changes (written in {:.2} s) handled in {:.2} s = {:.0} changes/s, {patches} pod patches{} (target >= 2000/s, one patch per change)",
        flipped.as_secs_f64(),
        elapsed.as_secs_f64(),
        pods as f64 / elapsed.as_secs_f64(),
        if done { "" } else { " (TIMED OUT)" },
    );
    if patches != pods {
        report_extra_patches(journal);
    }
    s.manager.shutdown().await;
    (elapsed, patches)
}

/// The writes of the run other than pod patches (what else could have triggered reconciles),
/// and every pod that got more than one patch: the bodies and answers, to tell a double write
/// from a retry.
fn report_extra_patches(journal: &testkit::Journal) {
    for e in journal.entries() {
        let pod_patch = e.method == "PATCH" && e.path.contains("/pods/");
        if e.method != "GET" && !pod_patch {
            println!(
                "  other write #{} {} {} {} -> {} {}",
                e.seq, e.time, e.method, e.path, e.status, e.body
            );
        }
    }
    let mut by_pod: std::collections::BTreeMap<String, Vec<testkit::journal::Entry>> =
        Default::default();
    for e in journal.matching("PATCH", "pods") {
        by_pod.entry(e.path.clone()).or_default().push(e);
    }
    for (path, entries) in by_pod.iter().filter(|(_, v)| v.len() > 1) {
        println!("  {path}: {} patches", entries.len());
        for e in entries {
            println!(
                "    #{} {} status {}{} {}",
                e.seq,
                e.time,
                e.status,
                if e.fault { " (fault)" } else { "" },
                e.body
            );
        }
    }
}
