use super::*;
use crate::probe::{Handler, Port, Scheme};
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;

#[test]
fn tv04_named_ports_stay_names_and_resolve_against_the_container_at_attempt_time() {
    let value = r#"[{"name":"httpCheckHealthy","containerName":"main","probe":{"httpGet":{"path":"/index.html","port":"main-port","scheme":"HTTP"}},"podConditionType":"game.kruise.io/healthy"},{"name":"tcpCheckHealthy","containerName":"main","probe":{"tcpSocket":{"port":"main-port"}},"podConditionType":"game.kruise.io/tcp"}]"#;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"annotations": {PODPROBE_ANNOTATION: value}},
        "spec": {"containers": [{"name": "main", "ports": [{"name": "main-port", "containerPort": 80}]}]}
    }))
    .unwrap();
    let (set, containers) = from_pod(&pod).unwrap().unwrap();
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

#[test]
fn a_projection_replaces_the_volume_content_as_the_kubelets_atomic_writer_does() {
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("podinfo");
    let one = BTreeMap::from([("a".to_owned(), "1".to_owned())]);
    let two = BTreeMap::from([("a".to_owned(), "2 \"quoted\"".to_owned())]);
    let file = project_downward_api(&volume, &one).unwrap();
    assert_eq!(file, volume.join("annotations"));
    let first_target = std::fs::read_link(volume.join("..data")).unwrap();
    assert_eq!(project_downward_api(&volume, &two).unwrap(), file);
    let read = parse_downward_api(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(read, two);
    assert_ne!(
        std::fs::read_link(volume.join("..data")).unwrap(),
        first_target
    );
    let entries: Vec<_> = std::fs::read_dir(&volume)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        entries.len(),
        3,
        "..data, annotations and one content directory: {entries:?}"
    );
    assert!(
        !volume.join(first_target).exists(),
        "the previous content is gone"
    );
}
