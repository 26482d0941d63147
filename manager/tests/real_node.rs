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

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use podprobe_manager::webhook::Mode;
use serde_json::json;
use testkit::real::NodeOptions;
use testkit::real::node::images::{GAMESERVER_IMAGE, MANAGER_IMAGE, SIDECAR_IMAGE};

use installed::NS;
use on_node::{
    SIDECAR, allow_pods_exec, container_id, exec, game_pod, logs, memory_cgroup, memory_stat,
    node_and_chart, node_and_chart_in, node_and_chart_with, node_and_deployed_chart,
    pod_with_hand_written_sidecar, pods_of, projected_token, restart_count, scale_to_zero,
    wait_each_seen, wait_for,
};
use support::{annotation, condition_status, label};

const IDLE: &str = "game.kruise.io/idle";
const HEALTHY: &str = "game.kruise.io/healthy";
const ACCEPTING: &str = "game.kruise.io/accepting";
const SERVING: &str = "game.kruise.io/serving";
const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The example game server's probes (examples/game-server-pod.yaml) as a PodProbeMarker, with
/// the idle recipe's markers. Named ports need a sidecar that sees the pod spec (`--source
/// api`); the downward-API file carries only annotations.
fn game_ppm(named_ports: bool) -> podprobe_manager::crd::PodProbeMarker {
    let (http, game) = if named_ports {
        (json!("http"), json!("game"))
    } else {
        (json!(8080), json!(7777))
    };
    let probe = |name: &str, condition: &str, probe: serde_json::Value| {
        let mut probe = probe;
        probe["periodSeconds"] = json!(1);
        // Long enough that each probe publishes `Unknown` after a restart before the new
        // container has a result (within the writer's 200 ms window the newer result wins).
        // With the file source the sidecar learns of the new container from the kubelet's
        // status, read again at the latest 5 s after an attempt errored on the old one
        // (src/pod/status/triggers.rs): with a 5 s delay the new container's first results
        // sometimes came in the same instant as the `Unknown`, and replaced it unwritten.
        probe["initialDelaySeconds"] = json!(15);
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
            probe("healthy", HEALTHY, json!({"httpGet": {"path": "/healthz", "port": http, "scheme": "HTTP"}})),
            probe("accepting", ACCEPTING, json!({"tcpSocket": {"port": game}})),
            probe("serving", SERVING, json!({"grpc": {"port": 9090, "service": "game"}})),
        ]}
    }))
}

/// Creates `ppm` in [`NS`].
async fn create_ppm(
    cp: &testkit::real::ControlPlane,
    ppm: &podprobe_manager::crd::PodProbeMarker,
) -> Api<podprobe_manager::crd::PodProbeMarker> {
    let ppms = Api::namespaced(cp.client(), NS);
    ppms.create(&PostParams::default(), ppm).await.unwrap();
    ppms
}

/// Creates `pod` once the webhooks' caches have the PodProbeMarkers it matches (a dry run is
/// admitted with the probe annotation).
async fn create_admitted(cp: &testkit::real::ControlPlane, pod: &Pod) -> Api<Pod> {
    cp.wait_admission(pod, |p| annotation(p, support::PODPROBE).is_some())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    pods.create(&PostParams::default(), pod).await.unwrap();
    pods
}

/// The game server's state with no player action: healthy, accepting, serving, not idle.
fn game_up(pod: &Pod) -> bool {
    [HEALTHY, ACCEPTING, SERVING]
        .iter()
        .all(|c| condition_status(pod, c).as_deref() == Some("True"))
        && condition_status(pod, IDLE).as_deref() == Some("False")
}

fn is_ready(pod: &Pod) -> bool {
    condition_status(pod, "Ready").as_deref() == Some("True")
}

#[tokio::test(flavor = "multi_thread")]
async fn injected_sidecar_probes_the_game_server_on_a_real_node() {
    let (running, node) = node_and_chart(NodeOptions::default()).await;
    let cp = &running.cp;
    create_ppm(cp, &game_ppm(true)).await;
    // The pod opts out of the exec agent, so its exec probes take the procfs path this test
    // is about.
    let mut pod = game_pod("game-0", node.name());
    pod.metadata.annotations =
        Some([("podprobe.io/exec-agent".to_owned(), "disabled".to_owned())].into());
    let pods = create_admitted(cp, &pod).await;

    // Everything but idle holds; idle fails until the game says so. The readiness gate on
    // `healthy` is the kubelet's to compute.
    let up = wait_for(&pods, "game-0", "probes written, pod Ready", |p| {
        game_up(p) && is_ready(p)
    })
    .await;
    let sidecar_log = logs(&pods, "game-0", SIDECAR).await;
    assert!(
        sidecar_log.contains("procfs"),
        "auto chose and logged the exec mode:\n{sidecar_log}"
    );
    assert!(
        sidecar_log.contains("reads its probes from the downward-API file"),
        "the kubelet shape's source:\n{sidecar_log}"
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
    wait_each_seen(
        &pods,
        "game-0",
        &[IDLE, HEALTHY, ACCEPTING, SERVING],
        "Unknown",
    )
    .await;
    // The new container has no idle file: the real state is "not idle" again.
    let healthy = wait_for(&pods, "game-0", "the new container's results", |p| {
        game_up(p) && label(p, IDLE).as_deref() == Some("false") && restart_count(p, "game") == 1
    })
    .await;
    let new_game = container_id(&healthy, "game").unwrap();
    assert_ne!(new_game, old_game);
    let sidecar_log = logs(&pods, "game-0", SIDECAR).await;
    assert!(
        sidecar_log.contains(&format!(
            "container_id=\"containerd://{new_game}\" exec_mode=procfs"
        )),
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

    // Deletion: the kubelet stops the game, then the native sidecar, which stops probing,
    // exits 0 within the grace period, and writes nothing once the pod is terminating. Every
    // update of the pod is watched from here, so the kubelet's last report is seen.
    let watch = WatchParams::default().fields("metadata.name=game-0");
    let version = healthy.metadata.resource_version.clone().unwrap();
    let mut updates = pods.watch(&watch, &version).await.unwrap().boxed();
    pods.delete("game-0", &DeleteParams::default())
        .await
        .unwrap();
    let sidecar_exit = async {
        let mut exit = None;
        while let Some(event) = updates.try_next().await.unwrap() {
            let pod = match event {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => p,
                WatchEvent::Deleted(_) => return exit,
                other => panic!("watch: {other:?}"),
            };
            let terminated = pod
                .status
                .and_then(|s| s.init_container_statuses)
                .into_iter()
                .flatten()
                .find(|c| c.name == SIDECAR)
                .and_then(|c| c.state)
                .and_then(|s| s.terminated);
            exit = terminated.map(|t| t.exit_code).or(exit);
        }
        exit
    };
    let exit = tokio::time::timeout(Duration::from_secs(30), sidecar_exit)
        .await
        .expect("the pod went within its 10 s grace period");
    assert_eq!(
        exit,
        Some(0),
        "the sidecar's exit code as the kubelet reported it"
    );
    let audit = cp.audit().unwrap();
    let deleted = audit
        .iter()
        .position(|e| e.is("delete", "pods", Some("game-0")))
        .expect("the delete in the audit log");
    let sidecar_user = format!("system:serviceaccount:{NS}:podprobe-sidecar");
    // The file source held no watch, and read the pod only when probing needed its status:
    // at start, and after the probes failed with the killed container.
    let by_sidecar = |verb: &str, name: Option<&str>| {
        audit
            .iter()
            .filter(|e| e.user.username == sidecar_user && e.is(verb, "pods", name))
            .count()
    };
    assert_eq!(by_sidecar("watch", None), 0, "the sidecar watched");
    let reads = by_sidecar("get", Some("game-0"));
    println!("the sidecar read its pod {reads} times");
    assert!((2..=20).contains(&reads), "{reads} reads of the pod");
    // With the file source the sidecar learns of the deletion from its next read of the pod
    // or from its SIGTERM, and the kubelet stops the game server first: the probes' failures
    // in between may still be written (a patch, and one at the SIGTERM's flush; a CI run on a
    // loaded machine saw one). Nothing else: no write of another kind, no third patch.
    let late: Vec<_> = audit[deleted..]
        .iter()
        .filter(|e| e.user.username == sidecar_user && e.verb != "watch" && e.verb != "get")
        .collect();
    let late_uris: Vec<_> = late.iter().map(|e| &e.request_uri).collect();
    println!("the sidecar's writes after the deletion: {late_uris:?}");
    let status_patches = late
        .iter()
        .filter(|e| e.is("patch", "pods/status", Some("game-0")))
        .count();
    let events = late
        .iter()
        .filter(|e| e.is("create", "events", None) || e.is("patch", "events", None))
        .count();
    assert!(
        status_patches <= 2 && status_patches + events == late.len(),
        "the sidecar wrote after the deletion more than the game server's stop: {late_uris:?}"
    );
    let leftovers = node.stop(cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// `sh -c script` in the container `id` through containerd alone (no apiserver request).
/// How the game container last ended, running or not now.
fn game_termination(pod: &Pod) -> Option<k8s_openapi::api::core::v1::ContainerStateTerminated> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let game = statuses.iter().find(|c| c.name == "game")?;
    [game.state.as_ref(), game.last_state.as_ref()]
        .into_iter()
        .flatten()
        .find_map(|s| s.terminated.clone())
}

fn ctr_exec(node: &testkit::real::Node, id: &str, exec_id: &str, script: &str) {
    let status = node
        .ctr()
        .args([
            "tasks",
            "exec",
            "--exec-id",
            exec_id,
            id,
            "sh",
            "-c",
            script,
        ])
        .status()
        .unwrap();
    assert!(status.success(), "ctr tasks exec {id} {script:?}");
}

/// Stops the game container `game` of pod `name` as the kubelet does (SIGTERM to its main
/// process) and checks the game server stopped gracefully (its exit code 0 is the container's)
/// and that the restarted container's agent takes the probes on.
async fn stopped_gracefully_and_probed_again(
    node: &testkit::real::Node,
    pods: &Api<Pod>,
    name: &str,
    game: &str,
) {
    let stopped = node
        .ctr()
        .args(["tasks", "kill", "--signal", "SIGTERM", game])
        .status()
        .unwrap();
    assert!(stopped.success(), "ctr tasks kill {game}");
    let restarted = wait_for(pods, name, "the new container's results", |p| {
        game_up(p) && restart_count(p, "game") == 1
    })
    .await;
    let terminated = game_termination(&restarted).unwrap();
    assert_eq!(terminated.exit_code, 0, "{terminated:?}");
    let params = kube::api::LogParams {
        container: Some("game".into()),
        previous: true,
        ..Default::default()
    };
    let previous = pods.logs(name, &params).await.unwrap();
    assert!(
        previous.contains("gameserver: SIGTERM, exiting"),
        "{previous}"
    );
    let new_game = container_id(&restarted, "game").unwrap();
    ctr_exec(node, &new_game, "idle-again", "touch /var/run/game/idle");
    wait_for(pods, name, "idle in the new container", |p| {
        condition_status(p, IDLE).as_deref() == Some("True")
    })
    .await;
}

/// A fault in probe serving on the real node. The probe server crashes (SIGABRT, as a panic
/// ends the shipped build): the game server runs on, the agent starts another server, and the
/// probe flips through it. Then the new server hangs (SIGSTOP), for the caller to stop the
/// container gracefully all the same.
async fn probe_server_crashes_then_hangs(
    node: &testkit::real::Node,
    pods: &Api<Pod>,
    name: &str,
    game: &str,
) {
    signal_probe_server(node, game, "ABRT");
    ctr_exec(node, game, "idle-after-crash", "touch /var/run/game/idle");
    wait_for(pods, name, "idle through a new probe server", |p| {
        condition_status(p, IDLE).as_deref() == Some("True")
    })
    .await;
    let log = logs(pods, name, "game").await;
    assert!(
        log.contains("the probe server (pid") && log.contains("SIGABRT"),
        "{log}"
    );
    ctr_exec(node, game, "busy-after-crash", "rm /var/run/game/idle");
    wait_for(pods, name, "busy through the new probe server", |p| {
        condition_status(p, IDLE).as_deref() == Some("False")
    })
    .await;
    signal_probe_server(node, game, "STOP");
}

/// Sends `signal` to the one probe server in the container `game`: its process with
/// `--parent-pid` (a pattern this script's own command line does not match).
fn signal_probe_server(node: &testkit::real::Node, game: &str, signal: &str) {
    let script = format!(
        "n=0; for p in /proc/[0-9]*; do if grep -q 'parent-[p]id' $p/cmdline 2>/dev/null; then \
         kill -{signal} ${{p#/proc/}}; n=$((n+1)); fi; done; test $n = 1"
    );
    ctr_exec(node, game, &format!("probe-server-{signal}"), &script);
}

/// All `pods/exec` requests the apiserver has served.
async fn pods_exec_requests(cp: &testkit::real::ControlPlane) -> u64 {
    let counts = testkit::real::metrics::request_counts(&cp.metrics().await.unwrap());
    counts
        .iter()
        .filter(|((_, resource, sub), _)| resource == "pods" && sub == "exec")
        .map(|(_, n)| n)
        .sum()
}

/// The chart as installed (no shared process namespace, a non-root sidecar without
/// capabilities) and a game container that gives its command, started by tini as many game
/// images are (`ENTRYPOINT ["tini", "--", ...]`): the command runs under podprobe's exec agent,
/// so the exec probe runs in the game container without a `pods/exec` request; SIGTERM reaches
/// the game server through the agent and tini (which installs no handler: it waits for
/// signals); the restarted container's new agent takes the probes on.
#[tokio::test(flavor = "multi_thread")]
async fn exec_probes_run_through_the_agent_in_the_game_container_as_installed() {
    let (running, node) = node_and_chart_with(NodeOptions::default(), Mode::Standalone, &[]).await;
    let cp = &running.cp;
    create_ppm(cp, &game_ppm(false)).await;
    let mut pod = game_pod("game-agent", node.name());
    pod.spec.as_mut().unwrap().containers[0].command = Some(vec![
        "/bin/tini".into(),
        "--".into(),
        "/usr/local/bin/gameserver".into(),
    ]);
    let pods = create_admitted(cp, &pod).await;
    let up = wait_for(&pods, "game-agent", "probes written", game_up).await;
    let log = logs(&pods, "game-agent", SIDECAR).await;
    assert!(log.contains("exec_mode=agent"), "{log}");
    let game_log = logs(&pods, "game-agent", "game").await;
    assert!(
        game_log.contains("serving exec probes on /podprobe-agent-socket/agent.sock"),
        "{game_log}"
    );

    // Idle and back, set through containerd: the only pods/exec requests would be the
    // sidecar's.
    let before = pods_exec_requests(cp).await;
    let game = container_id(&up, "game").unwrap();
    ctr_exec(&node, &game, "idle", "touch /var/run/game/idle");
    wait_for(&pods, "game-agent", "idle", |p| {
        condition_status(p, IDLE).as_deref() == Some("True")
    })
    .await;
    ctr_exec(&node, &game, "busy", "rm /var/run/game/idle");
    wait_for(&pods, "game-agent", "busy again", |p| {
        condition_status(p, IDLE).as_deref() == Some("False")
    })
    .await;
    probe_server_crashes_then_hangs(&node, &pods, "game-agent", &game).await;
    let after = pods_exec_requests(cp).await;
    assert_eq!(after.saturating_sub(before), 0, "pods/exec requests");
    // The control: the count does count a pods/exec.
    exec(&pods, "game-agent", "game", "true").await;
    assert!(
        pods_exec_requests(cp).await > after,
        "pods/exec went uncounted"
    );

    // The runtime stops the container as the kubelet does, SIGTERM to its main process: the
    // agent forwards it to tini, tini to the game server, which exits, and the container's
    // exit is the game server's; its probe server hangs meanwhile.
    stopped_gracefully_and_probed_again(&node, &pods, "game-agent", &game).await;

    // A command that cannot start: the container ends as a shell would say (127), and why is
    // its termination message, which `kubectl describe` shows (the runtime's StartError did
    // before the agent).
    let mut missing = game_pod("game-missing", node.name());
    missing.spec.as_mut().unwrap().containers[0].command = Some(vec!["/no/such/game".into()]);
    let pods = create_admitted(cp, &missing).await;
    let ended = wait_for(&pods, "game-missing", "the game container's end", |p| {
        game_termination(p).is_some_and(|t| t.exit_code == 127)
    })
    .await;
    let message = game_termination(&ended)
        .unwrap()
        .message
        .unwrap_or_default();
    assert!(
        message.contains("cannot start") && message.contains("No such file or directory"),
        "{message:?}"
    );
    let leftovers = node.stop(cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The chart as installed and the game container as users write it: its image's entrypoint,
/// no `command`. Its postStart hook starts the exec agent beside the game server, so the exec
/// probe runs in the game container without a `pods/exec` request, while the game server
/// stays the container's PID 1: SIGTERM is its own, and so is the exit code; the restarted
/// container's hook starts a new agent, which takes the probes on.
#[tokio::test(flavor = "multi_thread")]
async fn exec_probes_run_through_the_agent_beside_the_images_entrypoint_as_installed() {
    let (running, node) = node_and_chart_with(NodeOptions::default(), Mode::Standalone, &[]).await;
    let cp = &running.cp;
    create_ppm(cp, &game_ppm(false)).await;
    let pods = create_admitted(cp, &game_pod("game-beside", node.name())).await;
    let up = wait_for(&pods, "game-beside", "probes written", game_up).await;
    let game_spec = &up.spec.as_ref().unwrap().containers[0];
    assert_eq!(game_spec.command, None);
    let hook = game_spec
        .lifecycle
        .as_ref()
        .and_then(|l| l.post_start.as_ref());
    let hook = hook
        .and_then(|h| h.exec.as_ref())
        .and_then(|e| e.command.clone());
    assert_eq!(
        hook.as_deref().and_then(|c| c.last()).map(String::as_str),
        Some("--detach")
    );
    let log = logs(&pods, "game-beside", SIDECAR).await;
    assert!(log.contains("exec_mode=agent"), "{log}");
    let game_log = logs(&pods, "game-beside", "game").await;
    assert!(
        game_log.contains("serving exec probes on /podprobe-agent-socket/agent.sock beside the container's own process"),
        "{game_log}"
    );
    let game = container_id(&up, "game").unwrap();
    ctr_exec(&node, &game, "pid-1", "grep -q gameserver /proc/1/cmdline");

    let before = pods_exec_requests(cp).await;
    ctr_exec(&node, &game, "idle", "touch /var/run/game/idle");
    wait_for(&pods, "game-beside", "idle", |p| {
        condition_status(p, IDLE).as_deref() == Some("True")
    })
    .await;
    ctr_exec(&node, &game, "busy", "rm /var/run/game/idle");
    wait_for(&pods, "game-beside", "busy again", |p| {
        condition_status(p, IDLE).as_deref() == Some("False")
    })
    .await;
    probe_server_crashes_then_hangs(&node, &pods, "game-beside", &game).await;
    assert_eq!(
        pods_exec_requests(cp).await.saturating_sub(before),
        0,
        "pods/exec requests"
    );

    // SIGTERM to the container's main process, as the kubelet stops it: the game server's
    // own, and its exit code is the container's.
    stopped_gracefully_and_probed_again(&node, &pods, "game-beside", &game).await;
    let leftovers = node.stop(cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The agent beside the entrypoint of a game container as hardened images run: a random
/// non-root uid, a read-only root filesystem, no capability. The hook runs as that user, the
/// agent serves and logs to the container's log as that user, and the exec probe runs there
/// without `pods/exec`.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_beside_a_non_root_random_uid_read_only_game_server() {
    let (running, node) = node_and_chart_with(NodeOptions::default(), Mode::Standalone, &[]).await;
    let cp = &running.cp;
    create_ppm(cp, &game_ppm(false)).await;
    let mut pod = serde_json::to_value(game_pod("game-hardened", node.name())).unwrap();
    let game = &mut pod["spec"]["containers"][0];
    game["securityContext"] = json!({
        "runAsUser": 43210, "runAsGroup": 43210, "runAsNonRoot": true,
        "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]}
    });
    game["volumeMounts"] = json!([{"name": "state", "mountPath": "/var/run/game"}]);
    pod["spec"]["volumes"] = json!([{"name": "state", "emptyDir": {}}]);
    let pods = create_admitted(cp, &serde_json::from_value(pod).unwrap()).await;
    let up = wait_for(&pods, "game-hardened", "probes written", game_up).await;
    let log = logs(&pods, "game-hardened", SIDECAR).await;
    assert!(log.contains("exec_mode=agent"), "{log}");
    let game_log = logs(&pods, "game-hardened", "game").await;
    assert!(
        game_log.contains("beside the container's own process"),
        "{game_log}"
    );
    let game = container_id(&up, "game").unwrap();
    // The agent runs as the container's user.
    ctr_exec(
        &node,
        &game,
        "agent-uid",
        "for p in /proc/[0-9]*; do if grep -q serve-for $p/cmdline; then grep -q 43210 $p/status || exit 1; found=1; fi; done; test -n \"$found\"",
    );
    let before = pods_exec_requests(cp).await;
    ctr_exec(&node, &game, "idle", "touch /var/run/game/idle");
    wait_for(&pods, "game-hardened", "idle", |p| {
        condition_status(p, IDLE).as_deref() == Some("True")
    })
    .await;
    assert_eq!(
        pods_exec_requests(cp).await.saturating_sub(before),
        0,
        "pods/exec requests"
    );
    let leftovers = node.stop(cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn file_source_and_pods_exec_through_the_kubelet_and_the_token_confined_to_its_pod() {
    let (running, node) = node_and_chart(NodeOptions::default()).await;
    let cp = &running.cp;
    allow_pods_exec(cp).await;
    let ppms = create_ppm(cp, &game_ppm(false)).await;
    let pods = create_admitted(cp, &pod_with_hand_written_sidecar("game-api", node.name())).await;
    wait_for(&pods, "game-api", "probes written", |p| {
        condition_status(p, HEALTHY).as_deref() == Some("True")
            && condition_status(p, IDLE).as_deref() == Some("False")
    })
    .await;
    // The exec probe ran through the apiserver and the kubelet: `test` is in the game
    // container only (the sidecar image has no shell).
    exec(&pods, "game-api", "game", "touch /var/run/game/idle").await;
    wait_for(&pods, "game-api", "idle through pods/exec", |p| {
        condition_status(p, IDLE).as_deref() == Some("True")
    })
    .await;

    // A probe added to the PodProbeMarker: the manager rewrites the annotation, the kubelet
    // rewrites the downward-API file (atomically, on its next sync), the sidecar picks it up.
    let lobby = json!({"name": "lobby", "containerName": "game", "podConditionType": "game.kruise.io/lobby",
                       "probe": {"tcpSocket": {"port": 7777}, "periodSeconds": 1}});
    let mut ppm = serde_json::to_value(ppms.get("game").await.unwrap()).unwrap();
    ppm["spec"]["probes"].as_array_mut().unwrap().push(lobby);
    ppms.replace(
        "game",
        &PostParams::default(),
        &serde_json::from_value(ppm).unwrap(),
    )
    .await
    .unwrap();
    let up = wait_for(&pods, "game-api", "the added probe's condition", |p| {
        condition_status(p, "game.kruise.io/lobby").as_deref() == Some("True")
    })
    .await;
    let log = logs(&pods, "game-api", SIDECAR).await;
    assert!(log.contains("game.kruise.io/lobby"), "{log}");
    assert!(log.contains("exec_mode=api"), "{log}");

    // The kubelet-projected token writes its own pod's conditions (above) and nothing else:
    // the chart's ValidatingAdmissionPolicy denies it a neighbour's status.
    let neighbour: Pod = serde_json::from_value(json!({
        "metadata": {"name": "neighbour", "namespace": NS, "labels": {"podprobe.io/inject": "disabled"}},
        "spec": {"containers": [{"name": "game", "image": GAMESERVER_IMAGE}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &neighbour)
        .await
        .unwrap();
    let token = projected_token(&node, &up);
    let as_sidecar: Api<Pod> = Api::namespaced(cp.client_for_token(&token), NS);
    let write = json!({"status": {"conditions": [{"type": HEALTHY, "status": "False"}]}});
    let denied = as_sidecar
        .patch_status(
            "neighbour",
            &PatchParams::default(),
            &Patch::Strategic(&write),
        )
        .await
        .expect_err("a write to the neighbour's status is denied");
    match denied {
        kube::Error::Api(e) => assert!(
            e.code == 403 && e.message.contains("ValidatingAdmissionPolicy"),
            "{e:?}"
        ),
        other => panic!("{other:?}"),
    }
    let own = json!({"status": {"conditions": [{"type": "game.kruise.io/lobby", "status": "True",
                                                "reason": "PodProbeSucceeded"}]}});
    as_sidecar
        .patch_status("game-api", &PatchParams::default(), &Patch::Strategic(&own))
        .await
        .expect("the same token writes its own pod's probe condition");

    let leftovers = node.stop(cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The serverless protocol end to end on a node labelled as a virtual-kubelet one: OpenKruise's
/// kruise-manager (EnablePodProbeMarkerOnServerless) owns the PodProbeMarker, annotates the pod
/// and writes the markers; podprobe-manager (companion) injects the sidecar, which runs on the
/// real kubelet and writes the conditions Kruise reads.
#[tokio::test(flavor = "multi_thread")]
async fn kruise_marks_the_pods_of_a_virtual_kubelet_node_from_the_sidecars_conditions() {
    let labels = [("type".to_owned(), "virtual-kubelet".to_owned())].into();
    let options = NodeOptions {
        labels,
        ..NodeOptions::default()
    };
    let (running, node) = node_and_chart_in(options, Mode::Companion).await;
    let cp = &running.cp;
    // Kruise's validation knows no grpc handler ("must specify a handler type").
    let mut ppm = game_ppm(true);
    ppm.spec.probes.retain(|p| p.name != "serving");
    create_ppm(cp, &ppm).await;
    let pods = create_admitted(cp, &game_pod("game-vk", node.name())).await;
    let failed = wait_for(&pods, "game-vk", "Kruise's Failed markers", |p| {
        condition_status(p, IDLE).as_deref() == Some("False")
            && label(p, IDLE).as_deref() == Some("false")
    })
    .await;
    assert_eq!(annotation(&failed, DELETION_COST).as_deref(), Some("100"));
    exec(&pods, "game-vk", "game", "touch /var/run/game/idle").await;
    let idle = wait_for(&pods, "game-vk", "Kruise's Succeeded markers", |p| {
        label(p, IDLE).as_deref() == Some("true")
    })
    .await;
    assert_eq!(annotation(&idle, DELETION_COST).as_deref(), Some("-100"));
    let leftovers = node.stop(cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// `examples/recipes/readiness-gate.yaml` as committed, on a real kubelet: the Deployment's
/// pod is Ready only while its probe condition is True, and the Service's EndpointSlice
/// follows. The test changes only what a node without a registry and a scheduler needs: the
/// image and `nodeName`.
#[tokio::test(flavor = "multi_thread")]
async fn readiness_gate_recipe_takes_a_draining_server_out_of_its_service() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::ListParams;

    let options = NodeOptions {
        controllers: vec!["deployment", "replicaset", "endpointslice"],
        ..NodeOptions::default()
    };
    let (running, node) = node_and_chart(options).await;
    let cp = &running.cp;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/recipes/readiness-gate.yaml");
    let docs = cluster::documents(&std::fs::read_to_string(path).unwrap());
    let pp = PostParams::default();
    let ppm = support::ppm(&docs[0]);
    Api::<podprobe_manager::crd::PodProbeMarker>::namespaced(cp.client(), NS)
        .create(&pp, &ppm)
        .await
        .unwrap();
    let service: Service = serde_json::from_value(docs[1].clone()).unwrap();
    Api::<Service>::namespaced(cp.client(), NS)
        .create(&pp, &service)
        .await
        .unwrap();
    let mut deployment = docs[2].clone();
    let template = &mut deployment["spec"]["template"];
    template["spec"]["nodeName"] = json!(node.name());
    template["spec"]["containers"][0]["image"] = json!(GAMESERVER_IMAGE);
    let probe_pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "template-check", "namespace": NS, "labels": template["metadata"]["labels"]},
        "spec": template["spec"]
    }))
    .unwrap();
    cp.wait_admission(&probe_pod, |p| annotation(p, support::PODPROBE).is_some())
        .await
        .unwrap();
    let deployment: Deployment = serde_json::from_value(deployment).unwrap();
    Api::<Deployment>::namespaced(cp.client(), NS)
        .create(&pp, &deployment)
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    let name = pods_of(&pods, "lobby", 1).await.remove(0);
    let slices: Api<EndpointSlice> = Api::namespaced(cp.client(), NS);
    let endpoint_ready = |want: bool| {
        let slices = slices.clone();
        async move {
            let by_service = ListParams::default().labels("kubernetes.io/service-name=lobby");
            let wait = async {
                loop {
                    let ready: Vec<bool> = slices
                        .list(&by_service)
                        .await
                        .unwrap()
                        .items
                        .iter()
                        .flat_map(|s| s.endpoints.iter())
                        .map(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
                        .collect();
                    if ready == [want] {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(60), wait)
                .await
                .unwrap_or_else(|_| panic!("the Service's one endpoint ready={want}"));
        }
    };

    wait_for(&pods, &name, "Ready through the gate", |p| {
        condition_status(p, HEALTHY).as_deref() == Some("True") && is_ready(p)
    })
    .await;
    endpoint_ready(true).await;
    exec(&pods, &name, "lobby", "touch /var/run/game/unhealthy").await;
    wait_for(&pods, &name, "not Ready while draining", |p| {
        condition_status(p, HEALTHY).as_deref() == Some("False") && !is_ready(p)
    })
    .await;
    endpoint_ready(false).await;
    exec(&pods, &name, "lobby", "rm /var/run/game/unhealthy").await;
    endpoint_ready(true).await;
    scale_to_zero(cp, NS, "lobby").await;
    let leftovers = node.stop(cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The install a user does: the chart's Deployment runs podprobe-manager from the image the
/// Dockerfile builds (non-root, read-only root filesystem, no capabilities), and everything
/// else goes through it: the pod webhook (via its Service) injects the sidecar image, and the
/// markers are the deployed manager's.
#[tokio::test(flavor = "multi_thread")]
async fn the_chart_runs_the_manager_image_on_the_node() {
    let (cp, node) = node_and_deployed_chart().await;
    let managers: Api<Pod> = Api::namespaced(cp.client(), cluster::RELEASE_NS);
    let named = |name: &str| {
        let selector = ListParams::default().labels(&format!("app.kubernetes.io/name={name}"));
        let managers = managers.clone();
        async move { managers.list(&selector).await.unwrap().items }
    };
    let replicas = named("podprobe-manager").await;
    assert_eq!(replicas.len(), 2, "the chart's two replicas");
    for pod in &replicas {
        let name = pod.metadata.name.as_deref().unwrap();
        let container = &pod.spec.as_ref().unwrap().containers[0];
        assert_eq!(container.image.as_deref(), Some(MANAGER_IMAGE), "{name}");
        let security = container.security_context.as_ref().unwrap();
        assert_eq!(security.read_only_root_filesystem, Some(true), "{name}");
        assert!(is_ready(pod), "{name} is Ready: {:?}", pod.status);
        assert_eq!(restart_count(pod, "manager"), 0, "{name}");
    }
    // `helm install` returned after its install check had the apiserver reach the webhook
    // through the Service (helm deleted the Job; no garbage collector runs here to delete its
    // pod).
    let checks = named("podprobe-install-check").await;
    assert_eq!(checks.len(), 1, "one install check pod");
    let check = checks[0].metadata.name.as_deref().unwrap();
    let phase = checks[0].status.as_ref().and_then(|s| s.phase.as_deref());
    assert_eq!(phase, Some("Succeeded"), "{check}");
    let log = logs(&managers, check, "check").await;
    assert!(
        log.contains("the apiserver reached the PodProbeMarker webhook"),
        "{log}"
    );

    create_ppm(&cp, &game_ppm(true)).await;
    let pods = create_admitted(&cp, &game_pod("game-0", node.name())).await;
    let pod = wait_for(&pods, "game-0", "probes, markers and readiness", |p| {
        game_up(p) && label(p, IDLE).as_deref() == Some("false") && is_ready(p)
    })
    .await;
    assert_eq!(annotation(&pod, DELETION_COST).as_deref(), Some("100"));
    let injected = &pod.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0];
    assert_eq!(injected.image.as_deref(), Some(SIDECAR_IMAGE));

    pods.delete("game-0", &DeleteParams::default())
        .await
        .unwrap();
    uninstalled_with_a_pod_waiting_for_its_token(&cp, &pods, &managers).await;
    let leftovers = node.stop(&cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Virtual-node pods admitted while the manager ran, whose replicas then all stopped before
/// they were issued their sidecar's token: each waits behind the scheduling gate. A `helm
/// upgrade` that turns injection off (which removes the issuer) and `helm uninstall` each
/// first run the chart's hook Job, as the manager's service account, which issues the token
/// and releases the pod, where nothing would lift the gate afterwards.
async fn uninstalled_with_a_pod_waiting_for_its_token(
    cp: &testkit::real::ControlPlane,
    pods: &Api<Pod>,
    managers: &Api<Pod>,
) {
    // What the pod webhook makes of pods for a virtual node, without storing them.
    let before_upgrade = admitted_for_a_virtual_node(pods, "game-virtual-0").await;
    let before_uninstall = admitted_for_a_virtual_node(pods, "game-virtual-1").await;

    // Every replica stops, then the pod is created as admitted: nothing issues its token.
    stop_every_replica(cp, managers).await;
    create_gated(pods, &before_upgrade).await;
    let upgrade = cluster::helm(
        cp,
        "upgrade",
        &["injection.enabled=false".to_owned()],
        &["--reuse-values", "--wait", "--timeout=3m"],
    );
    cluster::run(upgrade, "helm upgrade turning injection off");
    issued_and_released(cp, pods, "game-virtual-0").await;

    // Injection on again; every replica stops once more, and the release is uninstalled.
    let upgrade = cluster::helm(
        cp,
        "upgrade",
        &["injection.enabled=true".to_owned()],
        &["--reuse-values", "--wait", "--timeout=3m"],
    );
    cluster::run(upgrade, "helm upgrade turning injection on");
    stop_every_replica(cp, managers).await;
    create_gated(pods, &before_uninstall).await;
    let uninstall = cp
        .helm()
        .unwrap()
        .args(["uninstall", "podprobe", "--namespace", cluster::RELEASE_NS])
        .args(["--wait", "--timeout=3m"])
        .output()
        .expect("run helm");
    assert!(
        uninstall.status.success(),
        "helm uninstall: {}",
        String::from_utf8_lossy(&uninstall.stderr)
    );
    issued_and_released(cp, pods, "game-virtual-1").await;
}

/// `name` as the webhook admits it for a virtual node (a server-side dry run), ready to create.
async fn admitted_for_a_virtual_node(pods: &Api<Pod>, name: &str) -> Pod {
    let mut pod = game_pod(name, "unused");
    let spec = pod.spec.as_mut().unwrap();
    spec.node_name = None;
    spec.tolerations = Some(vec![
        serde_json::from_value(json!({
            "key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"
        }))
        .unwrap(),
    ]);
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut admitted = pods.create(&dry_run, &pod).await.unwrap();
    assert_eq!(
        label(&admitted, "podprobe.io/sidecar-token").as_deref(),
        Some("pending"),
        "the webhook gates a virtual-node pod"
    );
    let meta = &mut admitted.metadata;
    (meta.uid, meta.resource_version, meta.creation_timestamp) = (None, None, None);
    meta.managed_fields = None;
    admitted
}

/// Scales the manager to zero and waits until none of its replicas runs.
async fn stop_every_replica(cp: &testkit::real::ControlPlane, managers: &Api<Pod>) {
    scale_to_zero(cp, cluster::RELEASE_NS, "podprobe-manager").await;
    let selector = ListParams::default().labels("app.kubernetes.io/name=podprobe-manager");
    for replica in managers.list(&selector).await.unwrap().items {
        let (name, uid) = (
            replica.metadata.name.unwrap(),
            replica.metadata.uid.unwrap(),
        );
        let gone = kube::runtime::wait::await_condition(
            managers.clone(),
            &name,
            kube::runtime::wait::conditions::is_deleted(&uid),
        );
        tokio::time::timeout(Duration::from_secs(90), gone)
            .await
            .unwrap_or_else(|_| panic!("{name} still runs after 90 s"))
            .unwrap();
    }
}

fn gates(pod: &Pod) -> Vec<String> {
    let spec = pod.spec.as_ref().unwrap();
    let gates = spec.scheduling_gates.iter().flatten();
    gates.map(|g| g.name.clone()).collect()
}

async fn create_gated(pods: &Api<Pod>, admitted: &Pod) {
    let created = pods.create(&PostParams::default(), admitted).await.unwrap();
    assert_eq!(gates(&created), ["podprobe.io/sidecar-token"]);
}

/// `name` released with its token issued, not without it: the Secret the pod names holds its
/// token and is owned by it.
async fn issued_and_released(cp: &testkit::real::ControlPlane, pods: &Api<Pod>, name: &str) {
    let released = pods.get(name).await.unwrap();
    assert!(
        gates(&released).is_empty(),
        "{name}: {:?}",
        gates(&released)
    );
    assert_eq!(
        label(&released, "podprobe.io/sidecar-token"),
        None,
        "{name}"
    );
    let secret = support::token_secret(&released);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(cp.client(), NS);
    let issued = secrets.get(&secret).await.unwrap();
    let owner = &issued.metadata.owner_references.unwrap()[0];
    assert_eq!(Some(&owner.uid), released.metadata.uid.as_ref(), "{name}");
}
