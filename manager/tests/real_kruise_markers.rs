//! Markers side by side (TV-08…TV-11): the same PodProbeMarker, the same pods and the same
//! sequence of condition statuses (written as the sidecar would) on a control plane with the
//! real kruise-manager and on one with podprobe-manager standalone; what each wrote on the pod
//! is compared after every step, and the patches each sent per condition change are counted.

mod cluster;
mod installed;
mod side_by_side;
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use side_by_side::{Both, SideBySide};
use testkit::real::ControlPlane;

const NS: &str = "markers";
const LIMIT: Duration = Duration::from_secs(60);
const KRUISE_USER: &str = "system:serviceaccount:kruise-system:kruise-manager";
const PODPROBE_USER: &str = "system:serviceaccount:podprobe-system:podprobe-manager";
const IDLE: &str = "game.io/idle";
const HEALTHY: &str = "game.io/healthy";
const NGINX: &str = "game.kruise.io/healthy";
/// Toggled at every step: its marker says the step's markers were applied.
const STEP: &str = "podprobe.test/step";
const COST: &str = "controller.kubernetes.io/pod-deletion-cost";
const INGRESS: &str = "controller.kubernetes.io/ingress";

/// TV-08's two conditions with both policies, TV-09's Succeeded-only policy, TV-11's
/// marker without a condition, and the step marker.
fn markers_ppm() -> Value {
    let exec = json!({"exec": {"command": ["true"]}});
    let policy = |state: &str, mut markers: Value| {
        markers["state"] = json!(state);
        markers
    };
    let both = |c: &str, s: Value, f: Value| {
        json!({"name": c.rsplit('/').next().unwrap(), "containerName": "main", "probe": exec,
               "podConditionType": c,
               "markerPolicy": [policy("Succeeded", s), policy("Failed", f)]})
    };
    json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "game", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "game"}}, "probes": [
            both(IDLE,
                 json!({"labels": {"gameserver-idle": "true"}, "annotations": {COST: "-10"}}),
                 json!({"labels": {"gameserver-idle": "false"}, "annotations": {COST: "10"}})),
            both(HEALTHY,
                 json!({"labels": {"gameserver-healthy": "true"}, "annotations": {INGRESS: "true"}}),
                 json!({"labels": {"gameserver-healthy": "false"}, "annotations": {INGRESS: "false"}})),
            {"name": "nginx", "containerName": "main", "probe": exec, "podConditionType": NGINX,
             "markerPolicy": [{"state": "Succeeded", "labels": {"nginx": "healthy"}}]},
            {"name": "marker-only", "containerName": "main", "probe": exec,
             "markerPolicy": [{"state": "Succeeded", "labels": {"marker-only": "true"}}]},
            both(STEP, json!({"labels": {"step": "odd"}}), json!({"labels": {"step": "even"}})),
        ]}
    })
}

fn game_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "game"}},
        "spec": {"nodeName": "vk-1", "containers": [{"name": "main", "image": "game:1"}]}
    }))
    .unwrap()
}

/// The kubelet's running pod plus `conditions` (`"-"` removes one), as one status patch.
async fn set_conditions(client: Client, name: &str, conditions: &[(&str, &str)]) {
    let mut list = vec![
        json!({"type": "PodScheduled", "status": "True"}),
        json!({"type": "Initialized", "status": "True"}),
    ];
    for (type_, status) in conditions {
        list.push(match *status {
            "-" => json!({"type": type_, "$patch": "delete"}),
            _ => json!({"type": type_, "status": status}),
        });
    }
    let patch = json!({"status": {"phase": "Running", "conditions": list}});
    Api::<Pod>::namespaced(client, NS)
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap_or_else(|e| panic!("status of {name}: {e}"));
}

/// The marker keys present on the pod, labels as `l:key`, annotations as `a:key`.
fn markers(pod: &Pod) -> BTreeMap<String, String> {
    let keys = [
        "gameserver-idle",
        "gameserver-healthy",
        "nginx",
        "marker-only",
        "step",
    ];
    let mut found = BTreeMap::new();
    for (k, v) in pod.metadata.labels.iter().flatten() {
        if keys.contains(&k.as_str()) {
            found.insert(format!("l:{k}"), v.clone());
        }
    }
    for (k, v) in pod.metadata.annotations.iter().flatten() {
        if [COST, INGRESS].contains(&k.as_str()) {
            found.insert(format!("a:{k}"), v.clone());
        }
    }
    found
}

fn expect(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

async fn wait_step(client: Client, name: &str, step: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client, NS);
    let cond = kube::runtime::wait::await_condition(pods.clone(), name, |p: Option<&Pod>| {
        p.is_some_and(|p| markers(p).get("l:step").map(String::as_str) == Some(step))
    });
    match tokio::time::timeout(LIMIT, cond).await {
        Ok(Ok(Some(p))) => p,
        other => panic!(
            "step marker {step} on {name} not reached ({other:?}): {:#?}",
            pods.get(name).await.ok().map(|p| p.metadata)
        ),
    }
}

/// Sets the conditions on both sides and returns both pods once each side applied the step.
async fn step(both: &SideBySide, name: &str, conditions: &[(&str, &str)]) -> Both<Pod> {
    let clients = both.clients();
    let step = if conditions.contains(&(STEP, "True")) {
        "odd"
    } else {
        "even"
    };
    tokio::join!(
        set_conditions(clients.kruise.clone(), name, conditions),
        set_conditions(clients.podprobe.clone(), name, conditions)
    );
    let (kruise, podprobe) = tokio::join!(
        wait_step(clients.kruise, name, step),
        wait_step(clients.podprobe, name, step)
    );
    Both { kruise, podprobe }
}

fn pod_patches_by(cp: &ControlPlane, user: &str) -> usize {
    cp.audit()
        .unwrap()
        .iter()
        .filter(|e| e.user.username == user && e.is("patch", "pods", None))
        .count()
}

/// kruise-manager's Prometheus samples `name{...}` whose labels contain `needle`, summed
/// (e.g. over `result` values).
async fn kruise_metric(both: &SideBySide, name: &str, needle: &str) -> f64 {
    let addr = ([127, 0, 0, 1], both.kruise_addrs.metrics_port).into();
    let (_, text) = support::http_get(addr, "/metrics").await;
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Returns once kruise-manager's PodProbeMarker controller has run a reconcile since
/// `reconciles` and has nothing queued: every patch of that work has been sent.
async fn kruise_idle_after(both: &SideBySide, reconciles: f64) {
    const CONTROLLER: &str = "controller=\"PodProbeMarker-controller\"";
    let idle = async {
        loop {
            let done = kruise_metric(both, "controller_runtime_reconcile_total", CONTROLLER).await;
            let depth = kruise_metric(both, "workqueue_depth", "PodProbeMarker-controller").await;
            let active = kruise_metric(both, "controller_runtime_active_workers", CONTROLLER).await;
            if done > reconciles && depth == 0.0 && active == 0.0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    if tokio::time::timeout(LIMIT, idle).await.is_err() {
        let addr = ([127, 0, 0, 1], both.kruise_addrs.metrics_port).into();
        let (_, text) = support::http_get(addr, "/metrics").await;
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("PodProbeMarker"))
            .collect();
        panic!("kruise-manager's PodProbeMarker controller did not go idle: {lines:#?}");
    }
}

async fn kruise_reconciles(both: &SideBySide) -> f64 {
    kruise_metric(
        both,
        "controller_runtime_reconcile_total",
        "controller=\"PodProbeMarker-controller\"",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tv08_to_tv11_markers_and_patches_side_by_side() {
    let mut both = SideBySide::start().await;
    both.namespace(NS).await;
    let created = both.create_ppm(&markers_ppm()).await;
    assert!(
        created.kruise.is_ok() && created.podprobe.is_ok(),
        "{created:?}"
    );
    both.wait_caches().await;
    both.create_pod(&game_pod("gs-0")).await;

    // TV-08: two conditions, one True and one False; TV-09's nginx True.
    let pods = step(
        &both,
        "gs-0",
        &[
            (IDLE, "True"),
            (HEALTHY, "False"),
            (NGINX, "True"),
            (STEP, "True"),
        ],
    )
    .await;
    let tv08 = expect(&[
        ("l:gameserver-idle", "true"),
        ("l:gameserver-healthy", "false"),
        ("l:nginx", "healthy"),
        ("l:step", "odd"),
        ("a:controller.kubernetes.io/pod-deletion-cost", "-10"),
        ("a:controller.kubernetes.io/ingress", "false"),
    ]);
    assert_eq!(markers(&pods.kruise), tv08, "TV-08 Kruise");
    assert_eq!(markers(&pods.podprobe), tv08, "TV-08 podprobe");

    // Everything flips; TV-09: nginx False has no policy. Kruise's serverless path keeps the
    // Succeeded policy's label; podprobe removes the opposite policy's keys, as kruise-daemon's
    // path does and the user manual says (TV-11's semantics).
    let pods = step(
        &both,
        "gs-0",
        &[
            (IDLE, "False"),
            (HEALTHY, "True"),
            (NGINX, "False"),
            (STEP, "False"),
        ],
    )
    .await;
    let flipped = [
        ("l:gameserver-idle", "false"),
        ("l:gameserver-healthy", "true"),
        ("l:step", "even"),
        ("a:controller.kubernetes.io/pod-deletion-cost", "10"),
        ("a:controller.kubernetes.io/ingress", "true"),
    ];
    let mut kruise_keeps = expect(&flipped);
    kruise_keeps.insert("l:nginx".into(), "healthy".into());
    assert_eq!(markers(&pods.kruise), kruise_keeps, "TV-09 Kruise");
    assert_eq!(markers(&pods.podprobe), expect(&flipped), "TV-09 podprobe");

    // TV-10: Unknown changes nothing (idle stays Failed's); nginx back.
    let pods = step(
        &both,
        "gs-0",
        &[(IDLE, "Unknown"), (NGINX, "True"), (STEP, "True")],
    )
    .await;
    let mut tv10 = expect(&flipped);
    tv10.insert("l:nginx".into(), "healthy".into());
    tv10.insert("l:step".into(), "odd".into());
    assert_eq!(markers(&pods.kruise), tv10, "TV-10 Unknown, Kruise");
    assert_eq!(markers(&pods.podprobe), tv10, "TV-10 Unknown, podprobe");
    // ...and so does a condition that is gone.
    let pods = step(&both, "gs-0", &[(IDLE, "-"), (STEP, "False")]).await;
    tv10.insert("l:step".into(), "even".into());
    assert_eq!(markers(&pods.kruise), tv10, "TV-10 missing, Kruise");
    assert_eq!(markers(&pods.podprobe), tv10, "TV-10 missing, podprobe");
    // TV-11's marker without a condition never showed on either (checked in every map above).

    patches_per_condition_change(&both).await;
}

/// N pods in steady state; one condition change on one pod, then one on every pod: the pod
/// patches each manager sent for them.
async fn patches_per_condition_change(both: &SideBySide) {
    const N: usize = 20;
    let names: Vec<String> = (0..N).map(|i| format!("fleet-{i}")).collect();
    for name in &names {
        both.create_pod(&game_pod(name)).await;
    }
    let steady = [
        (IDLE, "True"),
        (HEALTHY, "True"),
        (NGINX, "True"),
        (STEP, "True"),
    ];
    for name in &names {
        step(both, name, &steady).await;
    }
    let count = |both: &SideBySide| Both {
        kruise: pod_patches_by(&both.kruise, KRUISE_USER),
        podprobe: pod_patches_by(&both.podprobe.cp, PODPROBE_USER),
    };
    let mut figures = Vec::new();
    for (what, changed) in [("one pod", &names[..1]), ("every pod", &names[..])] {
        let reconciles = kruise_reconciles(both).await;
        let before = count(both);
        for name in changed {
            step(both, name, &[(IDLE, "False"), (STEP, "False")]).await;
        }
        kruise_idle_after(both, reconciles).await;
        let after = count(both);
        let sent = (
            after.kruise - before.kruise,
            after.podprobe - before.podprobe,
        );
        figures.push((what, changed.len(), sent));
        // Each change is one patch of the pod whose condition changed, on both sides; Kruise's
        // reconcile visits every matched pod but patches only those whose markers differ.
        assert_eq!(
            sent,
            (changed.len(), changed.len()),
            "{what}: (Kruise, podprobe) patches"
        );
        for name in changed {
            step(both, name, &steady).await;
        }
    }
    for (what, changes, (kruise, podprobe)) in figures {
        println!(
            "{} pods matched, condition changed on {what} ({changes} changes): pod patches Kruise {kruise}, podprobe {podprobe}",
            N + 1
        );
    }
}
