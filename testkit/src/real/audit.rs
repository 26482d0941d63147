//! The apiserver's audit log as the tests' journal: who sent which request, with which body,
//! and what the apiserver answered. Unlike testkit's journal this is the real server's own
//! record, so a test can check what a client actually sent through the whole stack.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::Error;

/// Request bodies for the writes podprobe makes; metadata (who, what, the answer's code) for
/// everything else, reads included, so a refused list or watch (RBAC) shows too.
pub const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
    verbs: ["get", "list", "watch"]
  - level: Request
    resources:
      - group: ""
        resources: ["pods", "pods/status", "events"]
      - group: "events.k8s.io"
        resources: ["events"]
      - group: "apps.kruise.io"
        resources: ["podprobemarkers", "podprobemarkers/status"]
  - level: Metadata
"#;

/// One `audit.k8s.io/v1` Event (the fields the tests read).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    pub verb: String,
    #[serde(default)]
    pub user: AuditUser,
    #[serde(default)]
    pub object_ref: Option<ObjectRef>,
    #[serde(default)]
    pub response_status: Option<ResponseStatus>,
    #[serde(default)]
    pub request_object: Option<Value>,
    #[serde(default, rename = "requestURI")]
    pub request_uri: String,
    /// When the apiserver finished answering (RFC 3339, microseconds).
    #[serde(default)]
    pub stage_timestamp: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct AuditUser {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub subresource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub api_group: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResponseStatus {
    #[serde(default)]
    pub code: u16,
}

impl AuditEvent {
    /// Whether this is `verb` (lower case, as audit spells it: `patch`, `create`, ...) on
    /// `resource` (`pods` or `pods/status`) of the named object (`None`: any).
    pub fn is(&self, verb: &str, resource: &str, name: Option<&str>) -> bool {
        let Some(obj) = &self.object_ref else {
            return false;
        };
        let (res, sub) = resource.split_once('/').unwrap_or((resource, ""));
        self.verb == verb
            && obj.resource == res
            && obj.subresource == sub
            && name.is_none_or(|n| obj.name == n)
    }

    /// The HTTP code the apiserver answered (0 when unknown).
    pub fn code(&self) -> u16 {
        self.response_status.as_ref().map_or(0, |s| s.code)
    }
}

pub(super) fn read(path: &Path) -> Result<Vec<AuditEvent>, Error> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e.into()),
    };
    // The last line may be half written while the apiserver is running.
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}
