//! `podprobe run --exec-mode api|auto`, the real binary, against testkit's fake apiserver, whose
//! `pods/exec` endpoint runs the probe commands on this machine (testkit's default tokio
//! runner: this test binary runs no probes in-process, so no reaper owns its children).
//!
//! Still on the fake (issue 28): through a real apiserver, `pods/exec` needs a real kubelet,
//! so these move with the exec tests to the node (`manager/tests/real_node.rs` already runs a
//! sidecar's exec probes through the kubelet there).

mod support;

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use support::*;
use testkit::ApiServer;

/// testkit's fake apiserver with namespace [`NS`].
struct Cluster {
    api: ApiServer,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Cluster {
    async fn start() -> Cluster {
        let api = ApiServer::start().await.expect("start testkit");
        api.create_namespace(NS).expect("namespace");
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig).unwrap();
        Cluster {
            api,
            dir,
            kubeconfig,
        }
    }

    /// A running [`game_pod`] whose container `main` started long ago.
    fn create_pod(&self, name: &str, annotation: &str, ports: serde_json::Value) {
        self.api
            .create(&game_pod(name, annotation, ports))
            .expect("create pod");
        self.api
            .update_pod_status(NS, name, |status| {
                *status = running_status("containerd://main-1", long_ago());
            })
            .expect("update status");
    }

    fn sidecar(&self, name: &str, extra: &[&str]) -> Sidecar {
        start_sidecar(self.dir.path(), &self.kubeconfig, name, extra)
    }

    async fn wait_pod(&self, name: &str, limit: Duration, check: impl Fn(&Pod) -> bool) -> Pod {
        let pods = kube::Api::namespaced(self.api.client(), NS);
        wait_for_pod(&pods, name, limit, check).await
    }
}

const LIMIT: Duration = Duration::from_secs(30);

/// The condition follows the exit status of the command run through pods/exec.
#[tokio::test]
async fn api_mode_condition_follows_the_exit_status() {
    let cluster = Cluster::start().await;
    let flag = cluster.dir.path().join("idle");
    std::fs::write(&flag, "idle").unwrap();
    cluster.create_pod(
        "gs-api",
        &array(&[file_probe("idle", "game.kruise.io/idle", &flag)]),
        serde_json::json!([]),
    );
    let sidecar = cluster.sidecar("gs-api", &["--exec-mode", "api"]);

    let pod = cluster
        .wait_pod("gs-api", LIMIT, |p| {
            has_status(p, "game.kruise.io/idle", "True")
        })
        .await;
    let idle = condition(&pod, "game.kruise.io/idle").unwrap();
    assert_eq!(idle.reason.as_deref(), Some("PodProbeSucceeded"));
    assert_eq!(idle.message.as_deref(), Some("idle"));
    let seen = cluster.api.exec_requests();
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|r| r.pod == "gs-api"
        && r.namespace == NS
        && r.container == "main"
        && r.protocol == testkit::exec::V5
        && r.command[0] == "sh"));

    std::fs::remove_file(&flag).unwrap();
    let pod = cluster
        .wait_pod("gs-api", LIMIT, |p| {
            has_status(p, "game.kruise.io/idle", "False")
        })
        .await;
    let idle = condition(&pod, "game.kruise.io/idle").unwrap();
    assert_eq!(idle.reason.as_deref(), Some("PodProbeFailed"));
    assert!(
        idle.message.as_deref().unwrap_or("").contains("down"),
        "stderr of the failed command: {idle:?}"
    );

    std::fs::write(&flag, "back").unwrap();
    cluster
        .wait_pod("gs-api", LIMIT, |p| {
            has_status(p, "game.kruise.io/idle", "True")
                && condition(p, "game.kruise.io/idle").and_then(|c| c.message.as_deref())
                    == Some("back")
        })
        .await;
    drop(sidecar);
}

/// `auto` in the same setup: procfs finds no process of container `main` (containerID
/// `containerd://main-1` names no cgroup here), so the sidecar picks api, logs the choice once,
/// and probes through pods/exec.
#[tokio::test]
async fn auto_mode_picks_api_and_logs_it_once() {
    let cluster = Cluster::start().await;
    let flag = cluster.dir.path().join("idle");
    std::fs::write(&flag, "idle").unwrap();
    cluster.create_pod(
        "gs-auto",
        &array(&[file_probe("idle", "game.kruise.io/idle", &flag)]),
        serde_json::json!([]),
    );
    let mut sidecar = cluster.sidecar("gs-auto", &["--exec-mode", "auto"]);
    cluster
        .wait_pod("gs-auto", LIMIT, |p| {
            has_status(p, "game.kruise.io/idle", "True")
        })
        .await;
    // A few more periods: the choice is not logged again.
    let deadline = tokio::time::Instant::now() + LIMIT;
    while cluster.api.exec_requests().len() < 4 {
        assert!(tokio::time::Instant::now() < deadline, "probes stopped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(sidecar.terminate(Duration::from_secs(10)).is_some());
    let log = sidecar.log();
    let choices: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("run in api mode"))
        .collect();
    assert_eq!(choices.len(), 1, "the choice is logged once:\n{log}");
    assert!(
        choices[0].contains("procfs"),
        "with the reason procfs was passed over: {}",
        choices[0]
    );
}
