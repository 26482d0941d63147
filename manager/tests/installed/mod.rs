//! The chart installed by the real helm on a real control plane, and `podprobe-manager`
//! running in-process as the chart deploys it: its ServiceAccount's token, its ConfigMap's
//! injection config, webhooks pointed at it (`webhook.url`); with OpenKruise beside it for
//! companion mode. And what a node would do with the pods it admits: the kubelet's status
//! report, the injected sidecar run as its container spec says. Shared by the real-apiserver
//! tests of both modes.
#![allow(dead_code)] // each test binary uses a part of it

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::Api;
use kube::api::PostParams;
use podprobe_manager::config::InjectionConfig;
use podprobe_manager::pods::MarkerScope;
use podprobe_manager::run::{LeaderOptions, Manager, Options};
use podprobe_manager::webhook::Mode;
use serde_json::{Value, json};
use std::process::{Command, Stdio};
use testkit::real::ControlPlane;

use super::support::{Sidecar, sidecar_binary, vk_node};
use super::{cluster, support};

/// The namespace of the tests' pods and PodProbeMarkers.
pub const NS: &str = "test";
const LIMIT: Duration = Duration::from_secs(30);
/// The tests' injection adds a readiness gate on the game server's health.
pub const READINESS_GATE: &str = "injection.config.readinessGates={game.kruise.io/healthy}";

/// A fresh control plane (panics with the reason when it cannot start).
pub async fn start_control_plane() -> ControlPlane {
    ControlPlane::start()
        .await
        .unwrap_or_else(|e| panic!("real control plane: {e}"))
}

/// OpenKruise's kruise-manager, and beside it the chart in companion mode with the manager
/// running.
pub async fn kruise_and_companion() -> Running {
    let mut cp = start_control_plane().await;
    cp.start_kruise_manager()
        .await
        .unwrap_or_else(|e| panic!("kruise-manager: {e}"));
    install_and_run(cp, Mode::Companion).await
}

/// The chart's `mode` value.
fn mode_value(mode: Mode) -> &'static str {
    match mode {
        Mode::Standalone => "standalone",
        Mode::Companion => "companion",
    }
}

pub struct Running {
    pub cp: ControlPlane,
    pub manager: Manager,
    pub dir: tempfile::TempDir,
}

/// Installs the chart in `mode` on `cp` (webhooks at a local port, injection with a readiness
/// gate; in companion mode without its CRD, which is OpenKruise's then) and starts the manager
/// there with the chart's ServiceAccount and injection config. Namespace [`NS`] opts in to
/// injection; node `vk-1` is a virtual-kubelet node.
pub async fn install_and_run(cp: ControlPlane, mode: Mode) -> Running {
    install_and_run_with(cp, mode, &[]).await
}

/// Namespace [`NS`] opted in to injection, with its default ServiceAccount, and the
/// virtual-kubelet node `vk-1`.
pub async fn prepare_test_namespace(cp: &ControlPlane) {
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NS,
        "labels": {"podprobe.io/inject": "enabled"}}}))
    .unwrap();
    Api::<Namespace>::all(cp.client())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    // On a node the serviceaccount controller may have made it already.
    match cp.create_service_account(NS, "default").await {
        Ok(_) => {}
        Err(testkit::real::Error::Kube(kube::Error::Api(e))) if e.code == 409 => {}
        Err(e) => panic!("ServiceAccount {NS}/default: {e}"),
    }
    Api::<Node>::all(cp.client())
        .create(&PostParams::default(), &vk_node("vk-1"))
        .await
        .unwrap();
}

/// [`install_and_run`] with more helm arguments after the defaults (a later `--set` wins).
pub async fn install_and_run_with(cp: ControlPlane, mode: Mode, helm_args: &[&str]) -> Running {
    install_with(cp, mode, helm_args).await.start().await
}

/// The chart installed, its webhooks pointed at a port where no manager listens yet: the
/// apiserver admits pods as the chart's `failurePolicy` says it should while the manager is
/// unreachable.
pub struct Installed {
    pub cp: ControlPlane,
    pub options: Options,
    pub client: kube::Client,
    pub dir: tempfile::TempDir,
}

/// The chart installed as [`install_and_run_with`] does it, the manager not started.
pub async fn install_with(cp: ControlPlane, mode: Mode, helm_args: &[&str]) -> Installed {
    prepare_test_namespace(&cp).await;

    let port = testkit::port::free_port().unwrap();
    let mut sets = cluster::cert_values(&cp, &["127.0.0.1"]);
    sets.extend([
        format!("mode={}", mode_value(mode)),
        format!("webhook.url=https://127.0.0.1:{port}"),
        format!("sidecar.namespaces={{{NS}}}"),
        "injection.config.image=podprobe:dev".to_owned(),
        READINESS_GATE.to_owned(),
    ]);
    let mut extra = vec!["--create-namespace"];
    if mode == Mode::Companion {
        extra.push("--skip-crds");
    }
    extra.extend(helm_args);
    cluster::run(cluster::helm(&cp, "install", &sets, &extra), "helm install");

    // The manager as the chart deploys it: its ServiceAccount, its ConfigMap, its certificate.
    let dir = tempfile::tempdir().unwrap();
    let pair = cp.pki().issue(&["127.0.0.1"]).unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert, &pair.cert_pem).unwrap();
    std::fs::write(&key, &pair.key_pem).unwrap();
    let config = cluster::run(
        {
            let mut k = cp.kubectl().unwrap();
            k.args([
                "-n",
                cluster::RELEASE_NS,
                "get",
                "configmap",
                "podprobe-manager",
            ])
            .args(["-o", "jsonpath={.data.injection\\.yaml}"]);
            k
        },
        "the chart's injection config",
    );
    let injection = InjectionConfig::from_yaml(&config, "the chart's ConfigMap").unwrap();
    let token = cp
        .service_account_token(cluster::RELEASE_NS, "podprobe-manager")
        .await
        .unwrap();
    let options = Options {
        mode,
        webhook_addr: format!("127.0.0.1:{port}").parse().unwrap(),
        tls_cert: cert,
        tls_key: key,
        tls_reload_interval: Duration::from_secs(10),
        injection: Some(injection),
        metrics_addr: Some("127.0.0.1:0".parse().unwrap()),
        leader: Some(LeaderOptions {
            namespace: cluster::RELEASE_NS.into(),
            name: "podprobe-manager".into(),
            identity: "manager-0".into(),
            lease_duration: Duration::from_secs(15),
        }),
        scope: MarkerScope::default(),
        workers: 4,
    };
    let client = podprobe_manager::run::client(cp.config_for_token(&token)).unwrap();
    Installed {
        cp,
        options,
        client,
        dir,
    }
}

impl Installed {
    /// The manager started with the chart's ServiceAccount and injection config, and ready.
    pub async fn start(self) -> Running {
        let manager = self.start_manager().await;
        let Installed { cp, dir, .. } = self;
        Running { cp, manager, dir }
    }

    /// A manager replica as [`Installed::start`] runs it, kept by the caller (stop it and
    /// start another on the same port and Lease, as a restarted pod would).
    pub async fn start_manager(&self) -> Manager {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let manager = Manager::start(self.client.clone(), self.options.clone())
            .await
            .unwrap();
        let metrics = manager.metrics_addr.unwrap();
        let ready = async {
            while support::http_get(metrics, "/readyz").await.0 != 200 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(LIMIT, ready)
            .await
            .expect("the manager turns ready");
        manager
    }
}

/// The kubelet's report for the admitted pod: running on 127.0.0.1, the native sidecar and
/// `app_container` started.
pub fn kubelet_status(app_container: &str) -> Value {
    let running = |name: &str, id: &str| {
        json!({"name": name, "ready": true, "restartCount": 0, "image": "img", "imageID": "",
               "containerID": id, "started": true,
               "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}})
    };
    json!({"status": {
        "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
        "conditions": [{"type": "PodScheduled", "status": "True"},
                       {"type": "Initialized", "status": "True"}],
        "initContainerStatuses": [running("podprobe", "containerd://sidecar")],
        "containerStatuses": [running(app_container, "containerd://main-1")]
    }})
}

/// The injected container run as the kubelet would run it: its command (the image's
/// entrypoint: this build's binary), its args, its environment (the literal values and the
/// downward-API fields it declares, resolved from the pod; `status.podIP` is 127.0.0.1, where
/// [`kubelet_status`] and the tests' virtual nodes put their pods), its downward-API volume
/// (the pod's annotations, kept up to date while it runs: [`follow_downward_api`]), a token of
/// the pod's ServiceAccount bound to the pod. Exec probes run in the sidecar's own process (mode
/// `local`): no kubelet runs the pod's other containers here, so `pods/exec`, which the chart's
/// Role allows and `auto` would take, has nothing to reach; the tests' commands are local
/// scripts.
pub async fn run_injected_sidecar(running: &Running, pod: &Pod, service_account: &str) -> Sidecar {
    let token = running.cp.pod_token(service_account, pod).await.unwrap();
    run_injected_sidecar_with(running, pod, &token, &[])
}

/// The injected sidecar container of `pod`: a native sidecar or an ordinary container.
pub fn injected_container(pod: &Pod) -> &k8s_openapi::api::core::v1::Container {
    let spec = pod.spec.as_ref().unwrap();
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .find(|c| c.name == "podprobe")
        .expect("an injected podprobe container")
}

/// The container's environment as a node resolves it from `pod`.
fn resolved_env(
    pod: &Pod,
    container: &k8s_openapi::api::core::v1::Container,
) -> Vec<(String, String)> {
    let meta = &pod.metadata;
    container
        .env
        .iter()
        .flatten()
        .map(|e| {
            let field = e.value_from.as_ref().and_then(|v| v.field_ref.as_ref());
            let value = match field.map(|f| f.field_path.as_str()) {
                None => e.value.clone().unwrap_or_default(),
                Some("metadata.name") => meta.name.clone().unwrap(),
                Some("metadata.namespace") => meta.namespace.clone().unwrap(),
                Some("metadata.uid") => meta.uid.clone().unwrap(),
                Some("status.podIP") => "127.0.0.1".to_owned(),
                // Empty while unbound, as the kubelet would never see it.
                Some("spec.nodeName") => pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default(),
                Some(other) => {
                    panic!("the injected env reads {other}, which the tests do not resolve")
                }
            };
            (e.name.clone(), value)
        })
        .collect()
}

/// [`run_injected_sidecar`] with a given `token` (e.g. one bound to another pod, which the
/// admission policy refuses) and `env` set over the container's.
pub fn run_injected_sidecar_with(
    running: &Running,
    pod: &Pod,
    token: &str,
    env: &[(&str, &str)],
) -> Sidecar {
    let container = injected_container(pod);
    assert_eq!(
        container.command.as_deref(),
        Some(&[podprobe_manager::config::DEFAULT_COMMAND.to_owned()][..]),
        "the image's entrypoint"
    );
    let name = pod.metadata.name.as_deref().unwrap();
    let kubeconfig = running.dir.path().join(format!("{name}.kubeconfig"));
    running
        .cp
        .write_kubeconfig_for_token(&kubeconfig, token)
        .unwrap();
    let log = running.dir.path().join(format!("{name}.sidecar.log"));
    let (volume, annotations_file) = match downward_api_mount(pod, container) {
        Some(mount) => {
            let dir = running.dir.path().join(format!("{name}.podinfo"));
            let file = podprobe::annotation::project_downward_api(&dir, &annotations(pod))
                .expect("project the downward-API volume");
            // Where the sidecar's default `--annotations-file` (/etc/podinfo/annotations) is.
            assert_eq!(mount, "/etc/podinfo", "the volume's mount path");
            let follower = follow_downward_api(running.cp.client(), pod, dir);
            (
                Some(tokio::spawn(follower)),
                vec![("PODPROBE_ANNOTATIONS_FILE", file)],
            )
        }
        None => (None, Vec::new()),
    };
    let child = Command::new(sidecar_binary())
        .args(container.args.iter().flatten())
        .env_remove("POD_IP")
        .envs(resolved_env(pod, container))
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "podprobe=debug,info")
        .env("PODPROBE_EXEC_MODE", "local")
        .envs(annotations_file)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start the sidecar");
    let sidecar = Sidecar::new(child, log);
    match volume {
        Some(volume) => sidecar.serving(volume),
        None => sidecar,
    }
}

/// Where `container` mounts a downward-API volume of `pod`, if it does.
fn downward_api_mount(
    pod: &Pod,
    container: &k8s_openapi::api::core::v1::Container,
) -> Option<String> {
    let volumes = pod.spec.as_ref()?.volumes.as_ref()?;
    container.volume_mounts.iter().flatten().find_map(|m| {
        let volume = volumes.iter().find(|v| v.name == m.name)?;
        volume.downward_api.as_ref().map(|_| m.mount_path.clone())
    })
}

fn annotations(pod: &Pod) -> std::collections::BTreeMap<String, String> {
    pod.metadata.annotations.clone().unwrap_or_default()
}

/// Re-projects the pod's annotations into its downward-API volume at `dir` whenever they
/// change, as the kubelet does on its next sync of the pod.
fn follow_downward_api(
    client: kube::Client,
    pod: &Pod,
    dir: std::path::PathBuf,
) -> impl std::future::Future<Output = ()> + 'static {
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    let pods: Api<Pod> = Api::namespaced(client, pod.metadata.namespace.as_deref().unwrap());
    let name = pod.metadata.name.clone().unwrap();
    let mut last = annotations(pod);
    async move {
        let config =
            kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut pods = std::pin::pin!(kube::runtime::watcher(pods, config).applied_objects());
        while let Some(seen) = pods.next().await {
            let Ok(seen) = seen else { continue };
            let now = annotations(&seen);
            if now != last {
                podprobe::annotation::project_downward_api(&dir, &now)
                    .expect("re-project the downward-API volume");
                last = now;
            }
        }
    }
}

/// The condition type of [`listening_marker`]'s probe.
pub const LISTENING: &str = "example.com/listening";

/// A PodProbeMarker for pods labelled `app=game` in [`NS`]: a tcpSocket probe on `port` every
/// second, condition [`LISTENING`], marker label `listening=true` while it succeeds.
pub fn listening_marker(port: u16) -> podprobe_manager::crd::PodProbeMarker {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "listening", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": "game"}},
            "probes": [{
                "name": "listening", "containerName": "main",
                "probe": {"tcpSocket": {"port": port}, "periodSeconds": 1},
                "podConditionType": LISTENING,
                "markerPolicy": [{"state": "Succeeded", "labels": {"listening": "true"}}]
            }]
        }
    }))
    .unwrap()
}

/// A TCP listener for the probe to find, and [`listening_marker`] aimed at it, created in
/// [`NS`]. Keep the listener: the probe succeeds while it lives.
pub async fn listening_target(running: &Running) -> std::net::TcpListener {
    let target = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    Api::<podprobe_manager::crd::PodProbeMarker>::namespaced(running.cp.client(), NS)
        .create(
            &PostParams::default(),
            &listening_marker(target.local_addr().unwrap().port()),
        )
        .await
        .unwrap();
    target
}

/// Waits until pod `name` carries [`LISTENING`] True and the marker label it earns.
pub async fn wait_marked(running: &Running, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(running.cp.client(), NS);
    let marked = support::wait_pod(&pods, name, "condition and marker", |p| {
        support::label(p, "listening").as_deref() == Some("true")
    })
    .await;
    assert_eq!(
        support::condition_status(&marked, LISTENING).as_deref(),
        Some("True")
    );
    marked
}

/// `pod` created in [`NS`] through the admission chain once the webhook's cache has the
/// PodProbeMarkers: the pod as the webhook injected it.
pub async fn create_once_admitted(running: &Running, pod: &Pod) -> Pod {
    running
        .cp
        .wait_admission(pod, |p| support::annotation(p, support::PODPROBE).is_some())
        .await
        .unwrap_or_else(|e| panic!("the pod webhook never sees the PodProbeMarker: {e}"));
    Api::<Pod>::namespaced(running.cp.client(), NS)
        .create(&PostParams::default(), pod)
        .await
        .unwrap()
}

/// Pod `name` (`app=game`, service account `podprobe-sidecar`, on node `vk-1`) created through
/// the admission chain once the webhook's cache has the PodProbeMarkers, with the kubelet's
/// status report written: the pod as the webhook injected it.
pub async fn admitted_game_pod(running: &Running, name: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "game"}},
        "spec": {"nodeName": "vk-1", "serviceAccountName": "podprobe-sidecar",
                 "containers": [{"name": "main", "image": "game:1"}]}
    }))
    .unwrap();
    let created = create_once_admitted(running, &pod).await;
    let pods: Api<Pod> = Api::namespaced(running.cp.client(), NS);
    pods.patch_status(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Strategic(kubelet_status("main")),
    )
    .await
    .unwrap();
    created
}
