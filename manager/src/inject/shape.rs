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
//! bound yet, so "may run on a virtual node" is read from what a pod must carry to get there:
//! a toleration of the virtual node's taint (or of every taint), or a `type: virtual-kubelet`
//! node selector, the label the library gives its nodes.

use k8s_openapi::api::core::v1::PodSpec;

use crate::config::{InjectionConfig, PodShapeChoice};

/// The label the virtual-kubelet library puts on its nodes.
const VIRTUAL_NODE_LABEL: (&str, &str) = ("type", "virtual-kubelet");

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

/// The shape `spec` gets under `config`.
pub fn of(spec: &PodSpec, config: &InjectionConfig) -> Shape {
    match config.pod_shape {
        PodShapeChoice::Kubelet => Shape::Kubelet,
        PodShapeChoice::VirtualNode => Shape::VirtualNode,
        PodShapeChoice::Auto if may_run_on_a_virtual_node(spec, &config.virtual_node_taints) => {
            Shape::VirtualNode
        }
        PodShapeChoice::Auto => Shape::Kubelet,
    }
}

/// Why `spec` gets its shape, for `podprobe-manager render`.
pub fn explain(spec: &PodSpec, config: &InjectionConfig) -> &'static str {
    match (config.pod_shape, of(spec, config)) {
        (PodShapeChoice::Kubelet | PodShapeChoice::VirtualNode, _) => "set by podShape",
        (PodShapeChoice::Auto, Shape::VirtualNode) => {
            "podShape auto: the pod tolerates a virtualNodeTaints key or selects type=virtual-kubelet nodes"
        }
        (PodShapeChoice::Auto, Shape::Kubelet) => {
            "podShape auto: the pod tolerates no virtualNodeTaints key and selects no type=virtual-kubelet nodes"
        }
    }
}

fn may_run_on_a_virtual_node(spec: &PodSpec, taints: &[String]) -> bool {
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
    tolerated || selected
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
        ];
        for (spec, want) in cases {
            assert_eq!(of(&spec, &auto), want, "{spec:?}");
        }
    }

    #[test]
    fn an_explicit_choice_wins() {
        let virtual_spec = tolerating(Some("virtual-kubelet.io/provider"), "Exists");
        assert_eq!(
            of(&virtual_spec, &config(PodShapeChoice::Kubelet)),
            Shape::Kubelet
        );
        assert_eq!(
            of(&PodSpec::default(), &config(PodShapeChoice::VirtualNode)),
            Shape::VirtualNode
        );
    }
}
