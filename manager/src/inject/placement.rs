//! Whether kube-scheduler may place a pod on a given virtual node, read as it reads it:
//! `nodeSelector`, the required node affinity, and the node's `NoSchedule`/`NoExecute` taints
//! against the pod's tolerations. A pod bound at creation (`spec.nodeName`) is placed by no
//! scheduler; its shape is read from what it carries, as before. The shape decision uses it
//! for the virtual nodes the cluster has at admission, so that a pod that reaches one by
//! affinity, or an untainted one by default, gets the shape its provider accepts.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Taint, Toleration,
};

/// What placement reads of a virtual node: kept small, since the webhook holds every one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VirtualNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
}

/// The label the virtual-kubelet library puts on its nodes.
pub const VIRTUAL_NODE_LABEL: (&str, &str) = ("type", "virtual-kubelet");

impl VirtualNode {
    /// `node` if it is a virtual node: labelled `type=virtual-kubelet`, or tainted with one of
    /// `virtual_taints` (the chart's `virtualNodeTaints`).
    pub fn of(node: &Node, virtual_taints: &[String]) -> Option<VirtualNode> {
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        let (label, value) = VIRTUAL_NODE_LABEL;
        let labelled = labels.get(label).is_some_and(|v| v == value);
        let tainted = taints.iter().any(|t| virtual_taints.contains(&t.key));
        (labelled || tainted).then(|| VirtualNode {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels,
            taints,
        })
    }

    /// Whether kube-scheduler may place a pod of `spec` on this node. A pod bound at creation
    /// (`spec.nodeName`) is placed by no scheduler: never.
    pub fn admits(&self, spec: &PodSpec) -> bool {
        if spec.node_name.is_some() {
            return false;
        }
        let selected = spec
            .node_selector
            .iter()
            .flatten()
            .all(|(k, v)| self.labels.get(k) == Some(v));
        // The terms are ORed; a term matches when all of its requirements do.
        let affine = required_terms(spec)
            .is_none_or(|terms| terms.iter().any(|term| self.matches_term(term)));
        let tolerations = spec.tolerations.as_deref().unwrap_or_default();
        let tolerated = self
            .taints
            .iter()
            .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
            .all(|t| tolerations.iter().any(|tol| tolerates(tol, t)));
        selected && affine && tolerated
    }

    fn matches_term(&self, term: &NodeSelectorTerm) -> bool {
        let expressions = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        // An empty term selects no node (as the scheduler reads it).
        if expressions.is_empty() && fields.is_empty() {
            return false;
        }
        let name = BTreeMap::from([("metadata.name".to_owned(), self.name.clone())]);
        expressions.iter().all(|r| requirement(r, &self.labels))
            && fields.iter().all(|r| requirement(r, &name))
    }
}

/// The terms of the pod's required node affinity, if it has one.
pub fn required_terms(spec: &PodSpec) -> Option<&[NodeSelectorTerm]> {
    let affinity = spec.affinity.as_ref()?.node_affinity.as_ref()?;
    let required = affinity
        .required_during_scheduling_ignored_during_execution
        .as_ref()?;
    Some(&required.node_selector_terms)
}

/// One node selector requirement against `values` (labels, or `metadata.name`).
fn requirement(r: &NodeSelectorRequirement, values: &BTreeMap<String, String>) -> bool {
    let value = values.get(&r.key);
    let listed = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    let compare = |order: std::cmp::Ordering| match (value, listed) {
        (Some(v), [bound]) => match (number(v), number(bound)) {
            (Some(v), Some(bound)) => v.cmp(&bound) == order,
            _ => false,
        },
        _ => false,
    };
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| listed.contains(v)),
        "NotIn" => value.is_none_or(|v| !listed.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => compare(std::cmp::Ordering::Greater),
        "Lt" => compare(std::cmp::Ordering::Less),
        _ => false,
    }
}

/// Whether `toleration` tolerates `taint`, as the scheduler's `ToleratesTaint`.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    let operator = toleration.operator.as_deref().unwrap_or("Equal");
    if key.is_empty() {
        // No key with `Exists` tolerates every taint.
        return operator == "Exists";
    }
    if key != taint.key {
        return false;
    }
    match operator {
        "Exists" => true,
        "Equal" => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, labels: serde_json::Value, taints: serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints}
        }))
        .unwrap()
    }

    fn spec(v: serde_json::Value) -> PodSpec {
        let mut v = v;
        v["containers"] = json!([{"name": "game"}]);
        serde_json::from_value(v).unwrap()
    }

    const TAINTS: &[&str] = &["virtual-kubelet.io/provider"];

    fn taints() -> Vec<String> {
        TAINTS.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_virtual_node_is_labelled_or_tainted_so() {
        let labelled = node("vk", json!({"type": "virtual-kubelet"}), json!([]));
        let tainted = node(
            "aci",
            json!({}),
            json!([{"key": "virtual-kubelet.io/provider", "value": "azure", "effect": "NoSchedule"}]),
        );
        let kubelet = node("n1", json!({"kubernetes.io/os": "linux"}), json!([]));
        assert!(VirtualNode::of(&labelled, &taints()).is_some());
        assert!(VirtualNode::of(&tainted, &taints()).is_some());
        assert!(VirtualNode::of(&kubelet, &taints()).is_none());
    }

    #[test]
    fn placement_reads_node_name_selector_affinity_and_taints() {
        let untainted = VirtualNode::of(
            &node(
                "vk-0",
                json!({"type": "virtual-kubelet", "zone": "3"}),
                json!([]),
            ),
            &taints(),
        )
        .unwrap();
        let tainted = VirtualNode::of(
            &node(
                "vk-1",
                json!({"type": "virtual-kubelet"}),
                json!([{"key": "virtual-kubelet.io/provider", "value": "azure", "effect": "NoSchedule"},
                       {"key": "soft", "effect": "PreferNoSchedule"}]),
            ),
            &taints(),
        )
        .unwrap();
        let affinity = |terms: serde_json::Value| {
            spec(json!({"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}))
        };
        let cases = [
            ("nothing asked", spec(json!({})), true, false),
            (
                "bound elsewhere",
                spec(json!({"nodeName": "n1"})),
                false,
                false,
            ),
            (
                "bound there, by no scheduler",
                spec(json!({"nodeName": "vk-0"})),
                false,
                false,
            ),
            (
                "selector of another label",
                spec(json!({"nodeSelector": {"pool": "games"}})),
                false,
                false,
            ),
            (
                "affinity by name",
                affinity(
                    json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["vk-0"]}]}]),
                ),
                true,
                false,
            ),
            (
                "affinity away from virtual nodes",
                affinity(
                    json!([{"matchExpressions": [{"key": "type", "operator": "NotIn", "values": ["virtual-kubelet"]}]}]),
                ),
                false,
                false,
            ),
            (
                "second term matches",
                affinity(
                    json!([{"matchExpressions": [{"key": "pool", "operator": "Exists"}]},
                                {"matchExpressions": [{"key": "zone", "operator": "Gt", "values": ["2"]}]}]),
                ),
                true,
                false,
            ),
            (
                "Lt the other way",
                affinity(
                    json!([{"matchExpressions": [{"key": "zone", "operator": "Lt", "values": ["2"]}]}]),
                ),
                false,
                false,
            ),
            ("an empty term", affinity(json!([{}])), false, false),
            (
                "the taint tolerated by key and value",
                spec(
                    json!({"tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "azure"}]}),
                ),
                true,
                true,
            ),
            (
                "another value",
                spec(
                    json!({"tolerations": [{"key": "virtual-kubelet.io/provider", "value": "aws"}]}),
                ),
                true,
                false,
            ),
            (
                "another effect",
                spec(
                    json!({"tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoExecute"}]}),
                ),
                true,
                false,
            ),
            (
                "every taint",
                spec(json!({"tolerations": [{"operator": "Exists"}]})),
                true,
                true,
            ),
        ];
        for (what, spec, on_untainted, on_tainted) in cases {
            assert_eq!(untainted.admits(&spec), on_untainted, "{what}: untainted");
            assert_eq!(tainted.admits(&spec), on_tainted, "{what}: tainted");
        }
    }
}
