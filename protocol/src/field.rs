//! Field errors as apimachinery renders them (`field.ErrorList`), so messages read like the
//! apiserver's own: the PodProbeMarker webhook's, and the probe check's ([`crate::check`]).

use std::fmt;

/// Kind of a field error, as apimachinery's `field.ErrorType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Invalid,
    Required,
    Forbidden,
    NotSupported,
    TooLong,
}

/// One problem, naming the field it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub kind: ErrorKind,
    /// The offending value, rendered for the message (absent for Required/Forbidden).
    pub value: Option<String>,
    pub detail: String,
}

/// As apimachinery's `Error.Error()`: the field, the type (with the value where the type
/// shows one), and `: detail` only when there is a detail.
impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.value.as_deref().unwrap_or("");
        match self.kind {
            ErrorKind::Invalid => write!(f, "{}: Invalid value: {value}", self.field)?,
            ErrorKind::Required => write!(f, "{}: Required value", self.field)?,
            ErrorKind::Forbidden => write!(f, "{}: Forbidden", self.field)?,
            ErrorKind::NotSupported => write!(f, "{}: Unsupported value: {value}", self.field)?,
            ErrorKind::TooLong => write!(f, "{}: Too long", self.field)?,
        }
        if self.detail.is_empty() {
            Ok(())
        } else {
            write!(f, ": {}", self.detail)
        }
    }
}

/// All problems of one object; its message is what the webhook returns with HTTP 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", format_errors(.0))]
pub struct ValidationErrors(pub Vec<FieldError>);

fn format_errors(errors: &[FieldError]) -> String {
    let parts: Vec<String> = errors.iter().map(ToString::to_string).collect();
    match parts.len() {
        1 => parts.into_iter().next().unwrap_or_default(),
        _ => format!("[{}]", parts.join(", ")),
    }
}

/// A field error of any kind.
pub fn err(
    field: &str,
    kind: ErrorKind,
    value: Option<String>,
    detail: impl Into<String>,
) -> FieldError {
    FieldError {
        field: field.to_owned(),
        kind,
        value,
        detail: detail.into(),
    }
}

/// An `Invalid value` error, showing `value`.
pub fn invalid(field: &str, value: impl fmt::Display, detail: impl Into<String>) -> FieldError {
    err(field, ErrorKind::Invalid, Some(value.to_string()), detail)
}

/// A string value as apimachinery shows it in a message (Go's `%q`).
pub fn quoted(s: &str) -> String {
    format!("{s:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// apimachinery's `Error.Error()`, as kube-apiserver and OpenKruise print it.
    #[test]
    fn rendered_as_apimachinery_does() {
        let required = err(
            "spec.probes[0].probe.httpGet.path",
            ErrorKind::Required,
            None,
            "",
        );
        assert_eq!(
            required.to_string(),
            "spec.probes[0].probe.httpGet.path: Required value"
        );
        let with_detail = err("spec.probes", ErrorKind::Required, None, "empty probes");
        assert_eq!(
            with_detail.to_string(),
            "spec.probes: Required value: empty probes"
        );
        assert_eq!(
            invalid(
                "spec.probes[0].probe.periodSeconds",
                -1,
                "must be greater than or equal to 0"
            )
            .to_string(),
            "spec.probes[0].probe.periodSeconds: Invalid value: -1: must be greater than or equal to 0"
        );
        let forbidden = err("spec.probes[0].probe.grpc", ErrorKind::Forbidden, None, "");
        assert_eq!(
            forbidden.to_string(),
            "spec.probes[0].probe.grpc: Forbidden"
        );
        let two = ValidationErrors(vec![required, with_detail]);
        assert_eq!(
            two.to_string(),
            "[spec.probes[0].probe.httpGet.path: Required value, spec.probes: Required value: empty probes]"
        );
    }
}
