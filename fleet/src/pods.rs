//! The fleet's pods, made as a serverless provider's pods are: created bound to a
//! virtual-kubelet node through the whole admission chain (the manager's webhook writes
//! `kruise.io/podprobe`; podprobe's also injects its sidecar), their status written once as the
//! provider reports a started pod, and a token of the sidecar's ServiceAccount bound to each,
//! as the kubelet would mount it.

use std::path::{Path, PathBuf};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testkit::real::ControlPlane;

use crate::FleetError;
use crate::agents::{CONTAINER, GAME_COMMAND};
use crate::cluster::{NS, Nodes, SIDECAR_SA};
use crate::targets::pod_ip;

/// Requests in flight while the fleet is made (the apiserver's default max-in-flight for
/// mutations is 200; this stays well under).
const CONCURRENCY: usize = 32;

/// What a sidecar needs to know about its pod.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct FleetPod {
    pub index: usize,
    pub name: String,
    pub uid: String,
    pub ip: String,
    pub kubeconfig: PathBuf,
    /// The downward-API annotations file (kubelet layout), for `--source file`.
    pub annotations_file: PathBuf,
    /// Where its sidecar finds the exec agents' sockets (`--exec-agent-dir`), when injection
    /// wrapped its game container (`--exec agent`).
    #[serde(default)]
    pub agent_dir: Option<PathBuf>,
}

pub fn pod_name(i: usize) -> String {
    format!("fleet-{i}")
}

/// The index of the fleet pod named `name` (`fleet-<i>`).
pub fn index_of(name: &str) -> Option<usize> {
    name.strip_prefix("fleet-")?.parse().ok()
}

/// Pod `i` as its owner creates it: bound to its virtual-kubelet node.
///
/// On a node agent the pod opts out of sidecar injection: its sidecar runs beside the agent as
/// a process, and the library's mock provider refuses a container whose environment reads
/// `status.podIP` (as the injected sidecar's `POD_IP` does): `unsupported fieldPath`.
///
/// On a kubelet node the game container gives its command, as a game server's pod spec does:
/// injection then wraps it with the exec agent.
pub fn pod_template(i: usize, nodes: &Nodes, (http_port, tcp_port): (u16, u16)) -> Value {
    let mut labels = json!({"app": "fleet"});
    if let Nodes::Agents(_) = nodes {
        labels["podprobe.io/inject"] = json!("disabled");
    }
    let mut main = json!({"name": CONTAINER, "image": "game:1", "ports": [
        {"containerPort": http_port}, {"containerPort": tcp_port}]});
    if let Nodes::Kubelet(_) = nodes {
        main["command"] = json!([GAME_COMMAND]);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name(i), "namespace": NS, "labels": labels},
        "spec": {"nodeName": nodes.node_of(i),
                 "serviceAccountName": SIDECAR_SA,
                 "containers": [main]}
    })
}

/// The provider's one status report: scheduled, initialized, running at the pod's address,
/// every container started (the injected sidecar, when there is one, among them).
fn provider_status(pod: &Pod, ip: &str) -> Value {
    let running = |name: &str| {
        json!({"name": name, "ready": true, "restartCount": 0, "image": "img", "imageID": "",
               "containerID": format!("vk://{name}"), "started": true,
               "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}})
    };
    let spec = pod.spec.as_ref();
    let names = |containers: Option<&Vec<k8s_openapi::api::core::v1::Container>>| {
        containers
            .into_iter()
            .flatten()
            .map(|c| running(&c.name))
            .collect::<Vec<_>>()
    };
    json!({"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "PodScheduled", "status": "True"},
                       {"type": "Initialized", "status": "True"},
                       {"type": "ContainersReady", "status": "True"},
                       {"type": "Ready", "status": "True"}],
        "initContainerStatuses": names(spec.and_then(|s| s.init_containers.as_ref())),
        "containerStatuses": names(spec.map(|s| &s.containers)),
    }})
}

/// Creates pods `0..count` on `nodes`, writes their status (on Node objects without an agent)
/// and their sidecars' kubeconfigs and annotations files under `work`.
pub async fn create(
    cp: &ControlPlane,
    work: &Path,
    count: usize,
    nodes: &Nodes,
    ports: (u16, u16),
) -> Result<Vec<FleetPod>, FleetError> {
    let mut pods: Vec<FleetPod> = futures::stream::iter(0..count)
        .map(|i| create_one(cp, work, i, nodes, ports))
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await?;
    pods.sort_by_key(|p| p.index);
    Ok(pods)
}

async fn create_one(
    cp: &ControlPlane,
    work: &Path,
    i: usize,
    nodes: &Nodes,
    ports: (u16, u16),
) -> Result<FleetPod, FleetError> {
    let api: Api<Pod> = Api::namespaced(cp.client(), NS);
    let pod: Pod = serde_json::from_value(pod_template(i, nodes, ports))?;
    let pod = api.create(&PostParams::default(), &pod).await?;
    let name = pod_name(i);
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    if !annotations.contains_key("kruise.io/podprobe") {
        return Err(FleetError::Setup(format!(
            "{name} was admitted without kruise.io/podprobe: the manager's webhook did not annotate it"
        )));
    }
    let ip = pod_ip(i).to_string();
    let kubelet = matches!(nodes, Nodes::Kubelet(_));
    if kubelet {
        crate::agents::check_wrapped(&pod)?;
    }
    if let Nodes::Objects(_) | Nodes::Kubelet(_) = nodes {
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&provider_status(&pod, &ip)),
        )
        .await?;
    }
    let token = cp.pod_token(SIDECAR_SA, &pod).await?;
    let dir = work.join(&name);
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = dir.join("kubeconfig");
    cp.write_kubeconfig_for_token(&kubeconfig, &token)?;
    let annotations_file =
        podprobe::annotation::project_downward_api(&dir.join("podinfo"), &annotations)?;
    Ok(FleetPod {
        index: i,
        name,
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        ip,
        kubeconfig,
        annotations_file,
        agent_dir: kubelet.then(|| dir.join("agents")),
    })
}
