//! The chart's ValidatingAdmissionPolicy (templates/admission-policy.yaml) on a real
//! kube-apiserver: rendered by the real helm together with the sidecar's RBAC
//! (templates/sidecar-rbac.yaml), applied by kubectl, type-checked against the Pod schema by the
//! real controller (no warning allowed; a copy matching `pods`, as the checker skips
//! subresources), and then every case of `admission_policy.rs` (where the `cel` crate stands in
//! for the apiserver) sent as a real pods/status PATCH with a real token, one fresh pod each.
//!
//! A denial counts only when it is the policy's (403 naming the policy) and the validation
//! the `cel` test expects; an allowed write counts only when the stored conditions are then
//! what the write meant. The sidecar's Role allows every one of these requests, so RBAC never
//! decides one (another account bound to the same Role is the control: not matched, allowed).

mod cluster;

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use testkit::real::ControlPlane;

const NS: &str = "games";
const SA: &str = "podprobe-sidecar";
/// Another account in the namespace, bound to the sidecar's Role by the test.
const OTHER_SA: &str = "game-server";
const POLICY: &str = "podprobe-sidecar-pod-status";
const LIMIT: Duration = Duration::from_secs(60);
const HEALTHY: &str = "game.kruise.io/healthy";
const IDLE: &str = "game.kruise.io/idle";
/// A type in a domain Kubernetes reserves.
const RESERVED_DOMAIN_TYPE: &str = "node.kubernetes.io/gate";
/// As in admission_policy.rs: two declared types, and `"podConditionType":"Ready"` inside an
/// exec argument (JSON-escaped there, so it declares nothing).
const PROBES: &str = r#"[{"name":"healthy","containerName":"game","probe":{"tcpSocket":{"port":"game"},"periodSeconds":5},"podConditionType":"game.kruise.io/healthy"},{"name":"idle","containerName":"game","probe":{"exec":{"command":["sh","-c","echo \"podConditionType\":\"Ready\""]}},"podConditionType":"game.kruise.io/idle"}]"#;

// What each validation says when it denies, in the policy's order.
const NOT_ITS_POD: &str = "whose pod-name claim names the pod";
const NOT_ITS_UID: &str = "whose pod-uid claim is the pod's uid";
const METADATA: &str = "may not change labels, annotations, finalizers or spec";
const STATUS: &str = "may change nothing of its pod's status but the conditions";
const RESERVED: &str = "may never write a reserved condition type";
const ADDED: &str = "may add or change only the condition types declared";
const REMOVED: &str = "may remove only the condition types declared";

/// The conditions the kubelet (the admin here) wrote, in order.
const KUBELET: [(&str, &str); 4] = [
    ("Initialized", "True"),
    ("Ready", "True"),
    ("ContainersReady", "True"),
    ("PodScheduled", "True"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_of_the_cel_test_holds_on_the_real_apiserver() {
    let cp = setup().await;
    let neighbour = pod(&cp, "neighbour", Shape::Standard).await;
    let neighbour = cp.client_for_token(&cp.pod_token(SA, &neighbour).await.unwrap());
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    let mut failures = Vec::new();
    for (i, case) in cases().into_iter().enumerate() {
        let name = format!("case-{i}");
        let target = pod(&cp, &name, case.shape).await;
        let client = match case.actor {
            Actor::Own => cp.client_for_token(&cp.pod_token(SA, &target).await.unwrap()),
            Actor::Neighbour => neighbour.clone(),
            Actor::Unbound => cp.client_for_token(&cp.service_account_token(NS, SA).await.unwrap()),
            Actor::OtherAccount => {
                cp.client_for_token(&cp.service_account_token(NS, OTHER_SA).await.unwrap())
            }
            Actor::Admin => cp.client(),
        };
        let (code, message) = send(&client, &name, &(case.patch)(&target)).await;
        let stored = pods.get(&name).await.unwrap();
        println!("{:<55} {code} {message}", case.name);
        let unchanged = stored.metadata.resource_version == target.metadata.resource_version;
        let right = match &case.expect {
            Expect::Allowed(expected) => {
                let mut want: Vec<_> = expected
                    .iter()
                    .map(|(t, s)| (t.to_string(), s.to_string()))
                    .collect();
                want.sort();
                code == 200 && conditions(&stored) == want
            }
            Expect::Denied(why) => unchanged && denied_by(&(code, message.clone()), why),
            Expect::Refused(want, why) => {
                unchanged && code == *want && message.contains(why) && !message.contains(POLICY)
            }
            Expect::Dropped => code == 200 && unchanged,
        };
        if !right {
            let got = conditions(&stored);
            failures.push(format!(
                "{}: expected {:?}, got {code} {message} (stored pod unchanged: {unchanged}, \
                 conditions {got:?})",
                case.name, case.expect
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_pods_token_is_stopped_by_the_uid_check_until_it_stops_authenticating() {
    let cp = setup().await;
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    let old = pod(&cp, "gs-0", Shape::Standard).await;
    let old_token = cp.client_for_token(&cp.pod_token(SA, &old).await.unwrap());
    // An allowed write. kube-apiserver now caches the token's successful authentication (as
    // the old pod, its uid in the claims) for 10 s (TokenSuccessCacheTTL, no flag sets it),
    // whatever happens to the pod meanwhile.
    let write = |p: &Pod| sidecar(p, json!([cond(HEALTHY, "False")]));
    assert_eq!(send(&old_token, "gs-0", &write(&old)).await.0, 200);
    let cached = Instant::now();
    pods.delete("gs-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let new = pod(&cp, "gs-0", Shape::Standard).await;
    assert_ne!(new.metadata.uid, old.metadata.uid);

    // Same name, old uid in the token: only the policy's pod-uid validation refuses it.
    let stale = send(&old_token, "gs-0", &write(&new)).await;
    // What the old sidecar itself would send: its own (old) uid, which the apiserver refuses
    // before admission (metadata.uid is immutable), whatever the token.
    let own_uid = send(&old_token, "gs-0", &write(&old)).await;
    let within = cached.elapsed();
    println!("old token, new uid, {within:?} after caching: {stale:?}");
    println!("old token, old uid: {own_uid:?}");
    assert!(
        within < Duration::from_secs(9),
        "too slow to be inside the cache: {within:?}"
    );
    assert!(denied_by(&stale, NOT_ITS_UID), "{stale:?}");
    assert!(
        own_uid.0 == 422 && own_uid.1.contains("metadata.uid"),
        "{own_uid:?}"
    );
    assert!(!own_uid.1.contains(POLICY), "{own_uid:?}");

    // Once the cache entry expires the token is checked against the replacement: 401.
    let (old_token, stale_write) = (&old_token, &write(&new));
    let answer = until(|| async move {
        let answer = send(old_token, "gs-0", stale_write).await;
        (answer.0 == 401).then_some(answer)
    })
    .await;
    println!(
        "the old token is refused ({answer:?}) {:?} after it was cached",
        cached.elapsed()
    );
    assert!(answer.1.contains("Unauthorized"), "{answer:?}");

    // The replacement's own token writes it; with the old pod's uid in the patch it cannot.
    let new_token = cp.client_for_token(&cp.pod_token(SA, &new).await.unwrap());
    assert_eq!(send(&new_token, "gs-0", &write(&old)).await.0, 422);
    assert_eq!(send(&new_token, "gs-0", &write(&new)).await.0, 200);
    let stored = pods.get("gs-0").await.unwrap();
    assert!(conditions(&stored).contains(&(HEALTHY.to_owned(), "False".to_owned())));
}

/// The status allow-list pins every PodStatus field of the apiserver the project pins: when a
/// new k8s.io/api adds one, this fails until the policy pins it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_allow_list_pins_every_field_of_the_real_pod_schema() {
    let cp = ControlPlane::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let request = http::Request::get("/openapi/v3/api/v1")
        .body(Vec::new())
        .unwrap();
    let schema: Value = cp.client().request(request).await.unwrap();
    let fields = schema["components"]["schemas"]["io.k8s.api.core.v1.PodStatus"]["properties"]
        .as_object()
        .expect("PodStatus in the apiserver's OpenAPI v3")
        .keys()
        .cloned()
        .collect::<std::collections::BTreeSet<_>>();
    let policy =
        std::fs::read_to_string(cluster::chart_dir().join("templates/admission-policy.yaml"))
            .unwrap();
    let pinned = |f: &str| {
        policy.contains(&format!(
            "(!has(object.status.{f}) || object.status.{f} == oldObject.status.{f})"
        ))
    };
    let unpinned: Vec<_> = fields
        .iter()
        .filter(|f| *f != "conditions" && !pinned(f))
        .collect();
    println!("PodStatus fields: {fields:?}");
    assert!(
        fields.len() >= 22 && fields.contains("conditions"),
        "{fields:?}"
    );
    assert!(
        unpinned.is_empty(),
        "not pinned by the policy: {unpinned:?}"
    );
}

// ---- the cases of admission_policy.rs, one fresh pod each ----

struct Case {
    name: &'static str,
    shape: Shape,
    actor: Actor,
    patch: fn(&Pod) -> Patch<Value>,
    expect: Expect,
}

#[rustfmt::skip] // a table: one case per paragraph
fn cases() -> Vec<Case> {
    use Actor::*;
    use Expect::*;
    use Shape::*;
    vec![
        case("own pod, its own condition changed", Standard, Own,
            |p| sidecar(p, json!([cond(HEALTHY, "False")])),
            Allowed(kubelet_and(&[(HEALTHY, "False")]))),
        case("own pod, a declared condition added", Standard, Own,
            |p| sidecar(p, json!([cond(IDLE, "True")])),
            Allowed(kubelet_and(&[(HEALTHY, "True"), (IDLE, "True")]))),
        case("own pod, its own condition removed", Standard, Own,
            |p| sidecar(p, json!([{"type": HEALTHY, "$patch": "delete"}])),
            Allowed(kubelet_and(&[]))),
        case("own pod, a write that changes nothing", Standard, Own,
            |p| sidecar(p, json!([{"type": HEALTHY, "status": "True"}])),
            Allowed(kubelet_and(&[(HEALTHY, "True")]))),
        case("own pod without conditions, the first one", NoConditions, Own,
            |p| sidecar(p, json!([cond(HEALTHY, "True")])),
            Allowed(vec![(HEALTHY, "True")])),
        case("own pod, server-side apply of its own condition", Standard, Own,
            |_| Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod",
                                    "status": {"conditions": [cond(HEALTHY, "False")]}})),
            Allowed(kubelet_and(&[(HEALTHY, "False")]))),
        case("another account bound to the same Role: not matched", Standard, OtherAccount,
            |p| sidecar(p, json!([cond("Ready", "False")])),
            Allowed(vec![KUBELET[0], ("Ready", "False"), KUBELET[2], KUBELET[3], (HEALTHY, "True")])),
        case("the admin (the kubelet's stand-in): not matched", Standard, Admin,
            |p| sidecar(p, json!([cond("example.com/other", "True")])),
            Allowed(kubelet_and(&[(HEALTHY, "True"), ("example.com/other", "True")]))),

        case("another pod (a token bound to the neighbour)", Standard, Neighbour,
            |p| sidecar(p, json!([cond(HEALTHY, "False")])),
            Denied(NOT_ITS_POD)),
        case("a token without pod claims", Standard, Unbound,
            |p| sidecar(p, json!([cond(HEALTHY, "False")])),
            Denied(NOT_ITS_POD)),
        case("a label changed", Standard, Own,
            |p| metadata(p, json!({"labels": {"game.kruise.io/state": "idle"}})),
            Denied(METADATA)),
        case("a label added to a pod without labels", NoLabels, Own,
            |p| metadata(p, json!({"labels": {"game.kruise.io/state": "idle"}})),
            Denied(METADATA)),
        case("an annotation added", Standard, Own,
            |p| metadata(p, json!({"annotations": {"x": "y"}})),
            Denied(METADATA)),
        case("kruise.io/podprobe widened to declare Ready, and Ready changed", Standard, Own,
            |p| Patch::Strategic(json!({"metadata": {"uid": p.metadata.uid, "annotations": {
                    "kruise.io/podprobe": r#"[{"name":"x","containerName":"game","probe":{},"podConditionType":"Ready"}]"#}},
                "status": {"conditions": [cond("Ready", "False")]}})),
            Denied(METADATA)),
        case("a finalizer added", Standard, Own,
            |p| metadata(p, json!({"finalizers": ["example.com/hold"]})),
            Denied(METADATA)),
        case("the reason and message changed", Standard, Own,
            |p| status(p, json!({"reason": "Evicted", "message": "evicted by podprobe"})),
            Denied(STATUS)),
        case("the start time changed", Standard, Own,
            |p| status(p, json!({"startTime": "2020-01-01T00:00:00Z"})),
            Denied(STATUS)),
        case("the phase changed", Standard, Own,
            |p| status(p, json!({"phase": "Failed"})),
            Denied(STATUS)),
        case("the observed generation set", Standard, Own,
            |p| status(p, json!({"observedGeneration": p.metadata.generation})),
            Denied(STATUS)),
        case("a container status changed", Standard, Own,
            |p| {
                let mut statuses = json!(p.status.as_ref().unwrap().container_statuses);
                statuses[0]["ready"] = json!(false);
                status(p, json!({"containerStatuses": statuses}))
            },
            Denied(STATUS)),
        case("an undeclared condition type", Standard, Own,
            |p| sidecar(p, json!([cond("game.kruise.io/other", "True")])),
            Denied(ADDED)),
        case("a prefix of a declared type", Standard, Own,
            |p| sidecar(p, json!([cond("game.kruise.io/health", "True")])),
            Denied(ADDED)),
        case("the kubelet's Ready changed (quoted in an exec: not declared)", Standard, Own,
            |p| sidecar(p, json!([cond("Ready", "False")])),
            Denied(ADDED)),
        case("a pod without the annotation, its condition changed", NoAnnotation, Own,
            |p| sidecar(p, json!([cond(HEALTHY, "False")])),
            Denied(ADDED)),
        case("Ready declared by the annotation, and changed", DeclaresReady, Own,
            |p| sidecar(p, json!([cond("Ready", "False")])),
            Denied(RESERVED)),
        case("a kubernetes.io type declared by the annotation, and added", DeclaresReserved, Own,
            |p| sidecar(p, json!([cond(RESERVED_DOMAIN_TYPE, "True")])),
            Denied(RESERVED)),
        case("the kubelet's Ready removed ($patch: delete)", Standard, Own,
            |p| sidecar(p, json!([{"type": "Ready", "$patch": "delete"}])),
            Denied(REMOVED)),
        case("the conditions replaced ($patch: replace)", Standard, Own,
            |p| sidecar(p, json!([{"$patch": "replace"}, cond(HEALTHY, "False")])),
            Denied(REMOVED)),
        case("the conditions replaced (JSON merge patch)", Standard, Own,
            |p| Patch::Merge(json!({"metadata": {"uid": p.metadata.uid},
                                    "status": {"conditions": [cond(HEALTHY, "False")]}})),
            Denied(REMOVED)),

        // Never reach the policy: the status strategy resets these, or validation refuses.
        case("a spec change", Standard, Own,
            |p| Patch::Strategic(json!({"metadata": {"uid": p.metadata.uid}, "spec": {
                "activeDeadlineSeconds": 5, "containers": [{"name": "game", "image": "evil:1"}]}})),
            Dropped),
        case("an owner reference added", Standard, Own,
            |p| metadata(p, json!({"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
                "name": "x", "uid": "0b5e4d2c-1111-4a4a-8c8c-000000000001"}]})),
            Dropped),
        case("the QoS class changed", Standard, Own,
            |p| status(p, json!({"qosClass": "Guaranteed"})),
            Refused(422, "status.qosClass: Invalid value: \"Guaranteed\": field is immutable")),
        case("a nominated node set", Standard, Own,
            |p| status(p, json!({"nominatedNodeName": "vk-2"})),
            Refused(422, "may not be set on pods that are already bound to a node")),
    ]
}

fn case(
    name: &'static str,
    shape: Shape,
    actor: Actor,
    patch: fn(&Pod) -> Patch<Value>,
    expect: Expect,
) -> Case {
    Case {
        name,
        shape,
        actor,
        patch,
        expect,
    }
}

/// The kubelet's conditions followed by `more`.
fn kubelet_and(more: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    KUBELET.iter().chain(more).copied().collect()
}

#[derive(Debug)]
enum Expect {
    /// 200, and then the stored conditions are these (type, status), in order.
    Allowed(Vec<(&'static str, &'static str)>),
    /// 403 by the policy with this validation's message, and nothing stored.
    Denied(&'static str),
    /// Refused by the apiserver before admission: this code and message, nothing stored.
    Refused(u16, &'static str),
    /// 200, but nothing stored: the status strategy drops the change before admission.
    Dropped,
}

#[derive(Debug, Clone, Copy)]
enum Actor {
    /// A token bound to the pod written (the sidecar's own).
    Own,
    /// A token of the sidecar's account bound to another pod.
    Neighbour,
    /// A token of the sidecar's account bound to nothing.
    Unbound,
    OtherAccount,
    Admin,
}

#[derive(Debug, Clone, Copy)]
enum Shape {
    /// Labels, the kruise.io/podprobe annotation, the kubelet's conditions and HEALTHY=True.
    Standard,
    NoLabels,
    NoAnnotation,
    /// Status without conditions (as created; the kubelet has written nothing yet).
    NoConditions,
    /// The annotation also declares `Ready` (as whoever can edit the pod could write it).
    DeclaresReady,
    /// The annotation also declares [`RESERVED_DOMAIN_TYPE`].
    DeclaresReserved,
}

// ---- helpers ----

/// A control plane with the chart's policy and sidecar RBAC applied, the policy's expressions
/// type-checked without warnings, and the policy enforced.
async fn setup() -> ControlPlane {
    let mut cp = ControlPlane::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Type-checks policies against the schema and writes the result to their status.
    cp.start_controller_manager(&["validatingadmissionpolicy-status-controller"])
        .unwrap();
    // The chart's sidecar RBAC goes to the namespaces of sidecar.namespaces, which must exist
    // (the namespace label podprobe.io/inject only selects the injection webhook: not here).
    cp.create_namespace(NS).await.unwrap();
    let mut sets = cluster::cert_values(&cp, &["localhost"]);
    sets.push(format!("sidecar.namespaces={{{NS}}}"));
    let templates = [
        "templates/admission-policy.yaml",
        "templates/sidecar-rbac.yaml",
    ];
    let manifest = cluster::render(&cp, &sets, &templates);
    cluster::kubectl_apply(&cp, &manifest);

    // kube-apiserver's type checker skips subresources (extractResources in its
    // typechecking.go), so the policy itself, matching only pods/status, is never checked: its
    // status.typeChecking is empty whatever the CEL says. Copies matching `pods` are checked
    // (the same Pod as object and oldObject; no binding, never enforced): the policy's
    // expressions must draw no warning, and one wrong field must draw one (the check runs).
    let docs = cluster::documents(&manifest);
    let vap = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .unwrap();
    // One exception: the checker cannot see a map of quantities (Quantity's OpenAPI v3 schema
    // is a oneOf without a type, so the map gets no CEL type) and calls
    // status.allocatedResources an undefined field. At admission the object is untyped, where
    // has() on it works like on any other field: the allowed cases below would fail otherwise.
    let blind_spot = "undefined field 'allocatedResources'";
    let warnings = type_check(&cp, vap, "typecheck", None).await;
    let unexpected: Vec<_> = warnings
        .iter()
        .filter(|w| {
            let errors = w.lines().filter(|l| l.contains("ERROR:"));
            !errors.clone().all(|l| l.contains(blind_spot)) || errors.count() == 0
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "the apiserver's type check: {unexpected:#?}"
    );
    let wrong = type_check(
        &cp,
        vap,
        "typecheck-canary",
        Some("object.status.bogus == 'x'"),
    )
    .await;
    assert!(wrong.iter().any(|w| w.contains("bogus")), "{wrong:?}");

    // The control account: the sidecar's Role, another name.
    cp.create_service_account(NS, OTHER_SA).await.unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": OTHER_SA},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SA},
        "subjects": [{"kind": "ServiceAccount", "name": OTHER_SA, "namespace": NS}]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(cp.client(), NS)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    // The policy is enforced asynchronously: until a request it must deny is denied.
    let canary = pod(&cp, "canary", Shape::Standard).await;
    let unbound = &cp.client_for_token(&cp.service_account_token(NS, SA).await.unwrap());
    let write = &sidecar(&canary, json!([cond(IDLE, "True")]));
    let answer = until(|| async move {
        let answer = send(unbound, "canary", write).await;
        (answer.0 != 200).then_some(answer)
    })
    .await;
    assert!(denied_by(&answer, NOT_ITS_POD), "the canary: {answer:?}");
    cp
}

/// The apiserver's type-check warnings for a copy of `vap` that matches pods (not
/// pods/status), named `<policy>-<suffix>`, with `extra` as one more validation.
async fn type_check(
    cp: &ControlPlane,
    vap: &Value,
    suffix: &str,
    extra: Option<&str>,
) -> Vec<String> {
    let mut copy = vap.clone();
    let name = format!("{POLICY}-{suffix}");
    copy["metadata"]["name"] = json!(name);
    copy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] = json!(["pods"]);
    if let Some(expression) = extra {
        copy["spec"]["validations"]
            .as_array_mut()
            .unwrap()
            .push(json!({"expression": expression}));
    }
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(cp.client());
    let copy = serde_json::from_value(copy).unwrap();
    policies
        .create(&PostParams::default(), &copy)
        .await
        .unwrap();
    let checked = kube::runtime::wait::await_condition(policies, &name, |p: Option<&_>| {
        p.is_some_and(|p: &ValidatingAdmissionPolicy| {
            let status = p.status.as_ref();
            status.is_some_and(|s| s.type_checking.is_some())
                && status.and_then(|s| s.observed_generation) == p.metadata.generation
        })
    });
    let policy = tokio::time::timeout(LIMIT, checked)
        .await
        .expect("type-checked in time");
    let status = policy.unwrap().unwrap().status.unwrap();
    let warnings = status
        .type_checking
        .unwrap()
        .expression_warnings
        .unwrap_or_default();
    warnings
        .into_iter()
        .map(|w| format!("{}: {}", w.field_ref, w.warning))
        .collect()
}

/// A pod on a node, running as the sidecar's account, with status as the kubelet writes it.
async fn pod(cp: &ControlPlane, name: &str, shape: Shape) -> Pod {
    let mut metadata = json!({"name": name, "labels": {"app": "game"}, "annotations":
        {"kruise.io/podprobe": PROBES, "kruise.io/podprobemarker-list": "game"}});
    match shape {
        Shape::NoLabels => {
            metadata.as_object_mut().unwrap().remove("labels");
        }
        Shape::NoAnnotation => {
            metadata["annotations"]
                .as_object_mut()
                .unwrap()
                .remove("kruise.io/podprobe");
        }
        Shape::DeclaresReady | Shape::DeclaresReserved => {
            let declared = match shape {
                Shape::DeclaresReady => "Ready",
                _ => RESERVED_DOMAIN_TYPE,
            };
            metadata["annotations"]["kruise.io/podprobe"] = json!(PROBES.replace(IDLE, declared));
        }
        Shape::Standard | Shape::NoConditions => {}
    }
    let pod = json!({"metadata": metadata, "spec": {"nodeName": "vk-1", "serviceAccountName": SA,
        "containers": [{"name": "game", "image": "example.com/game:1"}]}});
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
    let mut conditions: Vec<Value> = KUBELET
        .iter()
        .map(|(t, s)| json!({"type": t, "status": s, "lastTransitionTime": "2026-01-01T00:00:05Z"}))
        .collect();
    conditions.push(
        json!({"type": HEALTHY, "status": "True", "lastTransitionTime": "2026-01-01T00:00:10Z"}),
    );
    let mut status = json!({"phase": "Running", "podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}],
        "hostIP": "192.168.0.1", "startTime": "2026-01-01T00:00:00Z",
        "containerStatuses": [{"name": "game", "ready": true, "restartCount": 0, "started": true,
            "image": "example.com/game:1", "imageID": "example.com/game@sha256:00",
            "containerID": "containerd://00", "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}}]});
    if !matches!(shape, Shape::NoConditions) {
        status["conditions"] = json!(conditions);
    }
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .unwrap()
}

fn cond(type_: &str, status: &str) -> Value {
    json!({"type": type_, "status": status, "reason": "PodProbe",
           "lastTransitionTime": "2026-01-01T00:01:00Z"})
}

/// The sidecar's write: a strategic merge of conditions, with the pod's uid.
fn sidecar(pod: &Pod, conditions: Value) -> Patch<Value> {
    Patch::Strategic(json!({"metadata": {"uid": pod.metadata.uid},
                            "status": {"conditions": conditions}}))
}

/// A strategic merge of `metadata` (with the pod's uid) through pods/status.
fn metadata(pod: &Pod, mut metadata: Value) -> Patch<Value> {
    metadata["uid"] = json!(pod.metadata.uid);
    Patch::Strategic(json!({"metadata": metadata}))
}

/// A strategic merge of `status` (with the pod's uid).
fn status(pod: &Pod, status: Value) -> Patch<Value> {
    Patch::Strategic(json!({"metadata": {"uid": pod.metadata.uid}, "status": status}))
}

/// The stored conditions as (type, status), sorted (a strategic merge puts new ones first).
fn conditions(pod: &Pod) -> Vec<(String, String)> {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.clone());
    let mut conditions: Vec<_> = conditions
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect();
    conditions.sort();
    conditions
}

/// The HTTP code and message of a pods/status PATCH (200 and "" when accepted).
async fn send(client: &Client, name: &str, patch: &Patch<Value>) -> (u16, String) {
    let params = match patch {
        Patch::Apply(_) => PatchParams::apply("podprobe").force(),
        _ => PatchParams::default(),
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    match pods.patch_status(name, &params, patch).await {
        Ok(_) => (200, String::new()),
        Err(kube::Error::Api(s)) => (s.code, s.message),
        Err(e) => panic!("{e}"),
    }
}

/// Whether the answer is the policy's denial by the validation saying `why`.
fn denied_by((code, message): &(u16, String), why: &str) -> bool {
    let by_policy = format!("ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied");
    *code == 403 && message.contains(&by_policy) && message.contains(why)
}

/// Polls `attempt` (every 100 ms) until it returns something, for at most LIMIT.
async fn until<T, F: Future<Output = Option<T>>>(mut attempt: impl FnMut() -> F) -> T {
    let poll = async {
        loop {
            if let Some(done) = attempt().await {
                return done;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(LIMIT, poll).await.expect("in time")
}
