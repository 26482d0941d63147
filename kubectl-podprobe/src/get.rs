//! `kubectl podprobe get`: one row per pod and probe.

use serde::Serialize;

use crate::facts::PodFacts;
use crate::inspect::{self, AnnotationState, NodeKind, Settings, Sidecar};
use podprobe_protocol::annotation::PODPROBE_ANNOTATION;

/// One probe of one pod, as the table and `-o json|yaml` show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeRow {
    pub namespace: String,
    pub pod: String,
    pub probe: String,
    pub container: String,
    pub condition_type: String,
    /// `True`, `False`, `Unknown`; `None` when the pod has no such condition.
    pub status: Option<String>,
    pub message: Option<String>,
    pub since_transition_seconds: Option<i64>,
    pub since_probe_seconds: Option<i64>,
    /// The marker keys of this probe's policies present on the pod (`label k=v`, ...).
    pub markers: Vec<String>,
    /// Short codes of what is wrong (see [`Warning`]).
    pub warnings: Vec<String>,
}

/// What `get` flags, by code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Warning {
    ConditionMissing,
    Stale,
    ProbeInvalid,
    SidecarMissing,
    SidecarNotReady,
    NodeNotServerless,
    AnnotationMissing,
    AnnotationOutOfDate,
    NotInAnnotation,
}

impl Warning {
    pub fn code(self) -> &'static str {
        match self {
            Warning::ConditionMissing => "condition-missing",
            Warning::Stale => "stale",
            Warning::ProbeInvalid => "probe-invalid",
            Warning::SidecarMissing => "sidecar-missing",
            Warning::SidecarNotReady => "sidecar-not-ready",
            Warning::NodeNotServerless => "node-not-serverless",
            Warning::AnnotationMissing => "annotation-missing",
            Warning::AnnotationOutOfDate => "annotation-out-of-date",
            Warning::NotInAnnotation => "not-in-annotation",
        }
    }
}

/// The rows of one pod: the probes of its annotation, then those its PodProbeMarkers add
/// (none for a pod without probes).
pub fn rows(facts: &PodFacts, settings: &Settings) -> Vec<ProbeRow> {
    let pod = &facts.pod;
    let expected = inspect::expected(facts);
    let actual = inspect::annotation(pod, PODPROBE_ANNOTATION)
        .map(inspect::listed_probes)
        .unwrap_or_default();
    let wanted = expected
        .annotation
        .as_deref()
        .map(inspect::listed_probes)
        .unwrap_or_default();
    let mut pod_warnings = Vec::new();
    match inspect::annotation_state(facts, &expected) {
        AnnotationState::Missing => pod_warnings.push(Warning::AnnotationMissing),
        AnnotationState::OutOfDate => pod_warnings.push(Warning::AnnotationOutOfDate),
        _ => {}
    }
    match inspect::sidecar(pod, &settings.sidecar_container) {
        Sidecar::Missing => pod_warnings.push(Warning::SidecarMissing),
        Sidecar::NotReady(_) => pod_warnings.push(Warning::SidecarNotReady),
        Sidecar::Ready => {}
    }
    if matches!(inspect::node_kind(facts, settings), NodeKind::Regular(_)) {
        pod_warnings.push(Warning::NodeNotServerless);
    }
    let invalid = inspect::invalid_probes(pod);
    let extra = wanted
        .iter()
        .filter(|w| !actual.iter().any(|a| a.condition_type == w.condition_type));
    let listed = actual.iter().enumerate().map(|(i, p)| (p, Some(i)));
    listed
        .chain(extra.map(|p| (p, None)))
        .map(|(probe, index)| {
            let mut warnings = pod_warnings.clone();
            match index {
                None => warnings.push(Warning::NotInAnnotation),
                Some(i) if invalid.iter().any(|bad| bad.index == i) => {
                    warnings.push(Warning::ProbeInvalid);
                }
                Some(_) => {}
            }
            row(facts, settings, &expected, probe, warnings)
        })
        .collect()
}

fn row(
    facts: &PodFacts,
    settings: &Settings,
    expected: &inspect::Expected,
    probe: &inspect::ListedProbe,
    mut warnings: Vec<Warning>,
) -> ProbeRow {
    let pod = &facts.pod;
    let condition = inspect::condition(pod, &probe.condition_type);
    let since = |t: Option<jiff::Timestamp>| t.map(|t| inspect::age(settings.now, t));
    let since_probe = since(
        condition
            .and_then(|c| c.last_probe_time.as_ref())
            .map(|t| t.0),
    );
    match (condition, since_probe) {
        (None, _) => warnings.push(Warning::ConditionMissing),
        (Some(_), Some(age)) if age > 2 * settings.refresh_interval.as_secs() as i64 => {
            warnings.push(Warning::Stale);
        }
        _ => {}
    }
    let markers = inspect::policies(expected, &probe.condition_type)
        .map(|(_, policies)| {
            policies
                .iter()
                .flat_map(|p| inspect::marker_keys(pod, p))
                .filter(|(_, present)| *present)
                .map(|(key, _)| key)
                .collect()
        })
        .unwrap_or_default();
    warnings.sort_by_key(|w| *w as u8);
    warnings.dedup();
    ProbeRow {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        pod: pod.metadata.name.clone().unwrap_or_default(),
        probe: probe.name.clone(),
        container: probe.container.clone(),
        condition_type: probe.condition_type.clone(),
        status: condition.map(|c| c.status.clone()),
        message: condition.and_then(|c| c.message.clone()),
        since_transition_seconds: since(
            condition
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0),
        ),
        since_probe_seconds: since_probe,
        markers,
        warnings: warnings.iter().map(|w| w.code().to_owned()).collect(),
    }
}
