//! Label selector evaluation with apimachinery's `LabelSelectorAsSelector` rules, and the
//! choice of PodProbeMarkers for a pod (OpenKruise's `GetPodProbeMarkerForPod`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use podprobe_protocol::annotation::MARKER_LIST_ANNOTATION;

use crate::crd::PodProbeMarker;

/// A selector that apimachinery would refuse to convert; OpenKruise skips such PPMs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error(
        "matchExpressions[{index}]: operator {operator:?} is not In, NotIn, Exists or DoesNotExist"
    )]
    UnknownOperator { index: usize, operator: String },
    #[error("matchExpressions[{index}]: operator {operator} requires at least one value")]
    MissingValues { index: usize, operator: String },
    #[error("matchExpressions[{index}]: operator {operator} must have no values")]
    UnexpectedValues { index: usize, operator: String },
}

/// Whether `selector` selects `labels`. An empty selector matches everything here; callers that
/// must treat it as "nothing" (the webhook) check [`is_empty`] first.
pub fn matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let mut result = true;
    for (key, value) in selector.match_labels.iter().flatten() {
        result &= labels.get(key) == Some(value);
    }
    for (index, req) in selector.match_expressions.iter().flatten().enumerate() {
        let values = req.values.as_deref().unwrap_or_default();
        let op = req.operator.as_str();
        let needs_values = matches!(op, "In" | "NotIn");
        match op {
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            _ => {
                return Err(SelectorError::UnknownOperator {
                    index,
                    operator: req.operator.clone(),
                });
            }
        }
        if needs_values && values.is_empty() {
            return Err(SelectorError::MissingValues {
                index,
                operator: req.operator.clone(),
            });
        }
        if !needs_values && !values.is_empty() {
            return Err(SelectorError::UnexpectedValues {
                index,
                operator: req.operator.clone(),
            });
        }
        let current = labels.get(&req.key);
        result &= match op {
            "In" => current.is_some_and(|v| values.contains(v)),
            "NotIn" => current.is_none_or(|v| !values.contains(v)),
            "Exists" => current.is_some(),
            _ => current.is_none(),
        };
    }
    Ok(result)
}

/// A selector with neither matchLabels nor matchExpressions.
pub fn is_empty(selector: &LabelSelector) -> bool {
    selector
        .match_labels
        .as_ref()
        .is_none_or(BTreeMap::is_empty)
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(Vec::is_empty)
}

/// The PodProbeMarkers that apply to `pod`, in the order their probes are merged.
///
/// `namespace_ppms` must be the PPMs of the pod's namespace (the caller's cache knows the
/// namespace even when an admission request's pod object omits it). If the pod carries a
/// non-empty `kruise.io/podprobemarker-list`, exactly the named PPMs are used, in the list's
/// order as OpenKruise reads them (unknown and repeated names are skipped), and selectors are
/// not evaluated; otherwise PPMs whose non-empty, valid selector matches the pod labels,
/// sorted by name: OpenKruise leaves that order to its informer's map, and sorting is what
/// makes the first-wins merge deterministic.
pub fn markers_for_pod<'a>(
    pod: &Pod,
    namespace_ppms: &'a [PodProbeMarker],
) -> Vec<&'a PodProbeMarker> {
    let list = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MARKER_LIST_ANNOTATION))
        .filter(|v| !v.is_empty());
    if let Some(list) = list {
        let mut chosen: Vec<&PodProbeMarker> = Vec::new();
        for name in list.split(',') {
            let found = namespace_ppms.iter().find(|ppm| ppm_name(ppm) == name);
            if let Some(ppm) = found.filter(|_| !chosen.iter().any(|c| ppm_name(c) == name)) {
                chosen.push(ppm);
            }
        }
        return chosen;
    }
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let mut chosen: Vec<&PodProbeMarker> = namespace_ppms
        .iter()
        .filter(|ppm| {
            ppm.spec
                .selector
                .as_ref()
                .is_some_and(|s| !is_empty(s) && matches(s, labels).unwrap_or(false))
        })
        .collect();
    chosen.sort_by(|a, b| ppm_name(a).cmp(ppm_name(b)));
    chosen.dedup_by(|a, b| ppm_name(a) == ppm_name(b));
    chosen
}

pub(crate) fn ppm_name(ppm: &PodProbeMarker) -> &str {
    ppm.metadata.name.as_deref().unwrap_or("")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::crd::PodProbeMarkerSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, ObjectMeta};

    pub(crate) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: if values.is_empty() {
                None
            } else {
                Some(values.iter().map(|v| v.to_string()).collect())
            },
        }
    }

    fn sel_exprs(exprs: Vec<LabelSelectorRequirement>) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(exprs),
            match_labels: None,
        }
    }

    pub(crate) fn sel(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: Some(labels(pairs)),
            match_expressions: None,
        }
    }

    #[test]
    fn match_labels_and_expressions_are_anded() {
        let pod = labels(&[("app", "web"), ("tier", "a")]);
        let mut s = sel(&[("app", "web")]);
        assert_eq!(matches(&s, &pod), Ok(true));
        s.match_expressions = Some(vec![expr("tier", "In", &["b"])]);
        assert_eq!(matches(&s, &pod), Ok(false));
        s.match_expressions = Some(vec![
            expr("tier", "NotIn", &["b"]),
            expr("x", "DoesNotExist", &[]),
        ]);
        assert_eq!(matches(&s, &pod), Ok(true));
        assert_eq!(
            matches(&sel_exprs(vec![expr("gone", "NotIn", &["v"])]), &pod),
            Ok(true)
        );
        assert_eq!(
            matches(&sel_exprs(vec![expr("gone", "Exists", &[])]), &pod),
            Ok(false)
        );
    }

    #[test]
    fn malformed_requirements_are_errors() {
        let pod = labels(&[]);
        assert!(matches!(
            matches(&sel_exprs(vec![expr("a", "Equals", &["x"])]), &pod),
            Err(SelectorError::UnknownOperator { .. })
        ));
        assert!(matches!(
            matches(&sel_exprs(vec![expr("a", "In", &[])]), &pod),
            Err(SelectorError::MissingValues { .. })
        ));
        assert!(matches!(
            matches(&sel_exprs(vec![expr("a", "Exists", &["x"])]), &pod),
            Err(SelectorError::UnexpectedValues { .. })
        ));
    }

    pub(crate) fn ppm(name: &str, selector: Option<LabelSelector>) -> PodProbeMarker {
        PodProbeMarker {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("sp1".into()),
                ..Default::default()
            },
            spec: PodProbeMarkerSpec {
                selector,
                probes: vec![],
            },
            status: None,
        }
    }

    pub(crate) fn pod_with(labels_: &[(&str, &str)], annotations: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some("sp1".into()),
                name: Some("pod1".into()),
                labels: Some(labels(labels_)),
                annotations: (!annotations.is_empty()).then(|| labels(annotations)),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn names(v: Vec<&PodProbeMarker>) -> Vec<&str> {
        v.into_iter().map(ppm_name).collect()
    }

    /// TV-05: the list annotation wins and selectors are never evaluated.
    #[test]
    fn tv05_list_annotation_overrides_selectors() {
        let ppms = vec![
            ppm("game-server-probe-v3", None),
            ppm("game-server-probe-v2", None),
            ppm("game-server-probe-v1", None),
        ];
        let pod = pod_with(
            &[("app", "test-v2")],
            &[(
                MARKER_LIST_ANNOTATION,
                "game-server-probe-v1,game-server-probe-v2,missing",
            )],
        );
        assert_eq!(
            names(markers_for_pod(&pod, &ppms)),
            ["game-server-probe-v1", "game-server-probe-v2"]
        );
    }

    /// OpenKruise GETs the listed PPMs one by one in the list's order, and the first-wins
    /// merge follows it (found side by side with the real kruise-manager).
    #[test]
    fn list_annotation_order_is_kept_and_repeats_are_skipped() {
        let ppms = vec![ppm("a", None), ppm("b", None), ppm("c", None)];
        let pod = pod_with(&[], &[(MARKER_LIST_ANNOTATION, "c,a,c,missing,b")]);
        assert_eq!(names(markers_for_pod(&pod, &ppms)), ["c", "a", "b"]);
    }

    /// TV-06: no selector matches → nothing.
    #[test]
    fn tv06_no_matching_marker() {
        let ppms = vec![
            ppm("game-server-probe-v1", Some(sel(&[("app", "test-v1")]))),
            ppm("game-server-probe-v2", Some(sel(&[("app", "test-v2")]))),
            ppm("game-server-probe-v3", Some(sel(&[("app", "test-v2")]))),
        ];
        let pod = pod_with(&[("app", "test")], &[]);
        assert!(markers_for_pod(&pod, &ppms).is_empty());
        let pod = pod_with(&[("app", "test-v2")], &[]);
        assert_eq!(
            names(markers_for_pod(&pod, &ppms)),
            ["game-server-probe-v2", "game-server-probe-v3"]
        );
    }

    #[test]
    fn nil_empty_and_invalid_selectors_match_nothing() {
        let bad = sel_exprs(vec![expr("app", "In", &[])]);
        let ppms = vec![
            ppm("nil", None),
            ppm("empty", Some(LabelSelector::default())),
            ppm("bad", Some(bad)),
        ];
        let pod = pod_with(&[("app", "web")], &[]);
        assert!(markers_for_pod(&pod, &ppms).is_empty());
    }

    #[test]
    fn empty_list_annotation_falls_back_to_selectors() {
        let ppms = vec![
            ppm("b", Some(sel(&[("app", "web")]))),
            ppm("a", Some(sel(&[("app", "web")]))),
        ];
        let pod = pod_with(&[("app", "web")], &[(MARKER_LIST_ANNOTATION, "")]);
        assert_eq!(names(markers_for_pod(&pod, &ppms)), ["a", "b"]);
    }
}
