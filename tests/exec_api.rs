//! `api` exec mode (pods/exec over WebSocket through kube-rs) against testkit's `pods/exec`
//! endpoint, raw remotecommand clients against that endpoint, and `auto`'s choice and
//! fallbacks.
#[path = "support/exec_kit.rs"]
mod exec_kit;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use podprobe::probe::{
    ApiExec, AttemptError, ExecAction, ExecConfig, ExecMode, Handler, MAX_MESSAGE_BYTES,
    MAX_READ_BYTES, Observation, Outcome, Prober, Target,
};
use testkit::exec::{V1, V4, V5};
use testkit::{ADMIN_TOKEN, ApiServer, Fault, Rule};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const SEC: Duration = Duration::from_secs(1);
const SA_TOKEN: &str = "podprobe-sa-token";
const SA_USER: &str = "system:serviceaccount:default:podprobe";

fn cmd(argv: &[&str]) -> ExecAction {
    ExecAction {
        command: argv.iter().map(|s| s.to_string()).collect(),
    }
}

fn api(server: &ApiServer) -> ApiExec {
    ApiExec::new(server.client(), exec_kit::NS, exec_kit::POD)
}

/// As the sidecar's service account (subject to the rules given to testkit).
fn api_as_sa(server: &ApiServer) -> ApiExec {
    server.add_token(SA_TOKEN, SA_USER, BTreeMap::new());
    ApiExec::new(
        server.client_for_token(SA_TOKEN),
        exec_kit::NS,
        exec_kit::POD,
    )
}

fn game(container_id: &str) -> Target {
    Target {
        container_name: "game".into(),
        container_id: Some(container_id.into()),
        ..Target::new("127.0.0.1")
    }
}

fn refused(server: &ApiServer) -> usize {
    server
        .journal()
        .matching("", "pods/exec")
        .iter()
        .filter(|e| e.status == 403)
        .count()
}

#[tokio::test]
async fn exit_zero_succeeds_with_stdout() {
    let server = exec_kit::start().await;
    let obs = api(&server)
        .attempt(
            &cmd(&["sh", "-c", "printf OK; printf noise >&2"]),
            "game",
            5 * SEC,
        )
        .await
        .unwrap();
    assert_eq!(obs, Observation::succeeded("OK"));
    let seen = &server.exec_requests()[0];
    assert_eq!(
        (seen.namespace.as_str(), seen.pod.as_str()),
        ("default", "game-0")
    );
    assert_eq!(seen.container, "game");
    assert_eq!(seen.command, ["sh", "-c", "printf OK; printf noise >&2"]);
    assert!(seen.stdout && seen.stderr && !seen.stdin && !seen.tty);
    assert_eq!(seen.protocol, V5, "kube-rs prefers v5 when offered");
    let journal = server.journal().matching("", "pods/exec");
    assert_eq!(journal.len(), 1);
    assert_eq!(journal[0].status, 101);
    assert_eq!(
        journal[0].method, "GET",
        "kube-rs upgrades with GET (authorized as create)"
    );
}

#[tokio::test]
async fn nonzero_exit_fails_with_stderr() {
    let server = exec_kit::start().await;
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

/// An apiserver without the v5 stream translator (< 1.30, or the gate off): kube-rs offers
/// `v5, v4` and the kubelet answers v4.
#[tokio::test]
async fn v4_servers_work_too() {
    let server = exec_kit::start().await;
    server.set_exec_v5(false);
    let ok = api(&server)
        .attempt(&cmd(&["printf", "v4"]), "game", 5 * SEC)
        .await
        .unwrap();
    assert_eq!(ok, Observation::succeeded("v4"));
    let failed = api(&server)
        .attempt(&cmd(&["sh", "-c", "echo bad >&2; exit 1"]), "game", 5 * SEC)
        .await
        .unwrap();
    assert_eq!(failed, Observation::failed("bad\n"));
    assert!(server.exec_requests().iter().all(|r| r.protocol == V4));
}

/// Timeout closes the stream and reports Failed with the local mode's message.
#[tokio::test]
async fn timeout_closes_the_stream_and_fails() {
    let server = exec_kit::start().await;
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
    let server = exec_kit::start().await;
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

/// A stream dropped (after 7 bytes of output) without an exit status: the outcome is unknown
/// → errored attempt.
#[tokio::test]
async fn dropped_stream_is_an_errored_attempt() {
    let server = exec_kit::start().await;
    server
        .faults()
        .add(Fault::drop_exec_stream_after(7).times(1));
    let err = api(&server)
        .attempt(
            &cmd(&["sh", "-c", "printf partial-and-more; sleep 1"]),
            "game",
            5 * SEC,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AttemptError::Other(m) if m.contains("without an exit status")),
        "{err:?}"
    );
    assert!(server.journal().entries().iter().any(|e| e.fault));
    // The rule is used up: the next attempt is whole.
    let obs = api(&server)
        .attempt(&cmd(&["printf", "whole"]), "game", 5 * SEC)
        .await
        .unwrap();
    assert_eq!(obs, Observation::succeeded("whole"));
}

/// The runtime cannot start the command (status InternalError) → errored, not Failed.
#[tokio::test]
async fn missing_command_is_an_errored_attempt() {
    let server = exec_kit::start().await;
    let err = api(&server)
        .attempt(&cmd(&["podprobe-no-such-command"]), "game", 5 * SEC)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AttemptError::Other(m) if m.contains("failed to exec")),
        "{err:?}"
    );
}

/// RBAC: without `create` on `pods/exec` (a `get` rule is not enough since 1.35) the mode
/// cannot work here; with it, it does.
#[tokio::test]
async fn forbidden_means_mode_unavailable() {
    let server = exec_kit::start().await;
    server.allow(Rule::new(&["get"], &["pods", "pods/exec"]).user(SA_USER));
    let exec = api_as_sa(&server);
    let err = exec
        .attempt(&cmd(&["true"]), "game", 5 * SEC)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AttemptError::ModeUnavailable { mode: ExecMode::Api, reason } if reason.contains("RBAC") && reason.contains("pods/exec")),
        "{err:?}"
    );
    assert_eq!(refused(&server), 1);
    server.allow(Rule::new(&["create"], &["pods/exec"]).user(SA_USER));
    let obs = exec
        .attempt(&cmd(&["printf", "allowed"]), "game", 5 * SEC)
        .await
        .unwrap();
    assert_eq!(obs, Observation::succeeded("allowed"));
    assert_eq!(server.exec_requests()[0].user, SA_USER);
}

/// No such pod (404) → mode unavailable; an unknown container (400) → errored attempt with the
/// apiserver's message.
#[tokio::test]
async fn missing_pod_and_unknown_container() {
    let server = exec_kit::start().await;
    let err = ApiExec::new(server.client(), "default", "no-such-pod")
        .attempt(&cmd(&["true"]), "game", 5 * SEC)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AttemptError::ModeUnavailable { mode: ExecMode::Api, reason } if reason.contains("404")),
        "{err:?}"
    );
    let err = api(&server)
        .attempt(&cmd(&["true"]), "nope", 5 * SEC)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AttemptError::Other(m) if m.contains("container nope is not valid for pod game-0")),
        "{err:?}"
    );
    assert!(server.exec_requests().is_empty());
}

// ---- raw remotecommand clients ---------------------------------------------------------

/// Opens `pods/exec` for `argv` offering `protocols` (none: no header); returns the negotiated
/// protocol and every binary message until the server closes.
async fn raw_exec(server: &ApiServer, protocols: &[&str], argv: &[&str]) -> (String, Vec<Vec<u8>>) {
    let mut query: String = argv
        .iter()
        .map(|a| format!("command={}&", urlencode(a)))
        .collect();
    query.push_str("container=game&stdout=true&stderr=true");
    let url = format!(
        "ws://127.0.0.1:{}/api/v1/namespaces/default/pods/game-0/exec?{query}",
        server.port()
    );
    let mut request = url.into_client_request().unwrap();
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {ADMIN_TOKEN}").parse().unwrap(),
    );
    if !protocols.is_empty() {
        request.headers_mut().insert(
            "sec-websocket-protocol",
            protocols.join(", ").parse().unwrap(),
        );
    }
    let (mut ws, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    let protocol = response
        .headers()
        .get("sec-websocket-protocol")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let mut frames = Vec::new();
    while let Some(msg) = tokio::time::timeout(5 * SEC, ws.next()).await.unwrap() {
        match msg.unwrap() {
            Message::Binary(b) => frames.push(b.to_vec()),
            Message::Close(_) => break,
            _ => {}
        }
    }
    (protocol, frames)
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn channel(frames: &[Vec<u8>], n: u8) -> Vec<u8> {
    frames
        .iter()
        .filter(|f| f.first() == Some(&n))
        .flat_map(|f| f[1..].to_vec())
        .collect()
}

/// `channel.k8s.io` (v1): channel-prefixed frames, an empty first frame on stdout, and on
/// channel 3 plain error text for a failure, nothing for success.
#[tokio::test]
async fn raw_v1_client() {
    let server = exec_kit::start().await;
    let script = ["sh", "-c", "printf out; printf err >&2; exit 3"];
    let (protocol, frames) = raw_exec(&server, &[V1], &script).await;
    assert_eq!(protocol, V1);
    assert_eq!(
        frames[0],
        [1u8],
        "the kubelet's empty frame on the lowest writable channel"
    );
    assert_eq!(channel(&frames, 1), b"out");
    assert_eq!(channel(&frames, 2), b"err");
    let status = String::from_utf8(channel(&frames, 3)).unwrap();
    assert!(
        status.starts_with("command terminated with non-zero exit code"),
        "{status}"
    );
    assert!(status.contains("exited with 3"), "{status}");
    assert_eq!(frames.last().unwrap()[0], 3, "the status comes last");

    let (_, frames) = raw_exec(&server, &[V1], &["printf", "fine"]).await;
    assert_eq!(channel(&frames, 1), b"fine");
    assert!(
        frames.iter().all(|f| f[0] != 3),
        "v1 sends no status on success"
    );

    // No subprotocol offered: v1 semantics, no protocol in the answer.
    let (protocol, frames) = raw_exec(&server, &[], &["sh", "-c", "exit 2"]).await;
    assert_eq!(protocol, "");
    assert!(
        String::from_utf8(channel(&frames, 3))
            .unwrap()
            .contains("exited with 2")
    );
}

/// A client that speaks only v4 gets v4 and a `metav1.Status` with the exit code; one that
/// lists v4 before v5 gets v5 (the apiserver's translator takes any v5 request).
#[tokio::test]
async fn raw_v4_only_client_and_v5_preference() {
    let server = exec_kit::start().await;
    let (protocol, frames) = raw_exec(&server, &[V4], &["sh", "-c", "exit 3"]).await;
    assert_eq!(protocol, V4);
    let status: serde_json::Value = serde_json::from_slice(&channel(&frames, 3)).unwrap();
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["reason"], "NonZeroExitCode");
    assert_eq!(
        status["details"]["causes"][0],
        serde_json::json!({"reason": "ExitCode", "message": "3"})
    );
    let (protocol, frames) = raw_exec(&server, &[V4, V5], &["true"]).await;
    assert_eq!(protocol, V5);
    let status: serde_json::Value = serde_json::from_slice(&channel(&frames, 3)).unwrap();
    assert_eq!(status["status"], "Success");
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

/// Captures this thread's log lines (tests here run on a current-thread runtime).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || logs.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// procfs cannot work for the target (no process of its container is visible): auto picks
/// api, runs the probe through testkit's endpoint, and logs the choice with procfs' reason,
/// once.
#[tokio::test]
async fn auto_falls_back_from_procfs_to_api() {
    let logs = Logs::default();
    let _guard = logs.capture();
    let server = exec_kit::start().await;
    let prober = auto(Some(api(&server)));
    let target = game(NO_SUCH_CONTAINER);
    assert_eq!(prober.exec_mode_for(&target), ExecMode::Api);
    for _ in 0..2 {
        let obs = prober
            .attempt(
                &Handler::Exec(cmd(&["printf", "via-api"])),
                &target,
                5 * SEC,
            )
            .await
            .unwrap();
        assert_eq!(obs, Observation::succeeded("via-api"));
    }
    assert_eq!(server.exec_requests().len(), 2);
    let text = logs.text();
    let choices: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("run in api mode"))
        .collect();
    assert_eq!(choices.len(), 1, "logged once:\n{text}");
    assert!(
        choices[0].contains("procfs"),
        "the reason procfs was passed over is in the line: {}",
        choices[0]
    );
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
    let server = exec_kit::start().await;
    server.allow(Rule::new(&["get"], &["pods"]).user(SA_USER));
    let prober = auto(Some(api_as_sa(&server)));
    let first = game(NO_SUCH_CONTAINER);
    let handler = Handler::Exec(cmd(&["printf", "ran"]));
    let obs = prober.attempt(&handler, &first, 5 * SEC).await.unwrap();
    assert_eq!(obs, Observation::succeeded("ran"));
    assert_eq!(prober.exec_mode_for(&first), ExecMode::Local);
    let _ = prober.attempt(&handler, &first, 5 * SEC).await.unwrap();
    assert_eq!(
        refused(&server),
        1,
        "api is not retried for the same container instance"
    );

    // The container restarts (new containerID) and RBAC has been fixed meanwhile.
    server.allow(Rule::new(&["create"], &["pods/exec"]).user(SA_USER));
    let restarted =
        game("containerd://1111111111111111111111111111111111111111111111111111111111111111");
    assert_eq!(prober.exec_mode_for(&restarted), ExecMode::Api);
    let obs = prober.attempt(&handler, &restarted, 5 * SEC).await.unwrap();
    assert_eq!(obs, Observation::succeeded("ran"));
    assert_eq!(server.exec_requests().len(), 1, "the accepted exec");
}

/// Explicit modes do not fall back: the attempt is errored with the reason.
#[tokio::test]
async fn explicit_modes_do_not_fall_back() {
    let server = exec_kit::start().await;
    server.enable_authorization();
    let prober = Prober::default().with_exec(ExecConfig {
        mode: ExecMode::Api,
        api: Some(api_as_sa(&server)),
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
