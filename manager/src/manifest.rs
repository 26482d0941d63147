//! Reading PodProbeMarker and Pod manifests from files for the CLI: multi-document YAML (or
//! JSON, which is YAML) and `kind: List`, with errors that name the file, the document and the
//! field.

use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::crd::PodProbeMarker;

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not valid YAML: {message}")]
    Yaml { path: String, message: String },
    #[error("{path}: document {doc}: field `{field}`: {message}")]
    Field {
        path: String,
        doc: usize,
        field: String,
        message: String,
    },
    #[error("{path}: document {doc}: expected kind {expected}, found {found:?}")]
    Kind {
        path: String,
        doc: usize,
        expected: &'static str,
        found: String,
    },
    #[error("{path}: expected exactly one {expected}, found {count}")]
    Count {
        path: String,
        expected: &'static str,
        count: usize,
    },
}

/// Objects of the file, with `kind: List` expanded; each with its 1-based document number.
fn documents(text: &str, path: &str) -> Result<Vec<(usize, Value)>, ManifestError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| ManifestError::Yaml {
        path: path.into(),
        message: e.to_string(),
    })?;
    let mut out = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        let n = i + 1;
        match doc {
            Value::Null => {}
            Value::Object(ref o) if o.get("kind").and_then(Value::as_str) == Some("List") => {
                let items = o
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                out.extend(items.into_iter().map(|item| (n, item)));
            }
            other => out.push((n, other)),
        }
    }
    Ok(out)
}

fn decode<T: DeserializeOwned>(
    path: &str,
    doc: usize,
    value: Value,
    expected: &'static str,
) -> Result<T, ManifestError> {
    let found = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    if found != expected {
        return Err(ManifestError::Kind {
            path: path.into(),
            doc,
            expected,
            found,
        });
    }
    serde_path_to_error::deserialize(value).map_err(|e| ManifestError::Field {
        path: path.into(),
        doc,
        field: e.path().to_string(),
        message: e.inner().to_string(),
    })
}

fn read(path: &Path) -> Result<String, ManifestError> {
    std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// All PodProbeMarkers in a manifest text; `origin` names it in errors.
pub fn parse_markers(text: &str, origin: &str) -> Result<Vec<PodProbeMarker>, ManifestError> {
    documents(text, origin)?
        .into_iter()
        .map(|(doc, v)| decode(origin, doc, v, "PodProbeMarker"))
        .collect()
}

pub fn load_markers(path: &Path) -> Result<Vec<PodProbeMarker>, ManifestError> {
    parse_markers(&read(path)?, &path.display().to_string())
}

/// The single Pod in a manifest text.
pub fn parse_pod(text: &str, origin: &str) -> Result<Pod, ManifestError> {
    let mut docs = documents(text, origin)?;
    if docs.len() != 1 {
        return Err(ManifestError::Count {
            path: origin.into(),
            expected: "Pod",
            count: docs.len(),
        });
    }
    let (doc, value) = docs.remove(0);
    decode(origin, doc, value, "Pod")
}

pub fn load_pod(path: &Path) -> Result<Pod, ManifestError> {
    parse_pod(&read(path)?, &path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"
apiVersion: apps.kruise.io/v1alpha1
kind: PodProbeMarker
metadata: {name: a}
spec: {selector: {matchLabels: {app: x}}, probes: []}
---
apiVersion: v1
kind: List
items:
- apiVersion: apps.kruise.io/v1alpha1
  kind: PodProbeMarker
  metadata: {name: b}
  spec: {selector: {matchLabels: {app: x}}, probes: []}
"#;

    #[test]
    fn multi_document_and_list() {
        let ppms = parse_markers(TWO, "f.yaml").unwrap();
        let names: Vec<_> = ppms
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn errors_name_file_document_and_field() {
        // A missing field decodes (validation names it, as the webhook does); a wrong type
        // does not.
        let bad = "kind: PodProbeMarker\nmetadata: {name: a}\nspec:\n  probes:\n  - name: x\n    containerName: [c]\n    probe: {}\n";
        let e = parse_markers(bad, "bad.yaml").unwrap_err().to_string();
        assert!(
            e.starts_with("bad.yaml: document 1: field `spec.probes[0]"),
            "{e}"
        );
        assert!(e.contains("containerName"), "{e}");
        let e = parse_markers("kind: Pod\n", "p.yaml").unwrap_err();
        assert!(matches!(e, ManifestError::Kind { found, .. } if found == "Pod"));
        let e = parse_markers("a: [", "y.yaml").unwrap_err();
        assert!(matches!(e, ManifestError::Yaml { .. }));
        let ports = "kind: PodProbeMarker\nspec:\n  probes:\n  - {name: x, containerName: c, probe: {tcpSocket: {port: [1]}}}\n";
        let e = parse_markers(ports, "p.yaml").unwrap_err().to_string();
        assert!(e.contains("spec.probes[0].probe.tcpSocket.port"), "{e}");
    }

    #[test]
    fn exactly_one_pod() {
        let pod = parse_pod("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", "p").unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("p"));
        assert!(matches!(
            parse_pod("kind: Pod\n---\nkind: Pod\n", "p"),
            Err(ManifestError::Count { count: 2, .. })
        ));
    }
}
