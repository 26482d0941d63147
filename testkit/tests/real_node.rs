//! The node harness itself on a real control plane: a pod runs through kubelet → containerd
//! → runc with images imported from local archives, reaches the apiserver through the
//! `kubernetes` Service from its own network namespace, and stopping the node leaves no
//! task, shim, mount or cgroup behind.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{LogParams, PostParams};
use serde_json::json;
use testkit::real::node::images::GAMESERVER_IMAGE;
use testkit::real::{ControlPlane, Node, NodeNetwork, NodeOptions};

async fn wait_phase(node: &Node, pods: &Api<Pod>, name: &str, phase: &str) -> Pod {
    let wait = async {
        loop {
            let pod = pods.get(name).await.unwrap();
            if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase) {
                return pod;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    match tokio::time::timeout(Duration::from_secs(90), wait).await {
        Ok(pod) => pod,
        Err(_) => panic!(
            "pod {name} did not reach {phase}: {:?}\nthe kubelet's log ends:\n{}",
            pods.get(name).await.unwrap().status,
            node.kubelet_log_tail(40)
        ),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_runs_on_the_node_and_stopping_leaves_nothing() {
    let network = NodeNetwork::create().unwrap();
    let mut cp = ControlPlane::start_on(network.host_ip()).await.unwrap();
    let node = Node::start(&mut cp, network, NodeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("node: {e}"));

    // The container asks the apiserver's /version through the Service address the kubelet
    // put in its environment, with the mounted token: the path an in-pod client takes.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "probe-net"},
        "spec": {"nodeName": node.name(), "restartPolicy": "Never",
                 "containers": [{"name": "c", "image": GAMESERVER_IMAGE,
                    "command": ["sh", "-c",
                      "echo service=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT; \
                       cat /proc/self/cgroup | grep memory; \
                       test -s /var/run/secrets/kubernetes.io/serviceaccount/token && echo token-mounted"]}]}
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(cp.client(), "default");
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let done = wait_phase(&node, &pods, "probe-net", "Succeeded").await;
    let ip = done.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap();
    assert!(
        node.network().holds_pod_ip(&ip),
        "pod IP {ip} from the node's bridge"
    );
    let log = pods.logs("probe-net", &LogParams::default()).await.unwrap();
    // The Service addresses of this node's control plane alone (10.96.<n>.1), which the host
    // routes to this node: another node test beside this one has its own.
    let service = cp.service_range().kubernetes_ip();
    assert!(log.contains(&format!("service={service}:443")), "{log}");
    assert!(log.contains("token-mounted"), "{log}");
    assert!(
        log.contains(&node.cgroup_root()),
        "container cgroup under the node's root: {log}"
    );

    let leftovers = node.stop(&cp).await.unwrap();
    assert!(
        leftovers.is_empty(),
        "left after a clean stop: {leftovers:?}"
    );
}
