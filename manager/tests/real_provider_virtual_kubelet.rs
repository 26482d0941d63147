//! The injected pod on the virtual-kubelet library, as providers run it: the chart installed
//! with its defaults, pods created through the real pod webhook, each node a real agent of the
//! library v1.11.0 (the version azure-aci v1.6.4 runs on) registered with the control plane:
//! - `aci-1`: `vk-replacer --aci-rules`, which refuses what azure-aci v1.6.4's provider refuses
//!   (no `downwardAPI` volume, no `args` without `command`, init containers without resources)
//!   and replaces the pods' whole status every 5 s with its own three conditions, as azure-aci
//!   does;
//! - `mock-1`: the library's own mock provider.
//!
//! A pod that tolerates the virtual node's taint gets the virtual-node shape (a plain container
//! with an explicit command, no `status.podIP`, no downward-API volume, probes from the
//! apiserver, its token from a Secret the manager issues while a scheduling gate holds the
//! pod): issued, scheduled by the real kube-scheduler, accepted, run, probed with the issued
//! token under the chart's admission policy, its conditions kept against the 5 s replacement
//! and its markers right both ways. A pod bound to the node without tolerating its taint gets
//! the kubelet shape, which the library cannot start ("unsupported fieldPath: status.podIP").
//! The exec agent's shape, which the chart's defaults give a pod for a virtual node whose
//! probed container gives its command, passes azure-aci's rules too.
//!
//! Neither agent runs containers: the injected container is run here, as the provider would
//! run it: its command, args and environment as the library resolves them, its token read
//! from the Secret its projected volume names (azure-aci copies a projected Secret's listed
//! keys).

mod cluster;
mod installed;
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::PostParams;
use podprobe_manager::webhook::Mode;
use serde_json::json;
use testkit::real::virtual_kubelet::{Provider, VirtualKubelet};

use installed::{
    LISTENING, NS, create_once_admitted as create, injected_container, install_and_run,
    run_injected_sidecar_with, start_control_plane,
};
use podprobe_manager::sidecar_token::{GATE, LABEL, REFUSED};

const LIMIT: Duration = Duration::from_secs(60);

/// A game pod with the sidecar's service account: bound to `node` when given (else left to
/// the scheduler), tolerating the library's taint when `tolerates`.
fn game_pod(name: &str, node: Option<&str>, tolerates: bool) -> Pod {
    let mut pod = json!({
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "game"}},
        "spec": {"serviceAccountName": "podprobe-sidecar",
                 "containers": [{"name": "main", "image": "game:1",
                                 "command": ["/game"], "args": ["--serve"]}]}
    });
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    if tolerates {
        pod["spec"]["tolerations"] = json!([{"key": "virtual-kubelet.io/provider",
            "operator": "Exists", "effect": "NoSchedule"}]);
    }
    serde_json::from_value(pod).unwrap()
}

/// The Secret the pod's token volume names.
fn issued_secret_name(pod: &Pod) -> String {
    let volume = pod.spec.as_ref().unwrap().volumes.iter().flatten();
    volume
        .filter_map(|v| v.projected.as_ref()?.sources.as_ref())
        .flatten()
        .find_map(|s| s.secret.as_ref())
        .expect("a token volume naming a Secret")
        .name
        .clone()
}

/// The token in the Secret the pod's token volume names, once the manager issued it.
async fn issued_token(running: &installed::Running, pod: &Pod) -> String {
    let secret = issued_secret_name(pod);
    let secrets: Api<Secret> = Api::namespaced(running.cp.client(), NS);
    let secret = secrets.get(&secret).await.expect("the issued Secret");
    let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Pod", pod.metadata.uid.as_deref().unwrap())
    );
    let data = secret.data.unwrap();
    assert_eq!(data["namespace"].0, NS.as_bytes());
    String::from_utf8(data["token"].0.clone()).unwrap()
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

async fn wait_running(running: &installed::Running, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(running.cp.client(), NS);
    testkit::wait::pod(&pods, name, "Running on its virtual node", LIMIT, |p| {
        phase(p) == Some("Running")
    })
    .await
}

/// Waits until the agent's log holds `text`.
async fn wait_logged(agent: &VirtualKubelet, text: &str) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !agent.log().contains(text) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the agent never logged {text:?}; its log ends:\n{}",
            agent.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A TCP listener for the probe to find, and a PodProbeMarker aimed at it in [`NS`] for pods
/// labelled `app=game`: condition [`LISTENING`], label `listening` `true` while it succeeds
/// and `false` once it fails (both policies, so that kruise-manager's serverless path, which
/// keeps a `Succeeded`-only label, shows both directions too).
async fn listening_target(running: &installed::Running) -> std::net::TcpListener {
    let target = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = target.local_addr().unwrap().port();
    let mut marker = installed::listening_marker(port);
    marker.spec.probes[0].marker_policy.push(
        serde_json::from_value(json!({"state": "Failed", "labels": {"listening": "false"}}))
            .unwrap(),
    );
    Api::<podprobe_manager::crd::PodProbeMarker>::namespaced(running.cp.client(), NS)
        .create(&PostParams::default(), &marker)
        .await
        .unwrap();
    target
}

/// Waits until the pod shows the probe's condition `status` and its marker at once (the
/// provider removes the condition every 5 s, and the sidecar puts it back).
async fn wait_marked(running: &installed::Running, name: &str, status: bool) {
    let pods: Api<Pod> = Api::namespaced(running.cp.client(), NS);
    let (condition, label) = if status {
        ("True", "true")
    } else {
        ("False", "false")
    };
    testkit::wait::pod(&pods, name, "condition and marker", LIMIT, |p| {
        support::label(p, "listening").as_deref() == Some(label)
            && support::condition_status(p, LISTENING).as_deref() == Some(condition)
    })
    .await;
}

/// The virtual-node shape, as the pod holds it after admission.
fn assert_virtual_node_shape(pod: &Pod) {
    let spec = pod.spec.as_ref().unwrap();
    assert!(
        spec.init_containers
            .iter()
            .flatten()
            .all(|c| c.name != "podprobe"),
        "an ordinary container"
    );
    let sidecar = injected_container(pod);
    assert!(sidecar.command.is_some(), "an explicit command");
    let fields: Vec<&str> = sidecar
        .env
        .iter()
        .flatten()
        .filter_map(|e| {
            Some(
                e.value_from
                    .as_ref()?
                    .field_ref
                    .as_ref()?
                    .field_path
                    .as_str(),
            )
        })
        .collect();
    // The library resolves these itself (internal/podutils/env.go, v1.11.0 line 490 for
    // spec.nodeName, which companion mode's sidecar reads); no status.* field.
    assert!(
        fields
            .iter()
            .all(|f| f.starts_with("metadata.") || *f == "spec.nodeName"),
        "{fields:?}"
    );
    assert!(
        spec.volumes
            .iter()
            .flatten()
            .all(|v| v.downward_api.is_none()),
        "no downwardAPI volume"
    );
}

/// A control plane as a cluster has it (the scheduler; the node lifecycle controller, which
/// lifts a new node's not-ready taint once it is Ready; the garbage collector, which deletes
/// an issued Secret with its pod), kruise-manager in companion mode, the chart installed in
/// `mode` with its manager running, and `provider`'s agent as node `node`.
async fn cluster(
    mode: Mode,
    node: &str,
    provider: Provider,
) -> (installed::Running, VirtualKubelet) {
    cluster_with(mode, node, provider, &[]).await
}

/// [`cluster`] with more helm arguments for the chart.
async fn cluster_with(
    mode: Mode,
    node: &str,
    provider: Provider,
    helm_args: &[&str],
) -> (installed::Running, VirtualKubelet) {
    let mut cp = start_control_plane().await;
    cp.start_scheduler()
        .unwrap_or_else(|e| panic!("kube-scheduler: {e}"));
    cp.start_controller_manager(&["node-lifecycle-controller", "garbage-collector-controller"])
        .unwrap_or_else(|e| panic!("kube-controller-manager: {e}"));
    if mode == Mode::Companion {
        cp.start_kruise_manager()
            .await
            .unwrap_or_else(|e| panic!("kruise-manager: {e}"));
    }
    let running = installed::install_and_run_with(cp, mode, helm_args).await;
    let agent = VirtualKubelet::start_node(&running.cp, node, provider)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (running, agent)
}

/// Pod `name`, left to the scheduler and tolerating the virtual node's taint: held until its
/// token is issued, scheduled on `node`, run, probed by its sidecar with that token (aiming
/// at [`listening_target`]'s `target`), its condition kept against the provider's 5 s status
/// replacement and its marker right both ways. Returns the pod as it ran.
async fn held_issued_probed_and_marked(
    running: &installed::Running,
    node: &str,
    name: &str,
    target: std::net::TcpListener,
) -> Pod {
    let pod = create(running, &game_pod(name, None, true)).await;
    assert_virtual_node_shape(&pod);
    let gates = pod.spec.as_ref().unwrap().scheduling_gates.iter().flatten();
    assert_eq!(gates.map(|g| g.name.as_str()).collect::<Vec<_>>(), [GATE]);
    let pod = wait_running(running, name).await;
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some(node));
    assert!(pod.spec.as_ref().unwrap().scheduling_gates.is_none());
    assert!(support::label(&pod, LABEL).is_none(), "released");
    let token = issued_token(running, &pod).await;
    let _sidecar = run_injected_sidecar_with(running, &pod, &token, &[]);
    wait_marked(running, name, true).await;

    // The provider replaces the whole status every 5 s: after a replacement the condition is
    // back, and the marker with it.
    let pods: Api<Pod> = Api::namespaced(running.cp.client(), NS);
    let replaced = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().all(|c| c.type_ != LISTENING))
    };
    testkit::wait::pod(&pods, name, "the provider's replacement", LIMIT, replaced).await;
    wait_marked(running, name, true).await;

    // The other way: the probe fails, the condition turns False, the marker follows.
    drop(target);
    wait_marked(running, name, false).await;
    pod
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_aci_rules_accept_the_injected_pod_and_it_is_probed_and_marked() {
    let (running, aci) = cluster(Mode::Standalone, "aci-1", Provider::AciRules).await;
    let target = listening_target(&running).await;

    // The kubelet shape on the virtual node: the library cannot resolve its environment.
    let kubelet_shaped = create(&running, &game_pod("bound-only", Some("aci-1"), false)).await;
    assert!(
        injected_container(&kubelet_shaped)
            .env
            .iter()
            .flatten()
            .any(|e| e.name == "POD_IP"),
        "a pod that does not tolerate the taint keeps the kubelet shape"
    );
    wait_logged(&aci, "unsupported fieldPath: status.podIP").await;

    let pod = held_issued_probed_and_marked(&running, "aci-1", "game-0", target).await;

    // A pod of another service account: the manager may not issue its tokens; the pod is
    // released without one, and says so.
    let mut other = game_pod("other-account", None, true);
    other.spec.as_mut().unwrap().service_account_name = Some("default".into());
    create(&running, &other).await;
    let released = wait_running(&running, "other-account").await;
    assert_eq!(support::label(&released, LABEL).as_deref(), Some(REFUSED));

    // The token goes with its pod: the Secret is the pod's, and collected after it.
    let secret = issued_secret_name(&pod);
    let pods: Api<Pod> = Api::namespaced(running.cp.client(), NS);
    pods.delete("game-0", &Default::default()).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(running.cp.client(), NS);
    let deadline = tokio::time::Instant::now() + LIMIT;
    while secrets.get_opt(&secret).await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "Secret {secret} outlived its pod"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    running.manager.shutdown().await;
}

/// The exec agent on a virtual node, as the chart installs it (`execAgent: auto`): the pod it
/// shapes (an install init container without resources or ports, the container's command
/// wrapped, an `emptyDir` per agent) passes azure-aci's rules on the real library and runs.
/// (The provider runs no containers here: that the agent then serves the probes on a virtual
/// node is shown on `vk-cri`, `real_virtual_node.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_chart_defaults_azure_aci_rules_accept_the_exec_agent_pod() {
    use podprobe_manager::inject::agent;
    let (running, _aci) = cluster_with(Mode::Standalone, "aci-1", Provider::AciRules, &[]).await;
    let mut marker = installed::listening_marker(1);
    marker.spec.probes[0].probe =
        serde_json::from_value(json!({"exec": {"command": ["/idle.sh"]}, "periodSeconds": 2}))
            .unwrap();
    Api::<podprobe_manager::crd::PodProbeMarker>::namespaced(running.cp.client(), NS)
        .create(&PostParams::default(), &marker)
        .await
        .unwrap();

    let pod = create(&running, &game_pod("game-0", None, true)).await;
    assert_virtual_node_shape(&pod);
    let spec = pod.spec.as_ref().unwrap();
    let install = spec.init_containers.iter().flatten();
    let install: Vec<_> = install
        .filter(|c| c.name == agent::INSTALL_CONTAINER)
        .collect();
    assert_eq!(install.len(), 1, "the agent's install container");
    let main = spec.containers.iter().find(|c| c.name == "main").unwrap();
    let command = main.command.as_deref().unwrap();
    assert_eq!(
        (
            command.first().map(String::as_str),
            command.last().map(String::as_str)
        ),
        (Some(agent::AGENT_BINARY), Some("/game")),
        "the container's command wrapped: {command:?}"
    );
    assert_eq!(main.args.as_deref(), Some(&["--serve".to_string()][..]));
    let env = injected_container(&pod).env.iter().flatten();
    let agents: Vec<_> = env
        .filter(|e| e.name == agent::AGENTS_ENV)
        .map(|e| e.value.as_deref())
        .collect();
    assert_eq!(
        agents,
        [Some("main")],
        "the sidecar's {}",
        agent::AGENTS_ENV
    );

    let ran = wait_running(&running, "game-0").await;
    assert_eq!(
        ran.spec.as_ref().unwrap().node_name.as_deref(),
        Some("aci-1")
    );
    running.manager.shutdown().await;
}

/// OpenKruise's own kruise-manager (serverless gate on) marks the pod from the conditions the
/// injected sidecar writes under azure-aci's rules; podprobe-manager in companion mode injects
/// and issues the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kruise_manager_marks_the_injected_pod_under_azure_aci_rules() {
    let (running, _aci) = cluster(Mode::Companion, "aci-1", Provider::AciRules).await;
    let target = listening_target(&running).await;
    held_issued_probed_and_marked(&running, "aci-1", "game-0", target).await;
    running.manager.shutdown().await;
}

/// interLink reports a running pod's conditions as `[Ready]` alone: kruise-manager, which waits
/// for Initialized, would mark nothing (read, `pod_probe_marker_controller.go:452-455`);
/// podprobe-manager does not wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podprobe_manager_marks_the_injected_pod_under_an_interlink_like_provider() {
    let (running, _agent) = cluster(Mode::Standalone, "interlink-1", Provider::ReadyOnly).await;
    let target = listening_target(&running).await;
    let pod = held_issued_probed_and_marked(&running, "interlink-1", "game-0", target).await;
    let pods: Api<Pod> = Api::namespaced(running.cp.client(), NS);
    let now = pods
        .get(pod.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    assert!(
        support::condition_status(&now, "Initialized").is_none(),
        "the provider reports no Initialized"
    );
    running.manager.shutdown().await;
}

/// The library's own mock provider, v1.11.0 and v1.14.1 (the newest the module proxy serves):
/// the same refusal of the kubelet shape, the virtual-node shape run. (The mock reports every
/// pod at 5.6.7.8, so nothing is probed here: the azure-aci test above probes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mock_provider_of_both_library_versions_runs_the_injected_pod() {
    let running = install_and_run(start_control_plane().await, Mode::Standalone).await;
    let _target = listening_target(&running).await;
    for (node, provider) in [("mock-1", Provider::Mock), ("mock-2", Provider::MockNewest)] {
        let agent = VirtualKubelet::start_node(&running.cp, node, provider)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        create(
            &running,
            &game_pod(&format!("{node}-bound"), Some(node), false),
        )
        .await;
        wait_logged(&agent, "unsupported fieldPath: status.podIP").await;
        let name = format!("{node}-game");
        let pod = create(&running, &game_pod(&name, Some(node), true)).await;
        assert_virtual_node_shape(&pod);
        let pods: Api<Pod> = Api::namespaced(running.cp.client(), NS);
        let ran =
            testkit::wait::watch_pod(&pods, &name, LIMIT, |p| phase(p) == Some("Running")).await;
        assert!(
            ran.is_some(),
            "{name} never ran; the agent's log ends:\n{}",
            agent.log_tail(60)
        );
    }
    running.manager.shutdown().await;
}
