//! The chart's ValidatingAdmissionPolicy for the sidecar, enforced by a real kube-apiserver:
//! the policy and the sidecar's RBAC rendered by the real helm and applied, then the cases of
//! `admission_policy.rs` (where the `cel` crate stands in) sent as real requests with real
//! tokens. The apiserver type-checks the CEL against the Pod schema when the policy is
//! created; a warning there fails the test.

mod cluster;

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use testkit::real::ControlPlane;

const NS: &str = "games";
const SA: &str = "podprobe-sidecar";
const POLICY: &str = "podprobe-sidecar-pod-status";
const LIMIT: Duration = Duration::from_secs(60);
const PROBES: &str = r#"[{"name":"healthy","containerName":"game","probe":{"tcpSocket":{"port":"game"},"periodSeconds":5},"podConditionType":"game.kruise.io/healthy"}]"#;

/// A pod on a node, running as the sidecar's account, with the kubelet's conditions.
async fn pod(cp: &ControlPlane, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "game"},
                     "annotations": {"kruise.io/podprobe": PROBES}},
        "spec": {"nodeName": "vk-1", "serviceAccountName": SA,
                 "containers": [{"name": "game", "image": "game:1"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let status = json!({"status": {"phase": "Running", "podIP": "10.0.0.7", "conditions": [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "True"},
        {"type": "ContainersReady", "status": "True"}
    ]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(&status))
        .await
        .unwrap()
}

fn condition(type_: &str) -> Value {
    json!({"type": type_, "status": "True", "reason": "PodProbeSucceeded"})
}

/// The sidecar's write: a strategic merge of conditions with the uid.
fn sidecar_patch(pod: &Pod, conditions: Value) -> Patch<Value> {
    Patch::Strategic(json!({"metadata": {"uid": pod.metadata.uid},
                            "status": {"conditions": conditions}}))
}

/// The HTTP code and message the apiserver answered (200 and "" when it accepted).
async fn send(client: &Client, name: &str, patch: &Patch<Value>) -> (u16, String) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    match pods
        .patch_status(name, &PatchParams::default(), patch)
        .await
    {
        Ok(_) => (200, String::new()),
        Err(kube::Error::Api(s)) => (s.code, s.message),
        Err(e) => panic!("{e}"),
    }
}

fn assert_denied_by_policy((code, message): &(u16, String), what: &str) {
    assert_eq!(*code, 403, "{what}: {message}");
    assert!(
        message.contains(&format!("ValidatingAdmissionPolicy '{POLICY}'")),
        "{what}: denied, but not by the policy: {message}"
    );
}

struct Setup {
    cp: ControlPlane,
    own: Pod,
    other: Pod,
    sidecar: Client,
}

async fn setup() -> Setup {
    let mut cp = ControlPlane::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Type-checks policies against the schema and reports it in their status.
    cp.start_controller_manager(&["validatingadmissionpolicy-status-controller"])
        .unwrap();
    cp.create_namespace(NS).await.unwrap();
    let mut sets = cluster::cert_values(&cp, &["localhost"]);
    sets.push(format!("sidecar.namespaces={{{NS}}}"));
    let manifest = cluster::render(
        &cp,
        &sets,
        &[
            "templates/admission-policy.yaml",
            "templates/sidecar-rbac.yaml",
        ],
    );
    cluster::kubectl_apply(&cp, &manifest);
    // The apiserver type-checks every expression against the Pod schema.
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(cp.client());
    let checked = kube::runtime::wait::await_condition(
        policies,
        POLICY,
        |p: Option<&ValidatingAdmissionPolicy>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.observed_generation.is_some() && s.type_checking.is_some())
        },
    );
    let policy = tokio::time::timeout(LIMIT, checked)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let warnings = policy
        .status
        .unwrap()
        .type_checking
        .unwrap()
        .expression_warnings;
    assert!(
        warnings.unwrap_or_default().is_empty(),
        "the apiserver's type check warns"
    );

    let own = pod(&cp, "gs-0").await;
    let other = pod(&cp, "gs-1").await;
    let sidecar = cp.client_for_token(&cp.pod_token(SA, &own).await.unwrap());
    // Policies take effect asynchronously: wait until one that must be denied is.
    let canary = sidecar_patch(&other, json!([condition("game.kruise.io/healthy")]));
    let wait = async {
        loop {
            let answer = send(&sidecar, "gs-1", &canary).await;
            if answer.0 == 403 {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let answer = tokio::time::timeout(LIMIT, wait)
        .await
        .expect("the policy takes effect");
    assert_denied_by_policy(&answer, "the canary");
    // The canary may have landed before enforcement began: start from a clean pod.
    let other = reset_conditions(&cp, "gs-1").await;
    Setup {
        cp,
        own,
        other,
        sidecar,
    }
}

async fn reset_conditions(cp: &ControlPlane, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    let patch = json!({"status": {"conditions": [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "True"},
        {"type": "ContainersReady", "status": "True"}
    ]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_confines_the_sidecar_to_its_own_pods_declared_conditions() {
    let Setup {
        cp,
        own,
        other,
        sidecar,
    } = setup().await;
    let healthy = json!([condition("game.kruise.io/healthy")]);

    // Allowed: its own pod, a declared condition type; then removing it again.
    assert_eq!(
        send(&sidecar, "gs-0", &sidecar_patch(&own, healthy.clone())).await,
        (200, String::new())
    );
    let remove = json!([{"type": "game.kruise.io/healthy", "$patch": "delete"}]);
    assert_eq!(
        send(&sidecar, "gs-0", &sidecar_patch(&own, remove)).await.0,
        200
    );

    // Denied by the policy, each for its own reason.
    assert_denied_by_policy(
        &send(&sidecar, "gs-1", &sidecar_patch(&other, healthy.clone())).await,
        "another pod",
    );
    let undeclared = json!([condition("game.kruise.io/idle")]);
    assert_denied_by_policy(
        &send(&sidecar, "gs-0", &sidecar_patch(&own, undeclared)).await,
        "an undeclared condition type",
    );
    let label = Patch::Strategic(
        json!({"metadata": {"uid": own.metadata.uid, "labels": {"app": "stolen"}}}),
    );
    assert_denied_by_policy(
        &send(&sidecar, "gs-0", &label).await,
        "a label change through pods/status",
    );
    let annotation = Patch::Strategic(json!({"metadata": {"uid": own.metadata.uid,
        "annotations": {"kruise.io/podprobe": "[]"}}}));
    assert_denied_by_policy(
        &send(&sidecar, "gs-0", &annotation).await,
        "an annotation change",
    );
    let drop_ready = json!([{"type": "Ready", "$patch": "delete"}]);
    assert_denied_by_policy(
        &send(&sidecar, "gs-0", &sidecar_patch(&own, drop_ready)).await,
        "removing the kubelet's Ready",
    );
    let flip_ready = json!([{"type": "Ready", "status": "False"}]);
    assert_denied_by_policy(
        &send(&sidecar, "gs-0", &sidecar_patch(&own, flip_ready)).await,
        "changing the kubelet's Ready",
    );
    let phase = Patch::Strategic(json!({"status": {"phase": "Failed"}}));
    assert_denied_by_policy(&send(&sidecar, "gs-0", &phase).await, "a phase change");

    // A spec change through pods/status never reaches the policy: the apiserver's status
    // strategy puts the stored spec back first, and the write succeeds without it.
    let spec = Patch::Strategic(json!({"spec": {"activeDeadlineSeconds": 5}}));
    assert_eq!(send(&sidecar, "gs-0", &spec).await.0, 200);
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    let stored = pods.get("gs-0").await.unwrap();
    assert_eq!(stored.spec.unwrap().active_deadline_seconds, None);

    // A token of the same account without pod claims.
    let unbound = cp.client_for_token(&cp.service_account_token(NS, SA).await.unwrap());
    assert_denied_by_policy(
        &send(&unbound, "gs-0", &sidecar_patch(&own, healthy.clone())).await,
        "a token without pod claims",
    );
    // The kubelet and controllers are not matched: the admin changes anything.
    assert_eq!(
        send(
            &cp.client(),
            "gs-0",
            &sidecar_patch(&own, json!([condition("game.kruise.io/idle")]))
        )
        .await
        .0,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_pods_token_never_writes_the_replacement() {
    let Setup {
        cp, own, sidecar, ..
    } = setup().await;
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    pods.delete("gs-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let replacement = pod(&cp, "gs-0").await;
    assert_ne!(replacement.metadata.uid, own.metadata.uid);
    // The token is bound to the old pod's uid. kube-apiserver checks that against the pod it
    // finds by name through its informer cache, so right after the replacement the token may
    // still authenticate (seen here); the policy's pod-uid check is what refuses the write
    // then. Once the cache has the replacement, authentication itself fails (401).
    let healthy = json!([condition("game.kruise.io/healthy")]);
    let (code, message) = send(&sidecar, "gs-0", &sidecar_patch(&replacement, healthy)).await;
    if code != 401 {
        assert_denied_by_policy(&(code, message.clone()), "the old pod's token");
        assert!(message.contains("pod-uid claim"), "{message}");
    }
    println!("the replaced pod's token was answered {code}: {message}");
    let stored = pods.get("gs-0").await.unwrap();
    let types: Vec<String> = stored
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert!(
        !types.iter().any(|t| t == "game.kruise.io/healthy"),
        "{types:?}"
    );
}
