//! `api` exec mode (pods/exec over WebSocket through kube-rs) on a real node: kube-apiserver,
//! the kubelet, containerd and runc run the commands in a real container, with the fault proxy
//! in front of the apiserver for what it cannot do on demand (a dropped stream, an apiserver
//! without the v5 subprotocol). Then `auto`'s choice and fallbacks against the same pod.
//!
//! One node for the whole file (a node takes most of a minute to start on 2 cores): each
//! scenario is a step of one test, against the same running pod.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::PostParams;
use podprobe::probe::{
    ApiExec, AttemptError, ExecAction, ExecConfig, ExecMode, Handler, MAX_MESSAGE_BYTES,
    MAX_READ_BYTES, Observation, Outcome, Prober, Target,
};
use serde_json::json;
use testkit::Fault;
use testkit::real::node::images::GAMESERVER_IMAGE;
use testkit::real::{ControlPlane, FaultProxy, Node, NodeNetwork, NodeOptions};

const SEC: Duration = Duration::from_secs(1);
const NS: &str = "exec";
const POD: &str = "game-0";
/// A ServiceAccount whose rights the steps change.
const PROBER: &str = "prober";
/// A containerID no cgroup names: procfs finds no process of it, so `auto` passes it over.
const NO_SUCH_CONTAINER: &str =
    "containerd://0000000000000000000000000000000000000000000000000000000000c0ffee";

fn cmd(argv: &[&str]) -> ExecAction {
    ExecAction {
        command: argv.iter().map(|s| s.to_string()).collect(),
    }
}

fn sh(script: &str) -> ExecAction {
    cmd(&["sh", "-c", script])
}

fn game(container_id: &str) -> Target {
    Target {
        container_name: "game".into(),
        container_id: Some(container_id.into()),
        ..Target::new("127.0.0.1")
    }
}

struct Lab {
    proxy: FaultProxy,
    _node: Node,
    cp: ControlPlane,
}

impl Lab {
    /// Through the proxy, as the admin.
    fn api(&self) -> ApiExec {
        ApiExec::new(self.proxy.client(), NS, POD)
    }

    /// Through the proxy, as [`PROBER`].
    async fn api_as_prober(&self) -> ApiExec {
        let token = self
            .cp
            .service_account_token(NS, PROBER)
            .await
            .expect("a token");
        let client = kube::Client::try_from(self.proxy.config_for_token(&token)).unwrap();
        ApiExec::new(client, NS, POD)
    }

    /// The exec requests the proxy passed to the apiserver, by answer status.
    fn execs(&self, status: u16) -> usize {
        self.proxy
            .journal()
            .matching("", "pods/exec")
            .iter()
            .filter(|e| e.status == status)
            .count()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_exec_through_the_apiserver_and_the_kubelet() {
    let lab = start().await;
    exit_zero_succeeds_with_stdout(&lab).await;
    nonzero_exit_fails_with_stderr(&lab).await;
    an_apiserver_without_v5_answers_v4(&lab).await;
    timeout_closes_the_stream_and_fails(&lab).await;
    large_output_is_capped(&lab).await;
    dropped_stream_is_an_errored_attempt(&lab).await;
    missing_command_is_an_errored_attempt(&lab).await;
    missing_pod_and_unknown_container(&lab).await;
    auto_falls_back_from_procfs_to_api(&lab).await;
    forbidden_means_mode_unavailable_and_auto_falls_back_to_local(&lab).await;
}

async fn start() -> Lab {
    let network = NodeNetwork::create().unwrap_or_else(|e| panic!("node network: {e}"));
    let mut cp = ControlPlane::start_on(network.host_ip())
        .await
        .unwrap_or_else(|e| panic!("control plane: {e}"));
    let node = Node::start(&mut cp, network, NodeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("node: {e}"));
    cp.create_namespace(NS).await.expect("namespace");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": POD},
        "spec": {"nodeName": node.name(), "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "game", "image": GAMESERVER_IMAGE}]}
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let running = kube::runtime::wait::await_condition(pods, POD, |p: Option<&Pod>| {
        p.and_then(|p| {
            p.status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .first()
                .cloned()
        })
        .is_some_and(|c| c.ready)
    });
    tokio::time::timeout(Duration::from_secs(120), running)
        .await
        .expect("the game container is ready within 2 min")
        .unwrap();
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": PROBER}})).unwrap();
    Api::<ServiceAccount>::namespaced(cp.client(), NS)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let proxy = FaultProxy::start(&cp).await.expect("the fault proxy");
    Lab {
        proxy,
        _node: node,
        cp,
    }
}

async fn exit_zero_succeeds_with_stdout(lab: &Lab) {
    let script = "printf OK; printf noise >&2";
    let obs = lab
        .api()
        .attempt(&sh(script), "game", 5 * SEC)
        .await
        .unwrap();
    assert_eq!(obs, Observation::succeeded("OK"));
    let journal = lab.proxy.journal().matching("", "pods/exec");
    let seen = journal.last().unwrap();
    assert_eq!(seen.status, 101);
    assert_eq!(
        seen.method, "GET",
        "kube-rs upgrades with GET (authorized as create)"
    );
    assert!(
        seen.path
            .ends_with(&format!("/namespaces/{NS}/pods/{POD}/exec"))
    );
    for part in ["container=game", "stdout=true", "stderr=true"] {
        assert!(seen.query.contains(part), "{part} in {}", seen.query);
    }
    assert!(!seen.query.contains("stdin=true") && !seen.query.contains("tty=true"));
}

async fn nonzero_exit_fails_with_stderr(lab: &Lab) {
    let script = "printf out; printf 'not idle' >&2; exit 3";
    let obs = lab
        .api()
        .attempt(&sh(script), "game", 5 * SEC)
        .await
        .unwrap();
    assert_eq!(obs, Observation::failed("not idle"));
}

/// An apiserver without the v5 stream translator (< 1.30, or the gate off) ignores v5 in
/// kube-rs' offer `v5, v4` and answers v4: both outcomes still come through.
async fn an_apiserver_without_v5_answers_v4(lab: &Lab) {
    lab.proxy
        .faults()
        .add(Fault::without_subprotocol("v5.channel.k8s.io").times(2));
    let ok = lab
        .api()
        .attempt(&sh("printf v4"), "game", 5 * SEC)
        .await
        .unwrap();
    assert_eq!(ok, Observation::succeeded("v4"));
    let script = "echo bad >&2; exit 1";
    let failed = lab
        .api()
        .attempt(&sh(script), "game", 5 * SEC)
        .await
        .unwrap();
    assert_eq!(failed, Observation::failed("bad\n"));
    assert!(
        lab.proxy
            .faults()
            .rules()
            .iter()
            .all(|r| r.times == Some(0))
    );
}

/// Timeout closes the stream and reports Failed with the local mode's message.
async fn timeout_closes_the_stream_and_fails(lab: &Lab) {
    let started = Instant::now();
    let obs = lab
        .api()
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
async fn large_output_is_capped(lab: &Lab) {
    let hundred = "a".repeat(100);
    let action = sh(&format!(
        "i=0; while [ $i -lt 2000 ]; do printf {hundred}; i=$((i+1)); done"
    ));
    let obs = lab.api().attempt(&action, "game", 10 * SEC).await.unwrap();
    assert_eq!(obs.outcome, Outcome::Succeeded);
    assert_eq!(obs.message, "a".repeat(MAX_READ_BYTES));
    let prober = Prober::default().with_exec(ExecConfig {
        mode: ExecMode::Api,
        api: Some(lab.api()),
        ..Default::default()
    });
    let obs = prober
        .attempt(&Handler::Exec(action), &game(NO_SUCH_CONTAINER), 10 * SEC)
        .await
        .unwrap();
    assert_eq!(obs.message.len(), MAX_MESSAGE_BYTES);
}

/// A stream dropped (after 7 bytes from the apiserver) without an exit status: the outcome
/// is unknown → errored attempt.
async fn dropped_stream_is_an_errored_attempt(lab: &Lab) {
    lab.proxy
        .faults()
        .add(Fault::drop_exec_stream_after(7).times(1));
    let script = "printf partial-and-more; sleep 1";
    let err = lab
        .api()
        .attempt(&sh(script), "game", 5 * SEC)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AttemptError::Other(m) if m.contains("without an exit status")),
        "{err:?}"
    );
    // The rule is used up: the next attempt is whole.
    let obs = lab
        .api()
        .attempt(&sh("printf whole"), "game", 5 * SEC)
        .await
        .unwrap();
    assert_eq!(obs, Observation::succeeded("whole"));
}

/// The runtime cannot start the command → errored, not Failed, with the runtime's reason.
async fn missing_command_is_an_errored_attempt(lab: &Lab) {
    let err = lab
        .api()
        .attempt(&cmd(&["podprobe-no-such-command"]), "game", 5 * SEC)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AttemptError::Other(m) if m.contains("podprobe-no-such-command")),
        "{err:?}"
    );
}

/// No such pod (404) → mode unavailable; an unknown container (400) → errored attempt with
/// the apiserver's message. Neither reaches the kubelet.
async fn missing_pod_and_unknown_container(lab: &Lab) {
    let upgraded = lab.execs(101);
    let err = ApiExec::new(lab.proxy.client(), NS, "no-such-pod")
        .attempt(&cmd(&["true"]), "game", 5 * SEC)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AttemptError::ModeUnavailable { mode: ExecMode::Api, reason } if reason.contains("404")),
        "{err:?}"
    );
    let err = lab
        .api()
        .attempt(&cmd(&["true"]), "nope", 5 * SEC)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AttemptError::Other(m) if m.contains("container nope is not valid for pod game-0")),
        "{err:?}"
    );
    assert_eq!(lab.execs(101), upgraded);
}

/// procfs cannot work for the target (no process of its container is visible here): auto
/// picks api, runs the probe through the kubelet, and logs the choice with procfs' reason,
/// once.
async fn auto_falls_back_from_procfs_to_api(lab: &Lab) {
    let logs = Logs::default();
    let _guard = logs.capture();
    let prober = auto(Some(lab.api()));
    let target = game(NO_SUCH_CONTAINER);
    assert_eq!(prober.exec_mode_for(&target), ExecMode::Api);
    let upgraded = lab.execs(101);
    for _ in 0..2 {
        let obs = prober
            .attempt(&Handler::Exec(sh("printf via-api")), &target, 5 * SEC)
            .await
            .unwrap();
        assert_eq!(obs, Observation::succeeded("via-api"));
    }
    assert_eq!(lab.execs(101), upgraded + 2);
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

/// RBAC without `create pods/exec` (`get` is not enough since 1.35): explicit api mode is
/// unavailable, auto falls back to local in the same attempt and stays there for that
/// container; once RBAC allows it, a restarted container (new containerID) gets api again.
async fn forbidden_means_mode_unavailable_and_auto_falls_back_to_local(lab: &Lab) {
    grant(lab, "get-pods", &["get"], &["pods", "pods/exec"]).await;
    let explicit = Prober::default().with_exec(ExecConfig {
        mode: ExecMode::Api,
        api: Some(lab.api_as_prober().await),
        ..Default::default()
    });
    let handler = Handler::Exec(sh("printf ran"));
    let err = explicit
        .attempt(&handler, &game(NO_SUCH_CONTAINER), 5 * SEC)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AttemptError::ModeUnavailable { mode: ExecMode::Api, reason } if reason.contains("RBAC") && reason.contains("pods/exec")),
        "{err:?}"
    );
    let procfs = Prober::default().with_exec(ExecConfig {
        mode: ExecMode::Procfs,
        api: None,
        ..Default::default()
    });
    let err = procfs
        .attempt(&handler, &game(NO_SUCH_CONTAINER), 5 * SEC)
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

    let refused = lab.execs(403);
    let prober = auto(Some(lab.api_as_prober().await));
    let first = game(NO_SUCH_CONTAINER);
    let obs = prober.attempt(&handler, &first, 5 * SEC).await.unwrap();
    assert_eq!(obs, Observation::succeeded("ran"), "run locally");
    assert_eq!(prober.exec_mode_for(&first), ExecMode::Local);
    let _ = prober.attempt(&handler, &first, 5 * SEC).await.unwrap();
    assert_eq!(
        lab.execs(403),
        refused + 1,
        "api is not retried for the same container instance"
    );

    grant(lab, "exec", &["create"], &["pods/exec"]).await;
    let restarted =
        game("containerd://1111111111111111111111111111111111111111111111111111111111111111");
    assert_eq!(prober.exec_mode_for(&restarted), ExecMode::Api);
    let upgraded = lab.execs(101);
    let obs = prober.attempt(&handler, &restarted, 5 * SEC).await.unwrap();
    assert_eq!(obs, Observation::succeeded("ran"));
    assert_eq!(lab.execs(101), upgraded + 1, "through the kubelet");
}

/// Grants [`PROBER`] `verbs` on `resources` in [`NS`] and waits until the apiserver's
/// authorizer says so (RBAC reaches it through a watch).
async fn grant(lab: &Lab, name: &str, verbs: &[&str], resources: &[&str]) {
    let admin = lab.cp.client();
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": resources, "verbs": verbs}]
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": PROBER, "namespace": NS}]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin, NS)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let token = lab.cp.service_account_token(NS, PROBER).await.unwrap();
    let reviews: Api<SelfSubjectAccessReview> = Api::all(lab.cp.client_for_token(&token));
    let (resource, subresource) = resources[0].split_once('/').unwrap_or((resources[0], ""));
    let review: SelfSubjectAccessReview = serde_json::from_value(json!({
        "spec": {"resourceAttributes": {"namespace": NS, "verb": verbs[0],
                 "resource": resource, "subresource": subresource}}
    }))
    .unwrap();
    let allowed = async {
        loop {
            let answer = reviews
                .create(&PostParams::default(), &review)
                .await
                .unwrap();
            if answer.status.is_some_and(|s| s.allowed) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), allowed)
        .await
        .unwrap_or_else(|_| panic!("{verbs:?} {resources:?} not allowed within 30 s"));
}

fn auto(api: Option<ApiExec>) -> Prober {
    Prober::default().with_exec(ExecConfig {
        mode: ExecMode::Auto,
        api,
        ..Default::default()
    })
}

/// Captures the current thread's log lines (the steps run on the test's thread).
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

/// Without procfs or api, auto runs the command locally (no cluster needed).
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
