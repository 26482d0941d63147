//! Sidecar injection settings, loaded from a YAML file.
//!
//! Every field but `image` has a default that is safe under Pod Security "restricted", so the
//! smallest useful file is `image: ghcr.io/podprobe/podprobe:0.2.0`. Unknown keys are errors:
//! a misspelt `readinesGates` silently ignored would be worse than a refused start.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{
    Capabilities, ResourceRequirements, SeccompProfile, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Serialize};

/// Opt-in label: a pod is injected when its namespace or the pod itself carries it with the
/// value `enabled`; a pod may opt out with the value `disabled` even in an opted-in namespace.
pub const DEFAULT_INJECT_LABEL: &str = "podprobe.io/inject";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InjectionConfig {
    /// Sidecar image (required).
    pub image: String,
    #[serde(default = "default_container_name")]
    pub container_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// The sidecar binary, as the container's `command`: given explicitly because some
    /// providers refuse `args` without a `command` (azure-aci). The image's entrypoint.
    #[serde(default = "default_command")]
    pub command: Vec<String>,
    /// Arguments of the sidecar binary.
    #[serde(default = "default_args")]
    pub args: Vec<String>,
    #[serde(default = "default_resources")]
    pub resources: ResourceRequirements,
    #[serde(default = "default_security_context")]
    pub security_context: SecurityContext,
    /// Label key used for opt-in on namespaces and pods.
    #[serde(default = "default_inject_label")]
    pub inject_label: String,
    /// Run the sidecar as a native sidecar (restartable init container).
    #[serde(default)]
    pub native_sidecar: NativeSidecar,
    /// Where the downward-API annotations file is mounted in the sidecar.
    #[serde(default = "default_podinfo_path")]
    pub podinfo_mount_path: String,
    #[serde(default = "default_podinfo_volume")]
    pub podinfo_volume_name: String,
    /// Condition types to add as pod readinessGates, when the pod runs a probe writing them;
    /// `"*"` means every probe condition of the pod. Empty: no gates.
    #[serde(default)]
    pub readiness_gates: Vec<String>,
    /// Run exec probes through podprobe's exec agent inside the probed container, where the
    /// pod allows it (`auto`: on kubelet and virtual nodes; `kubeletNodes`: on kubelet nodes
    /// only; injection decides per container whether the pod allows it), or never (`disabled`: they go through pods/exec,
    /// or procfs with `shareProcessNamespace`).
    #[serde(default)]
    pub exec_agent: ExecAgentChoice,
    /// Set `shareProcessNamespace: true`, which the sidecar's `procfs` exec mode needs.
    #[serde(default)]
    pub share_process_namespace: bool,
    /// Serve the sidecar's /metrics, /healthz and /readyz on this port (container port
    /// `podprobe-metric`: a port name has at most 15 characters; the chart's PodMonitor selects it). Unset: the sidecar serves nothing, the
    /// default, since a listener per pod is a cost every pod pays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_port: Option<u16>,
    /// Which shape the injected pod takes: the one for kubelet nodes, or the one every
    /// virtual-kubelet provider accepts (`auto`: the latter for pods that may run on a virtual
    /// node, as injection reads the pod's tolerations, selector and affinity).
    #[serde(default)]
    pub pod_shape: PodShapeChoice,
    /// Taint keys of virtual nodes: a pod tolerating one of them (or every taint) may run on a
    /// virtual node, so `podShape: auto` gives it the virtual-node shape.
    #[serde(default = "default_virtual_node_taints")]
    pub virtual_node_taints: Vec<String>,
    /// The lifetime of the token podprobe-manager issues a virtual-node pod's sidecar, from
    /// 10m to 8760h (a year; the apiserver may cap it lower): the sidecar renews it at 80 % of
    /// its lifetime or daily, whichever comes first, so a shorter one is renewed more often and is good for less time if
    /// stolen, and a sidecar that cannot renew it (stopped, or the apiserver unreachable) for
    /// that long loses its credential.
    #[serde(default = "default_sidecar_token_lifetime", with = "token_lifetime")]
    pub sidecar_token_lifetime: std::time::Duration,
}

fn default_sidecar_token_lifetime() -> std::time::Duration {
    token_lifetime::MAX
}

/// `sidecarTokenLifetime`: a duration (`8760h`, `30d`) between what a TokenRequest may ask
/// (10 minutes) and a year, the most the policies let the manager and the sidecar mint.
mod token_lifetime {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub const MIN: Duration = Duration::from_secs(600);
    pub const MAX: Duration = Duration::from_secs(365 * 24 * 3600);

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        let lifetime = humantime::parse_duration(&text).map_err(D::Error::custom)?;
        if !(MIN..=MAX).contains(&lifetime) {
            return Err(D::Error::custom(format!(
                "{text} is not between 10m and 8760h (a TokenRequest's least, and a year)"
            )));
        }
        Ok(lifetime)
    }
}

/// The `execAgent` setting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ExecAgentChoice {
    /// Wrap the command of each container that exec probes target, when it has one in the
    /// pod spec, in every pod: for kubelet nodes, and for virtual nodes, whose provider must
    /// then run init containers and share `emptyDir` volumes between containers (azure-aci's
    /// does, and Alibaba ECI documents both).
    #[default]
    Auto,
    /// The same as `auto` (before `auto` covered virtual nodes, it was the setting for them).
    Always,
    /// As `auto`, in pods for kubelet nodes only: for a virtual node whose provider runs no
    /// init containers or shares no `emptyDir` volumes (its exec probes then go through
    /// pods/exec, the provider's exec).
    KubeletNodes,
    /// Wrap nothing.
    Disabled,
}

/// The `podShape` setting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PodShapeChoice {
    /// The virtual-node shape for pods that tolerate a `virtualNodeTaints` key or select
    /// `type: virtual-kubelet` nodes; the kubelet shape for the others.
    #[default]
    Auto,
    /// Every pod as for a kubelet node.
    Kubelet,
    /// Every pod as for a virtual node (works on kubelet nodes too, with a watch per pod rather
    /// than the downward-API file).
    VirtualNode,
}

/// When to use a restartable init container instead of an ordinary container.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NativeSidecar {
    /// When the cluster supports it (Kubernetes ≥ 1.29, where SidecarContainers is on by default).
    #[default]
    Auto,
    Always,
    Never,
}

impl NativeSidecar {
    pub fn enabled(self, cluster_supports: bool) -> bool {
        match self {
            NativeSidecar::Auto => cluster_supports,
            NativeSidecar::Always => true,
            NativeSidecar::Never => false,
        }
    }
}

/// Whether an apiserver reporting `major.minor` (from `/version`, where minor may carry a
/// `+` suffix on managed clusters) runs native sidecars by default.
pub fn supports_native_sidecars(major: &str, minor: &str) -> bool {
    let num = |s: &str| {
        s.trim_end_matches(|c: char| !c.is_ascii_digit())
            .parse::<u32>()
            .ok()
    };
    matches!((num(major), num(minor)), (Some(1), Some(m)) if m >= 29)
        || num(major).is_some_and(|m| m > 1)
}

fn default_container_name() -> String {
    "podprobe".into()
}
/// The sidecar image's entrypoint.
pub const DEFAULT_COMMAND: &str = "/usr/local/bin/podprobe";

fn default_command() -> Vec<String> {
    vec![DEFAULT_COMMAND.into()]
}
/// The virtual-kubelet library's default taint (azure-aci, the mock, most providers), interLink's and
/// Liqo's.
fn default_virtual_node_taints() -> Vec<String> {
    [
        "virtual-kubelet.io/provider",
        "virtual-node.interlink/no-schedule",
        "virtual-node.liqo.io/not-allowed",
    ]
    .map(String::from)
    .to_vec()
}
fn default_args() -> Vec<String> {
    vec!["run".into()]
}
fn default_inject_label() -> String {
    DEFAULT_INJECT_LABEL.into()
}
fn default_podinfo_path() -> String {
    "/etc/podinfo".into()
}
fn default_podinfo_volume() -> String {
    "podprobe-podinfo".into()
}

fn default_resources() -> ResourceRequirements {
    let q = |s: &str| Quantity(s.into());
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".into(), q("10m")),
            ("memory".into(), q("16Mi")),
        ])),
        limits: Some(BTreeMap::from([("memory".into(), q("64Mi"))])),
        ..Default::default()
    }
}

/// Pod Security "restricted" as far as one container can meet it: non-root, no privilege
/// escalation, no capabilities, the runtime's default seccomp profile. A pod whose own
/// containers meet it stays admissible in a "restricted" namespace once injected.
fn default_security_context() -> SecurityContext {
    SecurityContext {
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        run_as_non_root: Some(true),
        run_as_user: Some(65532),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        ..Default::default()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read injection config {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("injection config {path} is not valid YAML: {message}")]
    Yaml { path: String, message: String },
    #[error("injection config {path}: field `{field}`: {message}")]
    Field {
        path: String,
        field: String,
        message: String,
    },
    #[error("injection config {path}: `image` must not be empty")]
    NoImage { path: String },
}

impl InjectionConfig {
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_yaml(&text, &path.display().to_string())
    }

    /// `origin` names the source in errors.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let value: serde_json::Value =
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Yaml {
                path: origin.into(),
                message: e.to_string(),
            })?;
        let config: Self =
            serde_path_to_error::deserialize(value).map_err(|e| ConfigError::Field {
                path: origin.into(),
                field: e.path().to_string(),
                message: e.inner().to_string(),
            })?;
        if config.image.trim().is_empty() {
            return Err(ConfigError::NoImage {
                path: origin.into(),
            });
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sidecar_token_lifetime_is_a_duration_within_what_may_be_minted() {
        let c = InjectionConfig::from_yaml("image: p\n", "t").unwrap();
        assert_eq!(c.sidecar_token_lifetime.as_secs(), 365 * 24 * 3600);
        let c = InjectionConfig::from_yaml("image: p\nsidecarTokenLifetime: 30d\n", "t").unwrap();
        assert_eq!(c.sidecar_token_lifetime.as_secs(), 30 * 24 * 3600);
        for bad in ["5m", "2y", "soon"] {
            let e = InjectionConfig::from_yaml(
                &format!("image: p\nsidecarTokenLifetime: {bad}\n"),
                "t",
            )
            .unwrap_err();
            assert!(e.to_string().contains("sidecarTokenLifetime"), "{e}");
        }
    }

    #[test]
    fn minimal_file_gets_restricted_defaults() {
        let c = InjectionConfig::from_yaml("image: podprobe:dev\n", "t").unwrap();
        assert_eq!(c.container_name, "podprobe");
        assert_eq!(c.native_sidecar, NativeSidecar::Auto);
        assert_eq!(c.podinfo_mount_path, "/etc/podinfo");
        let sc = &c.security_context;
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        assert!(c.readiness_gates.is_empty());
    }

    #[test]
    fn full_file_overrides_defaults() {
        let yaml = r#"
image: reg/podprobe:v1
imagePullPolicy: IfNotPresent
nativeSidecar: never
readinessGates: ["game.kruise.io/healthy"]
shareProcessNamespace: true
resources: {requests: {cpu: 50m}}
securityContext: {runAsUser: 1000, capabilities: {add: [SYS_CHROOT], drop: [ALL]}}
"#;
        let c = InjectionConfig::from_yaml(yaml, "t").unwrap();
        assert_eq!(c.native_sidecar, NativeSidecar::Never);
        assert_eq!(c.readiness_gates, ["game.kruise.io/healthy"]);
        assert!(c.share_process_namespace);
        assert_eq!(c.resources.requests.unwrap()["cpu"].0, "50m");
        assert_eq!(c.security_context.run_as_user, Some(1000));
    }

    #[test]
    fn errors_name_the_field() {
        let e =
            InjectionConfig::from_yaml("image: x\nreadinesGates: [a]\n", "cfg.yaml").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("cfg.yaml") && msg.contains("readinesGates"),
            "{msg}"
        );
        let e =
            InjectionConfig::from_yaml("image: x\nnativeSidecar: maybe\n", "cfg.yaml").unwrap_err();
        assert!(e.to_string().contains("nativeSidecar"), "{e}");
        assert!(matches!(
            InjectionConfig::from_yaml("image: ''\n", "c"),
            Err(ConfigError::NoImage { .. })
        ));
        assert!(matches!(
            InjectionConfig::from_yaml("args: [x]\n", "c"),
            Err(ConfigError::Field { .. })
        ));
    }

    #[test]
    fn native_sidecar_support_by_version() {
        assert!(supports_native_sidecars("1", "29"));
        assert!(supports_native_sidecars("1", "33+"));
        assert!(!supports_native_sidecars("1", "28"));
        assert!(!supports_native_sidecars("x", "y"));
        assert!(NativeSidecar::Auto.enabled(true));
        assert!(!NativeSidecar::Auto.enabled(false));
        assert!(NativeSidecar::Always.enabled(false));
        assert!(!NativeSidecar::Never.enabled(true));
    }
}
