//! The install a new user does, as the README writes it, on a fresh cluster with a real node:
//! the README's install block runs verbatim (kubectl and helm built here, the chart's default
//! values, the chart's default image names served by the images built from this repository),
//! then the recipes run with nothing changed but their placeholder images (and the idle
//! recipe's placeholder command, the image's entrypoint). The idle recipe's exec probe runs the
//! game server's `/idle.sh` as installed: through podprobe's exec agent in the game container
//! (no shared process namespace, a non-root sidecar without capabilities, no `pods/exec`), and
//! the sidecar's token may exec into its own pod only.

mod cluster;
mod installed;
mod on_node;
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::AttachParams;
use serde_json::{Value, json};
use testkit::real::node::images::{GAMESERVER_IMAGE, MANAGER_IMAGE, SIDECAR_IMAGE};
use testkit::real::{ControlPlane, NodeOptions};

use on_node::{
    SIDECAR, chart_default_images, exec, logs, node_for_workloads, pods_of, projected_token,
    readme_blocks, run_as_user, scale_to_zero, wait_for, workspace,
};
use support::{annotation, condition_status};

/// The namespace the README's install opts in.
const GAMES: &str = "games";
const IDLE: &str = "game.kruise.io/idle";
const HEALTHY: &str = "game.kruise.io/healthy";
const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The documents of `examples/recipes/<name>`, each Deployment's placeholder image replaced
/// by the test game server (which answers what the recipes probe), and a placeholder command
/// by that image's entrypoint.
fn recipe(name: &str) -> Vec<Value> {
    let path = workspace().join("examples/recipes").join(name);
    let mut docs = cluster::documents(&std::fs::read_to_string(path).unwrap());
    for doc in docs.iter_mut().filter(|d| d["kind"] == "Deployment") {
        let container = &mut doc["spec"]["template"]["spec"]["containers"][0];
        container["image"] = json!(GAMESERVER_IMAGE);
        if container.get("command").is_some() {
            container["command"] = json!(["/usr/local/bin/gameserver"]);
        }
    }
    docs
}

/// `kubectl apply -n games` of `docs`, as a user applies a recipe.
fn apply(cp: &ControlPlane, docs: &[Value]) {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": docs});
    on_node::kubectl_apply(cp, GAMES, &list);
}

/// Execs `sh -c :` in `pod`'s game container as `client`: `Ok` when it ran, else the apiserver's
/// refusal.
async fn exec_as(client: kube::Client, pod: &str, container: &str) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client, GAMES);
    let params = AttachParams::default()
        .container(container)
        .stdin(false)
        .stdout(false)
        .stderr(true);
    let mut process = pods.exec(pod, ["sh", "-c", ":"], &params).await?;
    let status = process.take_status().expect("a status channel");
    let status = tokio::time::timeout(Duration::from_secs(30), status)
        .await
        .expect("exec finished")
        .expect("exec status");
    assert_eq!(status.status.as_deref(), Some("Success"), "{status:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_install_runs_the_recipes_probes_exec_included_with_the_charts_defaults() {
    let options = NodeOptions {
        labels: BTreeMap::from([("type".to_owned(), "virtual-kubelet".to_owned())]),
        ..NodeOptions::default()
    };
    let (cp, node) = node_for_workloads(options).await;
    let (manager_image, sidecar_image) = chart_default_images();
    node.tag_image(MANAGER_IMAGE, &manager_image).unwrap();
    node.tag_image(SIDECAR_IMAGE, &sidecar_image).unwrap();

    let install = readme_blocks("Install");
    assert_eq!(
        install.len(),
        2,
        "standalone, then companion (real_mixed_okg.rs runs that one): {install:?}"
    );
    run_as_user(&cp, &node, &install[0]);

    // The idle recipe: /idle.sh in the game container, which the sidecar's image lacks, run
    // there by the exec agent that injection started beside the image's entrypoint (the
    // recipe gives no command).
    apply(&cp, &recipe("idle-deletion-cost.yaml"));
    let pods: Api<Pod> = Api::namespaced(cp.client(), GAMES);
    let arena = pods_of(&pods, "arena", 2).await;
    for name in &arena {
        wait_for(&pods, name, "idle, deletion cost -5", |p| {
            condition_status(p, IDLE).as_deref() == Some("True")
                && annotation(p, DELETION_COST).as_deref() == Some("-5")
        })
        .await;
    }
    let (busy, other) = (&arena[0], &arena[1]);
    // The README's look at them, as written (its `kubectl apply` is the one above, with the
    // image a user would have set).
    let first_probe = readme_blocks("A first probe");
    assert_eq!(first_probe.len(), 1, "{first_probe:?}");
    let look: Vec<&str> = first_probe[0]
        .lines()
        .filter(|l| !l.starts_with("kubectl apply"))
        .collect();
    let tables = run_as_user(&cp, &node, &look.join("\n"));
    for name in &arena {
        assert!(
            tables
                .lines()
                .any(|l| l.split_whitespace().eq([name.as_str(), "True", "-5"])),
            "kubectl get:\n{tables}"
        );
        let row = [
            name.as_str(),
            "idle",
            IDLE,
            "True",
            "idle",
            "annotation",
            "controller.kubernetes.io/pod-deletion-cost=-5",
            "-",
        ];
        assert!(
            tables.lines().any(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                // The two ages (TRANSITION, PROBED) vary: every other cell as the README shows.
                cells.len() == 10 && cells[..5] == row[..5] && cells[7..] == row[5..]
            }),
            "kubectl podprobe get:\n{tables}"
        );
    }
    let log = logs(&pods, busy, SIDECAR).await;
    assert!(log.contains("exec_mode=agent"), "{log}");
    exec(&pods, busy, "arena", "touch /var/run/game/players").await;
    let pod = wait_for(&pods, busy, "busy, deletion cost 5", |p| {
        condition_status(p, IDLE).as_deref() == Some("False")
            && annotation(p, DELETION_COST).as_deref() == Some("5")
    })
    .await;

    // The game's container holds no token (injection mounts it into the sidecar alone)...
    exec(
        &pods,
        busy,
        "arena",
        "test ! -e /var/run/secrets/kubernetes.io/serviceaccount/token",
    )
    .await;
    // ...and the sidecar's own token execs into its own pod, and nowhere else.
    let token = projected_token(&node, &pod);
    let as_sidecar = cp.client_for_token(&token);
    exec_as(as_sidecar.clone(), busy, "arena")
        .await
        .expect("the sidecar's token execs into its own pod");
    match exec_as(as_sidecar, other, "arena").await {
        Err(kube::Error::Api(e)) => assert!(
            e.code == 403 && e.message.contains("podprobe-sidecar-pods-exec"),
            "{e:?}"
        ),
        other => panic!("exec into a neighbour: {other:?}"),
    }

    // The readiness-gate recipe: an httpGet probe gating the pod's readiness.
    apply(&cp, &recipe("readiness-gate.yaml"));
    let lobby = pods_of(&pods, "lobby", 1).await;
    wait_for(&pods, &lobby[0], "Ready through the gate", |p| {
        condition_status(p, HEALTHY).as_deref() == Some("True")
            && condition_status(p, "Ready").as_deref() == Some("True")
    })
    .await;

    scale_to_zero(&cp, GAMES, "arena").await;
    scale_to_zero(&cp, GAMES, "lobby").await;
    let leftovers = node.stop(&cp).await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
