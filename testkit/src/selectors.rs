//! Label selectors (equality- and set-based) and field selectors.

use serde_json::Value;

use crate::error::ApiError;
use crate::resources::ResourceDef;

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

/// Split on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c)
            }
            ')' => {
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn set_values(rest: &str, whole: &str) -> Result<Vec<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement: found '{rest}', expected: '(' in {whole}"
            ))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    /// Parse the `labelSelector` query syntax; an error is a 400 like the
    /// real server's.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            if let Some(k) = part.strip_prefix('!') {
                reqs.push(LabelReq::NotExists(k.trim().to_string()));
            } else if let Some((k, v)) = part.split_once("!=") {
                reqs.push(LabelReq::NotEq(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = part.split_once("==") {
                reqs.push(LabelReq::Eq(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = part.split_once('=') {
                reqs.push(LabelReq::Eq(k.trim().into(), v.trim().into()));
            } else if let Some(idx) = part.find(" notin ") {
                let vals = set_values(&part[idx + 7..], s)?;
                reqs.push(LabelReq::NotIn(part[..idx].trim().into(), vals));
            } else if let Some(idx) = part.find(" in ") {
                let vals = set_values(&part[idx + 4..], s)?;
                reqs.push(LabelReq::In(part[..idx].trim().into(), vals));
            } else if part.contains(' ')
                || part.contains('(')
                || part.contains('<')
                || part.contains('>')
            {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement: <nil>: Invalid value: \"{part}\": unsupported selector in {s}"
                )));
            } else {
                reqs.push(LabelReq::Exists(part));
            }
        }
        for r in &reqs {
            let key = match r {
                LabelReq::Eq(k, _)
                | LabelReq::NotEq(k, _)
                | LabelReq::In(k, _)
                | LabelReq::NotIn(k, _)
                | LabelReq::Exists(k)
                | LabelReq::NotExists(k) => k,
            };
            if key.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement: found '', expected: identifier in {s}"
                )));
            }
        }
        Ok(Self(reqs))
    }

    /// Does an object's `metadata.labels` match?
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector` (`=`, `==`, `!=`, joined by commas).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// The field labels a resource supports, and the JSON pointer each reads.
fn field_pointer(r: &ResourceDef, label: &str) -> Option<&'static str> {
    let common = match label {
        "metadata.name" => Some("/metadata/name"),
        "metadata.namespace" => Some("/metadata/namespace"),
        _ => None,
    };
    if common.is_some() {
        return common;
    }
    match (r.group, r.plural, label) {
        ("", "pods", "spec.nodeName") => Some("/spec/nodeName"),
        ("", "pods", "spec.restartPolicy") => Some("/spec/restartPolicy"),
        ("", "pods", "spec.schedulerName") => Some("/spec/schedulerName"),
        ("", "pods", "spec.serviceAccountName") => Some("/spec/serviceAccountName"),
        ("", "pods", "status.phase") => Some("/status/phase"),
        ("", "pods", "status.podIP") => Some("/status/podIP"),
        ("", "pods", "status.nominatedNodeName") => Some("/status/nominatedNodeName"),
        ("", "nodes", "spec.unschedulable") => Some("/spec/unschedulable"),
        ("", "namespaces", "status.phase") => Some("/status/phase"),
        ("", "events", "involvedObject.kind") => Some("/involvedObject/kind"),
        ("", "events", "involvedObject.namespace") => Some("/involvedObject/namespace"),
        ("", "events", "involvedObject.name") => Some("/involvedObject/name"),
        ("", "events", "involvedObject.uid") => Some("/involvedObject/uid"),
        ("", "events", "involvedObject.apiVersion") => Some("/involvedObject/apiVersion"),
        ("", "events", "involvedObject.fieldPath") => Some("/involvedObject/fieldPath"),
        ("", "events", "reason") => Some("/reason"),
        ("", "events", "type") => Some("/type"),
        ("", "events", "reportingComponent") => Some("/reportingComponent"),
        ("", "events", "source") => Some("/source/component"),
        ("events.k8s.io", "events", "regarding.kind") => Some("/regarding/kind"),
        ("events.k8s.io", "events", "regarding.name") => Some("/regarding/name"),
        ("events.k8s.io", "events", "regarding.namespace") => Some("/regarding/namespace"),
        ("events.k8s.io", "events", "regarding.uid") => Some("/regarding/uid"),
        ("events.k8s.io", "events", "reason") => Some("/reason"),
        ("events.k8s.io", "events", "type") => Some("/type"),
        ("events.k8s.io", "events", "reportingController") => Some("/reportingController"),
        _ => None,
    }
}

impl FieldSelector {
    /// Parse a `fieldSelector` for resource `r`; unknown field labels are a
    /// 400 `field label not supported`, as on the real server.
    pub fn parse(r: &ResourceDef, s: &str) -> Result<Self, ApiError> {
        let mut out = Vec::new();
        for part in split_top(s) {
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let k = k.trim();
            if field_pointer(r, k).is_none() {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {k}"
                )));
            }
            out.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(Self(out))
    }

    /// Does an object match? Missing fields compare as `""`; booleans as
    /// `true`/`false`.
    pub fn matches(&self, r: &ResourceDef, obj: &Value) -> bool {
        self.0.iter().all(|(k, eq, v)| {
            let ptr = field_pointer(r, k).unwrap_or("/");
            let actual = match obj.pointer(ptr) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                _ if k == "spec.unschedulable" => "false".to_string(),
                _ => String::new(),
            };
            (actual == *v) == *eq
        })
    }

    /// The name this selector pins with `metadata.name=<x>`, if any.
    pub fn pinned_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, eq, _)| k == "metadata.name" && *eq)
            .map(|(_, _, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources;
    use serde_json::json;

    fn pod(labels: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns", "labels": labels}, "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn equality_and_set_based() {
        let p = pod(json!({"app": "web", "tier": "fe"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&p);
        assert!(m("app=web"));
        assert!(m("app==web,tier=fe"));
        assert!(!m("app!=web"));
        assert!(m("app in (web, db)"));
        assert!(!m("app notin (web)"));
        assert!(m("app notin (db),tier"));
        assert!(m("!missing"));
        assert!(!m("missing"));
        assert!(!m("app in (db)"));
        assert!(m(""));
    }

    #[test]
    fn bad_label_selector_is_400() {
        assert_eq!(LabelSelector::parse("app in web").unwrap_err().code, 400);
    }

    #[test]
    fn field_selectors() {
        let r = resources::find("", "v1", "pods").unwrap();
        let p = pod(json!({}));
        let m = |s: &str| FieldSelector::parse(r, s).unwrap().matches(r, &p);
        assert!(m("metadata.name=p"));
        assert!(m("metadata.namespace==ns,spec.nodeName=n1"));
        assert!(!m("spec.nodeName!=n1"));
        assert!(m("status.phase="));
        let e = FieldSelector::parse(r, "spec.foo=x").unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(e.message, "field label not supported: spec.foo");
    }
}
