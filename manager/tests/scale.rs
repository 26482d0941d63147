//! 10 000 serverless pods on a real kube-apiserver, all in steady state: starting the manager
//! costs no pod patch, and one condition change costs exactly one.

mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use support::*;

/// Pods created at once: enough to keep both cores busy, few enough not to queue in the
/// apiserver's max-in-flight.
const CONCURRENT_CREATES: usize = 32;

fn pods_n() -> usize {
    std::env::var("SCALE_pods")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_condition_change_among_10000_pods_is_one_patch() {
    let pods = pods_n();
    let cluster = Tv03Cluster::with_tv03().await;
    let t = Instant::now();
    futures::stream::iter(0..pods)
        .map(|i| cluster.create_steady_pod(i, true))
        .buffer_unordered(CONCURRENT_CREATES)
        .collect::<Vec<_>>()
        .await;
    eprintln!("created {pods} pods in {:?}", t.elapsed());

    let dir = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let s = cluster.start_manager(dir.path()).await;
    let metrics = s.manager.metrics.clone();
    let mut last = 0;
    eventually(
        Duration::from_secs(120),
        "every pod reconciled once",
        || {
            let n = metrics.pod_reconciles.get();
            if n / 1000 != last / 1000 {
                eprintln!("{:?}: {n}", t.elapsed());
            }
            last = n;
            n >= pods as u64
        },
    )
    .await;
    eprintln!("initial reconcile of {pods} pods in {:?}", t.elapsed());
    // Let stragglers (PPM-cache announcements, status) settle.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(cluster.pod_patches(), 0, "steady state costs no pod patch");

    cluster.proxy.journal().clear();
    let t = Instant::now();
    cluster.set_healthy("gs-4242", false).await;
    let pods = cluster.pods();
    let marked = tokio::time::timeout(
        Duration::from_secs(10),
        kube::runtime::wait::await_condition(pods, "gs-4242", |p: Option<&Pod>| {
            p.and_then(|p| label(p, "server-healthy")).as_deref() == Some("false")
        }),
    )
    .await;
    assert!(marked.is_ok(), "marker followed the condition");
    eprintln!("marked in {:?}", t.elapsed());
    tokio::time::sleep(Duration::from_millis(700)).await;
    let patches = cluster.proxy.journal().matching("PATCH", "pods");
    assert_eq!(patches.len(), 1, "{patches:#?}");
    assert!(patches[0].path.ends_with("/pods/gs-4242"));
    let body = patches[0].json();
    assert_eq!(body["metadata"]["labels"]["server-healthy"], "false");
    let uid = cluster.pod("gs-4242").await.metadata.uid;
    assert_eq!(
        body["metadata"]["uid"].as_str(),
        uid.as_deref(),
        "uid precondition"
    );
    s.manager.shutdown().await;
}
