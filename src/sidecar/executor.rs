//! Whether this sidecar or OpenKruise's kruise-daemon probes the pod, where both could.
//!
//! kruise-manager (with `EnablePodProbeMarkerOnServerless`) leaves a pod's probes to an in-pod
//! executor only when the pod's node is labelled `type=virtual-kubelet`; on any other node it
//! puts them in that node's NodePodProbe and kruise-daemon runs them. A sidecar on such a node
//! would run the same probes again and write the same conditions, so with
//! `--only-on-virtual-nodes` (which injection sets in companion mode) it stands down there.
//! The node is only known once the pod is bound, which is why this is decided by the running
//! sidecar and not at admission.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};

/// The label kruise-manager classifies nodes by (`pkg/util/virtual_kubelet.go`).
const VIRTUAL_NODE_LABEL: (&str, &str) = ("type", "virtual-kubelet");
/// Reads of the node before the sidecar gives up and probes (transient errors only).
const ATTEMPTS: u32 = 6;
const FIRST_RETRY: Duration = Duration::from_millis(250);
const LAST_RETRY: Duration = Duration::from_secs(8);

/// Who probes the pod, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Executor {
    /// This sidecar.
    Sidecar { why: String },
    /// kruise-daemon on `node`: the sidecar stands down.
    KruiseDaemon { node: String },
}

/// Decides for the pod on node `node` (`NODE_NAME`; `None` when not given). When the node
/// cannot be read the sidecar probes: two executors writing the same results is the lesser
/// harm next to a pod nobody probes.
pub async fn decide(client: &Client, node: Option<&str>) -> Executor {
    let Some(node) = node.filter(|n| !n.is_empty()) else {
        return Executor::Sidecar {
            why: "NODE_NAME is not set, so the node is unknown (set it from the downward API, \
                  fieldPath: spec.nodeName)"
                .into(),
        };
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let mut wait = FIRST_RETRY;
    let mut attempt = 1;
    let read = loop {
        match nodes.get_metadata(node).await {
            Ok(read) => break Ok(read),
            Err(e) if attempt < ATTEMPTS && transient(&e) => {
                tracing::debug!(
                    "reading node {node} (attempt {attempt}): {e}; retrying in {wait:?}"
                );
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(LAST_RETRY);
                attempt += 1;
            }
            Err(e) => break Err(e),
        }
    };
    match read {
        Ok(read) => classify(node, read.metadata.labels.as_ref()),
        Err(e) => Executor::Sidecar {
            why: format!(
                "node {node} cannot be read ({e}; the sidecar's account needs `get nodes`, \
                 which the chart grants in companion mode): if kruise-daemon runs there, it \
                 probes this pod too"
            ),
        },
    }
}

fn classify(node: &str, labels: Option<&std::collections::BTreeMap<String, String>>) -> Executor {
    let (key, value) = VIRTUAL_NODE_LABEL;
    match labels.and_then(|l| l.get(key)) {
        Some(v) if v == value => Executor::Sidecar {
            why: format!(
                "node {node} is labelled {key}={value}: OpenKruise leaves its pods' probes to \
                 an in-pod executor"
            ),
        },
        _ => Executor::KruiseDaemon {
            node: node.to_owned(),
        },
    }
}

/// Errors a later read may not meet: the apiserver unreachable or busy.
fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn only_a_type_virtual_kubelet_node_is_the_sidecars() {
        let labels = |v: &str| BTreeMap::from([("type".to_owned(), v.to_owned())]);
        assert!(matches!(
            classify("vk", Some(&labels("virtual-kubelet"))),
            Executor::Sidecar { .. }
        ));
        for other in [Some(labels("kubelet")), Some(BTreeMap::new()), None] {
            assert_eq!(
                classify("node-1", other.as_ref()),
                Executor::KruiseDaemon {
                    node: "node-1".into()
                }
            );
        }
    }

    #[tokio::test]
    async fn without_a_node_name_the_sidecar_probes() {
        // Never used: no node name means no request.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        for node in [None, Some("")] {
            let decided = decide(&client, node).await;
            assert!(
                matches!(&decided, Executor::Sidecar { why } if why.contains("NODE_NAME")),
                "{decided:?}"
            );
        }
    }
}
