//! The chart on a real control plane (testkit::real): rendered and installed by the real helm,
//! applied by the real kubectl. Shared by the manager's real-apiserver tests.
#![allow(dead_code)] // each test binary uses a part of it

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use base64::Engine;
use testkit::real::ControlPlane;

/// The release namespace of every install here.
pub const RELEASE_NS: &str = "podprobe-system";
/// The Kubernetes version the tools are built at (helm template needs it: it asks no cluster).
pub const KUBE_VERSION: &str = "1.37.2";

pub fn chart_dir() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/podprobe")
}

/// Runs a prepared command and returns stdout; panics with stderr when it fails.
pub fn run(mut command: Command, what: &str) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Values every install needs when cert-manager is not used: the webhook certificate and the
/// CA bundle (base64 PEM, as in a Secret), here from the test CA for `names`.
pub fn cert_values(cp: &ControlPlane, names: &[&str]) -> Vec<String> {
    let pair = cp.pki().issue(names).unwrap();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    vec![
        format!("cert.caBundle={}", b64(&cp.pki().ca_pem())),
        format!("cert.tlsCrt={}", b64(&pair.cert_pem)),
        format!("cert.tlsKey={}", b64(&pair.key_pem)),
    ]
}

/// `helm <verb> [podprobe] <chart> -n podprobe-system --set ...` plus `extra` arguments (the
/// release name for every verb but `lint`).
pub fn helm(cp: &ControlPlane, verb: &str, sets: &[String], extra: &[&str]) -> Command {
    let mut helm = cp.helm().unwrap();
    helm.arg(verb);
    if verb != "lint" {
        helm.arg("podprobe");
    }
    helm.arg(chart_dir()).args(["--namespace", RELEASE_NS]);
    for set in sets {
        helm.args(["--set", set]);
    }
    helm.args(extra);
    helm
}

/// `helm template` of the chart (optionally only some templates), as multi-document YAML.
pub fn render(cp: &ControlPlane, sets: &[String], only: &[&str]) -> String {
    let mut extra = vec!["--kube-version", KUBE_VERSION];
    for t in only {
        extra.extend(["--show-only", t]);
    }
    run(helm(cp, "template", sets, &extra), "helm template")
}

/// `kubectl apply -f -` of `manifest`, as the admin.
pub fn kubectl_apply(cp: &ControlPlane, manifest: &str) {
    let out = kubectl_stdin(cp, &["apply", "-f", "-"], manifest);
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `kubectl <args>` as the admin, `input` on its standard input: what it printed.
pub fn kubectl_stdin(cp: &ControlPlane, args: &[&str], input: &str) -> std::process::Output {
    let mut child = cp
        .kubectl()
        .unwrap()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// The chart's sidecar RBAC for `namespaces` and one of its sidecar policy templates
/// (`templates/admission-policy-*.yaml`), rendered by the real helm and applied: the set-up of
/// the tests that check one policy on its own.
pub fn apply_sidecar_policy(cp: &ControlPlane, namespaces: &[&str], policy_template: &str) {
    let mut sets = cert_values(cp, &["localhost"]);
    sets.push(format!("sidecar.namespaces={{{}}}", namespaces.join(",")));
    let templates = [policy_template, "templates/sidecar-rbac.yaml"];
    kubectl_apply(cp, &render(cp, &sets, &templates));
}

/// Whether `refusal` (a 403's message) is `policy`'s, by the validation saying `validation`.
pub fn refused_by(refusal: &Option<String>, policy: &str, validation: &str) -> bool {
    refusal
        .as_deref()
        .is_some_and(|m| m.contains(policy) && m.contains(validation))
}

/// The objects of multi-document YAML as JSON.
pub fn documents(yaml: &str) -> Vec<serde_json::Value> {
    serde_saphyr::from_multiple::<serde_json::Value>(yaml)
        .expect("YAML")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// `kind/name` of each object, sorted.
pub fn kinds_and_names(docs: &[serde_json::Value]) -> Vec<String> {
    let mut out: Vec<String> = docs
        .iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap_or_default(),
                d["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    out.sort();
    out
}
