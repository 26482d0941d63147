//! PATCH bodies: JSON patch (RFC 6902), merge patch (RFC 7386) and strategic
//! merge patch, chosen by `Content-Type`.

use serde_json::Value;

use crate::error::ApiError;
use crate::resources::ResourceDef;
use crate::strategic;

/// The patch types the real apiserver accepts for built-in resources.
pub const BUILTIN_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];
/// The patch types the real apiserver accepts for custom resources.
pub const CUSTOM_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/apply-patch+yaml",
];

/// A patch type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json`
    Json,
    /// `application/merge-patch+json`
    Merge,
    /// `application/strategic-merge-patch+json`
    Strategic,
}

impl PatchType {
    /// Parse a `Content-Type` for resource `r`: anything not accepted is 415,
    /// including strategic merge on a custom resource and server-side apply
    /// (which testkit does not implement).
    pub fn from_content_type(r: &ResourceDef, content_type: &str) -> Result<Self, ApiError> {
        let mime = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let accepted = if r.custom {
            CUSTOM_TYPES
        } else {
            BUILTIN_TYPES
        };
        let t = match mime.as_str() {
            "application/json-patch+json" => Self::Json,
            "application/merge-patch+json" => Self::Merge,
            "application/strategic-merge-patch+json" if !r.custom => Self::Strategic,
            _ => return Err(ApiError::unsupported_media_type(&mime, accepted)),
        };
        Ok(t)
    }
}

/// Apply `body` to `original` as a patch of type `t`.
pub fn apply(
    r: &ResourceDef,
    t: PatchType,
    original: &Value,
    body: &[u8],
) -> Result<Value, ApiError> {
    let patch: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    match t {
        PatchType::Merge => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("merge patch must be a JSON object"));
            }
            let mut doc = original.clone();
            json_patch::merge(&mut doc, &patch);
            Ok(doc)
        }
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch)
                .map_err(|e| ApiError::bad_request(format!("error decoding json patch: {e}")))?;
            let mut doc = original.clone();
            json_patch::patch(&mut doc, &ops.0).map_err(|e| {
                // The real server answers 422 for a failed `test` and for
                // paths that do not exist.
                ApiError::invalid(
                    r.group,
                    r.kind,
                    original
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or(""),
                    &format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?;
            Ok(doc)
        }
        PatchType::Strategic => strategic::apply(r.kind, original, &patch),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources;
    use serde_json::json;

    fn pods() -> &'static ResourceDef {
        resources::find("", "v1", "pods").unwrap()
    }

    #[test]
    fn merge_patch_replaces_lists() {
        let orig = json!({"status": {"conditions": [{"type": "A"}, {"type": "B"}]}});
        let out = apply(
            pods(),
            PatchType::Merge,
            &orig,
            br#"{"status":{"conditions":[{"type":"C"}]}}"#,
        )
        .unwrap();
        assert_eq!(out["status"]["conditions"], json!([{"type": "C"}]));
    }

    #[test]
    fn json_patch_ops_and_failed_test_is_422() {
        let orig = json!({"metadata": {"labels": {"a": "1"}}});
        let out = apply(
            pods(),
            PatchType::Json,
            &orig,
            br#"[{"op":"add","path":"/metadata/labels/b","value":"2"}]"#,
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"]["b"], "2");
        let e = apply(
            pods(),
            PatchType::Json,
            &orig,
            br#"[{"op":"test","path":"/metadata/labels/a","value":"9"}]"#,
        )
        .unwrap_err();
        assert_eq!(e.code, 422);
    }

    #[test]
    fn content_types() {
        let ppm = resources::find("apps.kruise.io", "v1alpha1", "podprobemarkers").unwrap();
        assert_eq!(
            PatchType::from_content_type(pods(), "application/strategic-merge-patch+json").unwrap(),
            PatchType::Strategic
        );
        let e = PatchType::from_content_type(ppm, "application/strategic-merge-patch+json")
            .unwrap_err();
        assert_eq!((e.code, e.reason), (415, "UnsupportedMediaType"));
        assert_eq!(
            PatchType::from_content_type(pods(), "text/plain")
                .unwrap_err()
                .code,
            415
        );
        assert_eq!(
            PatchType::from_content_type(pods(), "application/merge-patch+json; charset=utf-8")
                .unwrap(),
            PatchType::Merge
        );
    }
}
