//! Reading the `kruise.io/podprobe` annotation (the protocol's types and rules are the
//! `podprobe-protocol` crate's): parsing, per-probe validation into what the runner runs, and
//! the kubelet downward-API annotations file format (`downward_api`).
//!
//! Parsing never fails as a whole because of one bad probe: each entry is decoded and validated
//! on its own, good entries become [`ProbeSpec`]s and bad ones [`InvalidProbe`]s with a reason a
//! user can act on. Only an annotation that is not a JSON array (or is absurdly large) is an
//! [`AnnotationError`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerPort, PodSpec, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use podprobe_protocol::names::qualified_name_errors;
use podprobe_protocol::rules::{
    HEADER_NAME_RULE, PortViolation, UrlViolation, is_header_name, port_name_violations,
    port_number_violation, url_violation,
};

use crate::probe::{ExecAction, GrpcAction, Handler, HttpAction, Port, Scheme, TcpAction};

pub use podprobe_protocol::annotation::{
    MARKER_LIST_ANNOTATION, MAX_ANNOTATION_BYTES, PODPROBE_ANNOTATION, PodContainerProbe,
    RESERVED_CONDITION_TYPES,
};

/// A probe that passed validation, ready for the runner.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeSpec {
    pub name: String,
    pub container_name: String,
    /// The pod condition this probe writes; unique within one annotation.
    pub condition_type: String,
    pub handler: Handler,
    /// Raw timing fields as written (the runner applies minimums / defaults).
    pub timing: RawTiming,
}

/// Timing fields of a core/v1 Probe as written; absent fields are `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawTiming {
    pub initial_delay_seconds: Option<i32>,
    pub timeout_seconds: Option<i32>,
    pub period_seconds: Option<i32>,
    pub success_threshold: Option<i32>,
    pub failure_threshold: Option<i32>,
}

impl RawTiming {
    fn of(probe: &Probe) -> Self {
        RawTiming {
            initial_delay_seconds: probe.initial_delay_seconds,
            timeout_seconds: probe.timeout_seconds,
            period_seconds: probe.period_seconds,
            success_threshold: probe.success_threshold,
            failure_threshold: probe.failure_threshold,
        }
    }
}

/// A probe that was skipped, with why.
#[derive(Debug, Clone, PartialEq)]
pub struct InvalidProbe {
    /// Position in the annotation array (0-based).
    pub index: usize,
    /// Probe name, when it could be read.
    pub name: Option<String>,
    pub condition_type: Option<String>,
    pub error: ProbeError,
}

impl std::fmt::Display for InvalidProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "probe #{}", self.index)?;
        if let Some(name) = &self.name {
            write!(f, " {name:?}")?;
        }
        if let Some(ct) = &self.condition_type {
            write!(f, " (podConditionType {ct:?})")?;
        }
        write!(f, ": {}", self.error)
    }
}

/// Why one probe of the annotation was refused. Each message names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot decode the entry: {0}")]
    Decode(String),
    #[error("name: must not be empty")]
    EmptyName,
    #[error("containerName: must not be empty")]
    EmptyContainerName,
    #[error("containerName: no container {0:?} (nor a restartable init container) in the pod")]
    UnknownContainer(String),
    #[error("podConditionType: must not be empty (the sidecar writes its result there)")]
    EmptyConditionType,
    #[error("podConditionType: {0:?} is owned by the kubelet or Kruise")]
    ReservedConditionType(String),
    #[error(
        "podConditionType: {0:?} is not a qualified name, which the apiserver requires of a pod condition type ({1})"
    )]
    InvalidConditionType(String, String),
    #[error("podConditionType: {0:?} is already used by probe #{1}; the first entry wins")]
    DuplicateConditionType(String, usize),
    #[error("probe: must specify a handler type (exec, httpGet, tcpSocket or grpc)")]
    NoHandler,
    #[error("probe: may not specify more than 1 handler type (found {0})")]
    MultipleHandlers(String),
    #[error("probe.exec.command: must not be empty")]
    EmptyCommand,
    #[error("{0}.host: must not be set (refused to prevent probes aimed at other hosts)")]
    HostSet(&'static str),
    #[error("{field}: {reason}")]
    BadPort { field: &'static str, reason: String },
    #[error("probe.httpGet.scheme: {0:?} is not supported (HTTP or HTTPS)")]
    BadScheme(String),
    #[error("probe.httpGet.path: {0:?} is not a valid URL path: {1}")]
    BadPath(String, UrlViolation),
    #[error("probe.httpGet.httpHeaders: {0:?} is not a valid header name: {HEADER_NAME_RULE}")]
    BadHeaderName(String),
}

/// The annotation as a whole cannot be used (the last good probe set keeps running).
#[derive(Debug, thiserror::Error)]
pub enum AnnotationError {
    #[error(
        "annotation {PODPROBE_ANNOTATION} is {0} bytes, more than the {MAX_ANNOTATION_BYTES} \
         bytes Kubernetes allows for all annotations of an object"
    )]
    TooLarge(usize),
    #[error("annotation {PODPROBE_ANNOTATION} is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("annotation {PODPROBE_ANNOTATION} must be a JSON array of probes, found {0}")]
    NotAnArray(&'static str),
}

/// The outcome of reading one annotation value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProbeSet {
    pub probes: Vec<ProbeSpec>,
    pub invalid: Vec<InvalidProbe>,
}

/// The parts of the pod spec that validation and named ports need.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodContainers {
    /// Container name → declared ports, for containers that may be probed.
    pub ports: BTreeMap<String, Vec<ContainerPort>>,
}

impl PodContainers {
    /// Probe targets are `spec.containers` and restartable init containers (native sidecars),
    /// as OpenKruise's webhook allows.
    pub fn from_spec(spec: &PodSpec) -> Self {
        let restartable_inits = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        let ports = spec
            .containers
            .iter()
            .chain(restartable_inits)
            .map(|c| (c.name.clone(), c.ports.clone().unwrap_or_default()))
            .collect();
        PodContainers { ports }
    }
}

/// Parses and validates an annotation value. `pod` is the pod's containers when known (a pod
/// manifest or the apiserver); without it container names and named ports are not checked here
/// (named ports then resolve at attempt time).
pub fn parse(value: &str, pod: Option<&PodContainers>) -> Result<ProbeSet, AnnotationError> {
    if value.len() > MAX_ANNOTATION_BYTES {
        return Err(AnnotationError::TooLarge(value.len()));
    }
    let entries = match serde_json::from_str::<serde_json::Value>(value)? {
        serde_json::Value::Array(entries) => entries,
        other => return Err(AnnotationError::NotAnArray(json_kind(&other))),
    };
    let mut set = ProbeSet::default();
    let mut seen_conditions: Vec<(String, usize)> = Vec::new();
    for (index, entry) in entries.into_iter().enumerate() {
        let name = entry
            .get("name")
            .and_then(|v| v.as_str())
            .map(str::to_owned);
        let condition_type = entry
            .get("podConditionType")
            .and_then(|v| v.as_str())
            .map(str::to_owned);
        let invalid = |error| InvalidProbe {
            index,
            name: name.clone(),
            condition_type: condition_type.clone(),
            error,
        };
        let decoded: PodContainerProbe = match serde_json::from_value(entry) {
            Ok(decoded) => decoded,
            Err(e) => {
                set.invalid.push(invalid(ProbeError::Decode(e.to_string())));
                continue;
            }
        };
        match validate(&decoded, pod) {
            Ok(spec) => {
                if let Some((_, first)) = seen_conditions
                    .iter()
                    .find(|(ct, _)| *ct == spec.condition_type)
                {
                    set.invalid.push(invalid(ProbeError::DuplicateConditionType(
                        spec.condition_type.clone(),
                        *first,
                    )));
                    continue;
                }
                seen_conditions.push((spec.condition_type.clone(), index));
                set.probes.push(spec);
            }
            Err(error) => set.invalid.push(invalid(error)),
        }
    }
    Ok(set)
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Validates one decoded entry into a [`ProbeSpec`].
pub fn validate(
    entry: &PodContainerProbe,
    pod: Option<&PodContainers>,
) -> Result<ProbeSpec, ProbeError> {
    if entry.name.is_empty() {
        return Err(ProbeError::EmptyName);
    }
    if entry.container_name.is_empty() {
        return Err(ProbeError::EmptyContainerName);
    }
    let condition_type = entry
        .pod_condition_type
        .clone()
        .filter(|ct| !ct.is_empty())
        .ok_or(ProbeError::EmptyConditionType)?;
    if RESERVED_CONDITION_TYPES.contains(&condition_type.as_str()) {
        return Err(ProbeError::ReservedConditionType(condition_type));
    }
    // One condition type the apiserver refuses makes it reject the whole status patch, so
    // writing it would hold back every other probe's condition.
    let name_errors = qualified_name_errors(&condition_type);
    if !name_errors.is_empty() {
        return Err(ProbeError::InvalidConditionType(
            condition_type,
            name_errors.join("; "),
        ));
    }
    let container_ports = match pod {
        Some(pod) => Some(
            pod.ports
                .get(&entry.container_name)
                .ok_or_else(|| ProbeError::UnknownContainer(entry.container_name.clone()))?
                .as_slice(),
        ),
        None => None,
    };
    let handler = handler_of(&entry.probe, container_ports)?;
    Ok(ProbeSpec {
        name: entry.name.clone(),
        container_name: entry.container_name.clone(),
        condition_type,
        handler,
        timing: RawTiming::of(&entry.probe),
    })
}

fn handler_of(probe: &Probe, ports: Option<&[ContainerPort]>) -> Result<Handler, ProbeError> {
    let present: Vec<&str> = [
        probe.exec.as_ref().map(|_| "exec"),
        probe.http_get.as_ref().map(|_| "httpGet"),
        probe.tcp_socket.as_ref().map(|_| "tcpSocket"),
        probe.grpc.as_ref().map(|_| "grpc"),
    ]
    .into_iter()
    .flatten()
    .collect();
    match present.len() {
        0 => return Err(ProbeError::NoHandler),
        1 => {}
        _ => return Err(ProbeError::MultipleHandlers(present.join(", "))),
    }
    if let Some(exec) = &probe.exec {
        let command = exec.command.clone().unwrap_or_default();
        if command.is_empty() {
            return Err(ProbeError::EmptyCommand);
        }
        return Ok(Handler::Exec(ExecAction { command }));
    }
    if let Some(http) = &probe.http_get {
        if http.host.as_deref().is_some_and(|h| !h.is_empty()) {
            return Err(ProbeError::HostSet("probe.httpGet"));
        }
        let scheme = match http.scheme.as_deref() {
            None | Some("") | Some("HTTP") => Scheme::Http,
            Some("HTTPS") => Scheme::Https,
            Some(other) => return Err(ProbeError::BadScheme(other.to_owned())),
        };
        let path = http.path.clone().unwrap_or_default();
        if let Some(why) = url_violation(&path) {
            return Err(ProbeError::BadPath(path, why));
        }
        let mut headers = Vec::new();
        for header in http.http_headers.iter().flatten() {
            if !is_header_name(&header.name) {
                return Err(ProbeError::BadHeaderName(header.name.clone()));
            }
            headers.push((header.name.clone(), header.value.clone()));
        }
        let port = port_of(&http.port, "probe.httpGet.port", ports)?;
        return Ok(Handler::Http(HttpAction {
            scheme,
            path,
            port,
            headers,
        }));
    }
    if let Some(tcp) = &probe.tcp_socket {
        if tcp.host.as_deref().is_some_and(|h| !h.is_empty()) {
            return Err(ProbeError::HostSet("probe.tcpSocket"));
        }
        let port = port_of(&tcp.port, "probe.tcpSocket.port", ports)?;
        return Ok(Handler::Tcp(TcpAction { port }));
    }
    let grpc = probe.grpc.as_ref().ok_or(ProbeError::NoHandler)?;
    let port = port_number(i64::from(grpc.port), "probe.grpc.port")?;
    Ok(Handler::Grpc(GrpcAction {
        port,
        service: grpc.service.clone().unwrap_or_default(),
    }))
}

fn port_number(n: i64, field: &'static str) -> Result<u16, ProbeError> {
    match (port_number_violation(n), u16::try_from(n)) {
        (None, Ok(port)) => Ok(port),
        (violation, _) => Err(ProbeError::BadPort {
            field,
            reason: format!("{n} {}", violation.unwrap_or(PortViolation::OutOfRange)),
        }),
    }
}

/// Checks an int-or-string port. A name must be an IANA service name; when the container's ports
/// are known it must also exist there (or be a number in a string, as OpenKruise's resolver
/// accepts), since a pod's ports never change and such a probe could never run.
fn port_of(
    port: &IntOrString,
    field: &'static str,
    ports: Option<&[ContainerPort]>,
) -> Result<Port, ProbeError> {
    match port {
        IntOrString::Int(n) => port_number(i64::from(*n), field).map(Port::Number),
        IntOrString::String(name) => {
            if let Ok(n) = name.parse::<i64>() {
                return port_number(n, field).map(Port::Number);
            }
            if let Some(violation) = port_name_violations(name).first() {
                return Err(ProbeError::BadPort {
                    field,
                    reason: format!("{name:?} {violation}"),
                });
            }
            if let Some(ports) = ports
                && !ports.iter().any(|p| p.name.as_deref() == Some(name))
            {
                return Err(ProbeError::BadPort {
                    field,
                    reason: format!("no port named {name:?} in the target container"),
                });
            }
            Ok(Port::Name(name.clone()))
        }
    }
}

/// Reads a Pod manifest's annotation and containers. Returns `None` when the pod has no
/// `kruise.io/podprobe` annotation.
pub fn from_pod(
    pod: &k8s_openapi::api::core::v1::Pod,
) -> Option<Result<(ProbeSet, PodContainers), AnnotationError>> {
    let value = pod
        .metadata
        .annotations
        .as_ref()?
        .get(PODPROBE_ANNOTATION)?;
    let containers = pod
        .spec
        .as_ref()
        .map(PodContainers::from_spec)
        .unwrap_or_default();
    Some(parse(value, Some(&containers)).map(|set| (set, containers)))
}

mod downward_api;
#[cfg(test)]
mod tests;

pub use downward_api::{
    DownwardApiError, format_downward_api, go_quote, go_unquote, parse_downward_api,
};
