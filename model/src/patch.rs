//! RFC 6902 JSON patch operations, as carried by an AdmissionReview response.
//!
//! Our own small type keeps the patches comparable byte-for-byte in tests; [`to_json_patch`]
//! converts to the `json_patch` type that `kube::core::admission::AdmissionResponse::with_patch`
//! takes, and [`apply`] applies them locally (the CLI's `render`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One JSON patch operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum PatchOp {
    Add { path: String, value: Value },
    Replace { path: String, value: Value },
    Remove { path: String },
}

/// A patch that could not be converted or applied; always a bug in the patch builder or a
/// document that changed shape between building and applying.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("invalid JSON patch: {0}")]
    Invalid(#[from] serde_json::Error),
    #[error("JSON patch does not apply: {0}")]
    Apply(#[from] json_patch::PatchError),
}

/// RFC 6901 escaping of one path segment: annotation keys such as `kruise.io/podprobe`
/// contain `/`.
pub fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// `/a/b` from unescaped segments.
pub fn pointer(segments: &[&str]) -> String {
    segments.iter().map(|s| format!("/{}", escape(s))).collect()
}

pub fn to_json_patch(ops: &[PatchOp]) -> Result<json_patch::Patch, PatchError> {
    Ok(serde_json::from_value(serde_json::to_value(ops)?)?)
}

pub fn apply(doc: &mut Value, ops: &[PatchOp]) -> Result<(), PatchError> {
    let patch = to_json_patch(ops)?;
    json_patch::patch(doc, &patch)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pointer_escapes_tilde_before_slash() {
        assert_eq!(
            pointer(&["metadata", "annotations", "kruise.io/a~b"]),
            "/metadata/annotations/kruise.io~1a~0b"
        );
    }

    #[test]
    fn ops_serialize_as_rfc6902_and_apply() {
        let ops = vec![
            PatchOp::Add {
                path: "/a~1b".into(),
                value: json!(1),
            },
            PatchOp::Remove { path: "/c".into() },
        ];
        assert_eq!(
            serde_json::to_string(&ops).unwrap(),
            r#"[{"op":"add","path":"/a~1b","value":1},{"op":"remove","path":"/c"}]"#
        );
        let mut doc = json!({"c": true});
        apply(&mut doc, &ops).unwrap();
        assert_eq!(doc, json!({"a/b": 1}));
        assert!(apply(&mut doc, &[PatchOp::Remove { path: "/zz".into() }]).is_err());
    }
}
