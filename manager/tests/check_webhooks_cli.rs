//! `podprobe-manager check-webhooks` given bad input: it says what is wrong and exits 2 at once
//! (the chart's hook Job then fails with that line in its log), instead of retrying until its
//! timeout. Its answers from a real apiserver are in real_helm.rs and real_node.rs.

use std::process::{Command, Stdio};

fn check_webhooks(args: &[&str], kubeconfig: &std::path::Path) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_podprobe-manager"))
        .arg("check-webhooks")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("POD_NAMESPACE")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_input_exits_2_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-kubeconfig");

    let (code, stderr) = check_webhooks(&[], &missing);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--namespace"), "{stderr}");

    let (code, stderr) = check_webhooks(&["--namespace", "ns", "--interval", "0s"], &missing);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--interval") && stderr.contains("more than 0"),
        "{stderr}"
    );

    let (code, stderr) = check_webhooks(&["--namespace", "ns", "--timeout", "soon"], &missing);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--timeout"), "{stderr}");

    // No cluster to ask: no retrying, one line saying where a client comes from.
    let (code, stderr) = check_webhooks(&["--namespace", "ns"], &missing);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("no Kubernetes client (in-cluster service account or KUBECONFIG)"),
        "{stderr}"
    );
}
