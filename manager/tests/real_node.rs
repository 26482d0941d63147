//! podprobe on a real node (kubelet, containerd, runc): the pod admitted by podprobe-manager's
//! webhook runs with the injected native sidecar from the locally built image, the sidecar
//! probes the game server container (exec through procfs, tcp, http, grpc) and writes the
//! conditions with the kubelet-projected token, the manager writes the markers, the kubelet
//! computes readiness from the injected readiness gate, and a killed target container or a
//! deleted pod go as they would in production.

mod cluster;
mod installed;
mod on_node;
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use testkit::real::NodeOptions;
use testkit::real::node::images::GAMESERVER_IMAGE;

use installed::NS;
use on_node::{
    SIDECAR, container_id, exec, logs, memory_cgroup, memory_stat, node_and_chart, restart_count,
    wait_for,
};
use support::{annotation, condition_status, label};

const IDLE: &str = "game.kruise.io/idle";
const HEALTHY: &str = "game.kruise.io/healthy";
const ACCEPTING: &str = "game.kruise.io/accepting";
const SERVING: &str = "game.kruise.io/serving";
const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The example game server's probes (examples/game-server-pod.yaml) as a PodProbeMarker, with
/// the idle recipe's markers.
fn game_ppm() -> podprobe_manager::crd::PodProbeMarker {
    let probe = |name: &str, condition: &str, probe: serde_json::Value| {
        let mut probe = probe;
        probe["periodSeconds"] = json!(1);
        // Long enough to see `Unknown` after a restart before the new container's result.
        probe["initialDelaySeconds"] = json!(2);
        probe["failureThreshold"] = json!(1);
        json!({"name": name, "containerName": "game", "podConditionType": condition, "probe": probe})
    };
    let mut idle = probe(
        "idle",
        IDLE,
        json!({"exec": {"command": ["sh", "-c", "test -f /var/run/game/idle"]}}),
    );
    idle["markerPolicy"] = json!([
        {"state": "Succeeded", "labels": {IDLE: "true"}, "annotations": {DELETION_COST: "-100"}},
        {"state": "Failed", "labels": {IDLE: "false"}, "annotations": {DELETION_COST: "100"}}
    ]);
    support::ppm(&json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "game", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "game"}}, "probes": [
            idle,
            probe("healthy", HEALTHY, json!({"httpGet": {"path": "/healthz", "port": "http", "scheme": "HTTP"}})),
            probe("accepting", ACCEPTING, json!({"tcpSocket": {"port": "game"}})),
            probe("serving", SERVING, json!({"grpc": {"port": 9090, "service": "game"}})),
        ]}
    }))
}

fn game_pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "game"}},
        "spec": {"nodeName": node, "serviceAccountName": "podprobe-sidecar",
                 "terminationGracePeriodSeconds": 10,
                 "containers": [{"name": "game", "image": GAMESERVER_IMAGE,
                    "ports": [{"name": "game", "containerPort": 7777},
                              {"name": "http", "containerPort": 8080},
                              {"name": "grpc", "containerPort": 9090}]}]}
    }))
    .unwrap()
}

fn is_ready(pod: &Pod) -> bool {
    condition_status(pod, "Ready").as_deref() == Some("True")
}

#[tokio::test(flavor = "multi_thread")]
async fn injected_sidecar_probes_the_game_server_on_a_real_node() {
    let (running, node) = node_and_chart(NodeOptions::default()).await;
    let cp = &running.cp;
    let ppms: Api<podprobe_manager::crd::PodProbeMarker> = Api::namespaced(cp.client(), NS);
    ppms.create(&PostParams::default(), &game_ppm()).await.unwrap();
    let pod = game_pod("game-0", node.name());
    cp.wait_admission(&pod, |p| annotation(p, support::PODPROBE).is_some())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    pods.create(&PostParams::default(), &pod).await.unwrap();

    // Everything but idle holds; idle fails until the game says so. The readiness gate on
    // `healthy` is the kubelet's to compute.
    let up = wait_for(&pods, "game-0", "probes written, pod Ready", |p| {
        [HEALTHY, ACCEPTING, SERVING]
            .iter()
            .all(|c| condition_status(p, c).as_deref() == Some("True"))
            && condition_status(p, IDLE).as_deref() == Some("False")
            && is_ready(p)
    })
    .await;
    let sidecar_log = logs(&pods, "game-0", SIDECAR).await;
    assert!(
        sidecar_log.contains("procfs"),
        "auto chose and logged the exec mode:\n{sidecar_log}"
    );
    let markers = wait_for(&pods, "game-0", "Failed markers", |p| {
        label(p, IDLE).as_deref() == Some("false")
    })
    .await;
    assert_eq!(annotation(&markers, DELETION_COST).as_deref(), Some("100"));
    assert!(container_id(&up, SIDECAR).is_some());

    // The game goes idle (a file in its container): the exec probe, run through procfs in
    // the game container's root, sees it; the markers follow.
    exec(&pods, "game-0", "game", "touch /var/run/game/idle").await;
    let idle = wait_for(&pods, "game-0", "idle markers", |p| {
        condition_status(p, IDLE).as_deref() == Some("True")
            && label(p, IDLE).as_deref() == Some("true")
    })
    .await;
    assert_eq!(annotation(&idle, DELETION_COST).as_deref(), Some("-100"));

    // Draining: http and grpc fail, tcp still accepts; the readiness gate takes the pod out.
    exec(&pods, "game-0", "game", "touch /var/run/game/unhealthy").await;
    wait_for(&pods, "game-0", "unhealthy", |p| {
        condition_status(p, HEALTHY).as_deref() == Some("False")
            && condition_status(p, SERVING).as_deref() == Some("False")
            && condition_status(p, ACCEPTING).as_deref() == Some("True")
            && !is_ready(p)
    })
    .await;
    exec(&pods, "game-0", "game", "rm /var/run/game/unhealthy").await;
    let healthy = wait_for(&pods, "game-0", "healthy again", |p| {
        condition_status(p, HEALTHY).as_deref() == Some("True") && is_ready(p)
    })
    .await;

    // The game container is killed: the kubelet starts a new one (new container id); every
    // probe publishes `Unknown` until the new container's first results, and procfs finds
    // the new process by the id containerd gave it (in its /proc/<pid>/cgroup).
    let old_game = container_id(&healthy, "game").unwrap();
    let killed = node
        .ctr()
        .args(["tasks", "kill", "--signal", "SIGKILL", &old_game])
        .status()
        .unwrap();
    assert!(killed.success(), "ctr tasks kill {old_game}");
    wait_for(&pods, "game-0", "Unknown after the restart", |p| {
        [IDLE, HEALTHY, ACCEPTING, SERVING]
            .iter()
            .all(|c| condition_status(p, c).as_deref() == Some("Unknown"))
            && restart_count(p, "game") == 1
    })
    .await;
    // The new container has no idle file: the real state is "not idle" again.
    let healthy = wait_for(&pods, "game-0", "the new container's results", |p| {
        [HEALTHY, ACCEPTING, SERVING]
            .iter()
            .all(|c| condition_status(p, c).as_deref() == Some("True"))
            && condition_status(p, IDLE).as_deref() == Some("False")
            && label(p, IDLE).as_deref() == Some("false")
    })
    .await;
    let new_game = container_id(&healthy, "game").unwrap();
    assert_ne!(new_game, old_game);
    let sidecar_log = logs(&pods, "game-0", SIDECAR).await;
    assert!(
        sidecar_log.contains(&format!("container_id=\"containerd://{new_game}\" exec_mode=procfs")),
        "procfs found the restarted container by its id:\n{sidecar_log}"
    );

    // The sidecar's memory in its real container (v1 memory cgroup of its container id).
    let cgroup = memory_cgroup(&node, &container_id(&healthy, SIDECAR).unwrap());
    let usage: u64 = std::fs::read_to_string(cgroup.join("memory.usage_in_bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (rss, cache) = (memory_stat(&cgroup, "rss"), memory_stat(&cgroup, "cache"));
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "sidecar container memory (4 probes, period 1 s): usage {:.2} MiB, rss {:.2} MiB, cache {:.2} MiB",
        mib(usage),
        mib(rss),
        mib(cache)
    );
    assert!(rss > 0, "the sidecar's cgroup charges its memory");

    // Deletion: the kubelet stops the game and then the native sidecar, which exits 0.
    pods.delete("game-0", &DeleteParams::default()).await.unwrap();
    let sidecar_exit = async {
        loop {
            let Some(pod) = pods.get_opt("game-0").await.unwrap() else {
                return None;
            };
            let terminated = pod
                .status
                .and_then(|s| s.init_container_statuses)
                .into_iter()
                .flatten()
                .find(|c| c.name == SIDECAR)
                .and_then(|c| c.state)
                .and_then(|s| s.terminated);
            if let Some(t) = terminated {
                return Some(t.exit_code);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let exit = tokio::time::timeout(Duration::from_secs(60), sidecar_exit)
        .await
        .expect("the pod went within its grace period");
    assert!(
        matches!(exit, Some(0) | None),
        "the sidecar exited {exit:?}"
    );
    let leftovers = node.stop(cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
