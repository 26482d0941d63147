use super::*;

fn probe(json: serde_json::Value) -> Probe {
    serde_json::from_value(json).unwrap()
}

fn messages(result: Checked<Handler>) -> Vec<String> {
    result
        .err()
        .unwrap_or_default()
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// The three places where Kruise's webhook and its runtime read a probe differently, each with
/// what both readings decide. Sources: Kruise v1.9.1 `validating/podprobemarker_validating.go`
/// (webhook) and `pkg/daemon/podprobe/prober.go`, `pkg/util/pods.go` `ExtractPort` (runtime);
/// the kubelet v1.37 `pkg/probe/http/request.go`, `pkg/kubelet/prober/prober.go` (for the record).
#[test]
fn the_three_readings_that_differ() {
    struct Case {
        what: &'static str,
        probe: serde_json::Value,
        /// Kruise's webhook, as the apiserver's own validation of a pod's probe.
        admission: &'static [&'static str],
        /// kruise-daemon: empty scheme HTTP and path `/` (as the kubelet); digits in a string
        /// a port number (the kubelet would look for a port of that name and fail).
        runtime: Handler,
    }
    let cases = [
        Case {
            what: "no scheme",
            probe: serde_json::json!({"httpGet": {"path": "/healthz", "port": 8080}}),
            admission: &[
                r#"probe.httpGet.scheme: Unsupported value: "": supported values: "HTTP", "HTTPS""#,
            ],
            runtime: Handler::Http(HttpAction {
                scheme: Scheme::Http,
                path: "/healthz".into(),
                port: Port::Number(8080),
                headers: vec![],
            }),
        },
        Case {
            what: "no path",
            probe: serde_json::json!({"httpGet": {"port": 8080, "scheme": "HTTP"}}),
            admission: &["probe.httpGet.path: Required value"],
            runtime: Handler::Http(HttpAction {
                scheme: Scheme::Http,
                path: String::new(), // requested as `/`
                port: Port::Number(8080),
                headers: vec![],
            }),
        },
        Case {
            what: "port as a string of digits",
            probe: serde_json::json!({"tcpSocket": {"port": "8080"}}),
            admission: &[
                r#"probe.tcpSocket.port: Invalid value: "8080": must contain at least one letter (a-z)"#,
            ],
            runtime: Handler::Tcp(TcpAction {
                port: Port::Number(8080),
            }),
        },
    ];
    for case in cases {
        let probe = probe(case.probe);
        assert_eq!(
            messages(check_handler(&probe, "probe", Strictness::Admission, None)),
            case.admission,
            "{}: admission",
            case.what
        );
        assert_eq!(
            check_handler(&probe, "probe", Strictness::Runtime, None),
            Ok(case.runtime),
            "{}: runtime",
            case.what
        );
    }
}

#[test]
fn both_readings_refuse_the_same_otherwise() {
    let refused = [
        (
            serde_json::json!({}),
            vec!["probe: Required value: must specify a handler type"],
        ),
        (
            serde_json::json!({"exec": {"command": ["true"]}, "tcpSocket": {"port": 80}}),
            vec!["probe.tcpSocket: Forbidden: may not specify more than 1 handler type"],
        ),
        (
            serde_json::json!({"exec": {}}),
            vec!["probe.exec.command: Required value"],
        ),
        (
            serde_json::json!({"tcpSocket": {"port": 80, "host": "10.0.0.1"}}),
            vec![
                "probe.tcpSocket.host: Forbidden: probes always target the pod IP; a host would let a probe reach other endpoints (SSRF)",
            ],
        ),
        (
            serde_json::json!({"tcpSocket": {"port": 0}}),
            vec!["probe.tcpSocket.port: Invalid value: 0: must be between 1 and 65535, inclusive"],
        ),
        (
            serde_json::json!({"grpc": {"port": 70000}}),
            vec!["probe.grpc.port: Invalid value: 70000: must be between 1 and 65535, inclusive"],
        ),
        (
            serde_json::json!({"httpGet": {"path": "/a%zz", "port": "container-port-v2", "scheme": "FTP",
                                           "httpHeaders": [{"name": "X_Custom", "value": "x"}]}}),
            vec![
                r#"probe.httpGet.path: Invalid value: "/a%zz": must be a valid URL path: invalid URL escape"#,
                r#"probe.httpGet.port: Invalid value: "container-port-v2": must be no more than 15 characters"#,
                r#"probe.httpGet.scheme: Unsupported value: "FTP": supported values: "HTTP", "HTTPS""#,
                r#"probe.httpGet.httpHeaders[0].name: Invalid value: "X_Custom": a valid HTTP header must consist of alphanumeric characters or '-' (e.g. 'X-Header-Name', regex used for validation is '[-A-Za-z0-9]+')"#,
            ],
        ),
    ];
    for (json, expected) in refused {
        let probe = probe(json.clone());
        for strictness in [Strictness::Admission, Strictness::Runtime] {
            assert_eq!(
                messages(check_handler(&probe, "probe", strictness, None)),
                expected,
                "{json} ({strictness:?})"
            );
        }
    }
}

#[test]
fn a_port_name_must_be_the_target_containers_when_its_ports_are_known() {
    let ports: Vec<ContainerPort> =
        serde_json::from_value(serde_json::json!([{"name": "game", "containerPort": 7777}]))
            .unwrap();
    let named = |name: &str| probe(serde_json::json!({"tcpSocket": {"port": name}}));
    assert_eq!(
        check_handler(&named("game"), "probe", Strictness::Runtime, Some(&ports)),
        Ok(Handler::Tcp(TcpAction {
            port: Port::Name("game".into())
        }))
    );
    assert_eq!(
        messages(check_handler(
            &named("web"),
            "probe",
            Strictness::Runtime,
            Some(&ports)
        )),
        [
            r#"probe.tcpSocket.port: Invalid value: "web": no port with this name in the target container"#
        ]
    );
    // Without the pod (the webhook, or the sidecar reading only the downward-API file) a name
    // resolves, or not, at attempt time.
    assert!(check_handler(&named("web"), "probe", Strictness::Runtime, None).is_ok());
}
