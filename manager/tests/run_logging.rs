//! `podprobe-manager run`'s logs as a container runtime collects them (stderr not a terminal):
//! `--log-format json` writes one JSON object a line, `text` writes no colour codes. The run
//! fails at once (no kubeconfig, no cluster), which is logged: the error line is the one read.

use std::process::{Command, Stdio};

/// stderr of `podprobe-manager run` with `extra` flags and nowhere to connect to.
fn run_without_a_cluster(extra: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_podprobe-manager"))
        .args([
            "run",
            "--tls-cert",
            "/nonexistent/tls.crt",
            "--tls-key",
            "/nonexistent/tls.key",
        ])
        .args(extra)
        .env("KUBECONFIG", dir.path().join("no-kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn json_logs_are_one_object_a_line() {
    let (code, stderr) = run_without_a_cluster(&["--log-format", "json"]);
    assert_eq!(code, Some(2), "{stderr}");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["level"] == "ERROR" && l["fields"]["message"].is_string()),
        "{stderr}"
    );
}

#[test]
fn text_logs_carry_no_colour_codes_off_a_terminal() {
    let (code, stderr) = run_without_a_cluster(&[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("ERROR"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}
