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
    writer_for_new_pod_with(cluster, config).await
}

async fn writer_for_new_pod_with(cluster: &Cluster, config: WriterConfig) -> Writing {
    let pod = cluster.create_pod("w", "[]", json!([])).await;
    let (uid_tx, uid) = watch::channel(pod.metadata.uid.clone());
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
    let cluster = Cluster::start().await;
    let writing = writer_for_new_pod(&cluster).await;
    let writer = &writing.writer;
    writer.submit(cond("game.kruise.io/kept", "True"));
    cluster
        .wait_pod("w", LIMIT, |p| has_status(p, "game.kruise.io/kept", "True"))
        .await;

    let removal =
        json!({"status": {"conditions": [{"type": "game.kruise.io/kept", "$patch": "delete"}]}});
    let policy = Refusal {
        name: "keep-kept",
        expression: "!has(oldObject.status.conditions) || oldObject.status.conditions.all(o, o.type != 'game.kruise.io/kept' || (has(object.status.conditions) && object.status.conditions.exists(c, c.type == o.type)))",
        message: "game.kruise.io/kept may not be removed",
        refused: removal,
    };
    policy.enforce(&cluster).await;

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

/// A stopping sidecar's last result lands although its write was waiting out the backoff of
/// refusals (the production policy: the wait doubles to a minute): the flush sends it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_writes_the_last_result_although_its_write_was_backing_off() {
    let cluster = Cluster::start().await;
    let writing = writer_for_new_pod_with(&cluster, WriterConfig::default()).await;
    let writer = &writing.writer;
    let last = json!({"status": {"conditions": [cond("game.kruise.io/last", "True")]}});
    let policy = Refusal {
        name: "refuse-last",
        expression: "!has(object.status.conditions) || !object.status.conditions.exists(c, c.type == 'game.kruise.io/last')",
        message: "game.kruise.io/last is refused for now",
        refused: last,
    };
    policy.enforce(&cluster).await;

    writer.submit(cond("game.kruise.io/last", "True"));
    // Six refusals in a row (about 3 to 6 s): the writer now waits 3.2 to 6.4 s before the
    // next attempt, far past the sidecar's 900 ms flush at SIGTERM.
    let six_refusals = async {
        loop {
            let refused = cluster
                .cp
                .audit()
                .unwrap()
                .iter()
                .filter(|e| e.is("patch", "pods/status", Some("w")) && e.code() == 403)
                .count();
            if refused >= 6 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(LIMIT, six_refusals)
        .await
        .expect("six refused writes");
    policy.lift(&cluster).await;

    assert!(
        writer.flush(Duration::from_millis(900)).await,
        "the last result was not written within the sidecar's flush"
    );
    let pod: Pod = cluster.pods().get("w").await.unwrap();
    assert!(has_status(&pod, "game.kruise.io/last", "True"));
}

/// A ValidatingAdmissionPolicy (and its binding) `name` that refuses, as Forbidden (403), a
/// status update of pod `w` for which `expression` is false; `refused` is a status patch it
/// refuses, tried as a dry run to see it in force or lifted.
struct Refusal {
    name: &'static str,
    expression: &'static str,
    message: &'static str,
    refused: serde_json::Value,
}

impl Refusal {
    async fn enforce(&self, cluster: &Cluster) {
        use k8s_openapi::api::admissionregistration::v1::{
            ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        };
        use kube::Api;
        use kube::api::PostParams;

        let admin = cluster.cp.client();
        let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "metadata": {"name": self.name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["UPDATE"], "resources": ["pods/status"]}]},
                "validations": [{"expression": self.expression, "message": self.message,
                                 "reason": "Forbidden"}]
            }
        }))
        .unwrap();
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
            "metadata": {"name": self.name},
            "spec": {"policyName": self.name, "validationActions": ["Deny"]}
        }))
        .unwrap();
        Api::<ValidatingAdmissionPolicy>::all(admin.clone())
            .create(&PostParams::default(), &policy)
            .await
            .unwrap();
        Api::<ValidatingAdmissionPolicyBinding>::all(admin)
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
        self.wait_until_refused(cluster, true).await;
    }

    /// Deletes the binding; returns once the refused patch is accepted (as a dry run).
    async fn lift(&self, cluster: &Cluster) {
        use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
        use kube::Api;
        use kube::api::DeleteParams;

        Api::<ValidatingAdmissionPolicyBinding>::all(cluster.cp.client())
            .delete(self.name, &DeleteParams::default())
            .await
            .unwrap();
        self.wait_until_refused(cluster, false).await;
    }

    async fn wait_until_refused(&self, cluster: &Cluster, refused: bool) {
        use kube::api::{Patch, PatchParams};

        let dry_run = PatchParams {
            dry_run: true,
            ..PatchParams::default()
        };
        let settled = async {
            while cluster
                .pods()
                .patch_status("w", &dry_run, &Patch::Strategic(&self.refused))
                .await
                .is_ok()
                == refused
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(LIMIT, settled)
            .await
            .unwrap_or_else(|_| panic!("policy {} in force: {refused}", self.name));
    }
}
