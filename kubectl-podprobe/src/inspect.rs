//! Reading one pod's facts the way the sidecar and the managers read them: the probes of its
//! annotation and what its PodProbeMarkers say it should be, its sidecar, its node, its
//! conditions and the marker policies that apply. `get` and `explain` are views of these.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use podprobe_model::crd::{PodProbeMarker, ProbeMarkerPolicy};
use podprobe_model::selector::markers_for_pod;
use podprobe_protocol::annotation::{InvalidProbe, PodContainers};
use podprobe_protocol::annotation::{MARKER_LIST_ANNOTATION, PODPROBE_ANNOTATION};
use podprobe_protocol::state::ProbeState;
use serde_json::Value;

use crate::facts::PodFacts;

/// The flags that say what "serverless", "sidecar" and "stale" mean in this cluster.
#[derive(Debug, Clone)]
pub struct Settings {
    pub sidecar_container: String,
    pub serverless_label: (String, String),
    pub refresh_interval: Duration,
    pub now: jiff::Timestamp,
}

/// One probe as an annotation lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedProbe {
    pub name: String,
    pub container: String,
    pub condition_type: String,
    /// An exec probe (its command runs in the container).
    pub exec: bool,
}

/// The probes of a `kruise.io/podprobe` value, leniently (an entry without a condition type
/// is listed with an empty one; validity is [`invalid_probes`]'s business).
pub fn listed_probes(value: &str) -> Vec<ListedProbe> {
    let entries: Vec<Value> = serde_json::from_str(value).unwrap_or_default();
    let text = |e: &Value, key: &str| e.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
    entries
        .iter()
        .map(|e| ListedProbe {
            name: text(e, "name"),
            container: text(e, "containerName"),
            condition_type: text(e, "podConditionType"),
            exec: e.pointer("/probe/exec").is_some_and(|x| !x.is_null()),
        })
        .collect()
}

pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

pub fn pod_name(pod: &Pod) -> String {
    let meta = &pod.metadata;
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// What the PodProbeMarkers of its namespace give the pod, as both managers compute it
/// (`None`: no probe; also when the CRD is not installed).
#[derive(Debug)]
pub struct Expected<'a> {
    pub markers: Vec<&'a PodProbeMarker>,
    pub annotation: Option<String>,
}

pub fn expected(facts: &PodFacts) -> Expected<'_> {
    let Some(all) = &facts.markers else {
        return Expected {
            markers: vec![],
            annotation: None,
        };
    };
    Expected {
        markers: markers_for_pod(&facts.pod, all),
        annotation: podprobe_model::annotate::compute(&facts.pod, all).map(|c| c.probes),
    }
}

/// How the annotation compares with what its PodProbeMarkers give now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnnotationState {
    /// Nothing selects the pod and it has no annotation.
    Absent,
    Current,
    /// Selected, but the pod has no annotation.
    Missing,
    /// The annotation differs from what the PodProbeMarkers give now.
    OutOfDate,
    /// Annotated, but no PodProbeMarker gives it probes (or the CRD is not installed):
    /// written by hand, or its PodProbeMarker is gone.
    Unowned,
}

pub fn annotation_state(facts: &PodFacts, expected: &Expected) -> AnnotationState {
    let actual = annotation(&facts.pod, PODPROBE_ANNOTATION);
    match (actual, &expected.annotation) {
        (None, None) => AnnotationState::Absent,
        (None, Some(_)) => AnnotationState::Missing,
        (Some(_), None) => AnnotationState::Unowned,
        (Some(a), Some(e)) if a == e => AnnotationState::Current,
        (Some(_), Some(_)) => AnnotationState::OutOfDate,
    }
}

/// The probes of the pod's annotation the sidecar refuses, with why.
pub fn invalid_probes(pod: &Pod) -> Vec<InvalidProbe> {
    let Some(value) = annotation(pod, PODPROBE_ANNOTATION) else {
        return vec![];
    };
    let containers = pod.spec.as_ref().map(PodContainers::from_spec);
    match podprobe_protocol::annotation::parse(value, containers.as_ref()) {
        Ok(set) => set.invalid,
        Err(e) => vec![InvalidProbe {
            index: 0,
            name: None,
            condition_type: None,
            error: podprobe_protocol::annotation::ProbeError::Decode(e.to_string()),
        }],
    }
}

/// The sidecar container and its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sidecar {
    Missing,
    NotReady(String),
    Ready,
}

pub fn sidecar(pod: &Pod, container: &str) -> Sidecar {
    let spec = pod.spec.as_ref();
    let declared = spec.is_some_and(|s| {
        s.containers.iter().any(|c| c.name == container)
            || s.init_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
    });
    if !declared {
        return Sidecar::Missing;
    }
    let status = pod.status.as_ref().and_then(|s| {
        s.container_statuses
            .iter()
            .flatten()
            .chain(s.init_container_statuses.iter().flatten())
            .find(|c| c.name == container)
    });
    match status {
        Some(s) if s.ready => Sidecar::Ready,
        Some(s) => {
            let state = s.state.as_ref();
            let why = state
                .and_then(|st| st.waiting.as_ref())
                .and_then(|w| w.reason.clone())
                .or_else(|| {
                    state
                        .and_then(|st| st.terminated.as_ref())
                        .map(|t| format!("terminated, exit code {}", t.exit_code))
                })
                .unwrap_or_else(|| "running, not ready".into());
            Sidecar::NotReady(format!("{why}, {} restarts", s.restart_count))
        }
        None => Sidecar::NotReady("no container status yet".into()),
    }
}

/// Whether the pod's node is one whose pods get markers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    Unscheduled,
    Unknown(String),
    /// The credentials may not read the node (the apiserver's reason).
    Unreadable(String, String),
    Serverless(String),
    Regular(String),
}

pub fn node_kind(facts: &PodFacts, settings: &Settings) -> NodeKind {
    let Some(name) = facts.pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return NodeKind::Unscheduled;
    };
    if let Some(why) = &facts.unread.node {
        return NodeKind::Unreadable(name, why.clone());
    }
    let Some(node) = &facts.node else {
        return NodeKind::Unknown(name);
    };
    let (key, value) = &settings.serverless_label;
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .is_some_and(|v| v == value);
    if labelled {
        NodeKind::Serverless(name)
    } else {
        NodeKind::Regular(name)
    }
}

pub fn condition<'a>(pod: &'a Pod, type_: &str) -> Option<&'a PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// The marker policies of the probe that writes `condition_type`, from the first selecting
/// PodProbeMarker that has it (the one both managers merge first), with that marker's name.
pub fn policies<'a>(
    expected: &Expected<'a>,
    condition_type: &str,
) -> Option<(&'a str, &'a [ProbeMarkerPolicy])> {
    expected.markers.iter().find_map(|ppm| {
        let probe = ppm
            .spec
            .probes
            .iter()
            .find(|p| p.pod_condition_type == condition_type)?;
        Some((
            ppm.metadata.name.as_deref().unwrap_or_default(),
            probe.marker_policy.as_slice(),
        ))
    })
}

/// The policy for a condition status (`True` → `Succeeded`, `False` → `Failed`).
pub fn policy_for<'a>(
    policies: &'a [ProbeMarkerPolicy],
    status: &str,
) -> Option<&'a ProbeMarkerPolicy> {
    let state = ProbeState::of_condition_status(status);
    policies.iter().find(|p| p.state == state.as_str())
}

/// A policy's labels and annotations as `label k=v` / `annotation k=v`, each with whether
/// the pod carries exactly that value.
pub fn marker_keys(pod: &Pod, policy: &ProbeMarkerPolicy) -> Vec<(String, bool)> {
    let on = |map: &Option<BTreeMap<String, String>>, k: &str, v: &str| {
        map.as_ref().and_then(|m| m.get(k)).is_some_and(|x| x == v)
    };
    let labels = policy
        .labels
        .iter()
        .map(|(k, v)| (format!("label {k}={v}"), on(&pod.metadata.labels, k, v)));
    let annotations = policy.annotations.iter().map(|(k, v)| {
        (
            format!("annotation {k}={v}"),
            on(&pod.metadata.annotations, k, v),
        )
    });
    labels.chain(annotations).collect()
}

/// The pod's own `kruise.io/podprobemarker-list`, if any.
pub fn marker_list(pod: &Pod) -> Option<&str> {
    annotation(pod, MARKER_LIST_ANNOTATION)
}

/// Whole seconds from `then` to `now`, never negative.
pub fn age(now: jiff::Timestamp, then: jiff::Timestamp) -> i64 {
    (now.as_second() - then.as_second()).max(0)
}

/// `45s`, `12m`, `3h`, `2d`, as kubectl prints ages.
pub fn human_age(seconds: i64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(human_age(5), "5s");
        assert_eq!(human_age(600), "10m");
        assert_eq!(human_age(7200), "2h");
        assert_eq!(human_age(200_000), "2d");
    }

    #[test]
    fn listed_probes_are_read_leniently() {
        let listed = listed_probes(
            r#"[{"name":"a","containerName":"main","podConditionType":"x/a"},{"name":"b"}]"#,
        );
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].condition_type, "x/a");
        assert_eq!(listed[1].container, "");
        assert!(listed_probes("not json").is_empty());
    }
}
