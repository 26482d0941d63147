//! The Helm chart (charts/podprobe) without helm: the committed CRD is the one the code
//! generates, every template is YAML once its actions are stood in for (tests/chart/mod.rs says
//! how), and the pieces that must agree with the manager do: its flags, its injection config,
//! its webhook paths.

mod chart;

use clap::Parser;
use podprobe_manager::cli::{Cli, Command, run};
use podprobe_manager::config::InjectionConfig;

const REGENERATE: &str =
    "cargo run -p podprobe-manager -- crd > charts/podprobe/crds/podprobemarkers.yaml";

#[test]
fn committed_crd_is_the_generated_one() {
    let path = chart::chart_dir().join("crds/podprobemarkers.yaml");
    let committed = std::fs::read_to_string(&path).expect("the chart's CRD");
    let generated = run(&Command::Crd).expect("crd").stdout;
    let committed_value: serde_json::Value =
        serde_saphyr::from_str(&committed).expect("committed CRD is YAML");
    let generated_value =
        serde_json::to_value(podprobe_manager::crd::crd()).expect("CRD serializes");
    assert_eq!(
        committed_value, generated_value,
        "charts/podprobe/crds/podprobemarkers.yaml is stale: {REGENERATE}"
    );
    assert_eq!(
        committed, generated,
        "charts/podprobe/crds/podprobemarkers.yaml differs from `podprobe-manager crd` (format only): {REGENERATE}"
    );
}

fn templates() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(chart::chart_dir().join("templates"))
        .expect("templates/")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    names
}

#[test]
fn every_template_is_yaml_with_kind_and_name() {
    let names = templates();
    assert!(names.len() >= 8, "templates: {names:?}");
    for name in names {
        let docs = chart::documents(&name);
        assert!(!docs.is_empty(), "{name} renders no object");
        for doc in docs {
            for key in ["apiVersion", "kind"] {
                assert!(
                    doc[key].is_string(),
                    "{name}: an object without {key}: {doc}"
                );
            }
            assert!(
                doc["metadata"]["name"].is_string(),
                "{name}: an object without metadata.name: {doc}"
            );
        }
    }
}

#[test]
fn chart_and_values_are_yaml() {
    let chart = std::fs::read_to_string(chart::chart_dir().join("Chart.yaml")).unwrap();
    let chart: serde_json::Value = serde_saphyr::from_str(&chart).expect("Chart.yaml");
    assert_eq!(chart["apiVersion"], "v2");
    assert_eq!(chart["name"], "podprobe");
    let values = chart::values();
    assert_eq!(values["mode"], "standalone");
}

fn objects(kind: &str) -> Vec<serde_json::Value> {
    templates()
        .iter()
        .flat_map(|n| chart::documents(n))
        .filter(|d| d["kind"] == kind)
        .collect()
}

#[test]
fn deployment_args_are_flags_the_manager_accepts() {
    let deployments = objects("Deployment");
    assert_eq!(deployments.len(), 1);
    let container = &deployments[0]["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg"))
        .collect();
    let cli = Cli::try_parse_from(std::iter::once("podprobe-manager").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("the chart's args {args:?}: {e}"));
    let Command::Run(run) = cli.command else {
        panic!("not `run`: {args:?}");
    };
    assert_eq!(run.webhook_addr.port(), 9443);
    assert_eq!(run.metrics_addr.port(), 8080);
    assert!(run.config.is_some(), "injection is on by default");
    let paths: Vec<&str> = ["livenessProbe", "readinessProbe"]
        .iter()
        .map(|p| container[p]["httpGet"]["path"].as_str().expect("httpGet"))
        .collect();
    assert_eq!(paths, ["/healthz", "/readyz"]);
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(
        deployments[0]["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"],
        true
    );
}

#[test]
fn default_injection_config_loads() {
    let config = chart::values()["injection"]["config"].clone();
    let parsed: InjectionConfig = serde_json::from_value(config.clone())
        .unwrap_or_else(|e| panic!("values.yaml injection.config: {e}: {config}"));
    assert!(parsed.image.contains("podprobe"));
}

#[test]
fn webhooks_point_at_the_manager_paths_with_the_documented_policies() {
    let mutating = objects("MutatingWebhookConfiguration");
    let hook = &mutating[0]["webhooks"][0];
    assert_eq!(hook["clientConfig"]["service"]["path"], "/mutate-pods");
    assert_eq!(hook["failurePolicy"], "Ignore");
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(hook["reinvocationPolicy"], "IfNeeded");
    assert_eq!(
        hook["rules"][0]["operations"],
        serde_json::json!(["CREATE"])
    );
    let validating = objects("ValidatingWebhookConfiguration");
    let hook = &validating[0]["webhooks"][0];
    assert_eq!(
        hook["clientConfig"]["service"]["path"],
        "/validate-podprobemarkers"
    );
    assert_eq!(hook["failurePolicy"], "Fail");
    assert_eq!(hook["sideEffects"], "None");
}

/// The chart's images are the ones built from its own commit: the chart's version, its
/// `appVersion`, the crates' version (what `--version` and `*_build_info` report), the
/// default image tags and the examples' sidecar image all say the same, and a version still in
/// development (`-dev`, no image published under it) is the CHANGELOG's "Unreleased" section,
/// a released one its own section (CONTRIBUTING.md, "Releasing").
#[test]
fn the_charts_images_are_built_from_its_own_commit() {
    let chart = std::fs::read_to_string(chart::chart_dir().join("Chart.yaml")).unwrap();
    let chart: serde_json::Value = serde_saphyr::from_str(&chart).expect("Chart.yaml");
    let app_version = chart["appVersion"].as_str().expect("appVersion");
    assert_eq!(chart["version"], app_version, "Chart.yaml's version");
    assert_eq!(
        env!("CARGO_PKG_VERSION"),
        app_version,
        "the workspace's version (Cargo.toml) is not the chart's appVersion"
    );
    let values = chart::values();
    assert_eq!(values["image"]["tag"], app_version, "values.yaml image.tag");
    let sidecar = values["injection"]["config"]["image"].as_str().unwrap();
    assert_eq!(
        sidecar,
        format!("ghcr.io/podprobe/podprobe:{app_version}"),
        "values.yaml injection.config.image"
    );
    for example in ["game-server-pod.yaml", "sidecar-by-hand.yaml"] {
        let path = chart::chart_dir().join("../../examples").join(example);
        let text = std::fs::read_to_string(&path).unwrap();
        let images: Vec<&str> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("image: ghcr.io/podprobe/podprobe"))
            .collect();
        assert!(!images.is_empty(), "{example} names no podprobe image");
        for image in images {
            assert_eq!(image, format!(":{app_version}"), "examples/{example}");
        }
    }
    let changelog = std::fs::read_to_string(chart::chart_dir().join("../../CHANGELOG.md")).unwrap();
    let newest = changelog
        .lines()
        .find_map(|l| l.strip_prefix("## "))
        .expect("a section in CHANGELOG.md");
    let expected = if app_version.ends_with("-dev") {
        "Unreleased"
    } else {
        app_version
    };
    assert_eq!(
        newest, expected,
        "CHANGELOG.md's newest section for appVersion {app_version}"
    );
}
