//! The fleet's control plane: kube-apiserver and etcd (`testkit::real`), virtual-kubelet Node
//! objects, the namespace with the sidecar's RBAC, one PodProbeMarker, and the manager under
//! test: podprobe-manager installed by the chart (helm) and run as the chart runs it, or the
//! real kruise-manager with `EnablePodProbeMarkerOnServerless`.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};
use testkit::real::process::Daemon;
use testkit::real::virtual_kubelet::{Provider, VirtualKubelet};
use testkit::real::{ControlPlane, sidecar_rbac};

use crate::FleetError;
use crate::agents::CONTAINER;
use crate::http::get;
use crate::pods::pod_template;

/// The pods' namespace: the one `examples/sidecar-by-hand.yaml` gives the sidecar's RBAC.
pub const NS: &str = "games";
/// The sidecar's ServiceAccount there (the chart's `sidecar.serviceAccountName` too).
pub const SIDECAR_SA: &str = "podprobe-sidecar";
/// The condition the flipped probe writes, and the label its markerPolicy sets from it.
pub const CONDITION: &str = "game.io/idle";
pub const MARKER: &str = "fleet-idle";
/// Every condition the PodProbeMarker's probes write (http, tcp, exec).
pub const CONDITIONS: [&str; 3] = [CONDITION, "game.io/port-open", EXEC_CONDITION];
/// The exec probe's condition.
pub const EXEC_CONDITION: &str = "game.io/alive";
const RELEASE_NS: &str = "podprobe-system";

/// Which manager turns conditions into markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ManagerKind {
    /// podprobe-manager standalone, installed by the chart.
    Podprobe,
    /// OpenKruise's kruise-manager (`EnablePodProbeMarkerOnServerless`).
    Kruise,
}

/// Probe periods (seconds) of the PodProbeMarker's three probes.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Periods {
    pub http: u32,
    pub tcp: u32,
    pub exec: u32,
}

/// The pods' nodes.
#[derive(Debug, Clone)]
pub enum Nodes {
    /// `n` Node objects `vk-0` … labelled `type=virtual-kubelet`, with no agent behind them:
    /// the fleet writes each pod's status once, as a provider would.
    Objects(usize),
    /// `n` Node objects `node-0` … as a kubelet's (no virtual-kubelet label), with no kubelet
    /// behind them either: the fleet writes each pod's status once, as the kubelet would, and
    /// runs each pod's exec agent ([`crate::agents`]).
    Kubelet(usize),
    /// The virtual-kubelet library's node agents, named, each with its provider: the library
    /// writes the pods' status.
    Agents(Vec<(String, Provider)>),
}

impl Nodes {
    /// The node pod `i` is bound to.
    pub fn node_of(&self, i: usize) -> String {
        match self {
            Nodes::Objects(n) => format!("vk-{}", i % n.max(&1)),
            Nodes::Kubelet(n) => format!("node-{}", i % n.max(&1)),
            Nodes::Agents(agents) => agents[i % agents.len().max(1)].0.clone(),
        }
    }
}

/// The running control plane and manager; everything stops when dropped.
#[derive(Debug)]
pub struct Cluster {
    // Field order is drop order: the manager and node agents before the control plane they
    // talk to.
    podprobe_manager: Option<Daemon>,
    agents: Vec<VirtualKubelet>,
    pub cp: ControlPlane,
    pub kind: ManagerKind,
    /// Where the manager serves /metrics.
    pub manager_metrics: SocketAddr,
}

impl Cluster {
    /// The node agents' logs, for a failed run's diagnostics.
    pub fn agent_log_tails(&self, lines: usize) -> String {
        self.agents.iter().map(|a| a.log_tail(lines)).collect()
    }

    /// The manager's process id.
    pub fn manager_pid(&self) -> u32 {
        match &self.podprobe_manager {
            Some(daemon) => daemon.pid(),
            None => self.cp.pids().kruise_manager.unwrap_or(0),
        }
    }

    /// Starts everything for a fleet whose probes aim at `http_port` and `tcp_port`, on
    /// `nodes`, podprobe-manager's chart installed with `chart_values` besides the bench's own;
    /// returns once the manager's webhook annotates new pods.
    pub async fn start(
        kind: ManagerKind,
        manager_binary: &Path,
        chart_values: &[String],
        nodes: &Nodes,
        ports: (u16, u16),
        periods: Periods,
    ) -> Result<Cluster, FleetError> {
        let mut cp = ControlPlane::start().await?;
        let mut podprobe_manager = None;
        let manager_metrics = match kind {
            ManagerKind::Kruise => {
                let addrs = cp.start_kruise_manager().await?;
                cp.create_namespace(NS).await?;
                sidecar_rbac::apply(&cp).await?;
                SocketAddr::from(([127, 0, 0, 1], addrs.metrics_port))
            }
            ManagerKind::Podprobe => {
                let (daemon, metrics) = install_podprobe(&cp, manager_binary, chart_values).await?;
                podprobe_manager = Some(daemon);
                metrics
            }
        };
        let mut agents = Vec::new();
        match nodes {
            Nodes::Objects(count) | Nodes::Kubelet(count) => {
                let labels = match nodes {
                    Nodes::Objects(_) => json!({"type": "virtual-kubelet"}),
                    _ => json!({}),
                };
                for n in 0..*count {
                    let node: Node = serde_json::from_value(json!({"metadata": {
                        "name": nodes.node_of(n), "labels": labels}}))?;
                    Api::<Node>::all(cp.client())
                        .create(&PostParams::default(), &node)
                        .await?;
                }
            }
            Nodes::Agents(list) => {
                for (name, provider) in list {
                    agents.push(VirtualKubelet::start_node(&cp, name, *provider).await?);
                }
            }
        }
        let cluster = Cluster {
            podprobe_manager,
            agents,
            cp,
            kind,
            manager_metrics,
        };
        let client = cluster.cp.client();
        let ppm: DynamicObject = serde_json::from_value(podprobemarker(ports, periods))?;
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "apps.kruise.io",
            "v1alpha1",
            "PodProbeMarker",
        ));
        Api::<DynamicObject>::namespaced_with(client, NS, &resource)
            .create(&PostParams::default(), &ppm)
            .await?;
        // The webhooks read PodProbeMarkers from a watch cache: wait until it has this one.
        let sample: Pod = serde_json::from_value(pod_template(0, nodes, ports))?;
        cluster
            .cp
            .wait_admission(&sample, |p| {
                p.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("kruise.io/podprobe"))
            })
            .await?;
        Ok(cluster)
    }
}

/// One PodProbeMarker for every pod of the fleet: the flipped http probe with both marker
/// policies, and a tcp and an exec probe that stay up.
fn podprobemarker((http_port, tcp_port): (u16, u16), periods: Periods) -> Value {
    json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
        "metadata": {"name": "fleet", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "fleet"}}, "probes": [
            {"name": "idle", "containerName": CONTAINER, "podConditionType": CONDITION,
             "probe": {"httpGet": {"path": "/idle", "port": http_port, "scheme": "HTTP"},
                       "periodSeconds": periods.http},
             "markerPolicy": [{"state": "Succeeded", "labels": {MARKER: "true"}},
                              {"state": "Failed", "labels": {MARKER: "false"}}]},
            {"name": "port", "containerName": CONTAINER, "podConditionType": CONDITIONS[1],
             "probe": {"tcpSocket": {"port": tcp_port}, "periodSeconds": periods.tcp}},
            {"name": "alive", "containerName": CONTAINER, "podConditionType": EXEC_CONDITION,
             "probe": {"exec": {"command": ["true"]}, "periodSeconds": periods.exec}},
        ]}
    })
}

/// `helm install` of the chart with its defaults but for what a cluster without cert-manager
/// must give (the webhook's certificate) and where the manager listens (this machine), the
/// pods' namespace opted in; then `podprobe-manager run` with the chart's arguments, its
/// ServiceAccount's token and its ConfigMap's injection config.
async fn install_podprobe(
    cp: &ControlPlane,
    binary: &Path,
    chart_values: &[String],
) -> Result<(Daemon, SocketAddr), FleetError> {
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NS,
        "labels": {"podprobe.io/inject": "enabled"}}}))?;
    Api::<Namespace>::all(cp.client())
        .create(&PostParams::default(), &namespace)
        .await?;
    cp.create_service_account(NS, "default").await?;
    let webhook_port = free_port()?;
    let metrics_port = free_port()?;
    let dir = cp.dir().join("podprobe-manager");
    std::fs::create_dir_all(&dir)?;
    let pair = cp.pki().issue(&["127.0.0.1"])?;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/podprobe");
    let mut helm = cp.helm()?;
    helm.args(["install", "podprobe"]).arg(&chart).args([
        "--namespace",
        RELEASE_NS,
        "--create-namespace",
    ]);
    for set in [
        format!("cert.caBundle={}", b64(&cp.pki().ca_pem())),
        format!("cert.tlsCrt={}", b64(&pair.cert_pem)),
        format!("cert.tlsKey={}", b64(&pair.key_pem)),
        format!("webhook.url=https://127.0.0.1:{webhook_port}"),
        format!("sidecar.namespaces={{{NS}}}"),
    ]
    .iter()
    .chain(chart_values)
    {
        helm.args(["--set", set]);
    }
    run(helm, "helm install")?;
    let mut kubectl = cp.kubectl()?;
    kubectl
        .args(["-n", RELEASE_NS, "get", "configmap", "podprobe-manager"])
        .args(["-o", "jsonpath={.data.injection\\.yaml}"]);
    let config = run(kubectl, "kubectl get configmap")?;
    std::fs::write(dir.join("injection.yaml"), config)?;
    std::fs::write(dir.join("tls.crt"), &pair.cert_pem)?;
    std::fs::write(dir.join("tls.key"), &pair.key_pem)?;
    let token = cp
        .service_account_token(RELEASE_NS, "podprobe-manager")
        .await?;
    cp.write_kubeconfig_for_token(dir.join("kubeconfig"), &token)?;
    let p = |name: &str| dir.join(name).display().to_string();
    let args = vec![
        "run".to_owned(),
        "--mode=standalone".to_owned(),
        format!("--tls-cert={}", p("tls.crt")),
        format!("--tls-key={}", p("tls.key")),
        format!("--webhook-addr=127.0.0.1:{webhook_port}"),
        format!("--metrics-addr=127.0.0.1:{metrics_port}"),
        "--leader-election-name=podprobe-manager".to_owned(),
        format!("--config={}", p("injection.yaml")),
    ];
    let env = [
        ("KUBECONFIG", p("kubeconfig")),
        ("POD_NAMESPACE", RELEASE_NS.to_owned()),
    ];
    let mut daemon = Daemon::spawn_with_env(
        "podprobe-manager",
        binary,
        &args,
        &env,
        dir.join("manager.log"),
    )?;
    let metrics = SocketAddr::from(([127, 0, 0, 1], metrics_port));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = daemon.exited() {
            return Err(FleetError::Setup(format!(
                "podprobe-manager exited ({status}):\n{}",
                daemon.log_tail(20)
            )));
        }
        if get(metrics, "/readyz")
            .await
            .is_ok_and(|(code, _)| code == 200)
        {
            return Ok((daemon, metrics));
        }
        if tokio::time::Instant::now() > deadline {
            return Err(FleetError::Setup(format!(
                "podprobe-manager not ready within 60 s:\n{}",
                daemon.log_tail(20)
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn run(mut command: std::process::Command, what: &str) -> Result<String, FleetError> {
    let out = command.output()?;
    if !out.status.success() {
        return Err(FleetError::Setup(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn free_port() -> std::io::Result<u16> {
    testkit::port::free_port()
}
