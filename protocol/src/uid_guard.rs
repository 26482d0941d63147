//! The uid guard of podprobe's patches, as kube-apiserver answers it.
//!
//! Both binaries put the pod's `metadata.uid` into their strategic-merge patches (the sidecar's
//! status writes, the manager's markers) so that a same-named replacement pod is never written
//! from the old pod's state. A PATCH carries no preconditions: the apiserver applies the patch
//! and then refuses the differing uid as a change of an immutable field, `422 Pod "x" is
//! invalid: metadata.uid: Invalid value: "...": field is immutable`, not with 409 (the 409
//! "Precondition failed: UID in precondition" belongs to DELETE options).

use kube_core::Status;

/// Whether a refusal is the uid guard's: the pod was replaced by a same-named one (or, as some
/// servers answer, a 409 conflict on it).
pub fn refused_by_uid_guard(status: &Status) -> bool {
    match status.code {
        409 => true,
        422 => status
            .details
            .as_ref()
            .is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid")),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::refused_by_uid_guard;

    fn status(json: serde_json::Value) -> kube_core::Status {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn kube_apiservers_answer_to_a_replaced_pod() {
        // As kube-apiserver v1.37 answered the real replacement test (tests/real_sidecar.rs).
        let replaced = status(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid",
            "code": 422,
            "message": "Pod \"gs-r\" is invalid: metadata.uid: Invalid value: \"9d818f45-4406-4d3a-bcf0-2a117a099d38\": field is immutable",
            "details": {"name": "gs-r", "kind": "Pod", "causes": [{"reason": "FieldValueInvalid",
                "message": "Invalid value: \"9d818f45-4406-4d3a-bcf0-2a117a099d38\": field is immutable",
                "field": "metadata.uid"}]}
        }));
        assert!(refused_by_uid_guard(&replaced));
        let invalid_condition = status(serde_json::json!({
            "status": "Failure", "reason": "Invalid", "code": 422,
            "message": "Pod \"p\" is invalid: status.conditions[1].type: Invalid value",
            "details": {"causes": [{"field": "status.conditions[1].type"}]}
        }));
        assert!(!refused_by_uid_guard(&invalid_condition));
        assert!(refused_by_uid_guard(&status(
            serde_json::json!({"status": "Failure", "code": 409})
        )));
        assert!(!refused_by_uid_guard(&status(
            serde_json::json!({"status": "Failure", "code": 403})
        )));
    }
}
