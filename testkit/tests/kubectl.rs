//! The real kubectl against testkit: it must see what a real cluster would show. The kubectl
//! is the one built from the pinned Go modules (hack/build-tools.sh, the same version as the
//! real apiserver of `testkit::real`); a missing one is built, never skipped.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::pod;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use testkit::ApiServer;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::time::timeout;

fn kubectl_binary() -> std::path::PathBuf {
    testkit::real::tools::tool("kubectl").unwrap_or_else(|e| panic!("{e}"))
}

struct Env {
    api: ApiServer,
    _dir: tempfile::TempDir,
    kc: PathBuf,
}

async fn env() -> Env {
    let api = ApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kc).unwrap();
    api.create(&pod("a", json!({"app": "web"}))).unwrap();
    api.update_pod_status("default", "a", |s| {
        s.conditions = Some(
            serde_json::from_value(json!([
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "False"},
                {"type": "ContainersReady", "status": "False"}
            ]))
            .unwrap(),
        )
    })
    .unwrap();
    Env { api, _dir: dir, kc }
}

async fn kubectl(kc: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(kubectl_binary())
        .args(args)
        .env("KUBECONFIG", kc)
        .env("HOME", kc.parent().unwrap())
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn conds(api: &ApiServer) -> Vec<(String, String)> {
    let p: Pod = api.get("default", "a").unwrap();
    p.status
        .unwrap()
        .conditions
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[tokio::test]
async fn get_label_annotate() {
    let e = env().await;
    let (ok, out, err) = kubectl(&e.kc, &["get", "pods"]).await;
    assert!(ok, "{err}");
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]);
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..4], ["a", "0/1", "Pending", "0"]);

    let (ok, out, err) = kubectl(&e.kc, &["get", "pod", "a", "-o", "json"]).await;
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["kind"], "Pod");
    assert_eq!(v["metadata"]["labels"]["app"], "web");

    let (ok, out, err) = kubectl(&e.kc, &["label", "pod", "a", "tier=fe"]).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "pod/a labeled");
    let (ok, out, err) = kubectl(&e.kc, &["annotate", "pod", "a", "note=hi"]).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "pod/a annotated");
    let (ok, _, err) = kubectl(&e.kc, &["label", "pod", "a", "app-"]).await;
    assert!(ok, "{err}");
    let p: Pod = e.api.get("default", "a").unwrap();
    let labels = p.metadata.labels.unwrap();
    assert_eq!(labels.get("tier").map(String::as_str), Some("fe"));
    assert!(!labels.contains_key("app"));
    assert_eq!(p.metadata.annotations.unwrap()["note"], "hi");

    let (ok, out, _) = kubectl(
        &e.kc,
        &["get", "pods", "-l", "tier in (fe,be)", "-o", "name"],
    )
    .await;
    assert!(ok);
    assert_eq!(out.trim(), "pod/a");
    let (ok, _, err) = kubectl(&e.kc, &["get", "pod", "nope"]).await;
    assert!(!ok);
    assert_eq!(
        err.trim(),
        "Error from server (NotFound): pods \"nope\" not found"
    );
    // kubectl labels through the main endpoint: a PATCH of pods, not pods/status.
    assert_eq!(e.api.journal().count("PATCH", "pods"), 3);
}

#[tokio::test]
async fn patch_types_and_status_subresource() {
    let e = env().await;
    let kc = &e.kc;
    // Strategic merge of one condition keeps the others.
    let (ok, _, err) = kubectl(
        kc,
        &[
            "patch",
            "pod",
            "a",
            "--subresource=status",
            "--type=strategic",
            "-p",
            r#"{"status":{"conditions":[{"type":"Ready","status":"True"}]}}"#,
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(
        conds(&e.api),
        pairs(&[
            ("PodScheduled", "True"),
            ("Ready", "True"),
            ("ContainersReady", "False")
        ])
    );
    // A merge patch replaces the list.
    let (ok, _, err) = kubectl(
        kc,
        &[
            "patch",
            "pod",
            "a",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"conditions":[{"type":"Ready","status":"False"}]}}"#,
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(conds(&e.api), pairs(&[("Ready", "False")]));
    // JSON patch.
    let (ok, _, err) = kubectl(
        kc,
        &[
            "patch",
            "pod",
            "a",
            "--subresource=status",
            "--type=json",
            "-p",
            r#"[{"op":"add","path":"/status/conditions/-","value":{"type":"X","status":"True"}}]"#,
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(conds(&e.api), pairs(&[("Ready", "False"), ("X", "True")]));
    // Status through the main endpoint is ignored: kubectl reports no change.
    let (ok, out, err) = kubectl(
        kc,
        &[
            "patch",
            "pod",
            "a",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Running"}}"#,
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "pod/a patched (no change)");
    // A differing uid in a patch is refused as an immutable-field change (422), as
    // kube-apiserver does.
    let (ok, _, err) = kubectl(
        kc,
        &["patch", "pod", "a", "--subresource=status", "--type=strategic",
          "-p", r#"{"metadata":{"uid":"not-the-uid"},"status":{"conditions":[{"type":"Ready","status":"True"}]}}"#],
    )
    .await;
    assert!(!ok);
    assert_eq!(
        err.trim(),
        "The Pod \"a\" is invalid: metadata.uid: Invalid value: \"not-the-uid\": field is immutable"
    );
    assert_eq!(conds(&e.api), pairs(&[("Ready", "False"), ("X", "True")]));
}

#[tokio::test]
async fn get_watch_streams_changes() {
    let e = env().await;
    let mut child = Command::new(kubectl_binary())
        .args([
            "get",
            "pods",
            "-w",
            "-o",
            "custom-columns=NAME:.metadata.name,NODE:.metadata.labels.step",
        ])
        .env("KUBECONFIG", &e.kc)
        .env("HOME", e.kc.parent().unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let t = Duration::from_secs(10);
    let mut next = async || {
        timeout(t, lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    };
    assert!(next().await.starts_with("NAME"));
    assert_eq!(
        next().await.split_whitespace().collect::<Vec<_>>(),
        ["a", "<none>"]
    );
    e.api
        .modify::<Pod>("default", "a", |p| {
            p.metadata
                .labels
                .get_or_insert_default()
                .insert("step".into(), "one".into());
        })
        .unwrap();
    assert_eq!(
        next().await.split_whitespace().collect::<Vec<_>>(),
        ["a", "one"]
    );
    e.api.create(&pod("b", json!({"step": "two"}))).unwrap();
    assert_eq!(
        next().await.split_whitespace().collect::<Vec<_>>(),
        ["b", "two"]
    );
    child.kill().await.unwrap();
}
