//! Which shape the injected pod takes: one for kubelet nodes, one every virtual-kubelet provider
//! accepts.
//!
//! A kubelet resolves every downward-API field and volume, so there the sidecar reads its probes
//! from a downward-API file (`PODPROBE_SOURCE=file`: no watch on the apiserver, the pod read
//! only when probing needs its containers' status) and learns its IP from `status.podIP`.
//! Virtual-kubelet providers are narrower, in their own code:
//! - the virtual-kubelet library resolves env `fieldRef`s itself and knows `metadata.*` and
//!   `spec.nodeName`/`spec.serviceAccountName` only: `status.podIP` fails the pod ("unsupported
//!   fieldPath");
//! - azure-aci accepts no `downwardAPI` volume, refuses `args` without a `command`, and refuses
//!   init containers with resources (so no native sidecar).
//!
//! So a pod that may run on a virtual node gets the sidecar as a plain container, without the
//! downward-API volume and `POD_IP`, reading its probes and its IP from the apiserver (source
//! `api`). The shape works on kubelet nodes too; it costs a watch per pod there, which is why
//! pods that can only run on kubelet nodes keep the cheaper one. At admission the pod is not
//! bound yet, so "may run on a virtual node" is read two ways, either of which suffices:
//! - from what a pod must carry to get to one: a toleration of a virtual node's taint (or of
//!   every taint), or a `type: virtual-kubelet` node selector or required node affinity, the
//!   label the library gives its nodes; this holds for virtual nodes that do not exist yet;
//! - for a pod that picks its nodes (a node selector or a required node affinity), from the
//!   virtual nodes the cluster has (the webhook watches nodes): one among them that
//!   kube-scheduler may place the pod on ([`super::placement`]), by its labels or its name, an
//!   untainted one included. A pod that picks no node, or is bound at creation
//!   (`spec.nodeName`), is read the first way only: kubelet nodes labelled `type=virtual-kubelet`
//!   (for markers) would otherwise send every pod the virtual-node shape.
//!
//! A toleration another webhook adds after this one is seen only if the apiserver calls this
//! webhook again and the sidecar is not injected yet: the shape is decided once.

use k8s_openapi::api::core::v1::PodSpec;

use super::placement::{VIRTUAL_NODE_LABEL, VirtualNode, required_terms};
use crate::config::{InjectionConfig, PodShapeChoice};

/// The shape of one injected pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Native sidecar where supported, downward-API volume, `POD_IP` from `status.podIP`.
    Kubelet,
    /// Plain container, no downward-API volume or `status.*` field, probes from the apiserver.
    VirtualNode,
}

impl Shape {
    pub fn as_str(self) -> &'static str {
        match self {
            Shape::Kubelet => "kubelet",
            Shape::VirtualNode => "virtual-node",
        }
    }
}

/// Why `auto` gives a pod the virtual-node shape.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reason {
    /// A toleration, selector or affinity only a virtual node's pods carry.
    Carries,
    /// The cluster's virtual node of this name may run it.
    Placeable(String),
}

/// The shape `spec` gets under `config`, with `virtual_nodes` the cluster's virtual nodes as
/// the webhook knows them (none for `render`, which reads no cluster).
pub fn of(spec: &PodSpec, config: &InjectionConfig, virtual_nodes: &[VirtualNode]) -> Shape {
    match config.pod_shape {
        PodShapeChoice::Kubelet => Shape::Kubelet,
        PodShapeChoice::VirtualNode => Shape::VirtualNode,
        PodShapeChoice::Auto => match reason(spec, config, virtual_nodes) {
            Some(_) => Shape::VirtualNode,
            None => Shape::Kubelet,
        },
    }
}

/// Why `spec` gets its shape, for `podprobe-manager render` and the webhook's log.
pub fn explain(spec: &PodSpec, config: &InjectionConfig, virtual_nodes: &[VirtualNode]) -> String {
    if config.pod_shape != PodShapeChoice::Auto {
        return "set by podShape".into();
    }
    match reason(spec, config, virtual_nodes) {
        Some(Reason::Carries) => "podShape auto: the pod tolerates a virtualNodeTaints key or selects type=virtual-kubelet nodes".into(),
        Some(Reason::Placeable(node)) => format!(
            "podShape auto: kube-scheduler may place the pod on the virtual node {node} (its name, labels and taints admit it)"
        ),
        None if !picks_nodes(spec) => "podShape auto: the pod tolerates no virtualNodeTaints key and picks no nodes".into(),
        None => format!(
            "podShape auto: the pod tolerates no virtualNodeTaints key, selects no type=virtual-kubelet nodes, and none of the {} virtual nodes known admits it",
            virtual_nodes.len()
        ),
    }
}

fn reason(
    spec: &PodSpec,
    config: &InjectionConfig,
    virtual_nodes: &[VirtualNode],
) -> Option<Reason> {
    if carries_what_a_virtual_node_needs(spec, &config.virtual_node_taints) {
        return Some(Reason::Carries);
    }
    // Only a pod that picks its nodes: one that picks none is, on a cluster whose kubelet
    // nodes carry `type=virtual-kubelet` for markers, no more bound for a virtual node than
    // for any other, and the kubelet shape is the one a kubelet node wants.
    if !picks_nodes(spec) {
        return None;
    }
    virtual_nodes
        .iter()
        .find(|n| n.admits(spec))
        .map(|n| Reason::Placeable(n.name.clone()))
}

/// Whether `spec` restricts its nodes: a node selector or a required node affinity.
fn picks_nodes(spec: &PodSpec) -> bool {
    spec.node_selector.as_ref().is_some_and(|s| !s.is_empty())
        || required_terms(spec).is_some_and(|terms| !terms.is_empty())
}

fn carries_what_a_virtual_node_needs(spec: &PodSpec, taints: &[String]) -> bool {
    let tolerated = spec.tolerations.iter().flatten().any(|t| match &t.key {
        Some(key) if !key.is_empty() => taints.contains(key),
        // No key with `Exists` tolerates every taint.
        _ => t.operator.as_deref() == Some("Exists"),
    });
    let (label, value) = VIRTUAL_NODE_LABEL;
    let selected = spec
        .node_selector
        .as_ref()
        .and_then(|s| s.get(label))
        .is_some_and(|v| v == value);
    // A term (they are ORed) that asks for the label.
    let affine = required_terms(spec).is_some_and(|terms| {
        terms.iter().any(|term| {
            term.match_expressions.iter().flatten().any(|e| {
                e.key == label
                    && e.operator == "In"
                    && e.values.iter().flatten().any(|v| v == value)
            })
        })
    });
    tolerated || selected || affine
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Toleration;

    fn config(choice: PodShapeChoice) -> InjectionConfig {
        let mut c = InjectionConfig::from_yaml("image: podprobe:dev\n", "t").unwrap();
        c.pod_shape = choice;
        c
    }

    fn tolerating(key: Option<&str>, operator: &str) -> PodSpec {
        PodSpec {
            tolerations: Some(vec![Toleration {
                key: key.map(String::from),
                operator: Some(operator.into()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn auto_reads_what_a_pod_needs_to_reach_a_virtual_node() {
        let auto = config(PodShapeChoice::Auto);
        let cases = [
            (PodSpec::default(), Shape::Kubelet),
            (
                tolerating(Some("virtual-kubelet.io/provider"), "Exists"),
                Shape::VirtualNode,
            ),
            (
                tolerating(Some("virtual-node.interlink/no-schedule"), "Equal"),
                Shape::VirtualNode,
            ),
            (tolerating(None, "Exists"), Shape::VirtualNode),
            (
                tolerating(Some("node.kubernetes.io/not-ready"), "Exists"),
                Shape::Kubelet,
            ),
            (
                PodSpec {
                    node_selector: Some([("type".into(), "virtual-kubelet".into())].into()),
                    ..Default::default()
                },
                Shape::VirtualNode,
            ),
            (
                serde_json::from_value(serde_json::json!({
                    "containers": [],
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                        {"nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
                            {"matchExpressions": [{"key": "type", "operator": "In", "values": ["virtual-kubelet"]}]}]}}}
                }))
                .unwrap(),
                Shape::VirtualNode,
            ),
        ];
        for (spec, want) in cases {
            assert_eq!(of(&spec, &auto, &[]), want, "{spec:?}");
        }
    }

    #[test]
    fn an_explicit_choice_wins() {
        let virtual_spec = tolerating(Some("virtual-kubelet.io/provider"), "Exists");
        assert_eq!(
            of(&virtual_spec, &config(PodShapeChoice::Kubelet), &[]),
            Shape::Kubelet
        );
        assert_eq!(
            of(
                &PodSpec::default(),
                &config(PodShapeChoice::VirtualNode),
                &[]
            ),
            Shape::VirtualNode
        );
    }

    #[test]
    fn auto_reads_the_virtual_nodes_the_cluster_has() {
        let auto = config(PodShapeChoice::Auto);
        let untainted: k8s_openapi::api::core::v1::Node =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "vk-0", "labels": {"type": "virtual-kubelet"}}
            }))
            .unwrap();
        let nodes = [VirtualNode::of(&untainted, &auto.virtual_node_taints).unwrap()];
        // A pod that picks the untainted one by name.
        let by_name: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["vk-0", "n1"]}]}]}}}
        }))
        .unwrap();
        assert_eq!(of(&by_name, &auto, &[]), Shape::Kubelet);
        assert_eq!(of(&by_name, &auto, &nodes), Shape::VirtualNode);
        assert!(explain(&by_name, &auto, &nodes).contains("virtual node vk-0"));
        // One that picks no node keeps the kubelet shape (kubelet nodes may carry the label).
        assert_eq!(of(&PodSpec::default(), &auto, &nodes), Shape::Kubelet);
        assert!(explain(&PodSpec::default(), &auto, &nodes).contains("picks no nodes"));
        // Nor one that picks another node.
        let elsewhere = PodSpec {
            node_selector: Some([("pool".into(), "games".into())].into()),
            ..Default::default()
        };
        assert_eq!(of(&elsewhere, &auto, &nodes), Shape::Kubelet);
        assert!(explain(&elsewhere, &auto, &nodes).contains("none of the 1 virtual nodes"));
    }
}
