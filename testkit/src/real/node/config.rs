//! The node daemons' configuration files: containerd (CRI), the CNI bridge, the kubelet and
//! kube-proxy. Every path, socket and port a node owns is inside its directory or its network
//! namespace, so several nodes (of parallel tests) never share state.

use std::net::Ipv4Addr;
use std::path::Path;

use super::images::PAUSE_IMAGE;

/// Every node's pod subnet lies in this range (each node's [`NodeNetwork::pod_subnet`]
/// is a /22 of it): kube-proxy's `--cluster-cidr`.
///
/// [`NodeNetwork::pod_subnet`]: super::NodeNetwork::pod_subnet
pub const CLUSTER_POD_CIDR: &str = "10.244.0.0/14";
/// The port the kubelet serves on (exec, logs); free in the node's own namespace.
pub const KUBELET_PORT: u16 = 10250;

/// containerd 1.6 with its CRI plugin. `restrict_oom_score_adj`: this machine refuses a
/// negative `oom_score_adj` even to root, and CRI asks -998 for sandboxes; restricted, it
/// keeps containerd's own (0). The `native` snapshotter needs no overlay support.
pub fn containerd(dir: &Path, socket: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{d}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni"
"#,
        socket = socket.display()
    )
}

/// A bridge with the node as the pods' gateway; `ipMasq` so pod traffic to the apiserver
/// (outside the namespace) leaves with the node's address, which the host can answer.
pub fn cni(dir: &Path, pod_subnet: &str) -> String {
    serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "podprobe",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": pod_subnet}]],
                      "routes": [{"dst": "0.0.0.0/0"}],
                      "dataDir": dir.join("cni-ipam")}},
            {"type": "loopback"}
        ]
    })
    .to_string()
}

/// KubeletConfiguration: cgroupfs under a cgroup root of the node's own, no eviction or
/// node-allocatable enforcement (a shared test machine), every directory in `dir`.
pub fn kubelet(
    dir: &Path,
    socket: &Path,
    node_ip: Ipv4Addr,
    cgroup_root: &str,
    ca: &Path,
) -> String {
    serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        // This machine has cgroup v1 only; Kubernetes 1.35+ refuses it unless told otherwise.
        "failCgroupV1": false,
        "failSwapOn": false,
        // As containerd: a negative oom_score_adj is refused here.
        "oomScoreAdj": 0,
        "containerRuntimeEndpoint": format!("unix://{}", socket.display()),
        "address": node_ip.to_string(),
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": ca},
        },
        "authorization": {"mode": "Webhook"},
        "podLogsDir": dir.join("pod-logs"),
        "enforceNodeAllocatable": [],
        "localStorageCapacityIsolation": false,
        "evictionHard": {"memory.available": "0%", "nodefs.available": "0%",
                         "imagefs.available": "0%", "nodefs.inodesFree": "0%"},
        "imageGCHighThresholdPercent": 100,
        "resolvConf": "",
        "makeIPTablesUtilChains": false,
        "serializeImagePulls": false,
        "syncFrequency": "5s",
        "fileCheckFrequency": "5s",
    })
    .to_string()
}
