use super::*;
use crate::handler::{ExecAction, Handler, Port, Scheme, TcpAction};
use k8s_openapi::api::core::v1::Pod;

fn pod_with(annotation: Option<&str>) -> Pod {
    let mut pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pod-1", "namespace": "test", "annotations": {"version": "test"}},
        "spec": {
            "initContainers": [{"name": "init-1"}, {"name": "init-2", "restartPolicy": "Always"}],
            "containers": [
                {"name": "main", "ports": [{"name": "main-port", "containerPort": 80}]},
                {"name": "envoy"}
            ]
        }
    }))
    .unwrap();
    if let Some(value) = annotation {
        pod.metadata
            .annotations
            .get_or_insert_default()
            .insert(PODPROBE_ANNOTATION.into(), value.into());
    }
    pod
}

#[test]
fn tv01_pod_without_annotation_has_no_probes() {
    assert!(from_pod(&pod_with(None)).is_none());
}

#[test]
fn tv02_handlerless_entries_parse_but_are_refused_one_by_one() {
    // The annotation OpenKruise writes for TV-02: both probes have `"probe":{}`. The sidecar
    // reads both entries (names and condition types intact) and refuses each for lacking a handler.
    let value = r#"[{"name":"healthy","containerName":"main","probe":{},"podConditionType":"game.kruise.io/healthy"},{"name":"init","containerName":"init-2","probe":{},"podConditionType":"game.kruise.io/init"}]"#;
    let (set, containers) = from_pod(&pod_with(Some(value))).unwrap().unwrap();
    assert!(set.probes.is_empty());
    assert_eq!(set.invalid.len(), 2);
    assert_eq!(set.invalid[0].name.as_deref(), Some("healthy"));
    assert_eq!(
        set.invalid[1].condition_type.as_deref(),
        Some("game.kruise.io/init")
    );
    assert!(
        set.invalid.iter().all(|i| {
            i.error.to_string() == "probe: Required value: must specify a handler type"
        })
    );
    // init-2 is a native sidecar and may be probed; init-1 may not.
    assert!(containers.ports.contains_key("init-2"));
    assert!(!containers.ports.contains_key("init-1"));
}

#[test]
fn tv03_exec_probe_with_timing() {
    let value = r#"[{"name":"healthy","containerName":"main","probe":{"exec":{"command":["/bin/sh","-c","/healthy.sh"]},"initialDelaySeconds":10,"timeoutSeconds":3,"periodSeconds":10,"successThreshold":1,"failureThreshold":3},"podConditionType":"game.kruise.io/healthy"}]"#;
    let (set, _) = from_pod(&pod_with(Some(value))).unwrap().unwrap();
    assert!(set.invalid.is_empty(), "{:?}", set.invalid);
    let p = &set.probes[0];
    assert_eq!(p.name, "healthy");
    assert_eq!(p.container_name, "main");
    assert_eq!(p.condition_type, "game.kruise.io/healthy");
    assert_eq!(
        p.handler,
        Handler::Exec(ExecAction {
            command: vec!["/bin/sh".into(), "-c".into(), "/healthy.sh".into()]
        })
    );
    assert_eq!(
        p.timing,
        RawTiming {
            initial_delay_seconds: Some(10),
            timeout_seconds: Some(3),
            period_seconds: Some(10),
            success_threshold: Some(1),
            failure_threshold: Some(3),
        }
    );
}

#[test]
fn tv07_go_escaped_json_parses() {
    let value = r#"[{"name":"p","containerName":"main","probe":{"exec":{"command":["sh","-c","test -f /ready \u0026\u0026 echo \u003cok\u003e"]}},"podConditionType":"c"}]"#;
    let set = parse(value, None).unwrap();
    let Handler::Exec(exec) = &set.probes[0].handler else {
        panic!("expected exec")
    };
    assert_eq!(exec.command[2], "test -f /ready && echo <ok>");
}

#[test]
fn unknown_fields_are_ignored_and_ports_are_int_or_string() {
    let value = r#"[{"name":"p","containerName":"main","future":1,"probe":{"tcpSocket":{"port":"8080"},"someNewField":true},"podConditionType":"c","markerPolicy":[{"state":"Succeeded","labels":{"a":"b"}}]}]"#;
    let set = parse(value, None).unwrap();
    assert!(set.invalid.is_empty(), "{:?}", set.invalid);
    assert_eq!(
        set.probes[0].handler,
        Handler::Tcp(TcpAction {
            port: Port::Number(8080)
        })
    );
}

#[test]
fn a_malformed_marker_policy_costs_the_probe_nothing() {
    let value = r#"[{"name":"p","containerName":"main","probe":{"tcpSocket":{"port":80}},"podConditionType":"c","markerPolicy":"not a list"}]"#;
    let set = parse(value, None).unwrap();
    assert!(set.invalid.is_empty(), "{:?}", set.invalid);
    assert_eq!(set.probes.len(), 1);
}

fn one_error(probe_json: &str) -> ProbeError {
    let value = format!(
        r#"[{{"name":"p","containerName":"main","probe":{probe_json},"podConditionType":"c"}}]"#
    );
    let containers = PodContainers::from_spec(pod_with(None).spec.as_ref().unwrap());
    let set = parse(&value, Some(&containers)).unwrap();
    assert!(set.probes.is_empty(), "expected refusal of {probe_json}");
    set.invalid[0].error.clone()
}

#[test]
fn bad_handlers_are_refused_with_the_field_named() {
    // The rules are crate::check's (its tests hold them); here, that the parser applies them,
    // read for the runtime, with the pod's container ports.
    let refused = [
        (
            r#"{"exec":{"command":["true"]},"tcpSocket":{"port":80}}"#,
            "probe.tcpSocket: Forbidden: may not specify more than 1 handler type",
        ),
        (
            r#"{}"#,
            "probe: Required value: must specify a handler type",
        ),
        (
            r#"{"exec":{"command":[]}}"#,
            "probe.exec.command: Required value",
        ),
        (
            r#"{"httpGet":{"port":"web"}}"#,
            r#"probe.httpGet.port: Invalid value: "web": no port with this name in the target container"#,
        ),
        (
            r#"{"httpGet":{"port":80,"path":"/health\u0007z"}}"#,
            r#"probe.httpGet.path: Invalid value: "/health\u{7}z": must be a valid URL path: invalid control character in URL"#,
        ),
        (
            r#"{"tcpSocket":{"port":80,"host":"10.0.0.1"}}"#,
            "probe.tcpSocket.host: Forbidden: probes always target the pod IP; a host would let a probe reach other endpoints (SSRF)",
        ),
    ];
    for (probe, message) in refused {
        let error = one_error(probe);
        assert!(matches!(error, ProbeError::Probe(_)), "{probe}: {error:?}");
        assert_eq!(error.to_string(), message, "{probe}");
    }
    // Read for the runtime: a port given as digits in a string is that port, no scheme is HTTP.
    let value = r#"[{"name":"p","containerName":"main","probe":{"httpGet":{"port":"8080"}},"podConditionType":"c"}]"#;
    let set = parse(value, None).unwrap();
    assert_eq!(
        set.probes[0].handler,
        Handler::Http(crate::handler::HttpAction {
            scheme: Scheme::Http,
            path: String::new(),
            port: Port::Number(8080),
            headers: vec![],
        })
    );
    assert!(matches!(
        one_error(r#"{"exec":{"command":"not-a-list"}}"#),
        ProbeError::Decode(_)
    ));
}

#[test]
fn entry_level_errors() {
    let containers = PodContainers::from_spec(pod_with(None).spec.as_ref().unwrap());
    let value = r#"[
        {"name":"","containerName":"main","probe":{"tcpSocket":{"port":80}},"podConditionType":"a"},
        {"name":"p","containerName":"","probe":{"tcpSocket":{"port":80}},"podConditionType":"b"},
        {"name":"p","containerName":"nope","probe":{"tcpSocket":{"port":80}},"podConditionType":"c"},
        {"name":"p","containerName":"init-1","probe":{"tcpSocket":{"port":80}},"podConditionType":"d"},
        {"name":"p","containerName":"main","probe":{"tcpSocket":{"port":80}}},
        {"name":"p","containerName":"main","probe":{"tcpSocket":{"port":80}},"podConditionType":"Ready"},
        {"name":"good","containerName":"main","probe":{"tcpSocket":{"port":80}},"podConditionType":"e"},
        {"name":"dup","containerName":"envoy","probe":{"tcpSocket":{"port":81}},"podConditionType":"e"},
        "not an object",
        {"name":"p","containerName":"main","probe":{"tcpSocket":{"port":80}},"podConditionType":"not a qualified name!"}
    ]"#;
    let set = parse(value, Some(&containers)).unwrap();
    let errors: Vec<_> = set
        .invalid
        .iter()
        .map(|i| (i.index, i.error.clone()))
        .collect();
    assert_eq!(
        errors,
        vec![
            (0, ProbeError::EmptyName),
            (1, ProbeError::EmptyContainerName),
            (2, ProbeError::UnknownContainer("nope".into())),
            (3, ProbeError::UnknownContainer("init-1".into())),
            (4, ProbeError::EmptyConditionType),
            (5, ProbeError::ReservedConditionType("Ready".into())),
            (7, ProbeError::DuplicateConditionType("e".into(), 6)),
            (8, set.invalid[7].error.clone()),
            (9, set.invalid[8].error.clone()),
        ]
    );
    assert!(matches!(set.invalid[7].error, ProbeError::Decode(_)));
    assert!(
        matches!(&set.invalid[8].error, ProbeError::InvalidConditionType(t, why)
            if t == "not a qualified name!" && why.contains("alphanumeric")),
        "{:?}",
        set.invalid[8]
    );
    // The good probe survives its bad neighbours; the first entry of a condition type wins.
    assert_eq!(set.probes.len(), 1);
    assert_eq!(set.probes[0].name, "good");
}

#[test]
fn whole_annotation_errors() {
    assert!(matches!(
        parse("{not json", None),
        Err(AnnotationError::Json(_))
    ));
    assert!(matches!(
        parse(r#"{"name":"p"}"#, None),
        Err(AnnotationError::NotAnArray("an object"))
    ));
    let huge = format!("[{}]", " ".repeat(1024 * 1024));
    let err = parse(&huge, None).unwrap_err();
    assert!(matches!(err, AnnotationError::TooLarge(n) if n == 1024 * 1024 + 2));
    assert!(err.to_string().contains("262144"), "{err}");
    assert_eq!(parse("[]", None).unwrap(), ProbeSet::default());
}

#[test]
fn reserved_condition_types_include_kubernetes_domains() {
    for reserved in [
        "Ready",
        "PodResizePending",
        "kubernetes.io/x",
        "k8s.io/x",
        "node.kubernetes.io/ready",
        "a.b.k8s.io/gate",
    ] {
        assert!(is_reserved_condition_type(reserved), "{reserved}");
    }
    for free in [
        "game.kruise.io/idle",
        "Idle",
        "notkubernetes.io/x",
        "example.com/kubernetes.io",
        "k8s.io.example.com/x",
        "target-health.elbv2.k8s.aws/tg",
    ] {
        assert!(!is_reserved_condition_type(free), "{free}");
    }
}

fn tcp_probe(i: usize, timeout: i32) -> serde_json::Value {
    serde_json::json!({"name": format!("p{i}"), "containerName": "main",
        "probe": {"tcpSocket": {"port": 8080}, "timeoutSeconds": timeout},
        "podConditionType": format!("example.com/p{i}")})
}

#[test]
fn a_pod_runs_at_most_the_first_32_valid_probes() {
    // One invalid entry first: it does not count against the cap.
    let mut entries = vec![serde_json::json!({"name": "bad"})];
    entries.extend((0..40).map(|i| tcp_probe(i, 1)));
    let set = parse(&serde_json::Value::Array(entries).to_string(), None).unwrap();
    assert_eq!(set.probes.len(), MAX_PROBES_PER_POD);
    assert_eq!(set.probes.last().unwrap().name, "p31");
    let too_many: Vec<_> = set
        .invalid
        .iter()
        .filter(|p| p.error == ProbeError::TooManyProbes)
        .map(|p| p.index)
        .collect();
    assert_eq!(too_many, (33..=40).collect::<Vec<_>>());
    assert!(
        set.invalid[1]
            .to_string()
            .contains("podprobe runs the first 32")
    );
}

#[test]
fn a_timeout_over_five_minutes_is_refused() {
    let entries = serde_json::json!([tcp_probe(0, 300), tcp_probe(1, 301)]);
    let set = parse(&entries.to_string(), None).unwrap();
    assert_eq!(set.probes.len(), 1);
    assert_eq!(set.invalid[0].error, ProbeError::TimeoutTooLong(301));
    assert!(set.invalid[0].to_string().contains("limit of 300 seconds"));
}
