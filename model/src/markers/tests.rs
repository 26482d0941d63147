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

fn pod(l: Option<&[(&str, &str)]>, a: Option<&[(&str, &str)]>, conditions: &[(&str, &str)]) -> Pod {
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
