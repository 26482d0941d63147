//! Markers: turning the pod conditions the sidecar writes into the `markerPolicy`
//! labels/annotations of the probes' PodProbeMarkers.
//!
//! Per pod (not per PPM as in OpenKruise), so one pod event yields at most one patch covering
//! every PPM that applies. Unlike OpenKruise's serverless path, the keys of the opposite-state
//! policy are removed (the contract and OpenKruise's daemon path both do this), and a pod whose
//! labels or annotations map is missing gets no empty `{}` patch when nothing changes.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use serde::Serialize;

use podprobe_protocol::state::ProbeState;

use crate::crd::{PodContainerProbe, PodProbeMarker};
use crate::selector::markers_for_pod;

/// A strategic-merge patch of pod metadata: `Some` sets a key, `None` (JSON `null`) deletes it.
/// Serializes as `{"metadata":{"annotations":{..},"labels":{..}}}` with sorted keys, which is
/// the byte order Go's map encoding produces for OpenKruise's patch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MarkerPatch {
    pub metadata: MetadataPatch,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MetadataPatch {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, Option<String>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, Option<String>>,
}

impl MarkerPatch {
    /// The body for `PATCH pods/<name>` with `application/strategic-merge-patch+json`.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn is_empty(&self) -> bool {
        self.metadata.annotations.is_empty() && self.metadata.labels.is_empty()
    }
}

/// What the policies of one pass want for each key: a value, or removal.
#[derive(Default)]
struct Desired {
    labels: BTreeMap<String, Option<String>>,
    annotations: BTreeMap<String, Option<String>>,
}

/// Records the first value set for a key; a removal only when no policy sets the key, so a
/// key shared by several probes never flaps with PPM order.
fn want(map: &mut BTreeMap<String, Option<String>>, key: &str, value: Option<&str>) {
    match (map.get(key), value) {
        (Some(Some(_)), _) | (Some(None), None) => {}
        _ => {
            map.insert(key.to_owned(), value.map(str::to_owned));
        }
    }
}

/// The patch that brings `pod`'s metadata in line with its probe conditions, or `None` when it
/// already is (no API call). `namespace_ppms` are the PPMs of the pod's namespace; the ones
/// that apply are chosen as the webhook does (list annotation, else selector), in name order.
pub fn marker_patch(pod: &Pod, namespace_ppms: &[PodProbeMarker]) -> Option<MarkerPatch> {
    let conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let mut desired = Desired::default();
    // Sets are collected before removals so "sets beat removals" holds across probes too.
    let mut removals: Vec<(&PodContainerProbe, &str)> = Vec::new();
    for ppm in markers_for_pod(pod, namespace_ppms) {
        for probe in &ppm.spec.probes {
            if probe.pod_condition_type.is_empty() || probe.marker_policy.is_empty() {
                continue;
            }
            let Some(state) = condition_state(conditions, &probe.pod_condition_type) else {
                continue;
            };
            for policy in probe.marker_policy.iter().filter(|p| p.state == state) {
                for (k, v) in &policy.labels {
                    want(&mut desired.labels, k, Some(v));
                }
                for (k, v) in &policy.annotations {
                    want(&mut desired.annotations, k, Some(v));
                }
            }
            removals.push((probe, state));
        }
    }
    for (probe, state) in removals {
        let matched: Vec<_> = probe
            .marker_policy
            .iter()
            .filter(|p| p.state == state)
            .collect();
        for policy in probe.marker_policy.iter().filter(|p| p.state != state) {
            for k in policy.labels.keys() {
                if !matched.iter().any(|m| m.labels.contains_key(k)) {
                    want(&mut desired.labels, k, None);
                }
            }
            for k in policy.annotations.keys() {
                if !matched.iter().any(|m| m.annotations.contains_key(k)) {
                    want(&mut desired.annotations, k, None);
                }
            }
        }
    }
    let patch = MarkerPatch {
        metadata: MetadataPatch {
            labels: diff(pod.metadata.labels.as_ref(), desired.labels),
            annotations: diff(pod.metadata.annotations.as_ref(), desired.annotations),
        },
    };
    (!patch.is_empty()).then_some(patch)
}

/// The policy state a condition selects: `True` → Succeeded, `False` → Failed; `Unknown`,
/// anything else or no condition → none (markers stay as they are until the probe decides).
fn condition_state(conditions: &[PodCondition], condition_type: &str) -> Option<&'static str> {
    let condition = conditions.iter().find(|c| c.type_ == condition_type)?;
    ProbeState::of_condition_status(&condition.status).marker_state()
}

fn diff(
    current: Option<&BTreeMap<String, String>>,
    desired: BTreeMap<String, Option<String>>,
) -> BTreeMap<String, Option<String>> {
    desired
        .into_iter()
        .filter(|(k, want)| current.and_then(|c| c.get(k)) != want.as_ref())
        .collect()
}

/// Condition types whose status changed between two versions of a pod, including types new in
/// `new`; removed conditions and message/reason/time-only changes do not count (OpenKruise's
/// pod event filter, so controllers react to the same events).
pub fn changed_condition_types(old: &Pod, new: &Pod) -> BTreeSet<String> {
    let conds = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default()
    };
    let old = conds(old);
    conds(new)
        .into_iter()
        .filter(|n| {
            old.iter()
                .find(|o| o.type_ == n.type_)
                .is_none_or(|o| o.status != n.status)
        })
        .map(|c| c.type_)
        .collect()
}

/// Whether any PPM applying to `pod` has a marker probe on one of `condition_types`; lets a pod
/// watcher skip events that cannot change markers.
pub fn affects_markers(
    pod: &Pod,
    namespace_ppms: &[PodProbeMarker],
    condition_types: &BTreeSet<String>,
) -> bool {
    markers_for_pod(pod, namespace_ppms).iter().any(|ppm| {
        ppm.spec
            .probes
            .iter()
            .any(|p| !p.marker_policy.is_empty() && condition_types.contains(&p.pod_condition_type))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{PodProbeMarkerSpec, ProbeMarkerPolicy};
    use crate::selector::tests::{labels, sel};
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn policy(state: &str, l: &[(&str, &str)], a: &[(&str, &str)]) -> ProbeMarkerPolicy {
        ProbeMarkerPolicy {
            state: state.into(),
            labels: labels(l),
            annotations: labels(a),
        }
    }

    fn marker_probe(condition: &str, policies: Vec<ProbeMarkerPolicy>) -> PodContainerProbe {
        PodContainerProbe {
            name: condition.replace('/', "-"),
            container_name: "main".into(),
            pod_condition_type: condition.into(),
            marker_policy: policies,
            ..Default::default()
        }
    }

    fn ppm(name: &str, probes: Vec<PodContainerProbe>) -> PodProbeMarker {
        PodProbeMarker {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: PodProbeMarkerSpec {
                selector: Some(sel(&[("app", "web")])),
                probes,
            },
            status: None,
        }
    }

    fn pod(
        l: Option<&[(&str, &str)]>,
        a: Option<&[(&str, &str)]>,
        conditions: &[(&str, &str)],
    ) -> Pod {
        Pod {
            metadata: ObjectMeta {
                labels: l.map(labels),
                annotations: a.map(labels),
                ..Default::default()
            },
            spec: None,
            status: Some(PodStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| PodCondition {
                            type_: t.to_string(),
                            status: s.to_string(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
        }
    }

    fn tv08_ppm() -> PodProbeMarker {
        ppm(
            "game",
            vec![
                marker_probe(
                    "game.io/idle",
                    vec![
                        policy(
                            "Succeeded",
                            &[("gameserver-idle", "true")],
                            &[("controller.kubernetes.io/pod-deletion-cost", "-10")],
                        ),
                        policy(
                            "Failed",
                            &[("gameserver-idle", "false")],
                            &[("controller.kubernetes.io/pod-deletion-cost", "10")],
                        ),
                    ],
                ),
                marker_probe(
                    "game.io/healthy",
                    vec![
                        policy(
                            "Succeeded",
                            &[("gameserver-healthy", "true")],
                            &[("controller.kubernetes.io/ingress", "true")],
                        ),
                        policy(
                            "Failed",
                            &[("gameserver-healthy", "false")],
                            &[("controller.kubernetes.io/ingress", "false")],
                        ),
                    ],
                ),
            ],
        )
    }

    #[test]
    fn tv08_two_conditions_patch_matches_openkruise_verbatim() {
        let pod = pod(
            Some(&[("app", "web")]),
            Some(&[("app", "web")]),
            &[
                ("Initialized", "True"),
                ("game.io/idle", "True"),
                ("game.io/healthy", "False"),
            ],
        );
        let patch = marker_patch(&pod, &[tv08_ppm()]).unwrap();
        assert_eq!(
            patch.to_json(),
            r#"{"metadata":{"annotations":{"controller.kubernetes.io/ingress":"false","controller.kubernetes.io/pod-deletion-cost":"-10"},"labels":{"gameserver-healthy":"false","gameserver-idle":"true"}}}"#
        );
    }

    #[test]
    fn already_marked_pod_needs_no_call() {
        let pod = pod(
            Some(&[
                ("app", "web"),
                ("gameserver-idle", "true"),
                ("gameserver-healthy", "false"),
            ]),
            Some(&[
                ("controller.kubernetes.io/pod-deletion-cost", "-10"),
                ("controller.kubernetes.io/ingress", "false"),
            ]),
            &[("game.io/idle", "True"), ("game.io/healthy", "False")],
        );
        assert_eq!(marker_patch(&pod, &[tv08_ppm()]), None);
    }

    /// TV-09, contract version: with only a Succeeded policy, a False condition removes it.
    #[test]
    fn tv09_single_state_policy_label_removed_when_false() {
        let nginx = ppm(
            "ppm-nginx",
            vec![marker_probe(
                "game.kruise.io/healthy",
                vec![policy("Succeeded", &[("nginx", "healthy")], &[])],
            )],
        );
        let mut p = pod(
            Some(&[("app", "web"), ("nginx", "healthy")]),
            None,
            &[("game.kruise.io/healthy", "False")],
        );
        let patch = marker_patch(&p, std::slice::from_ref(&nginx)).unwrap();
        assert_eq!(patch.to_json(), r#"{"metadata":{"labels":{"nginx":null}}}"#);
        // Once removed, nothing more to do.
        p.metadata.labels = Some(labels(&[("app", "web")]));
        assert_eq!(marker_patch(&p, &[nginx]), None);
    }

    fn tv10_ppm() -> PodProbeMarker {
        ppm(
            "idle",
            vec![marker_probe(
                "game.io/idle",
                vec![
                    policy("Succeeded", &[("idle", "true")], &[]),
                    policy("Failed", &[("idle", "false")], &[]),
                ],
            )],
        )
    }

    #[test]
    fn tv10_unknown_or_missing_condition_changes_nothing() {
        // a: Unknown
        let a = pod(
            Some(&[("app", "web")]),
            Some(&[]),
            &[("game.io/idle", "Unknown")],
        );
        assert_eq!(marker_patch(&a, &[tv10_ppm()]), None);
        // b: no conditions
        let b = pod(Some(&[("app", "web")]), Some(&[]), &[]);
        assert_eq!(marker_patch(&b, &[tv10_ppm()]), None);
        // c: nil annotations; OpenKruise sends `{}` here, podprobe deliberately sends nothing.
        let c = pod(
            Some(&[("app", "web")]),
            None,
            &[("game.io/idle", "Unknown")],
        );
        assert_eq!(marker_patch(&c, &[tv10_ppm()]), None);
    }

    /// TV-11 semantics driven by the condition: the Failed policy replaces the Succeeded one,
    /// shared keys take the matched value, the rest of the Succeeded keys go.
    #[test]
    fn tv11_opposite_policy_keys_removed_shared_keys_overwritten() {
        let ppm = ppm(
            "test3",
            vec![marker_probe(
                "game.io/healthy",
                vec![
                    policy(
                        "Succeeded",
                        &[("server-healthy", "true"), ("success", "true")],
                        &[
                            ("controller.kubernetes.io/pod-deletion-cost", "10"),
                            ("success", "true"),
                        ],
                    ),
                    policy(
                        "Failed",
                        &[("failed", "true")],
                        &[
                            ("controller.kubernetes.io/pod-deletion-cost", "-10"),
                            ("failed", "true"),
                        ],
                    ),
                ],
            )],
        );
        let p = pod(
            Some(&[
                ("app", "web"),
                ("server-healthy", "true"),
                ("success", "true"),
            ]),
            Some(&[
                ("controller.kubernetes.io/pod-deletion-cost", "10"),
                ("success", "true"),
            ]),
            &[("game.io/healthy", "False")],
        );
        let patch = marker_patch(&p, &[ppm]).unwrap();
        assert_eq!(
            patch.to_json(),
            r#"{"metadata":{"annotations":{"controller.kubernetes.io/pod-deletion-cost":"-10","failed":"true","success":null},"labels":{"failed":"true","server-healthy":null,"success":null}}}"#
        );
    }

    #[test]
    fn sets_win_over_removals_and_first_marker_wins_conflicts() {
        let a = ppm(
            "a",
            vec![marker_probe(
                "c1",
                vec![
                    policy("Succeeded", &[("shared", "a")], &[]),
                    policy("Failed", &[("only-a", "x")], &[]),
                ],
            )],
        );
        let b = ppm(
            "b",
            vec![marker_probe(
                "c2",
                vec![
                    policy("Succeeded", &[("b-ok", "y")], &[]),
                    policy("Failed", &[("shared", "b")], &[]),
                ],
            )],
        );
        // c2 True wants `shared` removed (b's Failed key), but a's set of `shared` wins.
        let p = pod(
            Some(&[("app", "web"), ("only-a", "x")]),
            None,
            &[("c1", "True"), ("c2", "True")],
        );
        let got = marker_patch(&p, &[b.clone(), a.clone()]).unwrap().to_json();
        assert_eq!(
            got,
            r#"{"metadata":{"labels":{"b-ok":"y","only-a":null,"shared":"a"}}}"#
        );
        // Both set `shared`: the first PPM by name wins, whatever the input order.
        let p = pod(
            Some(&[("app", "web")]),
            None,
            &[("c1", "True"), ("c2", "False")],
        );
        let got = marker_patch(&p, &[b, a]).unwrap().to_json();
        assert_eq!(got, r#"{"metadata":{"labels":{"shared":"a"}}}"#);
    }

    #[test]
    fn probes_without_condition_or_policy_and_unselected_pods_are_ignored() {
        let mut p = pod(Some(&[("app", "other")]), None, &[("game.io/idle", "True")]);
        assert_eq!(marker_patch(&p, &[tv10_ppm()]), None);
        p.metadata.labels = Some(labels(&[("app", "web")]));
        let mut no_policy = tv10_ppm();
        no_policy.spec.probes[0].marker_policy.clear();
        assert_eq!(marker_patch(&p, &[no_policy]), None);
        assert!(marker_patch(&p, &[tv10_ppm()]).is_some());
    }

    /// TV-12: only status changes and new condition types count.
    #[test]
    fn tv12_changed_condition_types_and_affected_markers() {
        let old = pod(
            Some(&[("app", "web")]),
            None,
            &[
                ("Ready", "True"),
                ("Initialized", "False"),
                ("gone", "True"),
            ],
        );
        let new = pod(
            Some(&[("app", "web")]),
            None,
            &[
                ("Ready", "True"),
                ("Initialized", "True"),
                ("game.kruise.io/idle", "True"),
            ],
        );
        let changed = changed_condition_types(&old, &new);
        assert_eq!(
            changed.iter().map(String::as_str).collect::<Vec<_>>(),
            ["Initialized", "game.kruise.io/idle"]
        );
        let healthy = ppm(
            "game-server-probe-v1",
            vec![marker_probe(
                "game.kruise.io/healthy",
                vec![policy("Succeeded", &[("h", "t")], &[])],
            )],
        );
        let idle = ppm(
            "game-server-probe-v3",
            vec![marker_probe(
                "game.kruise.io/idle",
                vec![policy("Succeeded", &[("i", "t")], &[])],
            )],
        );
        assert!(!affects_markers(
            &new,
            std::slice::from_ref(&healthy),
            &changed
        ));
        assert!(affects_markers(&new, &[healthy, idle], &changed));
    }
}
