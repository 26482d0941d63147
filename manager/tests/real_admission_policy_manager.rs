//! The chart's policy on podprobe-manager's own pod writes
//! (templates/admission-policy-manager.yaml) on a real kube-apiserver, rendered by the real
//! helm with the manager's RBAC and applied by kubectl: type-checked by the real controller
//! without a warning, then each write a compromised manager could try, with the manager's own
//! token. The ClusterRole allows every one of them (`patch pods`), so the policy decides; the
//! admin's identical writes are the control. The same for the Secrets it may create (the
//! sidecar token of a virtual-node pod), where its Role allows any, and for the Events it may
//! create (its report of a pod running without its sidecar), where its ClusterRole allows any,
//! and for the tokens of the sidecar's account it may mint, where its Role allows any.

mod cluster;

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use testkit::real::ControlPlane;

const NS: &str = "games";
const POLICY: &str = "podprobe-manager-pods";
const SECRETS_POLICY: &str = "podprobe-manager-secrets";
const EVENTS_POLICY: &str = "podprobe-manager-events";
const TOKENS_POLICY: &str = "podprobe-manager-tokens";
const ONLY_OWN_WARNINGS: &str = "may create only its own Warning Events";
const ONLY_METADATA: &str = "may change only a pod's labels and annotations";
const ONLY_TOKENS: &str = "may create only its podprobe-token-* Secrets";
/// The gates of the tests' pods: another controller's, and the one the manager lifts.
const GATES: [&str; 2] = ["example.com/other", "podprobe.io/sidecar-token"];
const LABEL: &str = "may not change a pod label";

async fn pod(cp: &ControlPlane, name: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS,
            "labels": {"app": "game", "pod-template-hash": "7d9f"},
            "annotations": {"controller.kubernetes.io/pod-deletion-cost": "0"}},
        "spec": {"containers": [{"name": "game", "image": "game:1"}],
                 "schedulingGates": GATES.map(|g| json!({"name": g}))}
    }))
    .unwrap();
    Api::namespaced(cp.client(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

/// The HTTP code and message of a patch of pod `name` (200 and "" when accepted).
async fn send(client: &Client, name: &str, patch: &Patch<Value>) -> (u16, String) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    match pods.patch(name, &PatchParams::default(), patch).await {
        Ok(_) => (200, String::new()),
        Err(kube::Error::Api(s)) => (s.code, s.message),
        Err(e) => panic!("{e}"),
    }
}

/// Each case's patch, by the manager and then by the admin (the control), each on a fresh pod
/// `case-<i>`: refused by the policy with its message, or admitted (`None`).
async fn each_case(
    cp: &ControlPlane,
    manager: &Client,
    cases: &[(&str, Patch<Value>, Option<&str>)],
) {
    let mut failures = Vec::new();
    for (i, (what, patch, expect)) in cases.iter().enumerate() {
        let name = format!("case-{i}");
        pod(cp, &name).await;
        let answer = send(manager, &name, patch).await;
        let control = send(&cp.client(), &name, patch).await;
        println!("{what:<60} manager {answer:?}, admin {}", control.0);
        let right = match expect {
            None => answer.0 == 200,
            Some(why) => denied_by(&answer, why) && control.0 == 200,
        };
        if !right {
            failures.push(format!("{what}: expected {expect:?}, got {answer:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

fn denied_by((code, message): &(u16, String), why: &str) -> bool {
    *code == 403 && message.contains(POLICY) && message.contains(why)
}

/// A control plane with the manager's policies, RBAC (its sidecar-token Role in [`NS`]) and
/// ServiceAccount applied, both policies type-checked without a warning; and the manager's
/// client.
async fn installed() -> (ControlPlane, Client) {
    installed_in("standalone").await
}

/// [`installed`], with the chart in `mode`.
async fn installed_in(mode: &str) -> (ControlPlane, Client) {
    let mut cp = ControlPlane::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    cp.start_controller_manager(&["validatingadmissionpolicy-status-controller"])
        .unwrap();
    for namespace in [NS, cluster::RELEASE_NS] {
        cp.create_namespace(namespace).await.unwrap();
    }
    let mut sets = cluster::cert_values(&cp, &["localhost"]);
    sets.push(format!("sidecar.namespaces={{{NS}}}"));
    sets.push(format!("mode={mode}"));
    let templates = [
        "templates/admission-policy-manager.yaml",
        "templates/rbac.yaml",
        "templates/sidecar-rbac.yaml",
        "templates/serviceaccount.yaml",
    ];
    cluster::kubectl_apply(&cp, &cluster::render(&cp, &sets, &templates));

    // The policies match pods and secrets (not subresources), so the apiserver type-checks them.
    for name in [POLICY, SECRETS_POLICY, EVENTS_POLICY] {
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(cp.client());
        let checked = kube::runtime::wait::await_condition(policies, name, |p: Option<&_>| {
            p.is_some_and(|p: &ValidatingAdmissionPolicy| {
                p.status.as_ref().is_some_and(|s| s.type_checking.is_some())
            })
        });
        let policy = tokio::time::timeout(Duration::from_secs(60), checked)
            .await
            .expect("type-checked in time")
            .unwrap()
            .unwrap();
        let warnings = policy
            .status
            .unwrap()
            .type_checking
            .unwrap()
            .expression_warnings;
        assert_eq!(warnings, None, "the apiserver's type check of {name}");
    }
    let manager = cp.client_for_token(
        &cp.service_account_token(cluster::RELEASE_NS, "podprobe-manager")
            .await
            .unwrap(),
    );
    (cp, manager)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_managers_pod_writes_change_only_labels_and_annotations() {
    let (cp, manager) = installed().await;
    pod(&cp, "gs-0").await;
    // Enforced asynchronously: until a spec change is refused.
    let spec_change = Patch::Merge(json!({"spec": {"activeDeadlineSeconds": 5}}));
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        let answer = send(&manager, "gs-0", &spec_change).await;
        if answer.0 != 200 || Instant::now() > deadline {
            break answer;
        }
        // An admitted write changed the pod: start over with a fresh one.
        let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
        pods.delete("gs-0", &kube::api::DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        pod(&cp, "gs-0").await;
    };
    assert!(denied_by(&first, ONLY_METADATA), "{first:?}");

    let merge = Patch::Merge;
    let toleration: json_patch::Patch = serde_json::from_value(json!([{"op": "add",
        "path": "/spec/tolerations/-", "value": {"key": "example.com/any", "operator": "Exists"}}]))
    .unwrap();
    let lift = |i: usize| -> Patch<Value> {
        Patch::Json(
            serde_json::from_value(json!([
            {"op": "test", "path": format!("/spec/schedulingGates/{i}/name"), "value": GATES[i]},
            {"op": "remove", "path": format!("/spec/schedulingGates/{i}")}]))
            .unwrap(),
        )
    };
    #[rustfmt::skip] // a table: one case per entry
    let cases: [(&str, Patch<Value>, Option<&str>); 13] = [
        ("its own scheduling gate lifted", lift(1), None),
        ("another controller's scheduling gate lifted", lift(0), Some(ONLY_METADATA)),
        ("a node selector on a gated pod (the apiserver allows it)",
            merge(json!({"spec": {"nodeSelector": {"type": "virtual-kubelet"}}})),
            Some(ONLY_METADATA)),
        ("a marker label, the deletion cost and the probes annotation",
            merge(json!({"metadata": {"labels": {"server-healthy": "true"}, "annotations": {
                "controller.kubernetes.io/pod-deletion-cost": "-5", "kruise.io/podprobe": "[]"}}})),
            None),
        ("an image",
            Patch::Strategic(json!({"spec": {"containers": [{"name": "game", "image": "evil:1"}]}})),
            Some(ONLY_METADATA)),
        ("a toleration", Patch::Json(toleration), Some(ONLY_METADATA)),
        ("a finalizer", merge(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
            Some(ONLY_METADATA)),
        ("an owner", merge(json!({"metadata": {"ownerReferences": [{"apiVersion": "v1",
            "kind": "ConfigMap", "name": "x", "uid": "0b5e4d2c-1111-4a4a-8c8c-000000000001"}]}})),
            Some(ONLY_METADATA)),
        ("pod-template-hash changed",
            merge(json!({"metadata": {"labels": {"pod-template-hash": "x"}}})), Some(LABEL)),
        ("pod-template-hash removed",
            merge(json!({"metadata": {"labels": {"pod-template-hash": null}}})), Some(LABEL)),
        ("a kubernetes.io label",
            merge(json!({"metadata": {"labels": {"app.kubernetes.io/name": "x"}}})), Some(LABEL)),
        ("a k8s.io annotation (what markers are for)",
            merge(json!({"metadata": {"annotations": {"x.k8s.io/y": "z"}}})), None),
        ("the deletion cost removed",
            merge(json!({"metadata": {"annotations": {
                "controller.kubernetes.io/pod-deletion-cost": null}}})),
            None),
    ];
    each_case(&cp, &manager, &cases).await;
}

/// In companion mode kruise-manager writes the markers: podprobe-manager's only pod write is
/// its token issuer's release (the `podprobe.io/sidecar-token` label and gate) of a pod in the
/// sidecar's namespaces. Its ClusterRole's `patch pods` allows every case below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_companion_mode_the_managers_pod_writes_are_token_releases_only() {
    const ONLY_RELEASES: &str = "in companion mode may change only the podprobe.io/sidecar-token";
    let (cp, manager) = installed_in("companion").await;
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    let system: Api<Pod> = Api::namespaced(cp.client(), "kube-system");
    let release = Patch::Json(
        serde_json::from_value(json!([
            {"op": "test", "path": "/spec/schedulingGates/1/name", "value": GATES[1]},
            {"op": "remove", "path": "/spec/schedulingGates/1"},
            {"op": "add", "path": "/metadata/labels/podprobe.io~1sidecar-token", "value": "refused"}]))
        .unwrap(),
    );
    // Enforced asynchronously: until a marker label is refused.
    let marker = Patch::Merge(json!({"metadata": {"labels": {"server-healthy": "true"}}}));
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        pod(&cp, "gs-0").await;
        let answer = send(&manager, "gs-0", &marker).await;
        pods.delete("gs-0", &kube::api::DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        if answer.0 != 200 || Instant::now() > deadline {
            break answer;
        }
    };
    assert!(denied_by(&first, ONLY_RELEASES), "{first:?}");

    #[rustfmt::skip] // a table: one case per entry
    let cases: [(&str, Patch<Value>, Option<&str>); 3] = [
        ("its release: the gate lifted, the label set", release, None),
        ("the deletion cost",
            Patch::Merge(json!({"metadata": {"annotations": {
                "controller.kubernetes.io/pod-deletion-cost": "-5"}}})),
            Some(ONLY_RELEASES)),
        ("the probes annotation",
            Patch::Merge(json!({"metadata": {"annotations": {"kruise.io/podprobe": "[]"}}})),
            Some(ONLY_RELEASES)),
    ];
    each_case(&cp, &manager, &cases).await;

    // A pod outside the sidecar's namespaces, such as kube-system's: not even a label.
    let outside: Pod = serde_json::from_value(json!({
        "metadata": {"name": "system-0", "labels": {"app": "dns"}},
        "spec": {"containers": [{"name": "dns", "image": "dns:1"}]}
    }))
    .unwrap();
    // The admission of a pod needs its ServiceAccount, which no controller made here.
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(cp.client(), "kube-system");
    let default = serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
    match accounts.create(&PostParams::default(), &default).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("kube-system/default: {e}"),
    }
    system
        .create(&PostParams::default(), &outside)
        .await
        .unwrap();
    let as_manager: Api<Pod> = Api::namespaced(manager.clone(), "kube-system");
    let label = Patch::Merge(json!({"metadata": {"labels": {"podprobe.io/sidecar-token": "x"}}}));
    match as_manager
        .patch("system-0", &PatchParams::default(), &label)
        .await
    {
        Err(kube::Error::Api(s)) => assert!(
            s.code == 403 && s.message.contains(POLICY) && s.message.contains(ONLY_RELEASES),
            "{s:?}"
        ),
        other => panic!("a kube-system pod's label: {other:?}"),
    }
    system
        .patch("system-0", &PatchParams::default(), &label)
        .await
        .expect("the admin's control");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manager_creates_only_sidecar_token_secrets() {
    let (cp, manager) = installed().await;
    let owner = pod(&cp, "gs-0").await;
    let owned_by = json!([{"apiVersion": "v1", "kind": "Pod", "name": "gs-0",
        "uid": owner.metadata.uid.unwrap()}]);
    let token = |name: &str| {
        json!({"metadata": {"name": name, "ownerReferences": owned_by},
               "type": "Opaque", "data": {"token": "dA==", "namespace": "Z2FtZXM="}})
    };
    let mut account_token = token("podprobe-token-sa");
    account_token["type"] = json!("kubernetes.io/service-account-token");
    account_token["metadata"]["annotations"] =
        json!({"kubernetes.io/service-account.name": "default"});
    account_token["data"] = json!({});
    let mut unowned = token("podprobe-token-unowned");
    unowned["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("ownerReferences");
    let mut more = token("podprobe-token-more");
    more["data"]["ca.crt"] = json!("eA==");
    #[rustfmt::skip] // a table: one case per entry
    let cases: [(&str, Value, Option<&str>); 5] = [
        ("a sidecar token", token("podprobe-token-1"), None),
        ("another name", token("registry-credentials"), Some(ONLY_TOKENS)),
        ("a service-account token Secret", account_token, Some(ONLY_TOKENS)),
        ("no owner", unowned, Some(ONLY_TOKENS)),
        ("a key beyond token and namespace", more, Some(ONLY_TOKENS)),
    ];
    // The policy takes effect asynchronously: until a Secret of another name is refused.
    let probe = token("enforced-yet");
    creates_as_expected::<Secret>(&cp, &manager, SECRETS_POLICY, probe, &cases).await;
}

/// The tokens the manager may mint of the sidecar's account: bound to a pod, for a year at
/// most. The audiences are the apiserver's own when none is asked (filled in before admission).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manager_mints_only_pod_bound_credentials_for_a_year_at_most() {
    let (cp, manager) = installed().await;
    let sidecar_pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "gs-0", "namespace": NS},
        "spec": {"serviceAccountName": "podprobe-sidecar",
                 "containers": [{"name": "game", "image": "game:1"}]}
    }))
    .unwrap();
    let owner = Api::<Pod>::namespaced(cp.client(), NS)
        .create(&PostParams::default(), &sidecar_pod)
        .await
        .unwrap();
    let uid = owner.metadata.uid.unwrap();
    let request = |bound: Option<Value>, seconds: i64| -> TokenRequest {
        serde_json::from_value(json!({
            "spec": {"audiences": [], "boundObjectRef": bound, "expirationSeconds": seconds}
        }))
        .unwrap()
    };
    let pod_ref = json!({"apiVersion": "v1", "kind": "Pod", "name": "gs-0", "uid": uid});
    const YEAR: i64 = 365 * 24 * 3600;
    let only_bound = "may mint only tokens bound to a pod";
    #[rustfmt::skip] // a table: one case per entry
    let cases: [(&str, TokenRequest, Option<&str>); 5] = [
        ("bound to the pod, a year", request(Some(pod_ref.clone()), YEAR), None),
        ("bound to no object", request(None, YEAR), Some(only_bound)),
        ("bound to the pod by name alone", request(Some(json!({"apiVersion": "v1", "kind": "Pod", "name": "gs-0"})), YEAR), Some(only_bound)),
        ("bound to a Secret", request(Some(json!({"apiVersion": "v1", "kind": "Secret", "name": "s", "uid": "u"})), YEAR), Some(only_bound)),
        ("bound to the pod, two years", request(Some(pod_ref.clone()), 2 * YEAR), Some(only_bound)),
    ];
    let accounts: Api<ServiceAccount> = Api::namespaced(manager.clone(), NS);
    let mint = async |request: &TokenRequest| match accounts
        .create_token_request("podprobe-sidecar", &PostParams::default(), request)
        .await
    {
        Ok(_) => (200, String::new()),
        Err(kube::Error::Api(s)) => (s.code, s.message),
        Err(e) => panic!("{e}"),
    };
    // The policy takes effect asynchronously: until an unbound token is refused.
    let deadline = Instant::now() + Duration::from_secs(60);
    while mint(&cases[1].1).await.0 != 403 {
        assert!(
            Instant::now() < deadline,
            "{TOKENS_POLICY} never took effect"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut failures = Vec::new();
    for (what, request, expect) in &cases {
        let answer = mint(request).await;
        println!("{what:<40} manager {answer:?}");
        let right = match expect {
            None => answer.0 == 200,
            Some(why) => {
                answer.0 == 403 && answer.1.contains(TOKENS_POLICY) && answer.1.contains(why)
            }
        };
        if !right {
            failures.push(format!("{what}: expected {expect:?}, got {answer:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manager_creates_only_its_own_warnings_about_pods() {
    let (cp, manager) = installed().await;
    pod(&cp, "gs-0").await;
    let event = |name: &str| {
        json!({"metadata": {"name": name, "namespace": NS},
               "eventTime": "2026-11-27T00:00:00.000000Z",
               "reportingController": "podprobe-manager", "reportingInstance": "manager-0",
               "action": "CheckSidecar", "reason": "SidecarMissing", "type": "Warning",
               "note": "no podprobe container",
               "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": NS, "name": "gs-0"}})
    };
    let with = |name: &str, path: &str, value: Value| {
        let mut e = event(name);
        e[path] = value;
        e
    };
    #[rustfmt::skip] // a table: one case per entry
    let cases: [(&str, Value, Option<&str>); 10] = [
        ("SidecarMissing about the pod", event("report"), None),
        ("ProbeConditionsMissing about the pod", with("conditions-missing", "reason", json!("ProbeConditionsMissing")), None),
        ("SidecarTokenRefused about the pod", with("token-refused", "reason", json!("SidecarTokenRefused")), None),
        ("SidecarTokenNotIssued about the pod", with("token-not-issued", "reason", json!("SidecarTokenNotIssued")), None),
        ("another reason", with("other-reason", "reason", json!("Killing")), Some(ONLY_OWN_WARNINGS)),
        ("type Normal", with("normal", "type", json!("Normal")), Some(ONLY_OWN_WARNINGS)),
        ("about a Secret", with("secret", "regarding", json!({"apiVersion": "v1", "kind": "Secret", "namespace": NS, "name": "s"})), Some(ONLY_OWN_WARNINGS)),
        ("about a pod of another namespace", with("elsewhere", "regarding", json!({"apiVersion": "v1", "kind": "Pod", "namespace": "kube-system", "name": "p"})), Some(ONLY_OWN_WARNINGS)),
        ("as another controller", with("kubelet", "reportingController", json!("kubelet")), Some(ONLY_OWN_WARNINGS)),
        ("with a related object", with("related", "related", json!({"kind": "Pod", "namespace": NS, "name": "gs-1"})), Some(ONLY_OWN_WARNINGS)),
    ];
    // The policy takes effect asynchronously: until an Event of another reason is refused.
    let probe = with("enforced-yet", "reason", json!("Other"));
    creates_as_expected::<Event>(&cp, &manager, EVENTS_POLICY, probe, &cases).await;
}

/// Creates each case's object in [`NS`] as the manager and checks the answer: created (`None`)
/// or refused by `policy` with a message naming the reason given. First waits until the policy
/// is enforced (it takes effect asynchronously): until `probe`, which it refuses, is refused
/// (the admin deletes each `probe` created before). Panics listing every case answered
/// otherwise.
async fn creates_as_expected<K>(
    cp: &ControlPlane,
    manager: &Client,
    policy: &str,
    probe: Value,
    cases: &[(&str, Value, Option<&str>)],
) where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let objects = Api::<K>::namespaced(manager.clone(), NS);
    let create = async |object: &Value| {
        let object: K = serde_json::from_value(object.clone()).unwrap();
        match objects.create(&PostParams::default(), &object).await {
            Ok(_) => (200, String::new()),
            Err(kube::Error::Api(s)) => (s.code, s.message),
            Err(e) => panic!("{e}"),
        }
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let probe_name = probe["metadata"]["name"].as_str().unwrap().to_owned();
    while create(&probe).await.0 == 200 {
        assert!(Instant::now() < deadline, "{policy} never took effect");
        Api::<K>::namespaced(cp.client(), NS)
            .delete(&probe_name, &Default::default())
            .await
            .unwrap();
    }
    let mut failures = Vec::new();
    for (what, object, expect) in cases {
        let answer = create(object).await;
        println!("{what:<40} manager {answer:?}");
        let right = match expect {
            None => answer.0 == 200,
            Some(why) => answer.0 == 403 && answer.1.contains(policy) && answer.1.contains(why),
        };
        if !right {
            failures.push(format!("{what}: expected {expect:?}, got {answer:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
