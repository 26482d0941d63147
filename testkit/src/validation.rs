//! The field validation kube-apiserver applies that podprobe's writes can run into, with the
//! real server's messages (k8s.io/kubernetes v1.37 `pkg/apis/core/validation`): pod condition
//! types on status updates (`validatePodConditions`: every type but PodScheduled, Ready and
//! Initialized must be a qualified name). The name rule itself is apimachinery's as
//! `podprobe-protocol` implements it, word for word; `tests/differential.rs` holds both to the
//! real server's answers.

use podprobe_protocol::names::qualified_name_errors;
use serde_json::Value;

/// One `field.Invalid`: the path, the offending value (as Go's `%q` prints it) and why.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub field: String,
    pub value: String,
    pub detail: String,
}

/// Errors of a pod status update's conditions.
pub fn pod_status_errors(pod: &Value) -> Vec<FieldError> {
    let conditions = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut errors = Vec::new();
    for (i, condition) in conditions.iter().enumerate() {
        let type_ = condition["type"].as_str().unwrap_or_default();
        if matches!(type_, "PodScheduled" | "Ready" | "Initialized") {
            continue;
        }
        for detail in qualified_name_errors(type_) {
            errors.push(FieldError {
                field: format!("status.conditions[{i}].Type"),
                value: format!("{type_:?}"),
                detail,
            });
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use podprobe_protocol::names::QUALIFIED_PART_RULE;
    use serde_json::json;

    #[test]
    fn the_real_servers_verdict_on_condition_types() {
        let pod = json!({"status": {"conditions": [
            {"type": "game.kruise.io/fine"}, {"type": "not a qualified name!"},
            {"type": "Ready"}, {"type": "ContainersReady"}, {"type": "Bad.Prefix/x"}
        ]}});
        let errors = pod_status_errors(&pod);
        assert_eq!(errors.len(), 2, "{errors:?}");
        // As kube-apiserver v1.37 answered tests/real_sidecar.rs.
        assert_eq!(errors[0].field, "status.conditions[1].Type");
        assert_eq!(errors[0].value, "\"not a qualified name!\"");
        assert_eq!(errors[0].detail, format!("name part {QUALIFIED_PART_RULE}"));
        assert_eq!(errors[1].field, "status.conditions[4].Type");
        assert!(
            errors[1]
                .detail
                .starts_with("prefix part a lowercase RFC 1123")
        );
    }
}
