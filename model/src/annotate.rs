//! The pod mutating webhook's pure logic: which probes of which PodProbeMarkers go into a new
//! pod's `kruise.io/podprobe` annotation, and the JSON patch that writes it.
//!
//! Mirrors OpenKruise's `podProbeMarkerMutatingPod` (filter, first-wins merge, markerPolicy
//! stripped, Go-identical JSON), with PPMs processed in the order of the pod's list annotation
//! when it has one (as OpenKruise) and otherwise in name order, so the result is deterministic
//! where OpenKruise's follows its informer's map order.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use k8s_openapi::api::core::v1::Pod;
use podprobe_protocol::annotation::{
    MARKER_LIST_ANNOTATION, PODPROBE_ANNOTATION, PodContainerProbe,
};
use serde_json::Value;

use crate::crd::PodProbeMarker;
use crate::gojson;
use crate::patch::{PatchOp, pointer};
use crate::selector::{markers_for_pod, ppm_name};

/// The two annotation values OpenKruise would write on this pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeAnnotations {
    /// `kruise.io/podprobe`: compact Go JSON array of the accepted probes.
    pub probes: String,
    /// `kruise.io/podprobemarker-list`: sorted, de-duplicated, comma-joined PPM names.
    pub marker_list: String,
}

impl ProbeAnnotations {
    /// `(key, value)` pairs in the order the patch writes them.
    pub fn pairs(&self) -> [(&'static str, &str); 2] {
        [
            (PODPROBE_ANNOTATION, &self.probes),
            (MARKER_LIST_ANNOTATION, &self.marker_list),
        ]
    }
}

/// The annotations for `pod` given the PPMs of its namespace; `None` when no probe is accepted,
/// in which case the pod must be left untouched (existing values included).
pub fn compute(pod: &Pod, namespace_ppms: &[PodProbeMarker]) -> Option<ProbeAnnotations> {
    let allowed = allowed_containers(pod);
    let mut condition_types = HashSet::new();
    let mut keys = HashSet::new();
    let mut contributors = BTreeSet::new();
    let mut accepted = Vec::new();
    for ppm in markers_for_pod(pod, namespace_ppms) {
        for probe in &ppm.spec.probes {
            let condition = probe.pod_condition_type.as_str();
            if condition.is_empty()
                || condition_types.contains(condition)
                || !allowed.contains(probe.container_name.as_str())
            {
                continue;
            }
            let key = format!("{}/{}", probe.container_name, probe.name);
            if keys.contains(&key) {
                continue;
            }
            keys.insert(key);
            condition_types.insert(condition);
            contributors.insert(ppm_name(ppm));
            accepted.push(PodContainerProbe {
                name: probe.name.clone(),
                container_name: probe.container_name.clone(),
                probe: probe.probe.clone(),
                pod_condition_type: condition.to_owned(),
                marker_policy: Vec::new(),
            });
        }
    }
    if accepted.is_empty() {
        return None;
    }
    Some(ProbeAnnotations {
        probes: gojson::probes_to_go_json(&accepted),
        marker_list: contributors.into_iter().collect::<Vec<_>>().join(","),
    })
}

/// Containers a probe may target: app containers and native sidecars (restartable init
/// containers), which run for the pod's whole life; ordinary init and ephemeral containers do not.
fn allowed_containers(pod: &Pod) -> HashSet<&str> {
    let Some(spec) = &pod.spec else {
        return HashSet::new();
    };
    let app = spec.containers.iter().map(|c| c.name.as_str());
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.as_str());
    app.chain(sidecars).collect()
}

/// JSON patch ops that set both annotations on `pod`. A pod without an annotations map gets
/// the whole map in one `add` (a pointer into a missing object would fail); otherwise each key
/// is added, or replaced when present, leaving other annotations alone.
pub fn patch_ops(pod: &Pod, annotations: &ProbeAnnotations) -> Vec<PatchOp> {
    match &pod.metadata.annotations {
        None => {
            let map: BTreeMap<&str, &str> = annotations.pairs().into_iter().collect();
            vec![PatchOp::Add {
                path: "/metadata/annotations".into(),
                value: serde_json::to_value(map).unwrap_or(Value::Null),
            }]
        }
        Some(existing) => annotations
            .pairs()
            .into_iter()
            .filter(|(key, value)| existing.get(*key).map(String::as_str) != Some(*value))
            .map(|(key, value)| {
                let path = pointer(&["metadata", "annotations", key]);
                let value = Value::String(value.to_owned());
                if existing.contains_key(key) {
                    PatchOp::Replace { path, value }
                } else {
                    PatchOp::Add { path, value }
                }
            })
            .collect(),
    }
}

/// The webhook's whole decision: the ops to return in the AdmissionReview (empty = allow
/// unchanged).
pub fn mutate(pod: &Pod, namespace_ppms: &[PodProbeMarker]) -> Vec<PatchOp> {
    compute(pod, namespace_ppms)
        .map(|a| patch_ops(pod, &a))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{PodContainerProbe as PpmProbe, PodProbeMarkerSpec, ProbeMarkerPolicy};
    use crate::selector::tests::{labels, sel};
    use k8s_openapi::api::core::v1::{
        Container, ExecAction, HTTPGetAction, PodSpec, Probe, TCPSocketAction,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use serde_json::json;

    fn container(name: &str, restart: Option<&str>) -> Container {
        Container {
            name: name.into(),
            restart_policy: restart.map(Into::into),
            ..Default::default()
        }
    }

    /// The pod of TV-01/TV-02.
    fn tv01_pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some("test".into()),
                name: Some("pod-1".into()),
                labels: Some(labels(&[("app", "web")])),
                annotations: Some(labels(&[("version", "test")])),
                ..Default::default()
            },
            spec: Some(PodSpec {
                init_containers: Some(vec![
                    container("init-1", None),
                    container("init-2", Some("Always")),
                ]),
                containers: vec![container("main", None), container("envoy", None)],
                ..Default::default()
            }),
            status: None,
        }
    }

    fn probe(name: &str, container: &str, condition: &str) -> PpmProbe {
        PpmProbe {
            name: name.into(),
            container_name: container.into(),
            pod_condition_type: condition.into(),
            ..Default::default()
        }
    }

    fn ppm(name: &str, app: &str, probes: Vec<PpmProbe>) -> PodProbeMarker {
        PodProbeMarker {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("test".into()),
                ..Default::default()
            },
            spec: PodProbeMarkerSpec {
                selector: Some(sel(&[("app", app)])),
                probes,
            },
            status: None,
        }
    }

    fn apply(pod: &Pod, ops: &[PatchOp]) -> BTreeMap<String, String> {
        let mut doc = serde_json::to_value(pod).unwrap();
        crate::patch::apply(&mut doc, ops).unwrap();
        serde_json::from_value(doc["metadata"]["annotations"].clone()).unwrap()
    }

    #[test]
    fn tv01_no_condition_type_or_unknown_container_writes_nothing() {
        let ppms = vec![ppm(
            "healthy",
            "web",
            vec![
                probe("healthy", "main", ""),
                probe("healthy", "invalid", "game.kruise.io/healthy"),
            ],
        )];
        let pod = tv01_pod();
        assert_eq!(compute(&pod, &ppms), None);
        assert!(mutate(&pod, &ppms).is_empty());
    }

    #[test]
    fn tv02_merge_two_markers_duplicate_condition_and_init_containers() {
        // Given out of name order: the result must not depend on it.
        let ppms = vec![
            ppm(
                "init",
                "web",
                vec![
                    probe("init", "init-1", "game.kruise.io/init"),
                    probe("init", "init-2", "game.kruise.io/init"),
                ],
            ),
            ppm(
                "healthy",
                "web",
                vec![
                    probe("healthy", "main", "game.kruise.io/healthy"),
                    probe("healthy", "envoy", "game.kruise.io/healthy"),
                ],
            ),
        ];
        let pod = tv01_pod();
        let got = apply(&pod, &mutate(&pod, &ppms));
        let want = labels(&[
            ("version", "test"),
            (
                "kruise.io/podprobe",
                r#"[{"name":"healthy","containerName":"main","probe":{},"podConditionType":"game.kruise.io/healthy"},{"name":"init","containerName":"init-2","probe":{},"podConditionType":"game.kruise.io/init"}]"#,
            ),
            ("kruise.io/podprobemarker-list", "healthy,init"),
        ]);
        assert_eq!(got, want);
    }

    fn tv03_ppm() -> PodProbeMarker {
        let mut p = probe("healthy", "main", "game.kruise.io/healthy");
        p.probe = Probe {
            exec: Some(ExecAction {
                command: Some(vec!["/bin/sh".into(), "-c".into(), "/healthy.sh".into()]),
            }),
            initial_delay_seconds: Some(10),
            timeout_seconds: Some(3),
            period_seconds: Some(10),
            success_threshold: Some(1),
            failure_threshold: Some(3),
            ..Default::default()
        };
        p.marker_policy = vec![
            ProbeMarkerPolicy {
                state: "Succeeded".into(),
                labels: labels(&[("server-healthy", "true")]),
                ..Default::default()
            },
            ProbeMarkerPolicy {
                state: "Failed".into(),
                labels: labels(&[("server-healthy", "false")]),
                ..Default::default()
            },
        ];
        ppm("ppm-test", "test", vec![p])
    }

    fn simple_pod(annotations: Option<&[(&str, &str)]>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some("test".into()),
                labels: Some(labels(&[("app", "test")])),
                annotations: annotations.map(labels),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![container("main", None)],
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn tv03_exec_probe_with_timing_and_marker_policy_stripped() {
        let got = compute(&simple_pod(None), &[tv03_ppm()]).unwrap();
        assert_eq!(
            got.probes,
            r#"[{"name":"healthy","containerName":"main","probe":{"exec":{"command":["/bin/sh","-c","/healthy.sh"]},"initialDelaySeconds":10,"timeoutSeconds":3,"periodSeconds":10,"successThreshold":1,"failureThreshold":3},"podConditionType":"game.kruise.io/healthy"}]"#
        );
        assert_eq!(got.marker_list, "ppm-test");
    }

    #[test]
    fn tv04_named_ports_stay_strings() {
        let mut http = probe("httpCheckHealthy", "main", "game.kruise.io/healthy");
        http.probe.http_get = Some(HTTPGetAction {
            path: Some("/index.html".into()),
            port: IntOrString::String("main-port".into()),
            scheme: Some("HTTP".into()),
            ..Default::default()
        });
        let mut tcp = probe("tcpCheckHealthy", "main", "game.kruise.io/tcp");
        tcp.probe.tcp_socket = Some(TCPSocketAction {
            port: IntOrString::String("main-port".into()),
            host: None,
        });
        let got = compute(&simple_pod(None), &[ppm("p", "test", vec![http, tcp])]).unwrap();
        assert_eq!(
            got.probes,
            concat!(
                r#"[{"name":"httpCheckHealthy","containerName":"main","probe":{"httpGet":{"path":"/index.html","port":"main-port","scheme":"HTTP"}},"podConditionType":"game.kruise.io/healthy"},"#,
                r#"{"name":"tcpCheckHealthy","containerName":"main","probe":{"tcpSocket":{"port":"main-port"}},"podConditionType":"game.kruise.io/tcp"}]"#
            )
        );
    }

    #[test]
    fn tv05_list_annotation_selects_markers_regardless_of_selector() {
        let mut pod = simple_pod(Some(&[(MARKER_LIST_ANNOTATION, "ppm-test")]));
        pod.metadata.labels = Some(labels(&[("app", "other")]));
        let got = compute(&pod, &[tv03_ppm()]).unwrap();
        assert_eq!(got.marker_list, "ppm-test");
        // The existing list value is identical, so only the probe annotation is written.
        let ops = patch_ops(&pod, &got);
        assert_eq!(ops.len(), 1);
        assert!(
            matches!(&ops[0], PatchOp::Add { path, .. } if path == "/metadata/annotations/kruise.io~1podprobe")
        );
    }

    #[test]
    fn tv06_no_matching_marker_leaves_pod_untouched() {
        let mut pod = simple_pod(Some(&[(PODPROBE_ANNOTATION, "user value")]));
        pod.metadata.labels = Some(labels(&[("app", "nope")]));
        assert!(mutate(&pod, &[tv03_ppm()]).is_empty());
    }

    #[test]
    fn tv07_go_html_escaping_in_commands() {
        let mut p = probe("e", "main", "c");
        p.probe.exec = Some(ExecAction {
            command: Some(vec![
                "sh".into(),
                "-c".into(),
                "test -f /ready && echo <ok>".into(),
            ]),
        });
        let got = compute(&simple_pod(None), &[ppm("p", "test", vec![p])]).unwrap();
        assert!(
            got.probes.contains(r#""probe":{"exec":{"command":["sh","-c","test -f /ready \u0026\u0026 echo \u003cok\u003e"]}}"#),
            "{}",
            got.probes
        );
        let back: Value = serde_json::from_str(&got.probes).unwrap();
        assert_eq!(
            back[0]["probe"]["exec"]["command"][2],
            "test -f /ready && echo <ok>"
        );
    }

    #[test]
    fn first_wins_on_container_and_name_across_markers() {
        let ppms = vec![
            ppm("a", "web", vec![probe("healthy", "main", "c1")]),
            // Same <container>/<name> with a new condition type: skipped.
            ppm(
                "b",
                "web",
                vec![probe("healthy", "main", "c2"), probe("other", "main", "c1")],
            ),
            // Same name on another container is a different key: accepted.
            ppm("c", "web", vec![probe("healthy", "envoy", "c3")]),
        ];
        let got = compute(&tv01_pod(), &ppms).unwrap();
        let parsed: Vec<PodContainerProbe> = serde_json::from_str(&got.probes).unwrap();
        let summary: Vec<(&str, &str, &str)> = parsed
            .iter()
            .map(|p| {
                (
                    p.container_name.as_str(),
                    p.name.as_str(),
                    p.pod_condition_type.as_str(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [("main", "healthy", "c1"), ("envoy", "healthy", "c3")]
        );
        // "b" contributed nothing, so it is not listed.
        assert_eq!(got.marker_list, "a,c");
    }

    #[test]
    fn pod_without_annotations_gets_the_whole_map_in_one_add() {
        let pod = simple_pod(None);
        let ops = mutate(&pod, &[tv03_ppm()]);
        assert_eq!(ops.len(), 1);
        let PatchOp::Add { path, value } = &ops[0] else {
            panic!("{ops:?}")
        };
        assert_eq!(path, "/metadata/annotations");
        assert_eq!(value[MARKER_LIST_ANNOTATION], json!("ppm-test"));
        assert!(
            value[PODPROBE_ANNOTATION]
                .as_str()
                .unwrap()
                .starts_with(r#"[{"name":"healthy""#)
        );
    }

    #[test]
    fn existing_values_are_replaced_and_other_annotations_kept() {
        let pod = simple_pod(Some(&[(PODPROBE_ANNOTATION, "stale"), ("keep", "me")]));
        let ops = mutate(&pod, &[tv03_ppm()]);
        assert!(
            matches!(&ops[0], PatchOp::Replace { path, .. } if path == "/metadata/annotations/kruise.io~1podprobe")
        );
        assert!(
            matches!(&ops[1], PatchOp::Add { path, .. } if path == "/metadata/annotations/kruise.io~1podprobemarker-list")
        );
        let got = apply(&pod, &ops);
        assert_eq!(got["keep"], "me");
        assert_eq!(got[MARKER_LIST_ANNOTATION], "ppm-test");
    }

    #[test]
    fn ordinary_init_and_missing_spec_are_not_probe_targets() {
        let ppms = vec![ppm("p", "web", vec![probe("i", "init-1", "c")])];
        assert_eq!(compute(&tv01_pod(), &ppms), None);
        let mut pod = tv01_pod();
        pod.spec = None;
        let ppms = vec![ppm("p", "web", vec![probe("m", "main", "c")])];
        assert_eq!(compute(&pod, &ppms), None);
    }
}
