//! The condition writer against a real kube-apiserver: what the apiserver refuses must not
//! hold back what it accepts. The sidecar never sends an unqualified condition type (its
//! validation skips such probes); here the writer is handed one directly, as a stand-in for
//! any condition the apiserver refuses with 422.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use podprobe::condition::writer::{ApiserverAnswered, ConditionWriter, WriterConfig};
use podprobe::metrics::Metrics;
use serde_json::json;
use support::*;
use tokio::sync::watch;

const LIMIT: Duration = Duration::from_secs(30);

/// A writer that owns the status of pod `w` (created here) with short retry timings, as the
/// sidecar's; the uid sender and the task must live as long as the test.
struct Writing {
    writer: ConditionWriter,
    metrics: Metrics,
    _uid: watch::Sender<Option<String>>,
    _task: tokio::task::JoinHandle<()>,
}

async fn writer_for_new_pod(cluster: &Cluster) -> Writing {
    let pod = cluster.create_pod("w", "[]", json!([])).await;
    let (uid_tx, uid) = watch::channel(pod.metadata.uid.clone());
    let config = WriterConfig {
        coalesce: Duration::from_millis(50),
        retry: podprobe_ops::backoff::Policy {
            min: Duration::from_millis(50),
            unavailable_max: Duration::from_millis(400),
            refused_max: Duration::from_millis(400),
            throttled_min: Duration::from_millis(50),
            throttled_max: Duration::from_millis(400),
        },
    };
    let metrics = Metrics::new();
    let (writer, task) = ConditionWriter::spawn(
        cluster.pods(),
        "w".into(),
        uid,
        config,
        metrics.clone(),
        ApiserverAnswered::default(),
    );
    Writing {
        writer,
        metrics,
        _uid: uid_tx,
        _task: task,
    }
}

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
    let cluster = Cluster::start().await;
    let writing = writer_for_new_pod(&cluster).await;
    let (writer, metrics) = (&writing.writer, &writing.metrics);

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

/// A prune the apiserver refuses (here a ValidatingAdmissionPolicy like the chart's, which lets
/// the sidecar remove only condition types its annotation declares) is given up and holds back
/// no result: deletes never share a patch with sets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_prune_holds_back_nothing_and_is_not_retried() {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    use kube::Api;
    use kube::api::{Patch, PatchParams, PostParams};

    let cluster = Cluster::start().await;
    let writing = writer_for_new_pod(&cluster).await;
    let writer = &writing.writer;
    writer.submit(cond("game.kruise.io/kept", "True"));
    cluster
        .wait_pod("w", LIMIT, |p| has_status(p, "game.kruise.io/kept", "True"))
        .await;

    let admin = cluster.cp.client();
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": "keep-kept"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["UPDATE"], "resources": ["pods/status"]}]},
            "validations": [{"expression":
                "!has(oldObject.status.conditions) || oldObject.status.conditions.all(o, o.type != 'game.kruise.io/kept' || (has(object.status.conditions) && object.status.conditions.exists(c, c.type == o.type)))",
                "message": "game.kruise.io/kept may not be removed", "reason": "Forbidden"}]
        }
    }))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": "keep-kept"},
        "spec": {"policyName": "keep-kept", "validationActions": ["Deny"]}
    }))
    .unwrap();
    Api::<ValidatingAdmissionPolicy>::all(admin.clone())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    // The policy is enforced once a dry-run removal is refused.
    let removal =
        json!({"status": {"conditions": [{"type": "game.kruise.io/kept", "$patch": "delete"}]}});
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let enforced = async {
        while cluster
            .pods()
            .patch_status("w", &dry_run, &Patch::Strategic(&removal))
            .await
            .is_ok()
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(LIMIT, enforced)
        .await
        .expect("policy enforced");

    // A prune and a result, queued together.
    writer.delete("game.kruise.io/kept");
    writer.submit(cond("game.kruise.io/new", "True"));
    let pod = cluster
        .wait_pod("w", LIMIT, |p| has_status(p, "game.kruise.io/new", "True"))
        .await;
    assert!(
        has_status(&pod, "game.kruise.io/kept", "True"),
        "the refused prune left it"
    );
    assert!(
        writer.flush(LIMIT).await,
        "a refused prune is given up, not retried forever"
    );
}
