use super::*;
use crate::probe::Port;
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
    assert!(set.invalid.iter().all(|i| i.error == ProbeError::NoHandler));
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
fn tv04_named_ports_stay_names_and_must_exist_in_the_container() {
    let value = r#"[{"name":"httpCheckHealthy","containerName":"main","probe":{"httpGet":{"path":"/index.html","port":"main-port","scheme":"HTTP"}},"podConditionType":"game.kruise.io/healthy"},{"name":"tcpCheckHealthy","containerName":"main","probe":{"tcpSocket":{"port":"main-port"}},"podConditionType":"game.kruise.io/tcp"}]"#;
    let (set, containers) = from_pod(&pod_with(Some(value))).unwrap().unwrap();
    assert!(set.invalid.is_empty(), "{:?}", set.invalid);
    let Handler::Http(http) = &set.probes[0].handler else {
        panic!("expected httpGet")
    };
    assert_eq!(http.port, Port::Name("main-port".into()));
    assert_eq!(http.path, "/index.html");
    assert_eq!(http.scheme, Scheme::Http);
    let target = crate::probe::Target {
        host: "127.0.0.1".into(),
        container_ports: containers.ports["main"].clone(),
        ..Default::default()
    };
    assert_eq!(target.resolve_port(&http.port).unwrap(), 80);
    let Handler::Tcp(tcp) = &set.probes[1].handler else {
        panic!("expected tcpSocket")
    };
    assert_eq!(target.resolve_port(&tcp.port).unwrap(), 80);
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
fn bad_probes_are_refused_with_the_field_named() {
    assert_eq!(
        one_error(r#"{"exec":{"command":["true"]},"tcpSocket":{"port":80}}"#),
        ProbeError::MultipleHandlers("exec, tcpSocket".into())
    );
    assert_eq!(one_error(r#"{}"#), ProbeError::NoHandler);
    assert_eq!(
        one_error(r#"{"exec":{"command":[]}}"#),
        ProbeError::EmptyCommand
    );
    assert_eq!(one_error(r#"{"exec":{}}"#), ProbeError::EmptyCommand);
    assert_eq!(
        one_error(r#"{"tcpSocket":{"port":80,"host":"10.0.0.1"}}"#),
        ProbeError::HostSet("probe.tcpSocket")
    );
    assert_eq!(
        one_error(r#"{"httpGet":{"port":80,"host":"metadata.internal"}}"#),
        ProbeError::HostSet("probe.httpGet")
    );
    for port in ["0", "65536", "-1", "\"0\"", "\"70000\""] {
        let err = one_error(&format!(r#"{{"tcpSocket":{{"port":{port}}}}}"#));
        assert!(
            matches!(
                &err,
                ProbeError::BadPort {
                    field: "probe.tcpSocket.port",
                    ..
                }
            ),
            "{port}: {err}"
        );
    }
    let err = one_error(r#"{"httpGet":{"port":"web"}}"#);
    assert_eq!(
        err.to_string(),
        "probe.httpGet.port: no port named \"web\" in the target container"
    );
    let err = one_error(r#"{"httpGet":{"port":"container-port-v2"}}"#);
    assert_eq!(
        err.to_string(),
        "probe.httpGet.port: \"container-port-v2\" must be no more than 15 characters"
    );
    assert_eq!(
        one_error(r#"{"httpGet":{"port":80,"scheme":"FTP"}}"#),
        ProbeError::BadScheme("FTP".into())
    );
    assert_eq!(
        one_error(r#"{"httpGet":{"port":80,"path":"path%notvalid"}}"#),
        ProbeError::BadPath("path%notvalid".into(), UrlViolation::BadEscape)
    );
    // The check is the parser's: a control character would otherwise pass validation and then
    // fail every attempt.
    assert_eq!(
        one_error(r#"{"httpGet":{"port":80,"path":"/health\u0007z"}}"#),
        ProbeError::BadPath("/health\u{7}z".into(), UrlViolation::ControlCharacter)
    );
    assert_eq!(
        one_error(
            r#"{"httpGet":{"port":80,"httpHeaders":[{"name":"Invalid Header:Name","value":"x"}]}}"#
        ),
        ProbeError::BadHeaderName("Invalid Header:Name".into())
    );
    // apimachinery's IsHTTPHeaderName, as OpenKruise and the apiserver: an RFC 7230 token
    // character such as `_` is not enough.
    assert_eq!(
        one_error(r#"{"httpGet":{"port":80,"httpHeaders":[{"name":"X_Custom","value":"x"}]}}"#),
        ProbeError::BadHeaderName("X_Custom".into())
    );
    assert!(matches!(
        one_error(r#"{"grpc":{"port":0}}"#),
        ProbeError::BadPort {
            field: "probe.grpc.port",
            ..
        }
    ));
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
fn downward_api_round_trip_with_hard_values() {
    let json_value = format!(
        r#"[{{"name":"p","containerName":"main","probe":{{"exec":{{"command":["sh","-c","echo \u003cok\u003e \u0026\u0026 {}"]}}}},"podConditionType":"c"}}]"#,
        "x".repeat(4096)
    );
    let mut map = BTreeMap::new();
    map.insert("kruise.io/podprobe".to_owned(), json_value.clone());
    map.insert("quotes".to_owned(), r#"say "hi" \ back"#.to_owned());
    map.insert(
        "controls".to_owned(),
        "line1\nline2\ttab\r\u{7}\u{1b}".to_owned(),
    );
    map.insert("unicode".to_owned(), "ünïcödé 游戏 🎮 \u{2028}".to_owned());
    let text = format_downward_api(&map);
    assert_eq!(text.lines().count(), 4, "one line per key:\n{text}");
    assert!(
        text.contains(r#"controls="line1\nline2\ttab\r\a\x1b""#),
        "{text}"
    );
    assert!(text.contains(r#"quotes="say \"hi\" \\ back""#), "{text}");
    assert!(text.contains(r"\u2028"), "{text}");
    let parsed = parse_downward_api(&text).unwrap();
    assert_eq!(parsed, map);
    let set = parse(&parsed["kruise.io/podprobe"], None).unwrap();
    assert_eq!(set.probes.len(), 1);
}

#[test]
fn downward_api_reads_what_the_kubelet_writes() {
    // As written by the kubelet (Go %q): \u003c stays as the JSON text, JSON quotes are escaped.
    let text = "a=\"1\"\nkruise.io/podprobe=\"[{\\\"name\\\":\\\"p\\\",\\\"containerName\\\":\\\"main\\\",\\\"probe\\\":{\\\"exec\\\":{\\\"command\\\":[\\\"echo\\\",\\\"\\\\u003cok\\\\u003e\\\"]}},\\\"podConditionType\\\":\\\"c\\\"}]\"\noctal=\"\\101\\x42\\u00e9\\U0001F3AE\"";
    let map = parse_downward_api(text).unwrap();
    assert_eq!(map["a"], "1");
    assert_eq!(map["octal"], "ABé🎮");
    let set = parse(&map["kruise.io/podprobe"], None).unwrap();
    let Handler::Exec(exec) = &set.probes[0].handler else {
        panic!("expected exec")
    };
    assert_eq!(exec.command[1], "<ok>");
}

#[test]
fn downward_api_errors_name_the_line() {
    assert_eq!(
        parse_downward_api("a=\"1\"\nbroken"),
        Err(DownwardApiError::MissingEquals { line: 2 })
    );
    assert!(matches!(
        parse_downward_api("a=unquoted"),
        Err(DownwardApiError::BadQuoting { line: 1, .. })
    ));
    assert!(matches!(
        parse_downward_api(r#"a="bad \q escape""#),
        Err(DownwardApiError::BadQuoting {
            line: 1,
            reason: "unknown escape sequence"
        })
    ));
    assert!(
        parse_downward_api(r#"a="\xff""#).is_err(),
        "invalid UTF-8 is refused"
    );
}
