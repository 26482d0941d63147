//! The chart's ValidatingAdmissionPolicy for the sidecar (charts/podprobe/templates/
//! admission-policy.yaml), evaluated as committed: the test reads the template, extracts
//! `matchConditions`, `variables` and `validations`, and runs them with the `cel` crate against
//! admission requests a sidecar (or an attacker holding its token) could send.
//!
//! Evaluation follows the apiserver's: a request is in scope when every match condition is
//! true; variables are evaluated in order, each seeing the earlier ones as `variables.<name>`;
//! the request is allowed when every validation is true (false or an error denies:
//! `failurePolicy: Fail`).
//!
//! What this does not check, and why it still means something: the `cel` crate is an untyped
//! interpreter, so a CEL type error is not caught here. Nor does kube-apiserver catch one when
//! the policy is created: its type checker skips subresources, and this policy matches only
//! pods/status (`real_admission_policy.rs` type-checks a copy matching pods, and runs these
//! cases on a real apiserver). At admission the apiserver evaluates the expressions untyped
//! too (object and oldObject are `dyn`): plain JSON maps, as here (unset field = absent key, so
//! `has()` behaves the same; a misspelt field is a "no such key" error, which denies every
//! write). The policy uses no Kubernetes CEL library function and no optional types
//! (`[?...]`, `.orValue()`), precisely so that it means the same in both.

mod chart;

use std::sync::Arc;

use cel::{Context, Env, Value};
use serde_json::{Value as Json, json};

const SA: &str = "system:serviceaccount:games:podprobe-sidecar";
const UID: &str = "0b5e4d2c-1111-4a4a-8c8c-000000000001";
const PROBES: &str = r#"[{"name":"healthy","containerName":"game","probe":{"tcpSocket":{"port":"game"},"periodSeconds":5},"podConditionType":"game.kruise.io/healthy"},{"name":"idle","containerName":"game","probe":{"exec":{"command":["sh","-c","echo \"podConditionType\":\"Ready\""]}},"podConditionType":"game.kruise.io/idle"}]"#;

struct Policy {
    match_conditions: Vec<(String, String)>,
    variables: Vec<(String, String)>,
    validations: Vec<String>,
}

fn policy() -> Policy {
    let docs = chart::documents("admission-policy.yaml");
    let vap = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .expect("a ValidatingAdmissionPolicy");
    let named = |key: &str| -> Vec<(String, String)> {
        vap["spec"][key]
            .as_array()
            .unwrap_or_else(|| panic!("spec.{key}"))
            .iter()
            .map(|v| {
                (
                    v["name"].as_str().expect("name").to_owned(),
                    v["expression"].as_str().expect("expression").to_owned(),
                )
            })
            .collect()
    };
    let validations = vap["spec"]["validations"]
        .as_array()
        .expect("spec.validations")
        .iter()
        .map(|v| v["expression"].as_str().expect("expression").to_owned())
        .collect();
    Policy {
        match_conditions: named("matchConditions"),
        variables: named("variables"),
        validations,
    }
}

#[derive(Debug, PartialEq)]
enum Verdict {
    NotMatched,
    Allowed,
    /// The first failing validation (its expression) and what it evaluated to.
    Denied(String, String),
}

fn eval(env: &Arc<Env>, ctx: &Context, expr: &str) -> Result<Value, String> {
    let program = env
        .compile(expr)
        .unwrap_or_else(|e| panic!("does not parse: {expr}: {e:?}"));
    program.execute(ctx).map_err(|e| format!("{e:?}"))
}

fn admit(request: &Json, object: &Json, old: &Json) -> Verdict {
    let policy = policy();
    let env = Arc::new(Env::stdlib());
    let mut ctx = Context::with_env(env.clone());
    ctx.add_variable("request", cel::to_value(request).unwrap())
        .unwrap();
    ctx.add_variable("object", cel::to_value(object).unwrap())
        .unwrap();
    ctx.add_variable("oldObject", cel::to_value(old).unwrap())
        .unwrap();
    for (name, expr) in &policy.match_conditions {
        match eval(&env, &ctx, expr) {
            Ok(Value::Bool(true)) => {}
            Ok(Value::Bool(false)) => return Verdict::NotMatched,
            other => panic!("match condition {name} must not error: {other:?}"),
        }
    }
    let mut variables = serde_json::Map::new();
    for (name, expr) in &policy.variables {
        let value = eval(&env, &ctx, expr)
            .unwrap_or_else(|e| panic!("variable {name} must not error: {e}"));
        let value = value
            .json()
            .unwrap_or_else(|e| panic!("variable {name}: {e:?}"));
        variables.insert(name.clone(), value);
        ctx.add_variable("variables", cel::to_value(&variables).unwrap())
            .unwrap();
    }
    for expr in &policy.validations {
        match eval(&env, &ctx, expr) {
            Ok(Value::Bool(true)) => {}
            other => return Verdict::Denied(expr.clone(), format!("{other:?}")),
        }
    }
    Verdict::Allowed
}

fn sidecar_of(pod: &str, uid: &str) -> Json {
    json!({
        "username": SA,
        "uid": "u-1",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:games", "system:authenticated"],
        "extra": {
            "authentication.kubernetes.io/pod-name": [pod],
            "authentication.kubernetes.io/pod-uid": [uid],
            "authentication.kubernetes.io/credential-id": ["JTI=abc"],
        },
    })
}

fn request(user: Json) -> Json {
    json!({
        "operation": "UPDATE",
        "subResource": "status",
        "namespace": "games",
        "name": "game-server-0",
        "userInfo": user,
    })
}

fn condition(t: &str, status: &str, time: &str) -> Json {
    json!({"type": t, "status": status, "lastProbeTime": null, "lastTransitionTime": time})
}

/// The stored pod: kubelet's conditions, one probe condition already written.
fn stored() -> Json {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "game-server-0",
            "namespace": "games",
            "uid": UID,
            "labels": {"app": "game"},
            "annotations": {"kruise.io/podprobe": PROBES, "kruise.io/podprobemarker-list": "game"},
        },
        "spec": {"containers": [{"name": "game", "image": "example.com/game:1"}], "serviceAccountName": "podprobe-sidecar"},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.7",
            "conditions": [
                condition("Initialized", "True", "2026-01-01T00:00:00Z"),
                condition("Ready", "True", "2026-01-01T00:00:05Z"),
                condition("ContainersReady", "True", "2026-01-01T00:00:05Z"),
                condition("PodScheduled", "True", "2026-01-01T00:00:00Z"),
                condition("game.kruise.io/healthy", "True", "2026-01-01T00:00:10Z"),
            ],
            "containerStatuses": [{"name": "game", "ready": true, "restartCount": 0}],
        },
    })
}

fn conditions(pod: &mut Json) -> &mut Vec<Json> {
    pod["status"]["conditions"].as_array_mut().unwrap()
}

fn own_sidecar() -> Json {
    request(sidecar_of("game-server-0", UID))
}

fn assert_denied(verdict: Verdict, containing: &str) {
    match verdict {
        Verdict::Denied(expr, _) => assert!(
            expr.contains(containing),
            "denied, but by another validation than expected ({containing}): {expr}"
        ),
        other => panic!("expected a denial ({containing}), got {other:?}"),
    }
}

#[test]
fn policy_parses_and_uses_no_kubernetes_only_functions() {
    let p = policy();
    assert!(!p.match_conditions.is_empty() && !p.validations.is_empty());
    let env = Env::stdlib();
    for expr in p
        .match_conditions
        .iter()
        .chain(&p.variables)
        .map(|(_, e)| e)
        .chain(&p.validations)
    {
        env.compile(expr)
            .unwrap_or_else(|e| panic!("{expr}: {e:?}"));
        for k8s_only in [
            "orValue",
            "[?",
            ".?",
            "optional.",
            "url(",
            "quantity(",
            "ip(",
            "cidr(",
        ] {
            assert!(!expr.contains(k8s_only), "{k8s_only} in {expr}");
        }
    }
}

#[test]
fn own_pod_writing_its_own_condition_is_allowed() {
    let old = stored();
    let mut new = stored();
    conditions(&mut new)[4] = condition("game.kruise.io/healthy", "False", "2026-01-01T00:01:00Z");
    assert_eq!(admit(&own_sidecar(), &new, &old), Verdict::Allowed);
}

#[test]
fn own_pod_adding_a_declared_condition_is_allowed() {
    let old = stored();
    let mut new = stored();
    conditions(&mut new).push(condition(
        "game.kruise.io/idle",
        "True",
        "2026-01-01T00:01:00Z",
    ));
    assert_eq!(admit(&own_sidecar(), &new, &old), Verdict::Allowed);
}

#[test]
fn removing_its_own_condition_is_allowed() {
    let old = stored();
    let mut new = stored();
    conditions(&mut new).remove(4);
    assert_eq!(admit(&own_sidecar(), &new, &old), Verdict::Allowed);
}

#[test]
fn a_write_that_changes_nothing_is_allowed() {
    assert_eq!(
        admit(&own_sidecar(), &stored(), &stored()),
        Verdict::Allowed
    );
}

#[test]
fn another_pod_is_denied() {
    let old = stored();
    let mut new = stored();
    conditions(&mut new)[4] = condition("game.kruise.io/healthy", "False", "2026-01-01T00:01:00Z");
    let other = request(sidecar_of(
        "game-server-1",
        "0b5e4d2c-2222-4a4a-8c8c-000000000002",
    ));
    assert_denied(admit(&other, &new, &old), "variables.podName");
    // The name alone decides it too (validations are checked one by one, name first).
    let other_name = request(sidecar_of("game-server-1", UID));
    assert_denied(admit(&other_name, &new, &old), "variables.podName");
}

#[test]
fn same_name_but_another_uid_is_denied() {
    // A replacement pod with the old pod's name: the old pod's token must not write it.
    let old = stored();
    let mut new = stored();
    conditions(&mut new)[4] = condition("game.kruise.io/healthy", "False", "2026-01-01T00:01:00Z");
    let stale = request(sidecar_of(
        "game-server-0",
        "0b5e4d2c-9999-4a4a-8c8c-000000000009",
    ));
    assert_denied(admit(&stale, &new, &old), "variables.podUID");
}

#[test]
fn missing_pod_claims_are_denied() {
    let old = stored();
    let mut new = stored();
    conditions(&mut new)[4] = condition("game.kruise.io/healthy", "False", "2026-01-01T00:01:00Z");
    // A legacy Secret-based token: no extra at all.
    let legacy = request(json!({"username": SA, "groups": ["system:serviceaccounts"]}));
    assert_denied(admit(&legacy, &new, &old), "variables.podName");
    // Extra present, pod-name missing (uid present).
    let mut partial = sidecar_of("game-server-0", UID);
    partial["extra"]
        .as_object_mut()
        .unwrap()
        .remove("authentication.kubernetes.io/pod-name");
    assert_denied(admit(&request(partial), &new, &old), "variables.podName");
    // pod-name present, pod-uid missing.
    let mut no_uid = sidecar_of("game-server-0", UID);
    no_uid["extra"]
        .as_object_mut()
        .unwrap()
        .remove("authentication.kubernetes.io/pod-uid");
    assert_denied(admit(&request(no_uid), &new, &old), "variables.podUID");
}

#[test]
fn label_change_through_status_is_denied() {
    let old = stored();
    let mut new = stored();
    new["metadata"]["labels"]["game.kruise.io/state"] = json!("idle");
    assert_denied(admit(&own_sidecar(), &new, &old), "object.metadata.labels");
    // Adding labels to a pod without any is a change too.
    let mut old = stored();
    old["metadata"].as_object_mut().unwrap().remove("labels");
    assert_denied(admit(&own_sidecar(), &new, &old), "object.metadata.labels");
}

#[test]
fn annotation_change_through_status_is_denied() {
    // In particular, widening its own kruise.io/podprobe to declare kubelet's Ready.
    let old = stored();
    let mut new = stored();
    new["metadata"]["annotations"]["kruise.io/podprobe"] =
        json!(r#"[{"name":"x","containerName":"game","probe":{},"podConditionType":"Ready"}]"#);
    conditions(&mut new)[1] = condition("Ready", "False", "2026-01-01T00:01:00Z");
    assert!(matches!(
        admit(&own_sidecar(), &new, &old),
        Verdict::Denied(..)
    ));
    let mut new = stored();
    new["metadata"]["annotations"]["x"] = json!("y");
    assert_denied(
        admit(&own_sidecar(), &new, &old),
        "object.metadata.annotations",
    );
}

#[test]
fn finalizer_change_through_status_is_denied() {
    // pods/status persists finalizers: one added would hold the pod's deletion, one removed
    // would cut another controller out of it.
    let old = stored();
    let mut new = stored();
    new["metadata"]["finalizers"] = json!(["example.com/hold"]);
    assert_denied(
        admit(&own_sidecar(), &new, &old),
        "object.metadata.finalizers",
    );
    let mut old = stored();
    old["metadata"]["finalizers"] = json!(["example.com/hold", "example.com/other"]);
    let mut new = old.clone();
    new["metadata"]["finalizers"] = json!(["example.com/other"]);
    assert_denied(
        admit(&own_sidecar(), &new, &old),
        "object.metadata.finalizers",
    );
}

#[test]
fn phase_or_container_status_change_is_denied() {
    let old = stored();
    let mut new = stored();
    new["status"]["phase"] = json!("Failed");
    assert_denied(admit(&own_sidecar(), &new, &old), "object.status.phase");
    // Fields pods/status persists next to the phase (reason "Evicted", say).
    for (field, value) in [
        ("reason", json!("Evicted")),
        ("message", json!("evicted by podprobe")),
        ("startTime", json!("2020-01-01T00:00:00Z")),
    ] {
        let mut new = stored();
        new["status"][field] = value;
        let expr = format!("object.status.{field}");
        assert_denied(admit(&own_sidecar(), &new, &old), &expr);
    }
    let mut new = stored();
    new["status"]["containerStatuses"][0]["ready"] = json!(false);
    assert_denied(admit(&own_sidecar(), &new, &old), "containerStatuses");
}

#[test]
fn undeclared_condition_type_is_denied() {
    let old = stored();
    let mut new = stored();
    conditions(&mut new).push(condition(
        "game.kruise.io/other",
        "True",
        "2026-01-01T00:01:00Z",
    ));
    assert_denied(admit(&own_sidecar(), &new, &old), "c.type");
    // A prefix of a declared type is not declared (the closing quote is part of the match).
    let mut new = stored();
    conditions(&mut new).push(condition(
        "game.kruise.io/health",
        "True",
        "2026-01-01T00:01:00Z",
    ));
    assert_denied(admit(&own_sidecar(), &new, &old), "c.type");
}

#[test]
fn quoted_text_inside_a_probe_does_not_declare_a_type() {
    // PROBES carries `"podConditionType":"Ready"` inside an exec argument, JSON-escaped.
    assert!(PROBES.contains(r#"\"podConditionType\":\"Ready\""#));
    let old = stored();
    let mut new = stored();
    conditions(&mut new)[1] = condition("Ready", "False", "2026-01-01T00:01:00Z");
    assert_denied(admit(&own_sidecar(), &new, &old), "c.type");
}

#[test]
fn kubelet_ready_changed_or_removed_is_denied() {
    let old = stored();
    let mut new = stored();
    conditions(&mut new)[1] = condition("Ready", "False", "2026-01-01T00:01:00Z");
    assert_denied(admit(&own_sidecar(), &new, &old), "c.type");
    let mut new = stored();
    conditions(&mut new).remove(1);
    assert_denied(admit(&own_sidecar(), &new, &old), "o.type");
}

#[test]
fn a_pod_without_the_annotation_allows_no_condition_write() {
    let mut old = stored();
    old["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("kruise.io/podprobe");
    let mut new = old.clone();
    conditions(&mut new)[4] = condition("game.kruise.io/healthy", "False", "2026-01-01T00:01:00Z");
    assert_denied(admit(&own_sidecar(), &new, &old), "c.type");
}

#[test]
fn first_condition_on_a_pod_without_conditions_is_allowed() {
    let mut old = stored();
    old["status"].as_object_mut().unwrap().remove("conditions");
    let mut new = old.clone();
    new["status"]["conditions"] = json!([condition(
        "game.kruise.io/healthy",
        "True",
        "2026-01-01T00:01:00Z"
    )]);
    assert_eq!(admit(&own_sidecar(), &new, &old), Verdict::Allowed);
}

#[test]
fn other_users_are_not_matched() {
    let old = stored();
    let mut new = stored();
    conditions(&mut new)[1] = condition("Ready", "False", "2026-01-01T00:01:00Z");
    let kubelet = request(json!({"username": "system:node:vk-0", "groups": ["system:nodes"]}));
    assert_eq!(admit(&kubelet, &new, &old), Verdict::NotMatched);
    let other_sa = request(json!({"username": "system:serviceaccount:games:game-server"}));
    assert_eq!(admit(&other_sa, &new, &old), Verdict::NotMatched);
    // A name that merely ends like ours in another namespace is still our sidecar's name:
    // matched (and so confined), never exempted.
    let same_name = request(json!({"username": "system:serviceaccount:other:podprobe-sidecar"}));
    assert!(matches!(admit(&same_name, &new, &old), Verdict::Denied(..)));
}

/// The stored pod with `t` declared by its annotation (as a PodProbeMarker author or anyone
/// who can edit the pod's annotations could) and the write setting it.
fn declaring(t: &str) -> (Json, Json) {
    let mut old = stored();
    let probes = PROBES.replace("game.kruise.io/idle", t);
    old["metadata"]["annotations"]["kruise.io/podprobe"] = json!(probes);
    let mut new = old.clone();
    conditions(&mut new).push(condition(t, "False", "2026-01-01T00:01:00Z"));
    (old, new)
}

#[test]
fn reserved_condition_types_are_denied_even_when_declared() {
    let (old, mut new) = declaring("Ready");
    // The kubelet's Ready is the second condition: changed, not added.
    conditions(&mut new).pop();
    conditions(&mut new)[1] = condition("Ready", "False", "2026-01-01T00:01:00Z");
    assert_denied(admit(&own_sidecar(), &new, &old), "reservedTypes");
    let mut removed = old.clone();
    conditions(&mut removed).remove(1);
    assert_denied(admit(&own_sidecar(), &removed, &old), "reservedTypes");
    for t in ["PodResizePending", "node.kubernetes.io/gate", "k8s.io/x"] {
        let (old, new) = declaring(t);
        assert_denied(admit(&own_sidecar(), &new, &old), "reservedTypes");
    }
    // The control: the same write of a free type is allowed.
    let (old, new) = declaring("example.com/gate");
    assert_eq!(admit(&own_sidecar(), &new, &old), Verdict::Allowed);
}

/// The policy's reserved types and domains are the sidecar's and the manager's: evaluated from
/// the policy and compared with podprobe-protocol's rule.
#[test]
fn the_policys_reserved_types_are_the_protocols() {
    let policy = policy();
    let env = Arc::new(Env::stdlib());
    let expr = |name: &str| {
        let found = policy.variables.iter().find(|(n, _)| n == name);
        found.unwrap_or_else(|| panic!("variable {name}")).1.clone()
    };
    let ctx = Context::with_env(env.clone());
    let types = eval(&env, &ctx, &expr("reservedTypes"))
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(
        types,
        json!(podprobe_protocol::annotation::RESERVED_CONDITION_TYPES)
    );
    let domains = expr("reservedDomains");
    for t in [
        "kubernetes.io/x",
        "k8s.io/x",
        "node.kubernetes.io/ready",
        "a.b.k8s.io/gate",
        "game.kruise.io/idle",
        "Idle",
        "notkubernetes.io/x",
        "example.com/kubernetes.io",
        "k8s.io.example.com/x",
        "target-health.elbv2.k8s.aws/tg",
    ] {
        let matches = format!("{:?}.matches({domains})", t);
        let in_policy = eval(&env, &ctx, &matches).unwrap() == Value::Bool(true);
        let in_protocol = podprobe_protocol::annotation::is_reserved_condition_type(t);
        assert_eq!(in_policy, in_protocol, "{t}");
    }
}

#[test]
fn every_status_field_but_the_conditions_is_pinned() {
    let old = stored();
    for (field, value) in [
        ("observedGeneration", json!(7)),
        ("resources", json!({"limits": {"cpu": "64"}})),
        ("resize", json!("Proposed")),
        (
            "volumeHealth",
            json!([{"name": "data", "status": "Healthy"}]),
        ),
        ("podIP", json!("10.0.0.8")),
    ] {
        let mut new = stored();
        new["status"][field] = value;
        assert_denied(
            admit(&own_sidecar(), &new, &old),
            &format!("object.status.{field} =="),
        );
    }
}
