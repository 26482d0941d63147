//! `podprobe check` as a user runs it: the real binary, real files, real targets.

use std::io::Write;
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};

fn podprobe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_podprobe"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run podprobe")
}

fn write_temp(dir: &tempfile::TempDir, name: &str, content: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, content).unwrap();
    path.display().to_string()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn annotation(entries: &[String]) -> String {
    format!("[{}]", entries.join(","))
}

fn entry(name: &str, condition: &str, probe: &str) -> String {
    format!(
        r#"{{"name":"{name}","containerName":"main","probe":{probe},"podConditionType":"{condition}"}}"#
    )
}

fn pod_yaml(annotation: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations:\n    kruise.io/podprobe: '{annotation}'\nspec:\n  containers:\n  - name: main\n    ports:\n    - name: web\n      containerPort: 8080\n"
    )
}

#[test]
fn bad_input_exits_2_naming_file_probe_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, String, &str)> = vec![
        ("malformed.json", "[{not json".into(), "not valid JSON"),
        (
            "two-handlers.yaml",
            pod_yaml(&annotation(&[entry(
                "p",
                "c",
                r#"{"exec":{"command":["true"]},"tcpSocket":{"port":80}}"#,
            )])),
            "may not specify more than 1 handler type",
        ),
        (
            "host.yaml",
            pod_yaml(&annotation(&[entry(
                "p",
                "c",
                r#"{"httpGet":{"port":80,"host":"169.254.169.254"}}"#,
            )])),
            "probe.httpGet.host: Forbidden: probes always target the pod IP",
        ),
        (
            "port0.json",
            annotation(&[entry("p", "c", r#"{"tcpSocket":{"port":0}}"#)]),
            "probe.tcpSocket.port: Invalid value: 0: must be between 1 and 65535, inclusive",
        ),
        (
            "port65536.json",
            annotation(&[entry("p", "c", r#"{"tcpSocket":{"port":65536}}"#)]),
            "probe.tcpSocket.port: Invalid value: 65536: must be between 1 and 65535, inclusive",
        ),
        (
            "unknown-port.yaml",
            pod_yaml(&annotation(&[entry(
                "p",
                "c",
                r#"{"httpGet":{"port":"metrics"}}"#,
            )])),
            "Invalid value: \"metrics\": no port with this name in the target container",
        ),
        (
            "empty-command.json",
            annotation(&[entry("p", "c", r#"{"exec":{"command":[]}}"#)]),
            "probe.exec.command: Required value",
        ),
        (
            "huge.json",
            format!("[{}]", " ".repeat(1024 * 1024)),
            "more than the 262144 bytes",
        ),
        (
            "no-annotation.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n".into(),
            "has no kruise.io/podprobe annotation",
        ),
        (
            "deployment.yaml",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\n".into(),
            "kind is \"Deployment\", expected Pod",
        ),
    ];
    for (name, content, expected) in cases {
        let path = write_temp(&dir, name, &content);
        let out = podprobe(&["check", "--once", &path]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains(expected),
            "{name}: expected {expected:?} in:\n{err}"
        );
        assert!(err.contains(name), "{name}: the file is named in:\n{err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
    let out = podprobe(&["check", "--once", "/nonexistent/pod.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("/nonexistent/pod.yaml: cannot read"));
}

#[test]
fn invalid_probes_are_all_listed_with_their_names_and_the_valid_ones_run() {
    let dir = tempfile::tempdir().unwrap();
    let value = annotation(&[
        entry("good", "a", r#"{"exec":{"command":["true"]}}"#),
        entry("bad-port", "b", r#"{"tcpSocket":{"port":70000}}"#),
        entry("no-handler", "c", r#"{}"#),
    ]);
    let path = write_temp(&dir, "mixed.json", &value);
    let out = podprobe(&["check", "--once", "-o", "json", &path]);
    assert_eq!(out.status.code(), Some(2));
    let lines = json_lines(&out);
    let conditions = lines.last().and_then(|l| l.conditions.clone()).unwrap();
    assert_eq!(conditions.len(), 1, "{conditions:?}");
    assert_eq!(conditions[0]["type"], "a");
    assert_eq!(conditions[0]["status"], "True");
    let err = stderr(&out);
    assert!(
        err.contains("2 invalid probe(s) skipped, the other 1 run"),
        "{err}"
    );
    assert!(
        err.contains(r#"probe #1 "bad-port" (podConditionType "b"): probe.tcpSocket.port"#),
        "{err}"
    );
    assert!(err.contains(r#"probe #2 "no-handler""#), "{err}");
}

#[test]
fn a_named_port_the_container_does_not_declare_skips_that_probe_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut entries: Vec<String> = (0..30)
        .map(|i| {
            entry(
                &format!("ok-{i}"),
                &format!("c/ok-{i}"),
                r#"{"exec":{"command":["true"]}}"#,
            )
        })
        .collect();
    entries.push(entry("web", "c/web", r#"{"httpGet":{"port":"nope"}}"#));
    let path = write_temp(&dir, "pod.yaml", &pod_yaml(&annotation(&entries)));
    let out = podprobe(&["check", "--once", "-o", "json", &path]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let conditions = json_lines(&out)
        .last()
        .and_then(|l| l.conditions.clone())
        .unwrap();
    assert_eq!(conditions.len(), 30, "{conditions:?}");
    assert!(
        conditions.iter().all(|c| c["status"] == "True"),
        "{conditions:?}"
    );
    let err = stderr(&out);
    assert!(
        err.contains(r#"probe #30 "web" (podConditionType "c/web"): probe.httpGet.port"#),
        "{err}"
    );
    assert!(err.contains("nope"), "{err}");
}

#[derive(Debug, serde::Deserialize)]
struct Line {
    name: Option<String>,
    #[serde(rename = "podConditionType")]
    condition: Option<String>,
    state: Option<String>,
    message: Option<String>,
    at: Option<String>,
    conditions: Option<Vec<serde_json::Value>>,
}

fn json_lines(out: &Output) -> Vec<Line> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn once_reports_each_probe_and_the_conditions_as_json() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let open = listener.local_addr().unwrap().port();
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = tempfile::tempdir().unwrap();
    let value = annotation(&[
        entry(
            "ok",
            "game.kruise.io/ok",
            r#"{"exec":{"command":["sh","-c","echo ready"]}}"#,
        ),
        entry(
            "accepting",
            "game.kruise.io/accepting",
            &format!(r#"{{"tcpSocket":{{"port":{open}}}}}"#),
        ),
        entry(
            "closed",
            "game.kruise.io/closed",
            &format!(r#"{{"tcpSocket":{{"port":{closed}}}}}"#),
        ),
    ]);
    let path = write_temp(&dir, "probes.json", &value);
    let out = podprobe(&["check", "--once", "--output", "json", &path]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "one probe fails: {}",
        stderr(&out)
    );
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 4, "{lines:?}");
    let by_name = |n: &str| lines.iter().find(|l| l.name.as_deref() == Some(n)).unwrap();
    let ok = by_name("ok");
    assert_eq!(ok.state.as_deref(), Some("Succeeded"));
    assert_eq!(ok.message.as_deref(), Some("ready\n"));
    assert_eq!(ok.condition.as_deref(), Some("game.kruise.io/ok"));
    assert!(ok.at.as_deref().is_some_and(|t| t.ends_with('Z')));
    assert_eq!(by_name("accepting").state.as_deref(), Some("Succeeded"));
    let closed = by_name("closed");
    assert_eq!(closed.state.as_deref(), Some("Failed"));
    assert!(
        closed
            .message
            .as_deref()
            .unwrap()
            .contains("connection refused"),
        "{closed:?}"
    );
    let conditions = lines[3].conditions.as_ref().expect("conditions last");
    assert_eq!(conditions.len(), 3);
    let closed_condition = conditions
        .iter()
        .find(|c| c["type"] == "game.kruise.io/closed")
        .unwrap();
    assert_eq!(closed_condition["status"], "False");
    assert_eq!(closed_condition["reason"], "PodProbeFailed");
    drop(listener);
}

#[test]
fn once_exits_0_when_everything_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let value = annotation(&[entry("t", "c", r#"{"exec":{"command":["true"]}}"#)]);
    let path = write_temp(&dir, "ok.json", &value);
    let out = podprobe(&["check", "--once", &path]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Succeeded"), "{stdout}");
    assert!(
        stdout.contains("conditions the sidecar would write"),
        "{stdout}"
    );
}

#[test]
fn an_always_erroring_probe_ends_unknown_after_its_attempt_budget() {
    // A named port cannot resolve without a pod spec: every attempt errors. With thresholds
    // 1/1 the budget is 1 + 1 + 2 = 4 attempts, then Unknown with the last error.
    let dir = tempfile::tempdir().unwrap();
    let value = annotation(&[entry(
        "named",
        "c",
        r#"{"tcpSocket":{"port":"web"},"periodSeconds":1}"#,
    )]);
    let path = write_temp(&dir, "named.json", &value);
    let out = podprobe(&["check", "--once", "-o", "json", &path]);
    assert_eq!(out.status.code(), Some(1));
    let lines = json_lines(&out);
    assert_eq!(lines[0].state.as_deref(), Some("Unknown"));
    assert!(
        lines[0].message.as_deref().unwrap().contains("\"web\""),
        "{lines:?}"
    );
    assert_eq!(
        lines[1].conditions.as_ref().unwrap()[0]["status"],
        "Unknown"
    );
    let errored = stderr(&out).matches("attempt errored").count();
    assert_eq!(errored, 4, "{}", stderr(&out));
}

#[test]
fn stdin_and_named_ports_from_the_pod_spec() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let manifest = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"p","annotations":{{"kruise.io/podprobe":"[{{\"name\":\"web\",\"containerName\":\"main\",\"probe\":{{\"tcpSocket\":{{\"port\":\"web\"}}}},\"podConditionType\":\"c\"}}]"}}}},"spec":{{"containers":[{{"name":"main","ports":[{{"name":"web","containerPort":{port}}}]}}]}}}}"#
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_podprobe"))
        .args(["check", "--once", "-o", "json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(manifest.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json_lines(&out)[0].state.as_deref(), Some("Succeeded"));
}

#[test]
fn the_shipped_example_is_valid() {
    // Ports 7777/8080/9090 may or may not answer on this machine; only validity is checked here
    // (`demo` runs it against real targets).
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/game-server-pod.yaml");
    let (set, containers) = podprobe::check::load(std::path::Path::new(example)).unwrap();
    assert_eq!(set.probes.len(), 4);
    assert!(containers.ports.contains_key("game"));
}

#[test]
fn help_explains_every_flag() {
    let out = podprobe(&["check", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--once",
        "--output",
        "--host",
        "--timing-defaults",
        "--user-agent",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    assert!(help.contains("Exit codes"), "{help}");
}

#[test]
fn the_by_hand_sidecar_example_is_a_valid_pod() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/sidecar-by-hand.yaml"
    ))
    .unwrap();
    let pod_doc = text
        .split("\n---\n")
        .find(|doc| doc.contains("kind: Pod"))
        .expect("a Pod document");
    let (set, containers) = podprobe::check::load_str(pod_doc, "sidecar-by-hand.yaml").unwrap();
    assert_eq!(set.probes[0].condition_type, "game.kruise.io/healthy");
    assert!(containers.ports.contains_key("game"));
    // The sidecar is a restartable init container with the downward-API identity.
    let pod: k8s_openapi::api::core::v1::Pod = serde_saphyr::from_str(pod_doc).unwrap();
    let sidecar = &pod.spec.unwrap().init_containers.unwrap()[0];
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
    let env: Vec<_> = sidecar
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(env, ["POD_NAME", "POD_NAMESPACE", "POD_UID", "POD_IP"]);
}

/// A bad `--log-level` is said, and logging goes on at info: a sidecar that exited on a typo
/// in its log filter would crash-loop and probe nothing.
#[test]
fn a_bad_log_level_is_said_and_the_command_still_runs() {
    let dir = tempfile::tempdir().unwrap();
    let value = annotation(&[entry("t", "c", r#"{"exec":{"command":["true"]}}"#)]);
    let path = write_temp(&dir, "ok.json", &value);
    let out = Command::new(env!("CARGO_BIN_EXE_podprobe"))
        .args(["--log-level", "podprobe=loud", "check", "--once", &path])
        .env_remove("RUST_LOG")
        .env_remove("PODPROBE_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run podprobe");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(r#"--log-level "podprobe=loud""#) && err.contains("logging at info"),
        "{err}"
    );
}
