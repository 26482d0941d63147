//! The sidecar token issuer (manager/src/sidecar_token) on a real kube-apiserver, with the
//! chart installed and its RBAC and admission policies in force, where it used to hurt users:
//! - a pod that names another pod's token Secret never gets that Secret's token nor writes
//!   over it: after the grace it is released as refused, with an Event saying why;
//! - a RoleBinding that lands after the pods (a `helm upgrade` adding a namespace) does not
//!   leave them tokenless for life: the refusal is asked again with backoff, shown on the
//!   pod as an Event meanwhile, and the token is issued once the binding is there; in both
//!   modes (companion beside OpenKruise's kruise-manager);
//! - a virtual-node pod that keeps its projected token (bound at creation, or asking for the
//!   token everywhere) is told at creation and labelled so.
//!
//! The pods tolerate the virtual node's taint (the virtual-node shape: a Secret and a
//! scheduling gate); no scheduler runs, so each stays where the issuer leaves it.

mod cluster;
mod installed;
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use podprobe_manager::sidecar_token::issue::REFUSAL_GRACE;
use podprobe_manager::sidecar_token::{GATE, LABEL, PENDING, REFUSED};
use podprobe_manager::webhook::Mode;
use serde_json::json;

use installed::{NS, install_and_run, listening_target, start_control_plane};

/// Past the grace, the backoff's last wait (at most 30 s) and a margin.
const LIMIT: Duration = Duration::from_secs(REFUSAL_GRACE.as_secs() + 60);

/// A game pod for a virtual node, created through the webhook once it sees the
/// PodProbeMarker: the pod as injected.
async fn create_game_pod(running: &installed::Running, name: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "game"}},
        "spec": {"serviceAccountName": "podprobe-sidecar",
                 "tolerations": [{"key": "virtual-kubelet.io/provider",
                                  "operator": "Exists", "effect": "NoSchedule"}],
                 "containers": [{"name": "main", "image": "game:1",
                                 "command": ["/game"]}]}
    }))
    .unwrap();
    installed::create_once_admitted(running, &pod).await
}

fn gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == GATE))
}

/// Waits until the issuer is done with pod `name`: its gate lifted and its label removed
/// (issued) or set to refused.
async fn wait_released(running: &installed::Running, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(running.cp.client(), NS);
    testkit::wait::pod(&pods, name, "released by the issuer", LIMIT, |p| {
        !gated(p) && support::label(p, LABEL).as_deref() != Some(PENDING)
    })
    .await
}

/// The Warning Events podprobe-manager published about pod `name`: (reason, note).
async fn warnings(running: &installed::Running, name: &str) -> Vec<(String, String)> {
    Api::<Event>::namespaced(running.cp.client(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reporting_controller.as_deref() == Some("podprobe-manager")
        })
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_naming_another_pods_token_secret_never_gets_or_overwrites_it() {
    let running = install_and_run(start_control_plane().await, Mode::Standalone).await;
    let _target = listening_target(&running).await;
    create_game_pod(&running, "victim").await;
    let victim = wait_released(&running, "victim").await;
    assert_eq!(support::label(&victim, LABEL), None, "issued: {victim:?}");
    let secret_name = support::token_secret(&victim);
    let secrets: Api<Secret> = Api::namespaced(running.cp.client(), NS);
    let issued = secrets.get(&secret_name).await.unwrap();

    // Another pod that names the victim's Secret in its own token volume, as injection would
    // have written it, labelled and gated for the issuer: what `create pods` alone allows
    // once the name is known. Injection leaves an already injected pod alone.
    let mut attacker: serde_json::Value = serde_json::to_value(&victim).unwrap();
    attacker["metadata"] = json!({"name": "attacker", "namespace": NS,
        "labels": {"app": "game", LABEL: PENDING},
        "annotations": victim.metadata.annotations});
    attacker["spec"]["schedulingGates"] = json!([{"name": GATE}]);
    attacker.as_object_mut().unwrap().remove("status");
    let attacker: Pod = serde_json::from_value(attacker).unwrap();
    assert_eq!(support::token_secret(&attacker), secret_name);
    let created = Api::<Pod>::namespaced(running.cp.client(), NS)
        .create(&PostParams::default(), &attacker)
        .await
        .unwrap();
    assert!(gated(&created), "{created:?}");

    let started = std::time::Instant::now();
    let attacker = wait_released(&running, "attacker").await;
    assert_eq!(
        support::label(&attacker, LABEL).as_deref(),
        Some(REFUSED),
        "{attacker:?}"
    );
    // Not refused at once: another replica may be releasing a pod whose Secret it just wrote.
    assert!(
        started.elapsed() >= REFUSAL_GRACE - Duration::from_secs(5),
        "refused after {:?}",
        started.elapsed()
    );
    let told = warnings(&running, "attacker").await;
    assert!(
        told.iter()
            .any(|(reason, note)| reason == "SidecarTokenNotIssued"
                && note.contains(&secret_name)
                && note.contains("exists already")),
        "{told:?}"
    );

    // The victim's Secret is as the issuer wrote it for the victim.
    let after = secrets.get(&secret_name).await.unwrap();
    assert_eq!(
        after.metadata.resource_version, issued.metadata.resource_version,
        "the victim's Secret was written again"
    );
    let owner = &after.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(Some(owner.uid.as_str()), victim.metadata.uid.as_deref());
}

/// A virtual-node pod that cannot be issued a token keeps the projected one, which a provider
/// that does not project tokens replaces or drops: its creator is told (kubectl prints the
/// admission warning) and the pod says so (its label), as does a pod that asks for the token
/// in every container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_node_pod_that_keeps_its_projected_token_is_told_and_says_so() {
    use podprobe_manager::sidecar_token::PROJECTED;
    let running = install_and_run(start_control_plane().await, Mode::Standalone).await;
    let _target = listening_target(&running).await;
    // Once the webhook injects (it knows the PodProbeMarker), as a user would create them.
    create_game_pod(&running, "issued").await;
    for (name, extra, why) in [
        ("bound", json!({"nodeName": "vk-1"}), "spec.nodeName"),
        (
            "automount",
            json!({"automountServiceAccountToken": true}),
            "automountServiceAccountToken: true",
        ),
    ] {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {"app": "game"}},
            "spec": {"serviceAccountName": "podprobe-sidecar",
                     "tolerations": [{"key": "virtual-kubelet.io/provider",
                                      "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "main", "image": "game:1", "command": ["/game"]}]}
        });
        pod["spec"]
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let out = cluster::kubectl_stdin(&running.cp, &["create", "-f", "-"], &pod.to_string());
        assert!(
            out.status.success(),
            "kubectl create: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(
                "Warning: podprobe: this virtual-node pod keeps its projected service-account token"
            ) && stderr.contains(why),
            "kubectl printed: {stderr}"
        );
        let created = Api::<Pod>::namespaced(running.cp.client(), NS)
            .get(name)
            .await
            .unwrap();
        assert_eq!(
            support::label(&created, LABEL).as_deref(),
            Some(PROJECTED),
            "{created:?}"
        );
        assert!(!gated(&created), "{created:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolebinding_that_lands_after_the_pod_still_gets_its_token_issued() {
    let running = install_and_run(start_control_plane().await, Mode::Standalone).await;
    a_late_rolebinding_still_issues(&running).await;
}

/// The same beside OpenKruise: the issuer runs in companion mode too, and the chart lets it
/// tell the pod (its Events grant and policy are not standalone's alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_companion_mode_a_late_rolebinding_is_told_on_the_pod_and_issued() {
    a_late_rolebinding_still_issues(&installed::kruise_and_companion().await).await;
}

async fn a_late_rolebinding_still_issues(running: &installed::Running) {
    let _target = listening_target(running).await;
    // The chart's grant of token requests to the manager in the pod's namespace, taken away
    // and given back later, as a `helm upgrade` that adds the namespace would land it.
    let bindings: Api<RoleBinding> = Api::namespaced(running.cp.client(), NS);
    let binding = bindings
        .get("podprobe-manager-sidecar-token")
        .await
        .unwrap();
    bindings
        .delete("podprobe-manager-sidecar-token", &DeleteParams::default())
        .await
        .unwrap();

    let pod = create_game_pod(running, "late").await;
    assert!(gated(&pod));
    // The refusal shows on the pod while it waits.
    let told = testkit::wait::until_some(
        LIMIT,
        "a SidecarTokenRefused Event on the pod",
        async || {
            let told = warnings(running, "late").await;
            told.iter()
                .any(|(reason, _)| reason == "SidecarTokenRefused")
                .then_some(told)
        },
    )
    .await;
    assert!(
        told.iter()
            .any(|(_, note)| note.contains("forbidden") || note.contains("403")),
        "{told:?}"
    );
    let pods: Api<Pod> = Api::namespaced(running.cp.client(), NS);
    assert!(
        gated(&pods.get("late").await.unwrap()),
        "released before the grant came"
    );

    let mut binding = binding;
    binding.metadata.resource_version = None;
    binding.metadata.uid = None;
    binding.metadata.creation_timestamp = None;
    binding.metadata.managed_fields = None;
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    let released = wait_released(running, "late").await;
    assert_eq!(support::label(&released, LABEL), None, "{released:?}");
    let secret = Api::<Secret>::namespaced(running.cp.client(), NS)
        .get(&support::token_secret(&released))
        .await
        .expect("the issued Secret");
    let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(Some(owner.uid.as_str()), released.metadata.uid.as_deref());
    assert_eq!(
        secret.immutable,
        Some(true),
        "the issued Secret can be changed"
    );
    assert!(
        !warnings(running, "late")
            .await
            .iter()
            .any(|(reason, _)| reason == "SidecarTokenNotIssued")
    );
}
