//! The condition writer against a real kube-apiserver: what the apiserver refuses must not
//! hold back what it accepts. The sidecar never sends an unqualified condition type (its
//! validation skips such probes); here the writer is handed one directly, as a stand-in for
//! any condition the apiserver refuses with 422.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use podprobe::condition::writer::{ConditionWriter, WriterConfig};
use podprobe::metrics::Metrics;
use serde_json::json;
use support::real::RealCluster;
use support::*;
use tokio::sync::watch;

const LIMIT: Duration = Duration::from_secs(30);

fn cond(type_: &str, status: &str) -> PodCondition {
    serde_json::from_value(
        json!({"type": type_, "status": status, "reason": "PodProbeSucceeded",
        "message": "m", "lastProbeTime": "2026-11-23T00:00:00Z",
        "lastTransitionTime": "2026-11-23T00:00:00Z"}),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_condition_holds_back_nothing_before_or_after() {
    let cluster = RealCluster::start().await;
    let pod = cluster.create_pod("w", "[]", json!([])).await;
    let (_uid_tx, uid) = watch::channel(pod.metadata.uid.clone());
    let config = WriterConfig {
        coalesce: Duration::from_millis(50),
        backoff_min: Duration::from_millis(50),
        backoff_max: Duration::from_millis(400),
    };
    let metrics = Metrics::new();
    let (writer, _task) =
        ConditionWriter::spawn(cluster.pods(), "w".into(), uid, config, metrics.clone());

    // One patch with both: the apiserver refuses it whole; the writer then isolates.
    writer.submit(cond("game.kruise.io/a", "True"));
    writer.submit(cond("not a qualified name!", "True"));
    writer.submit(cond("game.kruise.io/b", "False"));
    let pod = cluster
        .wait_pod("w", LIMIT, |p| {
            has_status(p, "game.kruise.io/a", "True") && has_status(p, "game.kruise.io/b", "False")
        })
        .await;
    assert!(condition(&pod, "not a qualified name!").is_none());
    let refused: Vec<u16> = cluster
        .cp
        .audit()
        .unwrap()
        .iter()
        .filter(|e| e.is("patch", "pods/status", Some("w")))
        .map(|e| e.code())
        .collect();
    assert!(refused.contains(&422), "{refused:?}");

    // The refused one stays parked (retried with backoff) while later results still land.
    writer.submit(cond("game.kruise.io/a", "False"));
    cluster
        .wait_pod("w", LIMIT, |p| has_status(p, "game.kruise.io/a", "False"))
        .await;
    assert!(
        !writer.is_idle(),
        "the refused condition is still to be written"
    );
    assert!(!writer.flush(Duration::from_millis(300)).await);

    let text = metrics.encode();
    assert!(
        text.contains("podprobe_status_write_errors_total{code=\"422\"}"),
        "{text}"
    );
    let pod: Pod = cluster.pods().get("w").await.unwrap();
    assert!(has_status(&pod, "game.kruise.io/b", "False"));
}
