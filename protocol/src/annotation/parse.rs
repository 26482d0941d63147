//! Parsing the annotation and checking each probe into what the sidecar runs.
//!
//! Parsing never fails as a whole because of one bad probe: each entry is decoded and validated
//! on its own, good entries become [`ProbeSpec`]s and bad ones [`InvalidProbe`]s with a reason a
//! user can act on. Only an annotation that is not a JSON array (or is absurdly large) is an
//! [`AnnotationError`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerPort, PodSpec, Probe};

use super::{
    MAX_ANNOTATION_BYTES, MAX_PROBES_PER_POD, MAX_TIMEOUT_SECONDS, PODPROBE_ANNOTATION,
    PodContainerProbe, is_reserved_condition_type,
};
use crate::check::{Strictness, check_handler};
use crate::field::ValidationErrors;
use crate::handler::Handler;
use crate::names::qualified_name_errors;

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
    #[error(
        "podConditionType: {0:?} is owned by the kubelet, Kruise or Kubernetes (kubernetes.io and k8s.io domains)"
    )]
    ReservedConditionType(String),
    #[error(
        "podConditionType: {0:?} is not a qualified name, which the apiserver requires of a pod condition type ({1})"
    )]
    InvalidConditionType(String, String),
    #[error(
        "probe.timeoutSeconds: {0} is more than podprobe's limit of {MAX_TIMEOUT_SECONDS} seconds"
    )]
    TimeoutTooLong(i32),
    #[error(
        "more than {MAX_PROBES_PER_POD} valid probes in one pod: podprobe runs the first {MAX_PROBES_PER_POD}"
    )]
    TooManyProbes,
    #[error("podConditionType: {0:?} is already used by probe #{1}; the first entry wins")]
    DuplicateConditionType(String, usize),
    /// The handler's fields, as [`crate::check`] reads them for the runtime.
    #[error("{0}")]
    Probe(ValidationErrors),
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
    for (index, mut entry) in entries.into_iter().enumerate() {
        // Writers clear markerPolicy and nothing here reads it: whatever shape one has, it
        // must not cost the probe (the probe type decodes it for the CRD's sake).
        if let Some(fields) = entry.as_object_mut() {
            fields.remove("markerPolicy");
        }
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
                if set.probes.len() == MAX_PROBES_PER_POD {
                    set.invalid.push(invalid(ProbeError::TooManyProbes));
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
    if entry.pod_condition_type.is_empty() {
        return Err(ProbeError::EmptyConditionType);
    }
    let condition_type = entry.pod_condition_type.clone();
    if is_reserved_condition_type(&condition_type) {
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
    let handler = check_handler(&entry.probe, "probe", Strictness::Runtime, container_ports)
        .map_err(|errors| ProbeError::Probe(ValidationErrors(errors)))?;
    if let Some(timeout) = entry.probe.timeout_seconds
        && timeout > MAX_TIMEOUT_SECONDS
    {
        return Err(ProbeError::TimeoutTooLong(timeout));
    }
    Ok(ProbeSpec {
        name: entry.name.clone(),
        container_name: entry.container_name.clone(),
        condition_type,
        handler,
        timing: RawTiming::of(&entry.probe),
    })
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
