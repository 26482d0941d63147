//! README's "The choices" table says what the defaults are; the code decides them. Each
//! default the table names in backticks is the one the injected sidecar and the chart get:
//! where exec probes run, the sidecar's source per node kind, and the overwrite repair.

use k8s_openapi::api::core::v1::Container;
use podprobe_manager::config::{ExecAgentChoice, InjectionConfig};
use podprobe_manager::inject::shape::Shape;
use podprobe_manager::inject::sidecar_container;

/// The default cell of the README's choices row whose first cell names `key`.
fn readme_default(key: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
    let readme = std::fs::read_to_string(path).unwrap();
    let row = readme
        .lines()
        .skip_while(|l| *l != "## The choices")
        .take_while(|l| !l.starts_with("## ") || *l == "## The choices")
        .find(|l| l.starts_with('|') && l.split('|').nth(1).is_some_and(|c| c.contains(key)))
        .unwrap_or_else(|| panic!("no row for {key} in README's \"The choices\""));
    row.split('|').nth(2).unwrap().trim().to_owned()
}

fn env(container: &Container, name: &str) -> Option<String> {
    container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

fn chart_injection_config() -> InjectionConfig {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../charts/podprobe/values.yaml"
    );
    let values: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    serde_json::from_value(values["injection"]["config"].clone()).unwrap()
}

#[test]
fn where_exec_probes_run_by_default_is_the_readmes() {
    let said = readme_default("`injection.config.execAgent`");
    let chart = chart_injection_config().exec_agent;
    assert_eq!(chart, ExecAgentChoice::default(), "the chart's execAgent");
    let named = serde_json::to_value(chart).unwrap();
    let named = named.as_str().unwrap();
    assert!(
        said.starts_with(&format!("`{named}`")),
        "README says {said:?}; the default is `{named}`"
    );
}

#[test]
fn the_sidecars_source_and_repair_per_node_kind_are_the_readmes() {
    let config = chart_injection_config();
    let kubelet = sidecar_container(&config, Shape::Kubelet, true);
    let virtual_node = sidecar_container(&config, Shape::VirtualNode, false);
    for (container, args) in [(&kubelet, "kubelet"), (&virtual_node, "virtual")] {
        assert!(
            !container
                .args
                .iter()
                .flatten()
                .any(|a| a == "--source" || a == "--overwrite-repair"),
            "{args}: the chart's args override the env: {:?}",
            container.args
        );
    }

    let source = readme_default("`injection.config.args`");
    let kubelet_source = env(&kubelet, "PODPROBE_SOURCE").expect("a source on kubelet nodes");
    let virtual_source = env(&virtual_node, "PODPROBE_SOURCE").expect("a source on virtual nodes");
    assert!(
        source.starts_with(&format!("`{kubelet_source}`"))
            && source.contains(&format!("on kubelet nodes, `{virtual_source}`"))
            && source.ends_with("on virtual nodes"),
        "README says {source:?}; injection gives {kubelet_source} on kubelet nodes and \
         {virtual_source} on virtual nodes"
    );

    let repair = readme_default("`--overwrite-repair`");
    let virtual_repair = env(&virtual_node, "PODPROBE_OVERWRITE_REPAIR").expect("virtual repair");
    assert_eq!(env(&kubelet, "PODPROBE_OVERWRITE_REPAIR"), None);
    let sidecar_default = serde_json::to_value(podprobe::sidecar::RepairPolicy::default()).unwrap();
    let sidecar_default = sidecar_default.as_str().unwrap();
    assert!(
        repair.starts_with(&format!("virtual nodes: `{virtual_repair}`"))
            && repair.contains(&format!("elsewhere `{sidecar_default}`")),
        "README says {repair:?}; injection gives {virtual_repair} on virtual nodes, the sidecar \
         defaults to {sidecar_default}"
    );
}
