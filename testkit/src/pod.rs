//! What the tests read off a pod: a condition, its status, a label, an annotation.

use k8s_openapi::api::core::v1::{Pod, PodCondition};

/// The pod's condition of type `type_`, if it has one.
pub fn condition<'a>(pod: &'a Pod, type_: &str) -> Option<&'a PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// The status (`True`, `False`, `Unknown`) of the pod's condition `type_`, if it has one.
pub fn condition_status(pod: &Pod, type_: &str) -> Option<String> {
    condition(pod, type_).map(|c| c.status.clone())
}

/// The pod has condition `type_` with `status`.
pub fn has_status(pod: &Pod, type_: &str, status: &str) -> bool {
    condition(pod, type_).is_some_and(|c| c.status == status)
}

pub fn label(pod: &Pod, key: &str) -> Option<String> {
    pod.metadata.labels.as_ref()?.get(key).cloned()
}

pub fn annotation(pod: &Pod, key: &str) -> Option<String> {
    pod.metadata.annotations.as_ref()?.get(key).cloned()
}
