//! The field validation kube-apiserver applies that podprobe's writes can run into, with the
//! real server's messages (k8s.io/kubernetes v1.37 `pkg/apis/core/validation`): pod condition
//! types on status updates (`validatePodConditions`: every type but PodScheduled, Ready and
//! Initialized must be a qualified name).

use serde_json::Value;

/// One `field.Invalid`: the path, the offending value (as Go's `%q` prints it) and why.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub field: String,
    pub value: String,
    pub detail: String,
}

const QUALIFIED_PART: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const DNS_SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

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

fn is_qualified_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// apimachinery's `IsQualifiedName`, with its messages.
fn qualified_name_errors(value: &str) -> Vec<String> {
    let (prefix, name) = match value.split('/').collect::<Vec<_>>().as_slice() {
        [name] => (None, *name),
        [prefix, name] => (Some(*prefix), *name),
        _ => {
            return vec![format!(
                "a qualified name {QUALIFIED_PART} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )];
        }
    };
    let mut errors = Vec::new();
    match prefix {
        Some("") => errors.push("prefix part must be non-empty".to_owned()),
        Some(p) if !is_dns_subdomain(p) => errors.push(format!("prefix part {DNS_SUBDOMAIN}")),
        _ => {}
    }
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        errors.push("name part must be no more than 63 characters".to_owned());
    }
    if !name.is_empty() && !is_qualified_part(name) {
        errors.push(format!("name part {QUALIFIED_PART}"));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert_eq!(errors[0].detail, format!("name part {QUALIFIED_PART}"));
        assert_eq!(errors[1].field, "status.conditions[4].Type");
        assert!(
            errors[1]
                .detail
                .starts_with("prefix part a lowercase RFC 1123")
        );
    }
}
