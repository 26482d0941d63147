use super::*;
use crate::crd::PodContainerProbe;
use crate::selector::tests::{labels, sel};
use k8s_openapi::api::core::v1::{
    ExecAction, GRPCAction, HTTPGetAction, HTTPHeader, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// OpenKruise's `ppmDemo`.
fn ppm_demo() -> PodProbeMarker {
    PodProbeMarker {
        metadata: ObjectMeta {
            name: Some("ppm-test".into()),
            ..Default::default()
        },
        spec: PodProbeMarkerSpec {
            selector: Some(sel(&[("app", "test")])),
            probes: vec![PodContainerProbe {
                name: "healthy".into(),
                container_name: "main".into(),
                probe: Probe {
                    exec: Some(ExecAction {
                        command: Some(vec!["/bin/sh".into(), "-c".into(), "/healthy.sh".into()]),
                    }),
                    ..Default::default()
                },
                pod_condition_type: "game.kruise.io/healthy".into(),
                marker_policy: vec![
                    ProbeMarkerPolicy {
                        state: "Succeeded".into(),
                        annotations: labels(&[(
                            "controller.kubernetes.io/pod-deletion-cost",
                            "10",
                        )]),
                        labels: labels(&[("server-healthy", "true")]),
                    },
                    ProbeMarkerPolicy {
                        state: "Failed".into(),
                        annotations: labels(&[(
                            "controller.kubernetes.io/pod-deletion-cost",
                            "-10",
                        )]),
                        labels: labels(&[("server-healthy", "false")]),
                    },
                ],
            }],
        },
        status: None,
    }
}

fn count(ppm: &PodProbeMarker) -> usize {
    match validate(ppm, None) {
        Ok(()) => 0,
        Err(ValidationErrors(e)) => e.len(),
    }
}

fn http_probe(name: &str) -> PodContainerProbe {
    PodContainerProbe {
        name: name.into(),
        container_name: "other".into(),
        probe: Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/index.html".into()),
                scheme: Some("HTTP".into()),
                port: IntOrString::Int(80),
                ..Default::default()
            }),
            ..Default::default()
        },
        pod_condition_type: "game.kruise.io/check".into(),
        ..Default::default()
    }
}

#[test]
fn tv13_error_counts_match_openkruise() {
    type Mutation = fn(&mut PodProbeMarker);
    let cases: Vec<(&str, Mutation, usize)> = vec![
        ("base", |_| {}, 0),
        ("test1 nil selector", |p| p.spec.selector = None, 1),
        ("test2 no probes", |p| p.spec.probes.clear(), 1),
        (
            "test3 duplicate name",
            |p| {
                p.spec.probes.push(PodContainerProbe {
                    name: "healthy".into(),
                    container_name: "other".into(),
                    ..Default::default()
                })
            },
            1,
        ),
        (
            "test4 valid http probe",
            |p| p.spec.probes.push(http_probe("check")),
            0,
        ),
        (
            "test5 empty exec",
            |p| {
                let mut probe = http_probe("check");
                probe.probe = Probe {
                    exec: Some(ExecAction::default()),
                    ..Default::default()
                };
                p.spec.probes.push(probe)
            },
            1,
        ),
        (
            "test6 Unknown state",
            |p| {
                p.spec.probes[0].marker_policy = vec![ProbeMarkerPolicy {
                    state: "Unknown".into(),
                    annotations: labels(&[("controller.kubernetes.io/pod-deletion-cost", "10")]),
                    labels: labels(&[("server-healthy", "true")]),
                }]
            },
            1,
        ),
        (
            "test7 bad label key",
            |p| {
                p.spec.probes[0].marker_policy = vec![ProbeMarkerPolicy {
                    state: "Succeeded".into(),
                    annotations: labels(&[("controller.kubernetes.io/pod-deletion-cost", "10")]),
                    labels: labels(&[("server-/$healthy", "true")]),
                }]
            },
            2,
        ),
        (
            "test8 reserved probe name",
            |p| p.spec.probes[0].name = "Initialized".into(),
            1,
        ),
        (
            "test9 bad condition type",
            |p| p.spec.probes[0].pod_condition_type = "#5invalid".into(),
            1,
        ),
        ("test10 empty name", |p| p.spec.probes[0].name.clear(), 1),
        (
            "test11 empty container",
            |p| p.spec.probes[0].container_name.clear(),
            1,
        ),
    ];
    for (name, mutate, want) in cases {
        let mut ppm = ppm_demo();
        mutate(&mut ppm);
        assert_eq!(count(&ppm), want, "{name}: {:?}", validate(&ppm, None));
    }
}

fn http(path: &str, port: IntOrString, scheme: &str) -> HTTPGetAction {
    HTTPGetAction {
        path: Some(path.into()),
        port,
        scheme: Some(scheme.into()),
        ..Default::default()
    }
}

fn header(name: &str) -> Option<Vec<HTTPHeader>> {
    Some(vec![HTTPHeader {
        name: name.into(),
        value: "value".into(),
    }])
}

#[test]
fn tv14_http_get_error_counts() {
    let int = IntOrString::Int;
    let cases: Vec<(&str, HTTPGetAction, usize)> = vec![
        ("valid", http("/healthz", int(8080), "HTTP"), 0),
        ("missing path", http("", int(8080), "HTTP"), 1),
        ("port 65536", http("/healthz", int(65536), "HTTP"), 1),
        (
            "bad port name",
            http(
                "/healthz",
                IntOrString::String("invalid-port-name-!@#".into()),
                "HTTP",
            ),
            2,
        ),
        ("FTP", http("/healthz", int(8080), "FTP"), 1),
        (
            "bad header",
            HTTPGetAction {
                http_headers: header("Invalid Header:Name"),
                ..http("/healthz", int(8080), "HTTPS")
            },
            1,
        ),
        (
            "multiple",
            HTTPGetAction {
                http_headers: header("Invalid:Header"),
                ..http("", int(99999), "FTP")
            },
            4,
        ),
        (
            "bad path escape",
            HTTPGetAction {
                http_headers: header("Valid-Header"),
                ..http("path%notvalid", int(8080), "HTTP")
            },
            1,
        ),
        (
            "host",
            HTTPGetAction {
                host: Some("127.0.0.1".into()),
                ..http("/healthz", int(8080), "HTTP")
            },
            1,
        ),
        (
            "Host header allowed (contract)",
            HTTPGetAction {
                http_headers: header("Host"),
                ..http("/healthz", int(8080), "HTTP")
            },
            0,
        ),
    ];
    for (name, action, want) in cases {
        let errors = validate_http_get(&action, "test");
        assert_eq!(errors.len(), want, "{name}: {errors:?}");
    }
}

fn validate_http_get(action: &HTTPGetAction, path: &str) -> Vec<FieldError> {
    validate_handler(
        &Probe {
            http_get: Some(action.clone()),
            ..Default::default()
        },
        path,
    )
}

fn handler_errors(p: Probe) -> usize {
    validate_handler(&p, "field").len()
}

fn tcp(port: IntOrString) -> Option<TCPSocketAction> {
    Some(TCPSocketAction { host: None, port })
}

#[test]
fn handler_rules_and_grpc_is_a_handler() {
    let exec = Some(ExecAction {
        command: Some(vec!["echo".into()]),
    });
    assert_eq!(
        handler_errors(Probe {
            exec: exec.clone(),
            ..Default::default()
        }),
        0
    );
    assert_eq!(
        handler_errors(Probe {
            tcp_socket: tcp(IntOrString::Int(8000)),
            ..Default::default()
        }),
        0
    );
    let named = tcp(IntOrString::String("container-port".into()));
    assert_eq!(
        handler_errors(Probe {
            tcp_socket: named,
            ..Default::default()
        }),
        0
    );
    assert_eq!(handler_errors(Probe::default()), 1);
    let long = tcp(IntOrString::String("container-port-v2".into()));
    assert_eq!(
        handler_errors(Probe {
            tcp_socket: long.clone(),
            ..Default::default()
        }),
        1
    );
    assert_eq!(
        handler_errors(Probe {
            tcp_socket: tcp(IntOrString::Int(-1)),
            ..Default::default()
        }),
        1
    );
    let tcp_host = Some(TCPSocketAction {
        host: Some("127.0.0.1".into()),
        port: IntOrString::Int(80),
    });
    assert_eq!(
        handler_errors(Probe {
            tcp_socket: tcp_host,
            ..Default::default()
        }),
        1
    );
    // Two handlers: the second is forbidden, the first is still checked.
    let errors = validate_handler(
        &Probe {
            exec: Some(ExecAction::default()),
            tcp_socket: long,
            ..Default::default()
        },
        "field",
    );
    assert_eq!(
        errors.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(),
        ["field.exec.command", "field.tcpSocket"]
    );
    let grpc = Some(GRPCAction {
        port: 9000,
        service: None,
    });
    assert_eq!(
        handler_errors(Probe {
            grpc: grpc.clone(),
            ..Default::default()
        }),
        0
    );
    assert_eq!(
        handler_errors(Probe {
            grpc: grpc.clone(),
            exec,
            ..Default::default()
        }),
        1
    );
    let bad_grpc = Some(GRPCAction {
        port: 0,
        service: None,
    });
    assert_eq!(
        handler_errors(Probe {
            grpc: bad_grpc,
            ..Default::default()
        }),
        1
    );
}

#[test]
fn errors_name_the_field() {
    let mut ppm = ppm_demo();
    let mut probe = http_probe("check");
    probe.probe.http_get.as_mut().unwrap().port = IntOrString::Int(70000);
    ppm.spec.probes.push(probe);
    let message = validate(&ppm, None).unwrap_err().to_string();
    assert_eq!(
        message,
        "spec.probes[1].probe.httpGet.port: Invalid value: 70000: must be between 1 and 65535, inclusive"
    );
}

#[test]
fn selector_is_immutable_on_update() {
    let old = ppm_demo();
    let mut new = ppm_demo();
    new.spec.probes[0].probe.period_seconds = Some(5);
    assert_eq!(validate(&new, Some(&old)), Ok(()));
    new.spec.selector = Some(sel(&[("app", "other")]));
    let errors = validate(&new, Some(&old)).unwrap_err().0;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].field, "spec.selector");
    assert!(errors[0].detail.contains("immutable"));
}

#[test]
fn selector_rules() {
    let mut ppm = ppm_demo();
    ppm.spec.selector = Some(LabelSelector::default());
    assert_eq!(count(&ppm), 1);
    ppm.spec.selector = Some(LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "app".into(),
            operator: "Equals".into(),
            values: Some(vec!["x".into()]),
        }]),
        match_labels: None,
    });
    // NotSupported operator + failed conversion, as apimachinery + OpenKruise report it.
    assert_eq!(count(&ppm), 2);
}

#[test]
fn reserved_condition_type_is_refused() {
    let mut ppm = ppm_demo();
    ppm.spec.probes[0].pod_condition_type = "Ready".into();
    let errors = validate(&ppm, None).unwrap_err().0;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].field, "spec.probes[0].podConditionType");
    ppm.spec.probes[0].pod_condition_type = "node.kubernetes.io/gate".into();
    let errors = validate(&ppm, None).unwrap_err().0;
    assert_eq!(errors.len(), 1);
    assert!(errors[0].detail.contains("k8s.io"), "{errors:?}");
}

#[test]
fn negative_timing_and_policy_rules() {
    let mut ppm = ppm_demo();
    ppm.spec.probes[0].probe.period_seconds = Some(-1);
    ppm.spec.probes[0].probe.failure_threshold = Some(0);
    assert_eq!(count(&ppm), 1);
    let mut ppm = ppm_demo();
    ppm.spec.probes[0].marker_policy[1].state = "Succeeded".into();
    assert_eq!(count(&ppm), 1);
    let mut ppm = ppm_demo();
    ppm.spec.probes[0].marker_policy[1].labels.clear();
    ppm.spec.probes[0].marker_policy[1].annotations.clear();
    assert_eq!(count(&ppm), 1);
    let mut ppm = ppm_demo();
    ppm.spec.probes[0].marker_policy[1].labels = labels(&[("ok", "bad value!")]);
    assert_eq!(count(&ppm), 1);
}

#[test]
fn markers_may_not_set_reserved_keys() {
    let refused = |with_labels: &[(&str, &str)], with_annotations: &[(&str, &str)]| {
        let mut ppm = ppm_demo();
        ppm.spec.probes[0].marker_policy[0].labels = labels(with_labels);
        ppm.spec.probes[0].marker_policy[0].annotations = labels(with_annotations);
        match validate(&ppm, None) {
            Ok(()) => Vec::new(),
            Err(errors) => errors.0,
        }
    };
    // The demo's selector reads `app`.
    for (key, why) in [
        ("app", "selector"),
        ("pod-template-hash", "controller"),
        ("controller-revision-hash", "controller"),
        ("app.kubernetes.io/name", "reserves"),
        ("topology.k8s.io/zone", "reserves"),
        ("kruise.io/podprobe", "PodProbeMarker controller"),
    ] {
        let errors = refused(&[(key, "x")], &[]);
        assert_eq!(errors.len(), 1, "{key}: {errors:?}");
        assert_eq!(errors[0].field, "spec.probes[0].markerPolicy[0].labels");
        assert!(errors[0].detail.contains(why), "{key}: {errors:?}");
    }
    for (key, value, why) in [
        (
            "kruise.io/podprobemarker-list",
            "x",
            "PodProbeMarker controller",
        ),
        (
            "controller.kubernetes.io/pod-deletion-cost",
            "2147483648",
            "int32",
        ),
        (
            "controller.kubernetes.io/pod-deletion-cost",
            "idle",
            "int32",
        ),
    ] {
        let errors = refused(&[("server-healthy", "true")], &[(key, value)]);
        assert_eq!(errors.len(), 1, "{key}={value}: {errors:?}");
        assert_eq!(
            errors[0].field,
            "spec.probes[0].markerPolicy[0].annotations"
        );
        assert!(errors[0].detail.contains(why), "{key}: {errors:?}");
    }
    // What the recipes set stays allowed, and annotations in Kubernetes' domains (OpenKruise's
    // own vectors set `controller.kubernetes.io/ingress`).
    for (labels, annotations) in [
        (&[("example.com/traffic-online", "true")][..], &[][..]),
        (&[], &[("controller.kubernetes.io/pod-deletion-cost", "-5")]),
        (&[], &[("controller.kubernetes.io/ingress", "true")]),
        (
            &[],
            &[("cluster-autoscaler.kubernetes.io/safe-to-evict", "true")],
        ),
        (
            &[("server-healthy", "true")],
            &[("example.com/note", "idle")],
        ),
    ] {
        assert_eq!(refused(labels, annotations), Vec::new());
    }
}

#[test]
fn probe_count_and_timeout_caps_are_the_sidecars() {
    let mut ppm = ppm_demo();
    ppm.spec.probes[0].probe.timeout_seconds = Some(301);
    let errors = validate(&ppm, None).unwrap_err().0;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].field, "spec.probes[0].probe.timeoutSeconds");
    ppm.spec.probes[0].probe.timeout_seconds = Some(300);
    assert!(validate(&ppm, None).is_ok());

    let template = ppm.spec.probes[0].clone();
    ppm.spec.probes = (0..=MAX_PROBES_PER_POD)
        .map(|i| {
            let mut probe = template.clone();
            probe.name = format!("p{i}");
            probe.pod_condition_type = format!("example.com/p{i}");
            probe
        })
        .collect();
    let errors = validate(&ppm, None).unwrap_err().0;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].field, "spec.probes");
    assert!(errors[0].detail.contains("at most 32"), "{errors:?}");
    ppm.spec.probes.pop();
    assert!(validate(&ppm, None).is_ok());
}
