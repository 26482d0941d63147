//! `api` exec mode (pods/exec over WebSocket through kube-rs) against a local exec endpoint
//! that speaks the Kubernetes channel protocol, and `auto`'s choice and fallbacks.
#[path = "support/exec_server.rs"]
mod exec_server;

use std::time::{Duration, Instant};

use exec_server::{ExecServer, V4, V5};
use podprobe::probe::{
    ApiExec, AttemptError, ExecAction, ExecConfig, ExecMode, Handler, MAX_MESSAGE_BYTES,
    MAX_READ_BYTES, Observation, Outcome, Prober, Target,
};

const SEC: Duration = Duration::from_secs(1);

fn cmd(argv: &[&str]) -> ExecAction {
    ExecAction {
        command: argv.iter().map(|s| s.to_string()).collect(),
    }
}

fn api(server: &ExecServer) -> ApiExec {
    ApiExec::new(server.client(), "default", "game-0")
}

fn game(container_id: &str) -> Target {
    Target {
        container_name: "game".into(),
        container_id: Some(container_id.into()),
        ..Target::new("127.0.0.1")
    }
}

#[tokio::test]
async fn exit_zero_succeeds_with_stdout() {
    let server = ExecServer::start().await;
    let obs = api(&server)
        .attempt(
            &cmd(&["sh", "-c", "printf OK; printf noise >&2"]),
            "game",
            5 * SEC,
        )
        .await
        .unwrap();
    assert_eq!(obs, Observation::succeeded("OK"));
    let seen = &server.requests()[0];
    assert_eq!(seen.path, "/api/v1/namespaces/default/pods/game-0/exec");
    assert_eq!(seen.container.as_deref(), Some("game"));
    assert_eq!(seen.command, ["sh", "-c", "printf OK; printf noise >&2"]);
    assert_eq!(seen.protocol, V5, "kube-rs prefers v5 when offered");
}

#[tokio::test]
async fn nonzero_exit_fails_with_stderr() {
    let server = ExecServer::start().await;
    let obs = api(&server)
        .attempt(
            &cmd(&["sh", "-c", "printf out; printf 'not idle' >&2; exit 3"]),
            "game",
            5 * SEC,
        )
        .await
        .unwrap();
    assert_eq!(obs, Observation::failed("not idle"));
}

#[tokio::test]
async fn v4_servers_work_too() {
    let server = ExecServer::start().await;
    server.serve_protocols(&[V4]);
    let ok = api(&server)
        .attempt(&cmd(&["printf", "v4"]), "game", 5 * SEC)
        .await
        .unwrap();
    assert_eq!(ok, Observation::succeeded("v4"));
    let failed = api(&server)
        .attempt(&cmd(&["sh", "-c", "exit 1"]), "game", 5 * SEC)
        .await
        .unwrap();
    assert_eq!(failed.outcome, Outcome::Failed);
    assert_eq!(server.requests()[0].protocol, V4);
}

/// Timeout closes the stream and reports Failed with the local mode's message.
#[tokio::test]
async fn timeout_closes_the_stream_and_fails() {
    let server = ExecServer::start().await;
    let started = Instant::now();
    let obs = api(&server)
        .attempt(&cmd(&["sleep", "5"]), "game", SEC)
        .await
        .unwrap();
    assert!(started.elapsed() < 3 * SEC, "{:?}", started.elapsed());
    assert_eq!(
        obs,
        Observation::failed("command timed out: \"sleep 5\" timed out after 1s")
    );
}

/// 200 KB of stdout: the first 10 KiB are kept (1024 bytes reach the condition message), the
/// rest is read and discarded so the stream never stalls.
#[tokio::test]
async fn large_output_is_capped() {
    let server = ExecServer::start().await;
    let action = cmd(&["sh", "-c", "head -c 200000 /dev/zero | tr '\\0' a"]);
    let obs = api(&server)
        .attempt(&action, "game", 5 * SEC)
        .await
        .unwrap();
    assert_eq!(obs.outcome, Outcome::Succeeded);
    assert_eq!(obs.message, "a".repeat(MAX_READ_BYTES));
    let prober = Prober::default().with_exec(ExecConfig {
        mode: ExecMode::Api,
        api: Some(api(&server)),
    });
    let obs = prober
        .attempt(&Handler::Exec(action), &game("containerd://aa"), 5 * SEC)
        .await
        .unwrap();
    assert_eq!(obs.message.len(), MAX_MESSAGE_BYTES);
}

/// A stream that ends without an exit status: the outcome is unknown → errored attempt.
#[tokio::test]
async fn dropped_stream_is_an_errored_attempt() {
    let server = ExecServer::start().await;
    let err = api(&server)
        .attempt(&cmd(&["drop-stream"]), "game", 5 * SEC)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AttemptError::Other(m) if m.contains("without an exit status")),
        "{err:?}"
    );
}

/// The runtime cannot start the command (status InternalError) → errored, not Failed.
#[tokio::test]
async fn missing_command_is_an_errored_attempt() {
    let server = ExecServer::start().await;
    let err = api(&server)
        .attempt(&cmd(&["podprobe-no-such-command"]), "game", 5 * SEC)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AttemptError::Other(m) if m.contains("failed to exec")),
        "{err:?}"
    );
}

/// RBAC refusal (403) means the mode cannot work here.
#[tokio::test]
async fn forbidden_means_mode_unavailable() {
    let server = ExecServer::start().await;
    server.refuse_with(Some(403));
    let err = api(&server)
        .attempt(&cmd(&["true"]), "game", 5 * SEC)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AttemptError::ModeUnavailable { mode: ExecMode::Api, reason } if reason.contains("RBAC")),
        "{err:?}"
    );
}

// ---- auto ------------------------------------------------------------------------------
// These assume procfs finds no other container's process on the test machine (no shared PID
// namespace with another container, and a containerID no cgroup names), so auto passes it over.

const NO_SUCH_CONTAINER: &str =
    "containerd://0000000000000000000000000000000000000000000000000000000000c0ffee";

fn auto(api: Option<ApiExec>) -> Prober {
    Prober::default().with_exec(ExecConfig {
        mode: ExecMode::Auto,
        api,
    })
}

#[tokio::test]
async fn auto_uses_api_when_procfs_cannot_find_the_target() {
    let server = ExecServer::start().await;
    let prober = auto(Some(api(&server)));
    let target = game(NO_SUCH_CONTAINER);
    assert_eq!(prober.exec_mode_for(&target), ExecMode::Api);
    let obs = prober
        .attempt(
            &Handler::Exec(cmd(&["printf", "via-api"])),
            &target,
            5 * SEC,
        )
        .await
        .unwrap();
    assert_eq!(obs, Observation::succeeded("via-api"));
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn auto_uses_local_without_procfs_or_api() {
    let prober = auto(None);
    let target = game(NO_SUCH_CONTAINER);
    assert_eq!(prober.exec_mode_for(&target), ExecMode::Local);
    let obs = prober
        .attempt(&Handler::Exec(cmd(&["printf", "local"])), &target, 5 * SEC)
        .await
        .unwrap();
    assert_eq!(obs, Observation::succeeded("local"));
}

/// api refused by RBAC: the same attempt falls back to local (no errored attempt), later
/// attempts go straight to local, and a container restart re-evaluates (api is tried again).
#[tokio::test]
async fn auto_falls_back_from_api_to_local_and_reevaluates_on_restart() {
    let server = ExecServer::start().await;
    server.refuse_with(Some(403));
    let prober = auto(Some(api(&server)));
    let first = game(NO_SUCH_CONTAINER);
    let handler = Handler::Exec(cmd(&["printf", "ran"]));
    let obs = prober.attempt(&handler, &first, 5 * SEC).await.unwrap();
    assert_eq!(obs, Observation::succeeded("ran"));
    assert_eq!(prober.exec_mode_for(&first), ExecMode::Local);
    let _ = prober.attempt(&handler, &first, 5 * SEC).await.unwrap();
    assert_eq!(
        server.refused(),
        1,
        "api is not retried for the same container instance"
    );

    // The container restarts (new containerID) and RBAC has been fixed meanwhile.
    server.refuse_with(None);
    let restarted =
        game("containerd://1111111111111111111111111111111111111111111111111111111111111111");
    assert_eq!(prober.exec_mode_for(&restarted), ExecMode::Api);
    let obs = prober.attempt(&handler, &restarted, 5 * SEC).await.unwrap();
    assert_eq!(obs, Observation::succeeded("ran"));
    assert_eq!(server.requests().len(), 1, "the accepted exec");
}

/// Explicit modes do not fall back: the attempt is errored with the reason.
#[tokio::test]
async fn explicit_modes_do_not_fall_back() {
    let server = ExecServer::start().await;
    server.refuse_with(Some(403));
    let prober = Prober::default().with_exec(ExecConfig {
        mode: ExecMode::Api,
        api: Some(api(&server)),
    });
    let err = prober
        .attempt(
            &Handler::Exec(cmd(&["true"])),
            &game(NO_SUCH_CONTAINER),
            5 * SEC,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            AttemptError::ModeUnavailable {
                mode: ExecMode::Api,
                ..
            }
        ),
        "{err:?}"
    );
    let prober = Prober::default().with_exec(ExecConfig {
        mode: ExecMode::Procfs,
        api: None,
    });
    let err = prober
        .attempt(
            &Handler::Exec(cmd(&["true"])),
            &game(NO_SUCH_CONTAINER),
            5 * SEC,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            AttemptError::ModeUnavailable {
                mode: ExecMode::Procfs,
                ..
            }
        ),
        "{err:?}"
    );
}
