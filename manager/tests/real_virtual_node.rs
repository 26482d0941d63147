//! podprobe on a virtual node that runs the pod: `vk-cri` (hack/k8s-oldest/vkcri), a
//! virtual-kubelet provider on the real library that runs each pod as a CRI sandbox on the
//! lab's containerd and runc, with its own network namespace on the node's CNI bridge. The
//! chart is installed with its defaults; the pod is admitted by the real webhook, held by the
//! token gate until the manager issues its token, placed by kube-scheduler on the virtual node
//! (it tolerates the node's taint and selects `type=virtual-kubelet`, as users' pods for
//! virtual nodes do), and run there: the injected sidecar and the game server as containers
//! of one pod, the sidecar reaching the game over the pod's own network and the apiserver
//! with the token the provider copied from the issued Secret, exec probes through
//! `pods/exec`, the library and the provider's CRI exec, while the provider writes its own
//! status over the pod's every 5 s. The apiserver caps service account tokens at an hour
//! (`--service-account-max-token-expiration=1h`, the shortest it allows; managed clusters cap
//! them too), so the token the chart asks for a year is issued for an hour, and the sidecar
//! renews it within that hour, as it would on such a cluster.

mod cluster;
mod installed;
mod on_node;
mod support;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::Role;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use podprobe_manager::webhook::Mode;
use serde_json::json;
use testkit::real::node::images::{GAMESERVER_IMAGE, SIDECAR_IMAGE};
use testkit::real::virtual_kubelet::VIRTUAL_KUBELET_USER;
use testkit::real::{ControlPlane, FaultProxy, Node, NodeNetwork, NodeOptions, VirtualAgent};

use installed::{NS, Running, install_and_run_with};
use on_node::{SIDECAR, container_id, exec, logs, restart_count, wait_for};
use support::{annotation, condition_status, label};

const IDLE: &str = "game.kruise.io/idle";
const HEALTHY: &str = "game.kruise.io/healthy";
const ACCEPTING: &str = "game.kruise.io/accepting";
const SERVING: &str = "game.kruise.io/serving";
const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
const ALL: [&str; 4] = [IDLE, HEALTHY, ACCEPTING, SERVING];
/// What the sidecar logs when its provider started it without the token it should renew.
const NO_TOKEN: &str =
    "a virtual node's provider that started the container before it saw that Secret";
/// The apiserver's cap on service account tokens, `--service-account-max-token-expiration`.
const TOKEN_CAP: Duration = Duration::from_secs(3600);

/// The virtual node (`agent`) with kube-scheduler, and the chart in `mode` with its defaults
/// but for the sidecar image, which is the one built here.
async fn virtual_node_and_chart(agent: VirtualAgent, mode: Mode) -> (Running, Node) {
    virtual_node_and_chart_with(agent, mode, &[]).await
}

/// [`virtual_node_and_chart`] with more `--set` values.
async fn virtual_node_and_chart_with(
    agent: VirtualAgent,
    mode: Mode,
    values: &[&str],
) -> (Running, Node) {
    let (running, node, _) = virtual_node_lagging(agent, mode, values, None).await;
    (running, node)
}

/// [`virtual_node_and_chart_with`]; with `secret_lag`, the provider reaches the apiserver
/// through a fault proxy that holds each event of its Secret watches that long, as an
/// informer that lags the apiserver sees them.
async fn virtual_node_lagging(
    mut agent: VirtualAgent,
    mode: Mode,
    values: &[&str],
    secret_lag: Option<Duration>,
) -> (Running, Node, Option<FaultProxy>) {
    let network = NodeNetwork::create().unwrap_or_else(|e| panic!("node network: {e}"));
    let cap = format!(
        "--service-account-max-token-expiration={}s",
        TOKEN_CAP.as_secs()
    );
    let mut cp = ControlPlane::start_on_with_flags(network.host_ip(), &[&cap])
        .await
        .unwrap_or_else(|e| panic!("control plane: {e}"));
    let proxy = match secret_lag {
        None => None,
        Some(lag) => {
            let proxy = FaultProxy::start_on(&cp, network.host_ip())
                .await
                .unwrap_or_else(|e| panic!("fault proxy: {e}"));
            proxy
                .faults()
                .add(testkit::Fault::delay_watch_events(lag).path_contains("/secrets"));
            agent.apiserver = Some(proxy.url());
            Some(proxy)
        }
    };
    let options = NodeOptions {
        virtual_agent: Some(agent),
        // Lifts the not-ready taint the apiserver gives a new node, which kube-scheduler
        // respects.
        controllers: vec!["node-lifecycle-controller"],
        ..NodeOptions::default()
    };
    let node = Node::start(&mut cp, network, options)
        .await
        .unwrap_or_else(|e| panic!("virtual node: {e}"));
    cp.start_scheduler()
        .unwrap_or_else(|e| panic!("kube-scheduler: {e}"));
    if mode == Mode::Companion {
        cp.start_kruise_manager()
            .await
            .unwrap_or_else(|e| panic!("kruise-manager: {e}"));
    }
    let image = format!("injection.config.image={SIDECAR_IMAGE}");
    let mut args = vec!["--set", &image];
    for value in values {
        args.extend(["--set", value]);
    }
    let running = install_and_run_with(cp, mode, &args).await;
    (running, node, proxy)
}

/// The example game server's probes with the idle recipe's markers; named ports, which the
/// virtual-node shape's api source reads from the pod spec.
fn game_ppm() -> podprobe_manager::crd::PodProbeMarker {
    let probe = |name: &str, condition: &str, probe: serde_json::Value| {
        let mut probe = probe;
        probe["periodSeconds"] = json!(1);
        probe["failureThreshold"] = json!(1);
        json!({"name": name, "containerName": "game", "podConditionType": condition, "probe": probe})
    };
    let mut idle = probe(
        "idle",
        IDLE,
        json!({"exec": {"command": ["sh", "-c", "test -f /var/run/game/idle"]}}),
    );
    idle["probe"]["periodSeconds"] = json!(2);
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

/// The game server for a virtual node: no node named, the node's taint tolerated and its
/// label selected, as users write pods for AKS virtual nodes.
fn game_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "game"}},
        "spec": {"serviceAccountName": "podprobe-sidecar",
                 "terminationGracePeriodSeconds": 10,
                 "nodeSelector": {"type": "virtual-kubelet"},
                 "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists",
                                  "effect": "NoSchedule"}],
                 "containers": [{"name": "game", "image": GAMESERVER_IMAGE,
                    "ports": [{"name": "game", "containerPort": 7777},
                              {"name": "http", "containerPort": 8080},
                              {"name": "grpc", "containerPort": 9090}]}]}
    }))
    .unwrap()
}

/// The virtual node `agent` with the chart in standalone mode, [`game_ppm`], and the game
/// server pod `game-0` admitted (running or not yet).
async fn game_on(agent: VirtualAgent) -> (Running, Node, Api<Pod>) {
    let (running, node) = virtual_node_and_chart(agent, Mode::Standalone).await;
    let pods = create_game(&running.cp).await;
    (running, node, pods)
}

/// [`game_ppm`], and the game server pod `game-0` admitted (running or not yet).
async fn create_game(cp: &ControlPlane) -> Api<Pod> {
    Api::namespaced(cp.client(), NS)
        .create(&PostParams::default(), &game_ppm())
        .await
        .unwrap();
    create_admitted(cp, &game_pod("game-0")).await
}

async fn create_admitted(cp: &ControlPlane, pod: &Pod) -> Api<Pod> {
    cp.wait_admission(pod, |p| annotation(p, support::PODPROBE).is_some())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    pods.create(&PostParams::default(), pod).await.unwrap();
    pods
}

fn game_up(pod: &Pod) -> bool {
    [HEALTHY, ACCEPTING, SERVING]
        .iter()
        .all(|c| condition_status(pod, c).as_deref() == Some("True"))
        && condition_status(pod, IDLE).as_deref() == Some("False")
}

fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

fn pod_ip(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.pod_ip.as_deref()
}

#[tokio::test(flavor = "multi_thread")]
async fn virtual_node_runs_the_injected_pod_and_its_probes() {
    runs_the_injected_pod_and_its_probes(VirtualAgent::default()).await;
}

/// The same on interLink's behaviour: the provider's status carries the condition `Ready`
/// alone, written whole every sync.
#[tokio::test(flavor = "multi_thread")]
async fn virtual_node_ready_only_runs_the_injected_pod_and_its_probes() {
    runs_the_injected_pod_and_its_probes(VirtualAgent {
        ready_only: true,
        ..VirtualAgent::default()
    })
    .await;
}

/// The same on the library azure-aci v1.6.4 is built on.
#[tokio::test(flavor = "multi_thread")]
async fn virtual_node_v1_11_runs_the_injected_pod_and_its_probes() {
    runs_the_injected_pod_and_its_probes(VirtualAgent {
        library: testkit::real::Library::V1_11,
        ..VirtualAgent::default()
    })
    .await;
}

async fn runs_the_injected_pod_and_its_probes(agent: VirtualAgent) {
    let (running, node, pods) = game_on(agent).await;
    let cp = &running.cp;

    // Scheduled by kube-scheduler to the virtual node, run there as two containers of one
    // pod with an address of the node's pod network, the probes written.
    let up = wait_for(
        &pods,
        "game-0",
        "probes written on the virtual node",
        game_up,
    )
    .await;
    assert_eq!(node_name(&up), Some(node.name()));
    let ip = pod_ip(&up).expect("the pod's address");
    assert!(
        node.network().holds_pod_ip(ip),
        "an address on the node's CNI bridge: {ip}"
    );
    assert!(container_id(&up, SIDECAR).is_some() && container_id(&up, "game").is_some());
    let sidecar_log = logs(&pods, "game-0", SIDECAR).await;
    assert!(
        sidecar_log.contains("reads its probes from the apiserver"),
        "the virtual-node shape's source:\n{sidecar_log}"
    );

    // The chart asks for a year; the apiserver issued an hour, and the sidecar renews at
    // 80 % of the hour it holds (up to its jitter earlier), well before the cap ends it.
    let issued = issued_token(cp, &up).await;
    let lifetime = issued.expires.duration_since(issued.issued);
    assert_eq!(
        lifetime.unsigned_abs(),
        TOKEN_CAP,
        "the issued token's lifetime under the cap"
    );
    assert!(
        sidecar_log.contains(&format!("expires at {}; renewing it at", issued.expires)),
        "the sidecar holds the capped token:\n{sidecar_log}"
    );
    let due: jiff::Timestamp = testkit::child::logged_after(&sidecar_log, "renewing it at ")
        .and_then(|t| t.parse().ok())
        .expect("the renewal's time in the sidecar's log");
    let jitter = podprobe::credential::MAX_JITTER;
    assert!(
        due <= issued.renew_at() && due >= issued.renew_at() - jitter,
        "the sidecar schedules its renewal by the capped token: {due}, not in the {jitter:?} before {}:\n{sidecar_log}",
        issued.renew_at()
    );

    let markers = wait_for(&pods, "game-0", "Failed markers", |p| {
        label(p, IDLE).as_deref() == Some("false")
    })
    .await;
    assert_eq!(annotation(&markers, DELETION_COST).as_deref(), Some("100"));

    // The exec probe runs in the game container through pods/exec, the library and the
    // provider's CRI exec: the idle file the test writes there (the same way) is seen.
    exec(&pods, "game-0", "game", "touch /var/run/game/idle").await;
    let idle = wait_for(&pods, "game-0", "idle markers", |p| {
        condition_status(p, IDLE).as_deref() == Some("True")
            && label(p, IDLE).as_deref() == Some("true")
    })
    .await;
    assert_eq!(annotation(&idle, DELETION_COST).as_deref(), Some("-100"));

    // Draining: http and gRPC fail, tcp still accepts.
    exec(&pods, "game-0", "game", "touch /var/run/game/unhealthy").await;
    wait_for(&pods, "game-0", "unhealthy", |p| {
        condition_status(p, HEALTHY).as_deref() == Some("False")
            && condition_status(p, SERVING).as_deref() == Some("False")
            && condition_status(p, ACCEPTING).as_deref() == Some("True")
    })
    .await;
    exec(&pods, "game-0", "game", "rm /var/run/game/unhealthy").await;
    let healthy = wait_for(&pods, "game-0", "healthy again", |p| {
        condition_status(p, HEALTHY).as_deref() == Some("True")
    })
    .await;

    // The game container is killed: the provider starts a new one (restartPolicy Always);
    // the probes fail while it is gone, and the new one is not idle.
    let old_game = container_id(&healthy, "game").unwrap();
    kill(&node, &old_game);
    let restarted = wait_for(&pods, "game-0", "the new container's results", |p| {
        restart_count(p, "game") == 1 && game_up(p) && label(p, IDLE).as_deref() == Some("false")
    })
    .await;
    assert_ne!(container_id(&restarted, "game").unwrap(), old_game);

    // After a change (the restart), for 30 s: the provider sends its own status every 5 s
    // and the library writes it over the pod's whole status; the sidecar (its default
    // `--overwrite-repair after-change`) writes its conditions back at once.
    let replaced_before = status_replacements(cp, "game-0");
    let (present, worst_gap) = presence(&pods, "game-0", Duration::from_secs(30)).await;
    let replaced = status_replacements(cp, "game-0") - replaced_before;
    eprintln!(
        "conditions present in {present:.2} % of samples over 30 s (longest gap {worst_gap:?}), the provider's status written {replaced} times"
    );
    assert!(
        replaced >= 4,
        "the provider's status was written {replaced} times in 30 s"
    );
    // Each replacement removes them until the sidecar's write-back: the design's bound for a
    // repair is 2 s (without it, a gap lasts until the next change of a probe).
    assert!(
        worst_gap <= Duration::from_secs(2),
        "conditions missing for {worst_gap:?} at once ({present:.2} % present)"
    );

    // Deleted: the provider stops the containers with the grace period and the library
    // removes the pod once they have stopped.
    pods.delete("game-0", &DeleteParams::default())
        .await
        .unwrap();
    let gone = async {
        while pods.get_opt("game-0").await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), gone)
        .await
        .expect("the pod deleted within 60 s");
}

/// A virtual node without a taint takes a pod whose node affinity sends it there by the node's
/// name, with no toleration or `type=virtual-kubelet` selector: the webhook reads the
/// cluster's virtual nodes, so the pod gets the shape the provider accepts and its issued
/// credential, and runs there with its probes. With the shape read from the pod alone, it got
/// the kubelet shape, which the library refuses (`status.podIP`), and never ran.
#[tokio::test(flavor = "multi_thread")]
async fn virtual_node_untainted_runs_a_pod_its_affinity_sends_there_with_its_issued_credential() {
    let (running, node) = virtual_node_and_chart(VirtualAgent::default(), Mode::Standalone).await;
    let cp = &running.cp;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(cp.client());
    nodes
        .patch(
            node.name(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": null}})),
        )
        .await
        .unwrap();
    Api::namespaced(cp.client(), NS)
        .create(&PostParams::default(), &game_ppm())
        .await
        .unwrap();
    let mut pod = game_pod("game-0");
    let spec = pod.spec.as_mut().unwrap();
    spec.node_selector = None;
    spec.tolerations = None;
    spec.affinity = Some(
        serde_json::from_value(json!({"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In",
                                  "values": [node.name()]}]}]}}}))
        .unwrap(),
    );
    // Admitted with the virtual-node shape once the webhook has seen the node untainted.
    cp.wait_admission(&pod, |p| {
        annotation(p, support::PODPROBE).is_some()
            && label(p, podprobe_manager::sidecar_token::LABEL).as_deref()
                == Some(podprobe_manager::sidecar_token::PENDING)
    })
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let up = wait_for(
        &pods,
        "game-0",
        "probes written on the untainted virtual node",
        game_up,
    )
    .await;
    assert_eq!(node_name(&up), Some(node.name()));
    let sidecar_log = logs(&pods, "game-0", SIDECAR).await;
    assert!(
        sidecar_log.contains("reads its probes from the apiserver"),
        "the virtual-node shape's source:\n{sidecar_log}"
    );
}

/// A game server that outlives its sidecar's token: the chart with the shortest token lifetime
/// a TokenRequest may ask (10 minutes) stands for an apiserver that caps tokens
/// (`--service-account-max-token-expiration`, at least an hour) and for a month of running.
/// The sidecar renews the issued token at 80 % of its lifetime with a TokenRequest bound to
/// its own pod, which the chart's policy admits; past the issued token's expiry, when that token
/// is refused, the probes' results still reach the pod, and a sidecar restarted then starts
/// from the renewed token it kept in the pod's memory volume; all of it while no manager
/// replica runs. Beside it, a pod bound at creation, whose sidecar the provider starts without
/// a token, says so on the pod.
#[tokio::test(flavor = "multi_thread")]
async fn virtual_node_credential_outlives_its_lifetime_renewed_by_the_sidecar() {
    let (running, node) = virtual_node_and_chart_with(
        VirtualAgent::default(),
        Mode::Standalone,
        &["injection.config.sidecarTokenLifetime=10m"],
    )
    .await;
    let cp = &running.cp;
    let pods = create_game(cp).await;
    let up = wait_for(
        &pods,
        "game-0",
        "probes written on the virtual node",
        game_up,
    )
    .await;

    // Beside it, a pod bound to the node at creation: no gate can hold it, so it keeps the
    // projected token, which this provider (as azure-aci) fills from the account's legacy token
    // Secret, absent since Kubernetes 1.24. Its sidecar runs without a token and writes
    // nothing; the pod says so (checked below, minutes later).
    let mut bound = game_pod("game-bound");
    bound.spec.as_mut().unwrap().node_name = Some(node.name().to_owned());
    let bound = pods.create(&PostParams::default(), &bound).await.unwrap();
    assert_eq!(
        label(&bound, podprobe_manager::sidecar_token::LABEL).as_deref(),
        Some(podprobe_manager::sidecar_token::PROJECTED),
        "labelled at admission"
    );

    // The token issued into the pod's Secret, and when it expires.
    let issued = issued_token_text(cp, &up).await;
    let expires = podprobe::credential::Claims::of(&issued).unwrap().expires;
    let lifetime = expires.duration_since(jiff::Timestamp::now());
    assert!(
        lifetime <= jiff::SignedDuration::from_mins(10),
        "the chart's lifetime: {lifetime:#}"
    );

    // The bound pod runs its tokenless sidecar for longer than the manager's grace: an Event
    // on it names its conditions and its projected token.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(cp.client(), NS);
    let note = testkit::wait::until_some(
        podprobe_manager::pods::unprobed::SILENCE + Duration::from_secs(90),
        "a ProbeConditionsMissing Event on the pod bound at creation",
        async || {
            let listed = events.list(&Default::default()).await.ok()?;
            let found = listed.items.into_iter().find(|e| {
                e.reason.as_deref() == Some(podprobe_manager::pods::unprobed::CONDITIONS_REASON)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("game-bound")
            });
            if found.is_none() {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            found.and_then(|e| e.note)
        },
    )
    .await;
    assert!(
        note.contains(IDLE) && note.contains("projected"),
        "the Event's note: {note}"
    );
    let running_bound = pods.get("game-bound").await.unwrap();
    assert_eq!(
        running_bound
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref()),
        Some("Running"),
        "{running_bound:?}"
    );
    assert_eq!(condition_status(&running_bound, IDLE), None);

    // Every manager replica stops, and stays down: what follows (the token's expiry, its
    // renewal, the idle probe's flips, a restarted sidecar) needs no manager.
    let Running {
        cp,
        manager,
        dir: _dir,
    } = running;
    let cp = &cp;
    manager.kill();

    // Past its expiry: the apiserver accepts a token up to a minute after its `exp` (its JWT
    // validation's leeway) and caches a review for 10 s, so the issued token is asked with
    // until it is refused.
    let until = jiff::Timestamp::now().duration_until(expires);
    let wait = until.max(jiff::SignedDuration::ZERO).unsigned_abs();
    eprintln!("waiting {wait:?}, until the issued token's expiry at {expires}");
    tokio::time::sleep(wait).await;
    let with_issued = Api::<Pod>::namespaced(cp.client_for_token(&issued), NS);
    testkit::wait::until_some(
        Duration::from_secs(120),
        "the issued token refused after its expiry",
        async || match with_issued.get("game-0").await {
            Err(kube::Error::Api(e)) if e.code == 401 => Some(()),
            _ => {
                tokio::time::sleep(Duration::from_secs(2)).await;
                None
            }
        },
    )
    .await;
    let renewals = sidecar_token_requests(cp);
    assert!(renewals >= 1, "the sidecar asked for {renewals} tokens");

    // The sidecar still writes: the idle probe flips.
    set_idle(&pods, true, "idle after the issued token expired").await;

    // Restarted, the sidecar takes the renewed token it kept.
    let before = pods.get("game-0").await.unwrap();
    kill(&node, &container_id(&before, SIDECAR).unwrap());
    wait_for(&pods, "game-0", "the sidecar restarted", |p| {
        restart_count(p, SIDECAR) == 1
    })
    .await;
    set_idle(&pods, false, "busy, written by the restarted sidecar").await;
}

/// A provider whose Secret informer lags the apiserver, under azure-aci's rules (it copies a
/// pod's Secrets from its informer once, when it creates the pod, and skips a missing optional
/// one): the issuer writes the token's Secret before it lifts the gate, yet the provider,
/// which sees the Secret only 2 minutes later, starts the sidecar without it. The sidecar says so,
/// and writes nothing: a bound of the optional token volume (SECURITY.md), which the pod's
/// `ProbeConditionsMissing` Event and the sidecar's `PodProbeSidecarTokenFailing` alert report
/// (as for the pod bound at creation above). Without the lag, the same pod runs with its token.
#[tokio::test(flavor = "multi_thread")]
async fn virtual_node_aci_with_a_lagging_secret_informer_starts_the_sidecar_without_its_token() {
    let agent = VirtualAgent {
        aci: true,
        ..VirtualAgent::default()
    };
    // Far longer than the provider takes to start the pod once it is bound, on a loaded
    // machine too; nothing in the test waits for it.
    let lag = Duration::from_secs(120);
    let (running, _node, proxy) =
        virtual_node_lagging(agent, Mode::Standalone, &[], Some(lag)).await;
    let proxy = proxy.unwrap();
    let cp = &running.cp;
    let pods = create_game(cp).await;
    let started = wait_for(&pods, "game-0", "the sidecar started", |p| {
        container_id(p, SIDECAR).is_some()
    })
    .await;

    // The Secret, with its token, was there before the pod was bound: the issuer did its part.
    let issued = issued_token(cp, &started).await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(cp.client(), NS);
    let secret = secrets.get(&support::token_secret(&started)).await.unwrap();
    let written = secret.metadata.creation_timestamp.unwrap().0;
    let scheduled = started
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
        .and_then(|c| c.last_transition_time.clone())
        .expect("PodScheduled")
        .0;
    assert!(
        written <= scheduled,
        "the Secret ({written}) before the binding ({scheduled})"
    );
    assert_eq!(issued.pod_name, "game-0");
    // The provider's Secret watch was held.
    assert!(
        proxy
            .journal()
            .entries()
            .iter()
            .any(|e| e.fault && e.is_watch() && e.path.contains("/secrets")),
        "the provider watched Secrets through the proxy"
    );

    // The sidecar started without the token: it says so, and writes no condition.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let log = loop {
        let log = logs(&pods, "game-0", SIDECAR).await;
        if log.contains(NO_TOKEN) {
            break log;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sidecar's log does not say it has no token ({NO_TOKEN:?}):\n{log}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let now = pods.get("game-0").await.unwrap();
    for condition in ALL {
        assert_eq!(
            condition_status(&now, condition),
            None,
            "{condition} written without a token:\n{log}"
        );
    }
}

/// The token the manager issued into `pod`'s Secret.
async fn issued_token_text(cp: &ControlPlane, pod: &Pod) -> String {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(cp.client(), NS);
    let secret = secrets.get(&support::token_secret(pod)).await.unwrap();
    String::from_utf8(secret.data.unwrap()["token"].0.clone()).unwrap()
}

/// The claims of the token the manager issued into `pod`'s Secret.
async fn issued_token(cp: &ControlPlane, pod: &Pod) -> podprobe::credential::Claims {
    podprobe::credential::Claims::of(&issued_token_text(cp, pod).await).unwrap()
}

/// Makes game-0 idle (or busy) and waits until its idle condition says so.
async fn set_idle(pods: &Api<Pod>, idle: bool, what: &str) {
    let script = if idle { "touch" } else { "rm" };
    exec(
        pods,
        "game-0",
        "game",
        &format!("{script} /var/run/game/idle"),
    )
    .await;
    let want = if idle { "True" } else { "False" };
    wait_for(pods, "game-0", what, |p| {
        condition_status(p, IDLE).as_deref() == Some(want)
    })
    .await;
}

/// SIGKILL to the container `id` on the node, as an OOM kill would end it.
fn kill(node: &Node, id: &str) {
    let killed = node
        .ctr()
        .args(["tasks", "kill", "--signal", "SIGKILL", id])
        .status()
        .unwrap();
    assert!(killed.success(), "ctr tasks kill {id}");
}

/// TokenRequests the sidecar's own account made that the apiserver granted (the audit log).
fn sidecar_token_requests(cp: &ControlPlane) -> usize {
    let sidecar = format!("system:serviceaccount:{NS}:podprobe-sidecar");
    let events = cp.audit().unwrap();
    events
        .iter()
        .filter(|e| e.user.username == sidecar && e.verb == "create")
        .filter(|e| {
            e.object_ref
                .as_ref()
                .is_some_and(|o| o.resource == "serviceaccounts" && o.subresource == "token")
        })
        .filter(|e| e.response_status.as_ref().is_some_and(|s| s.code == 201))
        .count()
}

/// How often the node's agent has written `pod`'s status (the audit log).
fn status_replacements(cp: &ControlPlane, pod: &str) -> usize {
    let events = cp.audit().unwrap();
    events
        .iter()
        .filter(|e| e.user.username == VIRTUAL_KUBELET_USER && e.verb == "update")
        .filter(|e| {
            e.object_ref
                .as_ref()
                .is_some_and(|o| o.subresource == "status" && o.name == pod)
        })
        .count()
}

/// The share of samples (one every 100 ms for `window`) in which the pod shows all four
/// probe conditions, in percent, and the longest time they were not all shown.
async fn presence(pods: &Api<Pod>, name: &str, window: Duration) -> (f64, Duration) {
    let (mut samples, mut present) = (0u32, 0u32);
    let (mut missing_since, mut worst_gap) = (None, Duration::ZERO);
    let end = tokio::time::Instant::now() + window;
    let mut every = tokio::time::interval(Duration::from_millis(100));
    while tokio::time::Instant::now() < end {
        every.tick().await;
        let pod = pods.get(name).await.unwrap();
        let now = tokio::time::Instant::now();
        samples += 1;
        if ALL.iter().all(|c| condition_status(&pod, c).is_some()) {
            present += 1;
            if let Some(since) = missing_since.take() {
                worst_gap = worst_gap.max(now - since);
            }
        } else {
            missing_since.get_or_insert(now);
        }
    }
    if let Some(since) = missing_since {
        worst_gap = worst_gap.max(tokio::time::Instant::now() - since);
    }
    (f64::from(present) * 100.0 / f64::from(samples), worst_gap)
}

/// On azure-aci's library (v1.11.0) with its rules, volumes and exec: the injected pod passes
/// the rules and runs, tcp, http and gRPC probes hold, and an exec probe through `pods/exec`
/// reads success whatever the command does: azure-aci joins the command into one string,
/// which ACI starts as a single program (here no such file), and reports no exit status.
#[tokio::test(flavor = "multi_thread")]
async fn virtual_node_aci_exec_through_pods_exec_reports_success_whatever_the_command() {
    let agent = VirtualAgent {
        library: testkit::real::Library::V1_11,
        aci: true,
        ..VirtualAgent::default()
    };
    let (_running, node, pods) = game_on(agent).await;
    let up = wait_for(&pods, "game-0", "probes written on the aci node", |p| {
        [HEALTHY, ACCEPTING, SERVING]
            .iter()
            .all(|c| condition_status(p, c).as_deref() == Some("True"))
            && condition_status(p, IDLE).is_some()
    })
    .await;
    assert_eq!(node_name(&up), Some(node.name()));
    // The game is not idle (no /var/run/game/idle), yet the probe's `sh -c 'test -f ...'`,
    // sent as the one program name "sh -c test -f /var/run/game/idle", is read as a success.
    let idle = wait_for(&pods, "game-0", "the idle probe's result", |p| {
        label(p, IDLE).is_some()
    })
    .await;
    assert_eq!(
        condition_status(&idle, IDLE).as_deref(),
        Some("True"),
        "azure-aci's exec reports no exit status"
    );
}

/// The exec agent on azure-aci's library with its rules, volumes and exec, as the chart
/// installs it: the game container gives its command, so injection wraps it; the provider
/// runs the install init container to completion, then the wrapped game server, whose agent
/// runs the idle probe inside it: right both ways (the idle file written into the pod's
/// `emptyDir` where the provider keeps it), and not one `pods/exec` request.
#[tokio::test(flavor = "multi_thread")]
async fn virtual_node_aci_runs_exec_probes_through_the_agent_by_default() {
    runs_exec_probes_through_the_agent(VirtualAgent {
        library: testkit::real::Library::V1_11,
        aci: true,
        ..VirtualAgent::default()
    })
    .await;
}

/// The same under Alibaba ECI's exec quota, cut to one call a minute: the idle probe (every
/// 2 s) runs through the agent and spends none of it (through `pods/exec` the second attempt
/// would be refused).
#[tokio::test(flavor = "multi_thread")]
async fn virtual_node_exec_quota_is_not_spent_by_the_agent() {
    runs_exec_probes_through_the_agent(VirtualAgent {
        exec_quota: Some(1),
        ..VirtualAgent::default()
    })
    .await;
}

async fn runs_exec_probes_through_the_agent(agent: VirtualAgent) {
    use podprobe_manager::inject::agent;
    let (running, node) = virtual_node_and_chart(agent, Mode::Standalone).await;
    let cp = &running.cp;
    Api::namespaced(cp.client(), NS)
        .create(&PostParams::default(), &game_ppm())
        .await
        .unwrap();
    let mut pod = serde_json::to_value(game_pod("game-0")).unwrap();
    pod["spec"]["containers"][0]["command"] = json!(["/usr/local/bin/gameserver"]);
    pod["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "game-state", "mountPath": "/var/run/game"}]);
    pod["spec"]["volumes"] = json!([{"name": "game-state", "emptyDir": {}}]);
    let pods = create_admitted(cp, &serde_json::from_value(pod).unwrap()).await;

    let up = wait_for(&pods, "game-0", "probes written through the agent", |p| {
        game_up(p) && label(p, IDLE).as_deref() == Some("false")
    })
    .await;
    assert_eq!(node_name(&up), Some(node.name()));
    let spec = up.spec.as_ref().unwrap();
    assert_eq!(
        spec.containers[0].command.as_deref().unwrap()[0],
        agent::AGENT_BINARY,
        "the game server's command runs under the agent"
    );
    let install = spec.init_containers.iter().flatten();
    assert!(
        install
            .map(|c| &c.name)
            .any(|n| n == agent::INSTALL_CONTAINER)
    );

    // Where the provider keeps the pod's emptyDir on the node.
    let uid = up.metadata.uid.as_deref().unwrap();
    let idle_file = node
        .dir()
        .join("vk-cri/pods")
        .join(uid)
        .join("volumes/game-state/idle");
    std::fs::write(&idle_file, "").unwrap();
    wait_for(&pods, "game-0", "idle through the agent", |p| {
        condition_status(p, IDLE).as_deref() == Some("True")
            && label(p, IDLE).as_deref() == Some("true")
    })
    .await;
    std::fs::remove_file(&idle_file).unwrap();
    wait_for(&pods, "game-0", "busy again through the agent", |p| {
        condition_status(p, IDLE).as_deref() == Some("False")
            && label(p, IDLE).as_deref() == Some("false")
    })
    .await;
    let execs = cp
        .audit()
        .unwrap()
        .into_iter()
        .filter(|e| {
            e.object_ref
                .as_ref()
                .is_some_and(|o| o.subresource == "exec")
        })
        .count();
    assert_eq!(execs, 0, "pods/exec requests");
}

/// Deleted while its last result waits out the backoff of refused writes (the sidecar's Role
/// lost `pods/status` for a while, as in a `helm upgrade` that briefly replaces it): the
/// sidecar's flush at SIGTERM, which the provider sends at deletion, writes the result before
/// the pod is gone, although the writer's next attempt was seconds away.
#[tokio::test(flavor = "multi_thread")]
async fn virtual_node_deletion_flushes_the_last_result() {
    deletion_flushes_the_last_result(VirtualAgent::default()).await;
}

/// The same on the library azure-aci v1.6.4 is built on.
#[tokio::test(flavor = "multi_thread")]
async fn virtual_node_v1_11_deletion_flushes_the_last_result() {
    deletion_flushes_the_last_result(VirtualAgent {
        library: testkit::real::Library::V1_11,
        ..VirtualAgent::default()
    })
    .await;
}

async fn deletion_flushes_the_last_result(agent: VirtualAgent) {
    let (running, _node, pods) = game_on(agent).await;
    let cp = &running.cp;
    wait_for(&pods, "game-0", "probes written", game_up).await;

    let roles: Api<Role> = Api::namespaced(cp.client(), NS);
    let granted = roles.get("podprobe-sidecar").await.unwrap().rules;
    let mut withheld = granted.clone().unwrap_or_default();
    withheld.retain(|r| {
        !r.resources
            .iter()
            .flatten()
            .any(|resource| resource == "pods/status")
    });
    let set_rules = |rules| {
        let roles = roles.clone();
        async move {
            let patch = Patch::Merge(json!({"rules": rules}));
            roles
                .patch("podprobe-sidecar", &PatchParams::default(), &patch)
                .await
                .unwrap();
        }
    };
    set_rules(json!(withheld)).await;
    sidecar_may_write_status(cp, false).await;

    // The result changes while its writes are refused; from seven refusals in a row (6 to 13 s)
    // the writer waits 6.4 s or more before its next attempt. RBAC refuses before the body is
    // read, so the audit log has none: the sidecar's log says when the result is held.
    exec(&pods, "game-0", "game", "touch /var/run/game/unhealthy").await;
    let held_since = async {
        loop {
            let log = logs(&pods, "game-0", SIDECAR).await;
            let changed = log.lines().any(|line| {
                line.contains("probe result changed")
                    && line.contains("healthy")
                    && line.contains("Failed")
            });
            if changed {
                return refused_status_writes(cp, "game-0");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let held_since = tokio::time::timeout(Duration::from_secs(30), held_since)
        .await
        .expect("the sidecar's log says the healthy probe failed");
    let refusals_holding_the_result = async {
        loop {
            let refused = refused_status_writes(cp, "game-0");
            if refused >= 7.max(held_since + 1) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), refusals_holding_the_result)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "seven refused writes, one after the result: {} refused, {held_since} before it",
                refused_status_writes(cp, "game-0")
            )
        });
    set_rules(json!(granted)).await;
    sidecar_may_write_status(cp, true).await;

    let before = pods.get("game-0").await.unwrap();
    // True, or absent since the provider's last status write.
    assert_ne!(
        condition_status(&before, HEALTHY).as_deref(),
        Some("False"),
        "the new result is not written yet"
    );
    pods.delete("game-0", &DeleteParams::default())
        .await
        .unwrap();
    let params = WatchParams::default().fields("metadata.name=game-0");
    let version = before.metadata.resource_version.unwrap();
    let mut events = pods.watch(&params, &version).await.unwrap().boxed();
    let mut flushed = false;
    let until_gone = async {
        while let Some(event) = events.try_next().await.unwrap() {
            match event {
                WatchEvent::Modified(pod) => {
                    flushed |= pod.metadata.deletion_timestamp.is_some()
                        && condition_status(&pod, HEALTHY).as_deref() == Some("False");
                }
                WatchEvent::Deleted(_) => return,
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), until_gone)
        .await
        .expect("the pod deleted within 60 s");
    assert!(flushed, "the last result never showed on the deleted pod");
}

/// How many of the sidecar's status writes of `pod` were refused (403).
fn refused_status_writes(cp: &ControlPlane, pod: &str) -> usize {
    let sidecar = format!("system:serviceaccount:{NS}:podprobe-sidecar");
    cp.audit()
        .unwrap()
        .iter()
        .filter(|e| e.user.username == sidecar && e.is("patch", "pods/status", Some(pod)))
        .filter(|e| e.code() == 403)
        .count()
}

/// Waits until RBAC says the sidecar's account `may` patch pod status in the namespace.
async fn sidecar_may_write_status(cp: &ControlPlane, may: bool) {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let review: SubjectAccessReview = serde_json::from_value(json!({"spec": {
        "user": format!("system:serviceaccount:{NS}:podprobe-sidecar"),
        "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{NS}"),
                   "system:authenticated"],
        "resourceAttributes": {"namespace": NS, "verb": "patch", "resource": "pods",
                               "subresource": "status"}
    }}))
    .unwrap();
    let reviews: Api<SubjectAccessReview> = Api::all(cp.client());
    let settled = async {
        loop {
            let answer = reviews
                .create(&PostParams::default(), &review)
                .await
                .unwrap();
            if answer.status.is_some_and(|s| s.allowed == may) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), settled)
        .await
        .unwrap_or_else(|_| panic!("RBAC lets the sidecar write its status: {may}"));
}

/// The serverless protocol as OpenKruise users run it, on a virtual node that runs the pod:
/// kruise-manager v1.9.1 (`EnablePodProbeMarkerOnServerless`) owns the PodProbeMarker,
/// annotates the pod and writes the markers; podprobe-manager (companion) injects the sidecar,
/// which runs on `vk-cri` beside the game server and writes the conditions Kruise reads, with
/// the provider's `Initialized` (which kruise-manager waits for) in its status.
#[tokio::test(flavor = "multi_thread")]
async fn virtual_node_kruise_marks_the_pod_from_the_sidecars_conditions() {
    let (running, node) = virtual_node_and_chart(VirtualAgent::default(), Mode::Companion).await;
    let cp = &running.cp;
    // Kruise's validation knows no grpc handler ("must specify a handler type").
    let mut ppm = game_ppm();
    ppm.spec.probes.retain(|p| p.name != "serving");
    Api::namespaced(cp.client(), NS)
        .create(&PostParams::default(), &ppm)
        .await
        .unwrap();
    let pods = create_admitted(cp, &game_pod("game-0")).await;
    let failed = wait_for(&pods, "game-0", "Kruise's Failed markers", |p| {
        condition_status(p, IDLE).as_deref() == Some("False")
            && condition_status(p, HEALTHY).as_deref() == Some("True")
            && label(p, IDLE).as_deref() == Some("false")
    })
    .await;
    assert_eq!(node_name(&failed), Some(node.name()));
    assert_eq!(annotation(&failed, DELETION_COST).as_deref(), Some("100"));
    exec(&pods, "game-0", "game", "touch /var/run/game/idle").await;
    let idle = wait_for(&pods, "game-0", "Kruise's Succeeded markers", |p| {
        condition_status(p, IDLE).as_deref() == Some("True")
            && label(p, IDLE).as_deref() == Some("true")
    })
    .await;
    assert_eq!(annotation(&idle, DELETION_COST).as_deref(), Some("-100"));
}

/// Steady probes under the provider's whole-status replacement, as installed: past the 30 s in
/// which `after-change` writes a changed result back at once, the pod's conditions must still
/// come back after each replacement within the design's 2 s.
#[tokio::test(flavor = "multi_thread")]
async fn virtual_node_keeps_steady_conditions_present_under_status_replacement() {
    keeps_steady_conditions_present(VirtualAgent::default()).await;
}

/// The same under azure-aci's library, rules, volumes and exec.
#[tokio::test(flavor = "multi_thread")]
async fn virtual_node_aci_keeps_steady_conditions_present_under_status_replacement() {
    keeps_steady_conditions_present(VirtualAgent {
        library: testkit::real::Library::V1_11,
        aci: true,
        ..VirtualAgent::default()
    })
    .await;
}

async fn keeps_steady_conditions_present(agent: VirtualAgent) {
    let (running, _node, pods) = game_on(agent).await;
    wait_for(&pods, "game-0", "probes written", |p| {
        ALL.iter().all(|c| condition_status(p, c).is_some())
    })
    .await;
    // Nothing changes from here on: every probe's first result is at least 30 s old before
    // the window starts.
    tokio::time::sleep(Duration::from_secs(35)).await;
    let replaced_before = status_replacements(&running.cp, "game-0");
    let (present, worst_gap) = presence(&pods, "game-0", Duration::from_secs(30)).await;
    let replaced = status_replacements(&running.cp, "game-0") - replaced_before;
    eprintln!(
        "steady: conditions present in {present:.2} % of samples over 30 s (longest gap {worst_gap:?}), the provider's status written {replaced} times"
    );
    assert!(
        replaced >= 4,
        "the provider's status was written {replaced} times in 30 s"
    );
    assert!(
        worst_gap <= Duration::from_secs(2),
        "conditions missing for {worst_gap:?} at once ({present:.2} % present)"
    );
}
