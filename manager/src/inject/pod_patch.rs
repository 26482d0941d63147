//! The JSON patch injection builds, op by op: appends to the pod's arrays that remember
//! whether the array exists yet (a `/-` pointer into a missing array fails, and the first
//! append creates it).

use k8s_openapi::api::core::v1::PodSpec;
use serde_json::Value;

use crate::patch::PatchOp;

/// An array of the pod's spec that injection appends to.
#[derive(Debug, Clone, Copy)]
pub enum SpecArray {
    Volumes,
    InitContainers,
    ReadinessGates,
}

impl SpecArray {
    fn path(self) -> &'static str {
        match self {
            SpecArray::Volumes => "/spec/volumes",
            SpecArray::InitContainers => "/spec/initContainers",
            SpecArray::ReadinessGates => "/spec/readinessGates",
        }
    }
}

/// The ops so far, and which of the arrays exist once they are applied.
#[derive(Debug)]
pub struct PodPatch {
    pub ops: Vec<PatchOp>,
    volumes: bool,
    init_containers: bool,
    readiness_gates: bool,
}

impl PodPatch {
    /// An empty patch of a pod with `spec`.
    pub fn of(spec: &PodSpec) -> Self {
        PodPatch {
            ops: Vec::new(),
            volumes: spec.volumes.is_some(),
            init_containers: spec.init_containers.is_some(),
            readiness_gates: spec.readiness_gates.is_some(),
        }
    }

    pub fn extend(&mut self, ops: impl IntoIterator<Item = PatchOp>) {
        self.ops.extend(ops);
    }

    /// Adds `value` at `path` (a field, or `/-` of an array the pod always has).
    pub fn add(&mut self, path: &str, value: Value) {
        self.ops.push(PatchOp::Add {
            path: path.into(),
            value,
        });
    }

    /// Appends `value` to `array`, creating the array when the pod has none yet.
    pub fn append(&mut self, array: SpecArray, value: &impl serde::Serialize) {
        let exists = match array {
            SpecArray::Volumes => &mut self.volumes,
            SpecArray::InitContainers => &mut self.init_containers,
            SpecArray::ReadinessGates => &mut self.readiness_gates,
        };
        let value = serde_json::to_value(value).unwrap_or(Value::Null);
        let op = if *exists {
            PatchOp::Add {
                path: format!("{}/-", array.path()),
                value,
            }
        } else {
            PatchOp::Add {
                path: array.path().into(),
                value: Value::Array(vec![value]),
            }
        };
        *exists = true;
        self.ops.push(op);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Volume;

    #[test]
    fn the_first_append_creates_the_array_and_the_next_ones_extend_it() {
        let volume = |name: &str| Volume {
            name: name.into(),
            ..Default::default()
        };
        let mut patch = PodPatch::of(&PodSpec::default());
        patch.append(SpecArray::Volumes, &volume("a"));
        patch.append(SpecArray::Volumes, &volume("b"));
        let paths: Vec<_> = patch
            .ops
            .iter()
            .map(|op| match op {
                PatchOp::Add { path, .. } => path.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(paths, ["/spec/volumes", "/spec/volumes/-"]);
        let mut doc = serde_json::json!({"spec": {}});
        crate::patch::apply(&mut doc, &patch.ops).unwrap();
        assert_eq!(doc["spec"]["volumes"][1]["name"], "b");
    }
}
