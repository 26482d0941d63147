//! OpenKruise Game on a mixed cluster, on the virtual node: a kubelet node where the
//! Deployments run (podprobe's manager, installed by the README's companion install with the
//! chart's defaults) beside a virtual node with azure-aci v1.6.4's behaviour (`vk-cri --aci` on
//! the library v1.11.0: its pod rules, its volumes, its exec without an exit status, the
//! status written whole every 5 s) that runs the game servers. kruise-manager has
//! `EnablePodProbeMarkerOnServerless` and OpenKruise Game's manager runs beside it (both built
//! from their pinned modules, installed from their own manifests). The recipe
//! `examples/recipes/okg-serverless.yaml` is applied as committed but for its placeholder
//! image and command: kube-scheduler places the GameServerSet's pods on the virtual node, its
//! serviceQualities become OKG's PodProbeMarker, Kruise's webhook writes the probes into each
//! pod, the injected sidecar runs them (the idle exec probe through the exec agent in the
//! game container, the http one over the pod's network), and OKG turns the conditions into
//! each GameServer's opsState; scale-in then removes the idle server, not the highest ordinal.
//!
//! Beside it, on the kubelet node, kruise-daemon runs (as OpenKruise's DaemonSet would there),
//! and a second GameServerSet without the virtual node's toleration lands there: the sidecar
//! is injected into it too (the namespace opted in), but kruise-daemon probes that pod, so the
//! sidecar stands down: one executor per pod, each pod probed by the right one.

mod cluster;
mod installed;
mod on_node;
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use testkit::real::node::images::{GAMESERVER_IMAGE, MANAGER_IMAGE, SIDECAR_IMAGE};
use testkit::real::{ControlPlane, KruiseGame, Library, VirtualAgent};

use on_node::{
    SIDECAR, chart_default_images, kubectl_apply, logs, mixed_cluster, readme_blocks, run_as_user,
    runtime_exec, workspace,
};
use support::condition_status;

const GAMES: &str = "games";
const SET: &str = "arena";
const RECIPE: &str = "examples/recipes/okg-serverless.yaml";
const IDLE: &str = "game.kruise.io/idle";
const HEALTHY: &str = "game.kruise.io/healthy";
/// The GameServerSet on the kubelet node.
const LOBBY: &str = "lobby";
const LIMIT: Duration = Duration::from_secs(90);
/// The test game server image's entrypoint.
const GAMESERVER_COMMAND: &str = "/usr/local/bin/gameserver";

fn game_resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("game.kruise.io", "v1alpha1", kind))
}

/// The README's companion install, run as written. The recipe's comment gives the same
/// commands (its lines indented as commands, but the `kubectl apply` of the recipe itself,
/// which the test applies with its own image).
fn companion_install_commands() -> String {
    let install = readme_blocks("Install");
    let companion = install
        .iter()
        .find(|block| block.contains("--set mode=companion"))
        .unwrap_or_else(|| panic!("the README's install has a companion block: {install:?}"));
    let text = std::fs::read_to_string(workspace().join(RECIPE)).unwrap();
    let recipe: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .filter(|l| !l.starts_with("kubectl apply"))
        .collect();
    assert_eq!(
        recipe.join("\n"),
        *companion,
        "the recipe and the README install companion mode alike"
    );
    companion.clone()
}

/// A GameServerSet for the kubelet node: the recipe's without the virtual node's selector and
/// toleration, named `lobby`, one replica.
fn kubelet_game_server_set() -> Value {
    let mut set = recipe_game_server_set();
    set["metadata"]["name"] = json!(LOBBY);
    set["spec"]["replicas"] = json!(1);
    let spec = set["spec"]["gameServerTemplate"]["spec"]
        .as_object_mut()
        .unwrap();
    spec.remove("nodeSelector");
    spec.remove("tolerations");
    set
}

/// Whether podprobe's sidecar wrote any of `pod`'s status (its field manager).
fn written_by_podprobe(pod: &Pod) -> bool {
    pod.metadata
        .managed_fields
        .iter()
        .flatten()
        .any(|m| m.manager.as_deref() == Some(podprobe_protocol::pod::FIELD_MANAGER))
}

/// The recipe's GameServerSet, its placeholder image and command replaced by the test game
/// server's (which answers `/idle.sh` and `/healthz` as the recipe expects), imported on the
/// node, not pulled: there is no registry (Kruise's Advanced StatefulSet defaults the pull
/// policy to `Always`).
fn recipe_game_server_set() -> Value {
    let text = std::fs::read_to_string(workspace().join(RECIPE)).unwrap();
    let mut docs = cluster::documents(&text);
    assert_eq!(docs.len(), 1, "one GameServerSet");
    let mut set = docs.remove(0);
    assert_eq!(set["kind"], "GameServerSet");
    let container = &mut set["spec"]["gameServerTemplate"]["spec"]["containers"][0];
    container["image"] = json!(GAMESERVER_IMAGE);
    assert!(
        container["command"].is_array(),
        "the recipe gives the game container's command (the exec agent wraps it)"
    );
    container["command"] = json!([GAMESERVER_COMMAND]);
    container["imagePullPolicy"] = json!("IfNotPresent");
    set
}

/// A GameServer's `spec.opsState` and its service quality `name`'s status as OKG recorded it.
fn ops_state(server: &DynamicObject) -> &str {
    server.data["spec"]["opsState"].as_str().unwrap_or("")
}

fn quality_status<'a>(server: &'a DynamicObject, name: &str) -> &'a str {
    server.data["status"]["serviceQualitiesConditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name)
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
}

/// Polls GameServer `name` until `check` holds; panics with its spec and status otherwise.
async fn wait_server(
    servers: &Api<DynamicObject>,
    name: &str,
    what: &str,
    check: impl Fn(&DynamicObject) -> bool,
) -> DynamicObject {
    let wait = async {
        loop {
            if let Some(server) = servers.get_opt(name).await.unwrap()
                && check(&server)
            {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    match tokio::time::timeout(LIMIT, wait).await {
        Ok(server) => server,
        Err(_) => {
            let server = servers.get_opt(name).await.unwrap();
            panic!(
                "GameServer {name}: {what} not reached within {LIMIT:?}: {:?}",
                server.map(|s| s.data)
            );
        }
    }
}

/// The GameServerSet's pods not being deleted, by name.
async fn live_pods(pods: &Api<Pod>) -> Vec<String> {
    let selector = ListParams::default().labels(&format!("game.kruise.io/owner-gss={SET}"));
    let mut names: Vec<String> = pods
        .list(&selector)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    names
}

async fn scale(sets: &Api<DynamicObject>, pods: &Api<Pod>, replicas: usize, left: &[&str]) {
    sets.patch(
        SET,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": replicas}})),
    )
    .await
    .unwrap();
    let wait = async {
        while live_pods(pods).await != left {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    if tokio::time::timeout(LIMIT, wait).await.is_err() {
        panic!(
            "scaled to {replicas}: {:?} left, expected {left:?}",
            live_pods(pods).await
        );
    }
}

/// What the controllers did, for a failure message: the objects of the game's namespace and
/// the two Kruise managers' last log lines.
fn diagnosis(cp: &ControlPlane, okg: &KruiseGame) -> String {
    let objects = cp
        .kubectl()
        .unwrap()
        .args(["get", "-n", GAMES, "-o", "yaml"])
        .arg("gameserversets,gameservers,podprobemarkers,statefulsets.apps.kruise.io,pods,events")
        .output()
        .expect("run kubectl");
    format!(
        "{}\n{}\nkruise-game:\n{}\nkruise-manager:\n{}",
        String::from_utf8_lossy(&objects.stdout),
        String::from_utf8_lossy(&objects.stderr),
        okg.log_tail(40),
        cp.kruise_log_tail(40)
    )
}

/// Waits until the GameServerSet's pods are `names`.
async fn wait_pods(cp: &ControlPlane, okg: &KruiseGame, pods: &Api<Pod>, names: &[&str]) {
    let wait = async {
        while live_pods(pods).await != names {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    if tokio::time::timeout(LIMIT, wait).await.is_err() {
        panic!(
            "the GameServerSet's pods: {:?}, expected {names:?}\n{}",
            live_pods(pods).await,
            diagnosis(cp, okg)
        );
    }
}

/// Waits until `check` holds for pod `name`; panics with the [`diagnosis`] otherwise.
async fn wait_pod(
    cp: &ControlPlane,
    okg: &KruiseGame,
    pods: &Api<Pod>,
    name: &str,
    what: &str,
    check: impl Fn(&Pod) -> bool,
) -> Pod {
    match support::watch_until(pods, name, LIMIT, check).await {
        Some(pod) => pod,
        None => panic!(
            "{name}: {what} not reached within {LIMIT:?}\n{}",
            diagnosis(cp, okg)
        ),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn okg_opsstate_on_a_mixed_clusters_virtual_node_follows_podprobe_and_scale_in_removes_the_idle_server()
 {
    let aci = VirtualAgent {
        library: Library::V1_11,
        aci: true,
        ..VirtualAgent::default()
    };
    let (mut cp, node, virtual_node) = mixed_cluster(aci).await;
    cp.start_kruise_manager()
        .await
        .unwrap_or_else(|e| panic!("kruise-manager: {e}"));
    let kruise_daemon = node
        .start_kruise_daemon(&cp)
        .await
        .unwrap_or_else(|e| panic!("kruise-daemon: {e}"));
    let okg = KruiseGame::start(&cp, node.network().host_ip())
        .await
        .unwrap_or_else(|e| panic!("kruise-game: {e}"));
    let (manager_image, sidecar_image) = chart_default_images();
    node.tag_image(MANAGER_IMAGE, &manager_image).unwrap();
    for each in [&node, &virtual_node] {
        each.tag_image(SIDECAR_IMAGE, &sidecar_image).unwrap();
    }
    run_as_user(&cp, &node, &companion_install_commands());
    kubectl_apply(&cp, GAMES, &recipe_game_server_set());
    kubectl_apply(&cp, GAMES, &kubelet_game_server_set());

    let pods: Api<Pod> = Api::namespaced(cp.client(), GAMES);
    let servers: Api<DynamicObject> =
        Api::namespaced_with(cp.client(), GAMES, &game_resource("GameServer"));
    let sets: Api<DynamicObject> =
        Api::namespaced_with(cp.client(), GAMES, &game_resource("GameServerSet"));
    let names = ["arena-0", "arena-1", "arena-2"];
    wait_pods(&cp, &okg, &pods, &names).await;

    // No player anywhere: every server idle (podprobe's condition), so WaitToBeDeleted (OKG).
    for name in names {
        let pod = wait_pod(&cp, &okg, &pods, name, "idle and healthy", |p| {
            condition_status(p, IDLE).as_deref() == Some("True")
                && condition_status(p, HEALTHY).as_deref() == Some("True")
        })
        .await;
        assert_eq!(
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some(virtual_node.name()),
            "{name}: placed on the virtual node"
        );
        let annotated = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kruise.io/podprobe"))
            .unwrap_or_else(|| panic!("{name}: Kruise's webhook wrote no probes"));
        assert!(
            annotated.contains(IDLE) && annotated.contains(HEALTHY),
            "{annotated}"
        );
        wait_server(&servers, name, "WaitToBeDeleted, idle True", |s| {
            ops_state(s) == "WaitToBeDeleted" && quality_status(s, "idle") == "True"
        })
        .await;
    }

    let sidecar_log = logs(&pods, "arena-0", SIDECAR).await;
    assert!(
        sidecar_log.contains("this sidecar probes the pod")
            && sidecar_log.contains("is labelled type=virtual-kubelet"),
        "{sidecar_log}"
    );
    // Watched for, not read once: the provider writes its pods' status whole every 5 s, and a
    // write from a view older than the sidecar's takes podprobe's conditions, and its entry in
    // the managed fields, away until the sidecar writes them back.
    wait_pod(
        &cp,
        &okg,
        &pods,
        "arena-0",
        "conditions written by podprobe's sidecar",
        written_by_podprobe,
    )
    .await;

    // The lobby, on the kubelet node: idle by kruise-daemon's probe, which OKG acts on; the
    // sidecar injected there stands down and writes nothing.
    let lobby = format!("{LOBBY}-0");
    let pod = wait_pod(&cp, &okg, &pods, &lobby, "idle (kruise-daemon)", |p| {
        condition_status(p, IDLE).as_deref() == Some("True")
    })
    .await;
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node.name()),
        "{lobby}: placed on the kubelet node"
    );
    let sidecar_log = logs(&pods, &lobby, SIDECAR).await;
    assert!(
        sidecar_log.contains("stands down") && !sidecar_log.contains("reads its probes"),
        "{lobby}'s sidecar:\n{sidecar_log}\nkruise-daemon:\n{}",
        kruise_daemon.log_tail(20)
    );
    wait_server(&servers, &lobby, "WaitToBeDeleted, idle True", |s| {
        ops_state(s) == "WaitToBeDeleted" && quality_status(s, "idle") == "True"
    })
    .await;
    assert!(
        !written_by_podprobe(&pods.get(&lobby).await.unwrap()),
        "{lobby}: the sidecar wrote its status beside kruise-daemon"
    );
    sets.delete(LOBBY, &Default::default()).await.unwrap();

    // The game's state, changed in the arena container through the virtual node's runtime.
    let in_game = |name, script| runtime_exec(&virtual_node, &pods, name, "arena", script);

    // Players join arena-1 and arena-2: busy, so None. (The game's state is changed through
    // the node's runtime: azure-aci's exec runs a command without arguments. Through it, the
    // probe would read idle whatever the file says: only the exec agent gives this result.)
    for name in ["arena-1", "arena-2"] {
        in_game(name, "touch /var/run/game/players").await;
    }
    for name in ["arena-1", "arena-2"] {
        wait_server(&servers, name, "None, idle False", |s| {
            ops_state(s) == "None" && quality_status(s, "idle") == "False"
        })
        .await;
    }

    // arena-2's health check fails: Maintaining (healthy's action runs after idle's).
    in_game("arena-2", "touch /var/run/game/unhealthy").await;
    wait_server(&servers, "arena-2", "Maintaining, healthy False", |s| {
        ops_state(s) == "Maintaining" && quality_status(s, "healthy") == "False"
    })
    .await;
    // It passes again. On a kubelet node the server would stay Maintaining (healthy has no
    // action on true). Here the provider writes the pod's status whole every 5 s: when OKG
    // reads the pod between that write and the sidecar's repair, the qualities' conditions
    // are absent, OKG records them with no status, and the repaired condition reads to it as a
    // change, so it runs idle's action again: busy, so None (docs/providers.md, OpenKruise
    // Game). Seen within seconds of the recovery.
    in_game("arena-2", "rm /var/run/game/unhealthy").await;
    wait_server(&servers, "arena-2", "healthy True, then None", |s| {
        quality_status(s, "healthy") == "True" && ops_state(s) == "None"
    })
    .await;
    let idle = servers.get("arena-0").await.unwrap();
    assert_eq!(ops_state(&idle), "WaitToBeDeleted", "arena-0 is still idle");

    // Scale-in: the idle server goes first (without its opsState the highest ordinal would).
    scale(&sets, &pods, 2, &["arena-1", "arena-2"]).await;

    // kruise-game stays up until the node has stopped: its pod webhook (failurePolicy Fail)
    // also admits the kubelet's final deletion of the terminating pods.
    scale(&sets, &pods, 0, &[]).await;
    drop(kruise_daemon);
    let leftovers = virtual_node.stop(&cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let leftovers = node.stop(&cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    drop(okg);
}
