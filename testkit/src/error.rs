//! Errors: the API error that becomes a `metav1.Status` body, and the
//! handle's own error type.

use serde_json::{Value, json};

/// An error answered to an API client as a `metav1.Status` object, with the
/// `code`, `reason` and `message` the real kube-apiserver uses for the same
/// situation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code (also `Status.code`).
    pub code: u16,
    /// `Status.reason`, e.g. `NotFound`, `Conflict`.
    pub reason: &'static str,
    /// `Status.message`.
    pub message: String,
    /// `Status.details` (name, group, kind), when the real server sets them.
    pub details: Option<Value>,
    /// `Retry-After` seconds, when set (429, 504 ...).
    pub retry_after: Option<u64>,
}

/// The "qualified resource" as the apiserver prints it: `pods`,
/// `leases.coordination.k8s.io`.
pub(crate) fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

fn details(name: &str, group: &str, kind: &str) -> Option<Value> {
    let mut d = json!({ "name": name, "kind": kind });
    if !group.is_empty() {
        d["group"] = json!(group);
    }
    Some(d)
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// 404 `pods "x" not found`.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, plural)),
        );
        e.details = details(name, group, plural);
        e
    }

    /// 404 for a path that names no resource.
    pub fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 409 `pods "x" already exists`.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let mut e = Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, plural)),
        );
        e.details = details(name, group, plural);
        e
    }

    /// 409 `Operation cannot be fulfilled on pods "x": <why>`.
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, plural)
            ),
        );
        e.details = details(name, group, plural);
        e
    }

    /// The optimistic-lock conflict of an update with a stale resourceVersion.
    pub fn stale_resource_version(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 `Pod "x" is invalid: <field>: <why>`.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: &str) -> Self {
        let gk = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{gk} \"{name}\" is invalid: {causes}"),
        );
        e.details = details(name, group, kind);
        e
    }

    /// 422 for field errors, as the real server words and details them: one error
    /// `Pod "x" is invalid: <field>: Invalid value: <value>: <detail>`, several in `[..., ...]`,
    /// each also a `details.causes` entry.
    pub fn invalid_fields(
        group: &str,
        kind: &str,
        name: &str,
        errors: &[crate::validation::FieldError],
    ) -> Self {
        let one = |e: &crate::validation::FieldError| {
            format!("{}: Invalid value: {}: {}", e.field, e.value, e.detail)
        };
        let causes = if errors.len() == 1 {
            one(&errors[0])
        } else {
            format!(
                "[{}]",
                errors.iter().map(one).collect::<Vec<_>>().join(", ")
            )
        };
        let mut e = Self::invalid(group, kind, name, &causes);
        if let Some(details) = e.details.as_mut() {
            details["causes"] = errors
                .iter()
                .map(|f| {
                    json!({"reason": "FieldValueInvalid",
                           "message": format!("Invalid value: {}: {}", f.value, f.detail),
                           "field": f.field})
                })
                .collect();
        }
        e
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 401 Unauthorized.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 Forbidden, worded like the RBAC authorizer's denial.
    pub fn forbidden(
        user: &str,
        verb: &str,
        group: &str,
        resource: &str,
        subresource: &str,
        namespace: &str,
        name: &str,
    ) -> Self {
        let res = if subresource.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}/{subresource}")
        };
        let scope = if namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace \"{namespace}\"")
        };
        let what = if name.is_empty() {
            qualified(group, resource)
        } else {
            format!("{} \"{name}\"", qualified(group, resource))
        };
        let mut e = Self::new(
            403,
            "Forbidden",
            format!(
                "{what} is forbidden: User \"{user}\" cannot {verb} resource \"{res}\" in API group \"{group}\" {scope}"
            ),
        );
        e.details = details(name, group, resource);
        e
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    /// 415 for a patch content type the resource does not accept.
    pub fn unsupported_media_type(content_type: &str, accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}{}",
                accepted.join(", "),
                if content_type.is_empty() {
                    String::new()
                } else {
                    format!(" (got {content_type})")
                }
            ),
        )
    }

    /// 410 Gone / Expired: a watch or list from a compacted resourceVersion.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 429 TooManyRequests with Retry-After.
    pub fn too_many_requests(retry_after: u64) -> Self {
        let mut e = Self::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
        );
        e.retry_after = Some(retry_after);
        e.details = Some(json!({ "retryAfterSeconds": retry_after }));
        e
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// An arbitrary code, used by injected faults; the reason follows the
    /// apiserver's mapping of codes to reasons.
    pub fn from_code(code: u16, message: Option<String>) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            409 => "Conflict",
            410 => "Expired",
            415 => "UnsupportedMediaType",
            422 => "Invalid",
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "",
        };
        let message = message.unwrap_or_else(|| format!("testkit: injected fault ({code})"));
        Self::new(code, reason, message)
    }

    /// The `metav1.Status` JSON body.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// Errors of the [`ApiServer`](crate::ApiServer) handle's own operations.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding the listener or writing a file failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// Building the kube client failed.
    #[error("kube client: {0}")]
    Kube(#[from] kube::Error),
    /// The store refused the operation, as the API would.
    #[error("api: {0}")]
    Api(#[from] ApiError),
    /// An object could not be (de)serialized.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// The object's kind is not served by testkit.
    #[error("unknown resource: {0}")]
    UnknownResource(String),
}
