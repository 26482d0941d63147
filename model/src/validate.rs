//! The PodProbeMarker validating webhook's rules: OpenKruise's `validatePodProbeMarkerSpec`
//! (same checks, same early returns, hence the same error counts), with four deliberate
//! differences: `grpc` counts as a handler (the sidecar implements it), a `podConditionType`
//! that names a condition owned by the kubelet, Kruise or a Kubernetes domain is refused (the
//! sidecar would refuse to write it), marker keys that steer the protocol, Kubernetes'
//! controllers or the PodProbeMarker's own selection are refused ([`reserved`]), and errors
//! carry precise field paths (`spec.probes[1].probe.httpGet.port`).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use k8s_openapi::api::core::v1::Probe;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use podprobe_protocol::annotation::{
    MAX_ANNOTATION_BYTES, MAX_PROBES_PER_POD, MAX_TIMEOUT_SECONDS, RESERVED_PROBE_NAMES,
    is_reserved_condition_type,
};
use podprobe_protocol::check::{Strictness, check_handler};
use podprobe_protocol::names::{is_qualified_part, qualified_name_errors};
use podprobe_protocol::state::{STATE_FAILED, STATE_SUCCEEDED};

use crate::crd::{PodContainerProbe, PodProbeMarker, PodProbeMarkerSpec, ProbeMarkerPolicy};
use crate::selector;

pub use podprobe_protocol::field::{ErrorKind, FieldError, ValidationErrors};
use podprobe_protocol::field::{err, invalid, quoted};

/// CREATE (`old = None`) or UPDATE validation of a PodProbeMarker.
pub fn validate(
    new: &PodProbeMarker,
    old: Option<&PodProbeMarker>,
) -> Result<(), ValidationErrors> {
    let mut errors = validate_spec(&new.spec, "spec");
    if let Some(old) = old
        && old.spec.selector != new.spec.selector
    {
        errors.push(invalid(
            "spec.selector",
            serde_json::to_string(&new.spec.selector).unwrap_or_default(),
            "selector must be immutable",
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errors))
    }
}

/// OpenKruise's validation returns at the first of some errors; `Err(EarlyReturn)` carries
/// that stop out of the per-probe rules.
struct EarlyReturn;

/// The spec rules, in OpenKruise's order, including its early returns.
pub fn validate_spec(spec: &PodProbeMarkerSpec, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    match &spec.selector {
        None => errors.push(err(
            &format!("{path}.selector"),
            ErrorKind::Required,
            None,
            "empty Selector is not valid for PodProbeMarker",
        )),
        Some(s) => errors.extend(validate_selector(s, &format!("{path}.selector"))),
    }
    if spec.probes.is_empty() {
        errors.push(err(
            &format!("{path}.probes"),
            ErrorKind::Required,
            None,
            "empty probes is not valid for PodProbeMarker",
        ));
        return errors;
    }
    if spec.probes.len() > MAX_PROBES_PER_POD {
        errors.push(invalid(
            &format!("{path}.probes"),
            spec.probes.len(),
            format!(
                "must have at most {MAX_PROBES_PER_POD} probes: the podprobe sidecar runs at most \
                 {MAX_PROBES_PER_POD} in a pod"
            ),
        ));
    }
    let mut seen = SeenInSpec {
        selector_keys: reserved::selector_keys(spec.selector.as_ref()),
        ..Default::default()
    };
    for (i, probe) in spec.probes.iter().enumerate() {
        let at = format!("{path}.probes[{i}]");
        if validate_spec_probe(probe, &at, &mut seen, &mut errors).is_err() {
            break;
        }
    }
    errors
}

/// Names and condition types already used by earlier probes of the same spec, and the
/// selector's keys.
#[derive(Default)]
struct SeenInSpec<'a> {
    names: HashSet<&'a str>,
    condition_types: HashSet<&'a str>,
    /// The label keys the spec's selector reads, which no marker may set.
    selector_keys: BTreeSet<&'a str>,
}

fn validate_spec_probe<'a>(
    probe: &'a PodContainerProbe,
    at: &str,
    seen: &mut SeenInSpec<'a>,
    errors: &mut Vec<FieldError>,
) -> Result<(), EarlyReturn> {
    validate_probe_identity(probe, at, &mut seen.names, errors)?;
    errors.extend(validate_probe(&probe.probe, &format!("{at}.probe")));
    validate_condition_type(probe, at, &mut seen.condition_types, errors)?;
    let mut states = HashSet::new();
    for (j, policy) in probe.marker_policy.iter().enumerate() {
        let policy_path = format!("{at}.markerPolicy[{j}]");
        if !states.insert(policy.state.as_str()) {
            errors.push(invalid(
                &format!("{policy_path}.state"),
                quoted(&policy.state),
                "marker policy state must be unique",
            ));
            return Err(EarlyReturn);
        }
        errors.extend(validate_policy(policy, &policy_path));
        errors.extend(reserved::reserved_key_errors(
            policy,
            &seen.selector_keys,
            &policy_path,
        ));
    }
    Ok(())
}

/// Name and container: each error here ends OpenKruise's validation.
fn validate_probe_identity<'a>(
    probe: &'a PodContainerProbe,
    at: &str,
    names: &mut HashSet<&'a str>,
    errors: &mut Vec<FieldError>,
) -> Result<(), EarlyReturn> {
    let name_field = format!("{at}.name");
    let error = if probe.name.contains('#') {
        invalid(
            &name_field,
            quoted(&probe.name),
            "probe name can't contain '#'",
        )
    } else if probe.name.is_empty() {
        err(
            &name_field,
            ErrorKind::Required,
            None,
            "probe name can't be empty",
        )
    } else if probe.container_name.is_empty() {
        err(
            &format!("{at}.containerName"),
            ErrorKind::Required,
            None,
            "probe containerName can't be empty",
        )
    } else if RESERVED_PROBE_NAMES.contains(&probe.name.as_str()) {
        invalid(
            &name_field,
            quoted(&probe.name),
            format!("probe name can't be {}", probe.name),
        )
    } else if !names.insert(probe.name.as_str()) {
        invalid(
            &name_field,
            quoted(&probe.name),
            "probe name must be unique in PodProbeMarker",
        )
    } else {
        return Ok(());
    };
    errors.push(error);
    Err(EarlyReturn)
}

fn validate_condition_type<'a>(
    probe: &'a PodContainerProbe,
    at: &str,
    condition_types: &mut HashSet<&'a str>,
    errors: &mut Vec<FieldError>,
) -> Result<(), EarlyReturn> {
    let condition = probe.pod_condition_type.as_str();
    let condition_field = format!("{at}.podConditionType");
    if condition.is_empty() {
        if probe.marker_policy.is_empty() {
            errors.push(err(
                &condition_field,
                ErrorKind::Required,
                None,
                "podConditionType and markerPolicy cannot be empty at the same time",
            ));
            return Err(EarlyReturn);
        }
        return Ok(());
    }
    if !condition_types.insert(condition) {
        errors.push(invalid(
            &condition_field,
            quoted(condition),
            format!("podConditionType {condition} must be unique in podProbeMarker"),
        ));
        return Err(EarlyReturn);
    }
    for msg in qualified_name_errors(condition) {
        errors.push(invalid(&condition_field, quoted(condition), msg));
    }
    if is_reserved_condition_type(condition) {
        errors.push(invalid(
            &condition_field,
            quoted(condition),
            "is a condition owned by the kubelet, Kruise or Kubernetes (kubernetes.io and k8s.io \
             domains); the podprobe sidecar will not write it",
        ));
    }
    Ok(())
}

fn validate_selector(selector: &LabelSelector, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if let Some(labels) = &selector.match_labels {
        errors.extend(validate_labels(labels, &format!("{path}.matchLabels")));
    }
    for (i, req) in selector.match_expressions.iter().flatten().enumerate() {
        let at = format!("{path}.matchExpressions[{i}]");
        let has_values = req.values.as_ref().is_some_and(|v| !v.is_empty());
        match req.operator.as_str() {
            "In" | "NotIn" if !has_values => errors.push(err(
                &format!("{at}.values"),
                ErrorKind::Required,
                None,
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            "Exists" | "DoesNotExist" if has_values => errors.push(err(
                &format!("{at}.values"),
                ErrorKind::Forbidden,
                None,
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => errors.push(err(
                &format!("{at}.operator"),
                ErrorKind::NotSupported,
                Some(quoted(other)),
                r#"supported values: "DoesNotExist", "Exists", "In", "NotIn""#,
            )),
        }
        for msg in qualified_name_errors(&req.key) {
            errors.push(invalid(&format!("{at}.key"), quoted(&req.key), msg));
        }
    }
    if selector::is_empty(selector) {
        errors.push(invalid(
            path,
            "{}",
            "empty selector is not valid for podProbeMarker",
        ));
    }
    // apimachinery also fails the conversion for the operator errors above; OpenKruise reports
    // that as one more error, so the counts match only if we do too.
    if let Err(e) = selector::matches(selector, &BTreeMap::new()) {
        errors.push(invalid(path, "selector", e.to_string()));
    }
    errors
}

fn validate_probe(probe: &Probe, path: &str) -> Vec<FieldError> {
    let mut errors = validate_handler(probe, path);
    for (name, value) in [
        ("initialDelaySeconds", probe.initial_delay_seconds),
        ("timeoutSeconds", probe.timeout_seconds),
        ("periodSeconds", probe.period_seconds),
        ("successThreshold", probe.success_threshold),
        ("failureThreshold", probe.failure_threshold),
    ] {
        if let Some(v) = value.filter(|v| *v < 0) {
            errors.push(invalid(
                &format!("{path}.{name}"),
                v,
                "must be greater than or equal to 0",
            ));
        }
    }
    if let Some(v) = probe.timeout_seconds.filter(|v| *v > MAX_TIMEOUT_SECONDS) {
        errors.push(invalid(
            &format!("{path}.timeoutSeconds"),
            v,
            format!(
                "must be at most {MAX_TIMEOUT_SECONDS}: the podprobe sidecar refuses longer \
                 timeouts"
            ),
        ));
    }
    errors
}

/// Exactly one of exec, httpGet, tcpSocket, grpc, read as Kruise's webhook reads it (the one
/// probe check the sidecar and the plugin share, [`podprobe_protocol::check`]).
pub fn validate_handler(probe: &Probe, path: &str) -> Vec<FieldError> {
    check_handler(probe, path, Strictness::Admission, None)
        .err()
        .unwrap_or_default()
}

fn validate_policy(policy: &ProbeMarkerPolicy, path: &str) -> Vec<FieldError> {
    if policy.state != STATE_SUCCEEDED && policy.state != STATE_FAILED {
        return vec![err(
            &format!("{path}.state"),
            ErrorKind::Required,
            Some(quoted(&policy.state)),
            "marker policy state must be 'Succeeded' or 'Failed'",
        )];
    }
    if policy.labels.is_empty() && policy.annotations.is_empty() {
        return vec![err(
            path,
            ErrorKind::Required,
            None,
            "marker policy annotations or labels can't be both empty",
        )];
    }
    let mut errors = validate_labels(&policy.labels, &format!("{path}.labels"));
    let annotations_path = format!("{path}.annotations");
    let mut total = 0;
    for (k, v) in &policy.annotations {
        for msg in qualified_name_errors(&k.to_lowercase()) {
            errors.push(invalid(&annotations_path, quoted(k), msg));
        }
        total += k.len() + v.len();
    }
    if total > MAX_ANNOTATION_BYTES {
        errors.push(err(
            &annotations_path,
            ErrorKind::TooLong,
            None,
            format!("may not be more than {MAX_ANNOTATION_BYTES} bytes"),
        ));
    }
    errors
}

fn validate_labels(labels: &BTreeMap<String, String>, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (k, v) in labels {
        for msg in qualified_name_errors(k) {
            errors.push(invalid(path, quoted(k), msg));
        }
        for msg in label_value_errors(v) {
            errors.push(invalid(path, quoted(v), msg));
        }
    }
    errors
}

fn label_value_errors(value: &str) -> Vec<&'static str> {
    let mut msgs = Vec::new();
    if value.len() > 63 {
        msgs.push("must be no more than 63 characters");
    }
    if !value.is_empty() && !is_qualified_part(value) {
        msgs.push("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character");
    }
    msgs
}

mod reserved;
#[cfg(test)]
mod tests;
