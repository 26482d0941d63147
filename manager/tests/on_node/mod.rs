//! podprobe on a real node: the control plane on the node network's host address, a kubelet
//! with containerd and runc ([`testkit::real::Node`]), the chart installed with the sidecar
//! image imported there, and podprobe-manager running in-process as the chart deploys it.
//! What the tests read off the node: container ids, logs, exec, cgroup figures.
#![allow(dead_code)] // each test binary uses a part of it

pub mod usage;

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::{AttachParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use podprobe_manager::webhook::Mode;
use serde_json::json;
use testkit::real::node::images::{GAMESERVER_IMAGE, MANAGER_IMAGE, SIDECAR_IMAGE};
use testkit::real::{ControlPlane, Node, NodeNetwork, NodeOptions};

use super::cluster;
use super::installed::{NS, READINESS_GATE, Running, install_and_run_with, prepare_test_namespace};

/// The injected sidecar's container name.
pub const SIDECAR: &str = "podprobe";

/// Injection for procfs exec: a shared PID namespace and a root sidecar that keeps the
/// runtime's default capabilities (which hold `SYS_CHROOT`, `SETUID`, `SETGID`): the kernel's
/// ptrace-read check also wants every capability of the root game server, so `drop: [ALL]`
/// would fail it (docs/protocol.md, exec modes).
const PROCFS_SECURITY_CONTEXT: &str = r#"injection.config.securityContext={"runAsUser":0,"runAsNonRoot":false,"readOnlyRootFilesystem":true,"allowPrivilegeEscalation":false}"#;

/// A node (with `options`) and the chart in standalone mode on its control plane, injecting
/// the locally built sidecar image for procfs exec.
pub async fn node_and_chart(options: NodeOptions) -> (Running, Node) {
    node_and_chart_in(options, Mode::Standalone).await
}

/// The helm arguments that turn injection's procfs exec on ([`PROCFS_SECURITY_CONTEXT`]).
pub const PROCFS_INJECTION: [&str; 4] = [
    "--set",
    "injection.config.shareProcessNamespace=true",
    "--set-json",
    PROCFS_SECURITY_CONTEXT,
];

/// [`node_and_chart`] in `mode`; in companion mode OpenKruise's kruise-manager runs first
/// (its CRDs, webhooks and `EnablePodProbeMarkerOnServerless`).
pub async fn node_and_chart_in(options: NodeOptions, mode: Mode) -> (Running, Node) {
    node_and_chart_with(options, mode, &PROCFS_INJECTION).await
}

/// A node and the chart in `mode` injecting the locally built sidecar image, with `helm_args`
/// after the chart's defaults (none: the sidecar as the chart installs it).
pub async fn node_and_chart_with(
    options: NodeOptions,
    mode: Mode,
    helm_args: &[&str],
) -> (Running, Node) {
    let network = NodeNetwork::create().unwrap_or_else(|e| panic!("node network: {e}"));
    let mut cp = ControlPlane::start_on(network.host_ip())
        .await
        .unwrap_or_else(|e| panic!("control plane: {e}"));
    let node = Node::start(&mut cp, network, options)
        .await
        .unwrap_or_else(|e| panic!("node: {e}"));
    if mode == Mode::Companion {
        cp.start_kruise_manager()
            .await
            .unwrap_or_else(|e| panic!("kruise-manager: {e}"));
    }
    let image = format!("injection.config.image={SIDECAR_IMAGE}");
    let mut args = vec!["--set", image.as_str()];
    args.extend(helm_args);
    let running = install_and_run_with(cp, mode, &args).await;
    (running, node)
}

/// A node with a scheduler and the workload controllers, and the chart installed there as a
/// user installs it: podprobe-manager runs from the image the workspace's Dockerfile builds,
/// with the chart's replicas, affinity and security context, its webhooks reached through their Service (the apiserver's host routes Service
/// addresses to the node, where kube-proxy forwards them). `helm install --wait` returns once
/// the Deployment is available.
pub async fn node_and_deployed_chart() -> (ControlPlane, Node) {
    let (cp, node) = node_for_workloads(NodeOptions::default()).await;
    prepare_test_namespace(&cp).await;
    let (repository, tag) = MANAGER_IMAGE.rsplit_once(':').expect("a tag");
    let service = format!("podprobe-manager.{}.svc", cluster::RELEASE_NS);
    let mut sets = cluster::cert_values(&cp, &[&service]);
    sets.extend([
        "mode=standalone".to_owned(),
        format!("image.repository={repository}"),
        format!("image.tag={tag}"),
        // Imported, not pulled: there is no registry.
        "image.pullPolicy=Never".to_owned(),
        format!("sidecar.namespaces={{{NS}}}"),
        format!("injection.config.image={SIDECAR_IMAGE}"),
        "injection.config.shareProcessNamespace=true".to_owned(),
        READINESS_GATE.to_owned(),
    ]);
    let extra = [
        "--create-namespace",
        "--wait",
        "--timeout=2m",
        "--set-json",
        PROCFS_SECURITY_CONTEXT,
    ];
    let install = cluster::helm(&cp, "install", &sets, &extra)
        .output()
        .expect("run helm");
    if !install.status.success() {
        let mut describe = cp.kubectl().unwrap();
        describe.args(["describe", "pods", "-n", cluster::RELEASE_NS]);
        let described = describe.output().expect("run kubectl");
        panic!(
            "helm install --wait: {}\n{}\nkube-scheduler: {}\nkubelet: {}",
            String::from_utf8_lossy(&install.stderr),
            String::from_utf8_lossy(&described.stdout),
            cp.scheduler_log_tail(30),
            node.kubelet_log_tail(30)
        );
    }
    (cp, node)
}

/// A node (with `options`' labels) where workloads run as in a cluster: kube-scheduler places
/// their pods, and the Deployment, ReplicaSet, EndpointSlice and node-lifecycle controllers run.
pub async fn node_for_workloads(options: NodeOptions) -> (ControlPlane, Node) {
    let network = NodeNetwork::create().unwrap_or_else(|e| panic!("node network: {e}"));
    let mut cp = ControlPlane::start_on(network.host_ip())
        .await
        .unwrap_or_else(|e| panic!("control plane: {e}"));
    let mut options = options;
    // node-lifecycle: lifts the not-ready taint the kubelet registers with, which the
    // scheduler respects.
    options.controllers.extend([
        "deployment",
        "replicaset",
        // The chart's install check is a Job.
        "job",
        "endpointslice",
        "node-lifecycle-controller",
    ]);
    let node = Node::start(&mut cp, network, options)
        .await
        .unwrap_or_else(|e| panic!("node: {e}"));
    cp.start_scheduler()
        .unwrap_or_else(|e| panic!("kube-scheduler: {e}"));
    (cp, node)
}

/// A cluster with both node kinds, as a platform with virtual nodes has: a kubelet node where
/// workloads run ([`node_for_workloads`]: the chart's Deployments land there, the virtual
/// node's taint keeps them off it) and beside it the virtual node `agent` that runs its pods
/// (`vk-cri`), each in a network of its own, reaching the apiserver on the kubelet node's.
pub async fn mixed_cluster(agent: testkit::real::VirtualAgent) -> (ControlPlane, Node, Node) {
    let (mut cp, kubelet) = node_for_workloads(NodeOptions::default()).await;
    let network = NodeNetwork::create().unwrap_or_else(|e| panic!("virtual node network: {e}"));
    let options = NodeOptions {
        virtual_agent: Some(agent),
        ..NodeOptions::default()
    };
    let virtual_node = Node::start(&mut cp, network, options)
        .await
        .unwrap_or_else(|e| panic!("virtual node: {e}"));
    (cp, kubelet, virtual_node)
}

/// The names of the pods of `pods` labelled `app=<app>`, once there are `count` of them (a
/// controller creates them).
pub async fn pods_of(pods: &Api<Pod>, app: &str, count: usize) -> Vec<String> {
    let selector = ListParams::default().labels(&format!("app={app}"));
    let wait = async {
        loop {
            let names: Vec<String> = pods
                .list(&selector)
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect();
            if names.len() == count {
                return names;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .unwrap_or_else(|_| panic!("{count} pods labelled app={app}"))
}

/// Scales Deployment `name` to zero: no garbage collector runs here, so this is what stops its
/// ReplicaSet recreating the pods before the node stops.
pub async fn scale_to_zero(cp: &ControlPlane, namespace: &str, name: &str) {
    Api::<Deployment>::namespaced(cp.client(), namespace)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
}

/// The `containerd://` id of container `name` (init or regular) as the pod's status says.
pub fn container_id(pod: &Pod, name: &str) -> Option<String> {
    let status = pod.status.as_ref()?;
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .find(|c| c.name == name)?
        .container_id
        .as_deref()?
        .strip_prefix("containerd://")
        .map(str::to_owned)
}

pub fn restart_count(pod: &Pod, name: &str) -> i32 {
    let status = pod.status.as_ref();
    status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .chain(
            status
                .and_then(|s| s.init_container_statuses.as_ref())
                .into_iter()
                .flatten(),
        )
        .find(|c| c.name == name)
        .map_or(0, |c| c.restart_count)
}

/// The container's log through the apiserver and the kubelet.
pub async fn logs(pods: &Api<Pod>, pod: &str, container: &str) -> String {
    let params = LogParams {
        container: Some(container.into()),
        ..LogParams::default()
    };
    pods.logs(pod, &params)
        .await
        .unwrap_or_else(|e| panic!("logs of {pod}/{container}: {e}"))
}

/// `kubectl apply -n namespace -f -` of `doc`, as a user applies a manifest; panics unless it
/// succeeded.
pub fn kubectl_apply(cp: &ControlPlane, namespace: &str, doc: &serde_json::Value) {
    let mut child = cp
        .kubectl()
        .unwrap()
        .args(["apply", "-n", namespace, "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    serde_json::to_writer(child.stdin.take().unwrap(), doc).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `sh -c script` in `container` of `pod` through `node`'s containerd (`ctr tasks
/// exec`), not through the node's agent: the test's hand in the game's state where the
/// agent's own exec cannot carry it (azure-aci's runs a command without arguments).
pub async fn runtime_exec(node: &Node, pods: &Api<Pod>, pod: &str, container: &str, script: &str) {
    let running = pods.get(pod).await.unwrap();
    let id = container_id(&running, container)
        .unwrap_or_else(|| panic!("{pod}/{container}: no container id"));
    let exec_id = format!("test-{}", std::process::id());
    let out = node
        .ctr()
        .args([
            "tasks",
            "exec",
            "--exec-id",
            &exec_id,
            &id,
            "sh",
            "-c",
            script,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ctr tasks exec {script:?} in {pod}/{container}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `sh -c script` in `container` through `pods/exec` (apiserver → kubelet → runc) and
/// waits for it to finish; panics unless it succeeded.
pub async fn exec(pods: &Api<Pod>, pod: &str, container: &str, script: &str) {
    let params = AttachParams::default()
        .container(container)
        .stdin(false)
        .stdout(false)
        .stderr(true);
    let mut process = pods
        .exec(pod, ["sh", "-c", script], &params)
        .await
        .unwrap_or_else(|e| panic!("exec {script:?} in {pod}/{container}: {e}"));
    let status = process.take_status().expect("a status channel");
    let status = tokio::time::timeout(Duration::from_secs(30), status)
        .await
        .expect("exec finished")
        .expect("exec status");
    assert_eq!(
        status.status.as_deref(),
        Some("Success"),
        "exec {script:?} in {pod}/{container}: {status:?}"
    );
}

/// The memory cgroup (v1) of a container of the node: the kubelet names it after the
/// container id under `<cgroup root>/kubepods/<qos>/pod<uid>/`.
pub fn memory_cgroup(node: &Node, container_id: &str) -> PathBuf {
    let root =
        PathBuf::from("/sys/fs/cgroup/memory").join(node.cgroup_root().trim_start_matches('/'));
    find_dir(&root, container_id).unwrap_or_else(|| {
        panic!(
            "no memory cgroup named {container_id} under {}",
            root.display()
        )
    })
}

fn find_dir(dir: &std::path::Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if entry.file_name() == name {
            return Some(entry.path());
        }
        if let Some(found) = find_dir(&entry.path(), name) {
            return Some(found);
        }
    }
    None
}

/// One figure of a v1 `memory.stat` (bytes).
pub fn memory_stat(cgroup: &std::path::Path, key: &str) -> u64 {
    let stat = std::fs::read_to_string(cgroup.join("memory.stat")).unwrap();
    stat.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{key} not in {}/memory.stat", cgroup.display()))
}

/// Waits (watching, up to a minute) until `check` holds for pod `name`; on timeout panics with
/// the pod's conditions and the sidecar's log, which say why far better than the whole pod.
pub async fn wait_for(
    pods: &Api<Pod>,
    name: &str,
    what: &str,
    check: impl Fn(&Pod) -> bool,
) -> Pod {
    if let Some(pod) = super::support::watch_until(pods, name, Duration::from_secs(60), check).await
    {
        return pod;
    }
    let pod = pods.get(name).await.ok();
    let conditions: Vec<String> = pod
        .iter()
        .flat_map(|p| p.status.iter().flat_map(|s| s.conditions.iter().flatten()))
        .map(|c| {
            format!(
                "{}={} {}",
                c.type_,
                c.status,
                c.message.as_deref().unwrap_or("")
            )
        })
        .collect();
    let labels = pod.as_ref().and_then(|p| p.metadata.labels.clone());
    let sidecar = logs(pods, name, SIDECAR).await;
    panic!(
        "{what}: not reached within a minute\nconditions:\n  {}\nlabels: {labels:?}\nsidecar log:\n{sidecar}",
        conditions.join("\n  ")
    );
}

/// Watches pod `name` until each condition type in `types` has been seen with `status` at
/// some point (not necessarily all at once: each probe's worker notices a restart on its own
/// tick, and the first may have its new result before the last publishes `Unknown`).
pub async fn wait_each_seen(pods: &Api<Pod>, name: &str, types: &[&str], status: &str) {
    use futures::TryStreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let mut seen = std::collections::BTreeSet::new();
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = std::pin::pin!(watcher(pods.clone(), config).applied_objects());
    let watch = async {
        while let Some(pod) = stream.try_next().await.expect("watch the pod") {
            for condition in pod
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
            {
                if condition.status == status && types.contains(&condition.type_.as_str()) {
                    seen.insert(condition.type_.clone());
                }
            }
            if seen.len() == types.len() {
                return;
            }
        }
        panic!("the watch of pod {name} ended before {types:?} were each {status}");
    };
    if tokio::time::timeout(Duration::from_secs(60), watch)
        .await
        .is_err()
    {
        let sidecar = logs(pods, name, SIDECAR).await;
        panic!(
            "{types:?} each {status} at some point: only {seen:?} within a minute\nsidecar log:\n{sidecar}"
        );
    }
}

/// The game server pod (examples/game-server-pod.yaml's container) on `node`.
pub fn game_pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "game"}},
        "spec": {"nodeName": node, "serviceAccountName": "podprobe-sidecar",
                 "terminationGracePeriodSeconds": 10,
                 "containers": [{"name": "game", "image": GAMESERVER_IMAGE,
                    "ports": [{"name": "game", "containerPort": 7777},
                              {"name": "http", "containerPort": 8080},
                              {"name": "grpc", "containerPort": 9090}]}]}
    }))
    .unwrap()
}

/// The sidecar as `examples/sidecar-by-hand.yaml` adds it (no injection), reading its probes
/// from the downward-API file and running exec probes through `pods/exec`.
pub fn pod_with_hand_written_sidecar(name: &str, node: &str) -> Pod {
    let field = |name: &str, path: &str| json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}});
    let mut pod = game_pod(name, node);
    let mut value = serde_json::to_value(&pod).unwrap();
    value["metadata"]["labels"]["podprobe.io/inject"] = json!("disabled");
    value["spec"]["initContainers"] = json!([{
        "name": SIDECAR, "image": SIDECAR_IMAGE, "restartPolicy": "Always",
        "args": ["run", "--source", "file", "--exec-mode", "api"],
        "env": [field("POD_NAME", "metadata.name"), field("POD_NAMESPACE", "metadata.namespace"),
                field("POD_UID", "metadata.uid"), field("POD_IP", "status.podIP")],
        "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "readOnlyRootFilesystem": true,
                            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "podinfo", "mountPath": "/etc/podinfo", "readOnly": true}]
    }]);
    value["spec"]["volumes"] = json!([{"name": "podinfo", "downwardAPI": {"items": [
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}}]);
    pod = serde_json::from_value(value).unwrap();
    pod
}

/// `create` and `get` on pods/exec for the sidecar's account (exec over WebSocket is
/// authorized as `get`, and as `create` too where the apiserver checks both).
pub async fn allow_pods_exec(cp: &ControlPlane) {
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "podprobe-sidecar-exec", "namespace": NS},
        "rules": [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]}]
    }))
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "podprobe-sidecar-exec", "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "podprobe-sidecar-exec"},
        "subjects": [{"kind": "ServiceAccount", "name": "podprobe-sidecar", "namespace": NS}]
    }))
    .unwrap();
    let pp = PostParams::default();
    Api::<Role>::namespaced(cp.client(), NS)
        .create(&pp, &role)
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(cp.client(), NS)
        .create(&pp, &binding)
        .await
        .unwrap();
}

/// The service-account token the kubelet projected for the pod's sidecar, read where the
/// kubelet keeps the volume on the node: injection's `podprobe-api-access` (the sidecar's
/// alone), else the generated `kube-api-access-*` of a pod that keeps it everywhere.
pub fn projected_token(node: &Node, pod: &Pod) -> String {
    let uid = pod.metadata.uid.as_deref().unwrap();
    let volumes = node
        .dir()
        .join("kubelet/pods")
        .join(uid)
        .join("volumes/kubernetes.io~projected");
    let mut names: Vec<_> = std::fs::read_dir(&volumes)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n == "podprobe-api-access" || n.starts_with("kube-api-access-"))
        .collect();
    // "podprobe-…" sorts after "kube-…": the sidecar's own volume wins.
    names.sort();
    let volume = names
        .pop()
        .map(|n| volumes.join(n))
        .unwrap_or_else(|| panic!("no token volume in {}", volumes.display()));
    std::fs::read_to_string(volume.join("token")).unwrap()
}

/// The workspace: where a user runs the README's and the recipes' commands from.
pub fn workspace() -> &'static std::path::Path {
    std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The `sh` blocks under the README's `## {heading}` (its `###` subsections included), in
/// order: the commands a user copies, run as written.
pub fn readme_blocks(heading: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(workspace().join("README.md")).expect("README.md");
    let section = readme
        .split_once(&format!("\n## {heading}\n"))
        .unwrap_or_else(|| panic!("README.md has a section {heading:?}"))
        .1;
    let section = section.split_once("\n## ").map_or(section, |(s, _)| s);
    section
        .split("```sh\n")
        .skip(1)
        .map(|block| {
            block
                .split_once("\n```")
                .expect("the sh block ends")
                .0
                .to_owned()
        })
        .collect()
}

/// The chart's default images: the manager's and the injected sidecar's.
pub fn chart_default_images() -> (String, String) {
    let path = super::cluster::chart_dir().join("values.yaml");
    let values: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let manager = format!(
        "{}:{}",
        values["image"]["repository"].as_str().unwrap(),
        values["image"]["tag"].as_str().unwrap()
    );
    let sidecar = values["injection"]["config"]["image"]
        .as_str()
        .unwrap()
        .to_owned();
    (manager, sidecar)
}

/// Runs `script` as a user's shell would from a clone: in the workspace, with the tools built
/// here first on `PATH` and the cluster's admin kubeconfig; its stdout, or a panic with its
/// output unless it succeeded.
pub fn run_as_user(cp: &ControlPlane, node: &testkit::real::Node, script: &str) -> String {
    let helm = cp.helm().unwrap();
    let mut shell = std::process::Command::new("bash");
    shell
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(workspace())
        .stdin(std::process::Stdio::null());
    for (key, value) in helm.get_envs() {
        if let Some(value) = value {
            shell.env(key, value);
        }
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let plugin = testkit::workspace::binary("kubectl-podprobe", "kubectl-podprobe");
    let mut dirs = vec![
        testkit::real::tools::bin_dir().unwrap().to_path_buf(),
        // As `cargo install --path kubectl-podprobe` leaves it: kubectl finds its plugin there.
        plugin.parent().unwrap().to_path_buf(),
    ];
    dirs.extend(std::env::split_paths(&path));
    shell.env("PATH", std::env::join_paths(dirs).unwrap());
    let out = shell.output().expect("run bash");
    if !out.status.success() {
        let described = cp
            .kubectl()
            .unwrap()
            .args(["describe", "pods", "-n", super::cluster::RELEASE_NS])
            .output()
            .expect("run kubectl");
        panic!(
            "the user's commands failed ({}):\n{script}\nstdout: {}\nstderr: {}\n{}\nkube-scheduler: {}\nkubelet: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&described.stdout),
            cp.scheduler_log_tail(30),
            node.kubelet_log_tail(30)
        );
    }
    String::from_utf8(out.stdout).unwrap()
}
