//! Sidecar injection: the JSON patch ops that add the podprobe sidecar, its downward-API
//! volume and optional readiness gates to a pod at admission, in the shape the pod's node
//! needs ([`shape`]), and give the pod's service-account token to the sidecar alone
//! ([`token`]).

pub mod agent;
pub mod placement;
pub mod shape;
mod token;

pub use token::TOKEN_VOLUME;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, DownwardAPIVolumeFile, DownwardAPIVolumeSource, EnvVar, EnvVarSource,
    ObjectFieldSelector, Pod, PodReadinessGate, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::config::InjectionConfig;
use crate::patch::PatchOp;
use crate::sidecar_token;
use shape::Shape;

/// What the webhook knows beyond the pod and the configuration.
#[derive(Debug, Clone, Default)]
pub struct InjectContext<'a> {
    /// Labels of the pod's namespace (opt-in).
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    /// The apiserver runs restartable init containers.
    pub native_sidecars_supported: bool,
    /// Condition types of the probes written into the pod's `kruise.io/podprobe`.
    pub probe_condition_types: &'a [String],
    /// Containers that the pod's exec probes target.
    pub exec_probe_containers: &'a [String],
    /// The admission request's uid: names the Secret of a virtual-node pod's token.
    pub request_uid: &'a str,
    /// Companion mode: OpenKruise's kruise-daemon probes pods on nodes not labelled
    /// `type=virtual-kubelet`, where the sidecar stands down.
    pub companion: bool,
    /// The cluster's virtual nodes, as the webhook knows them (the shape decision).
    pub virtual_nodes: &'a [placement::VirtualNode],
    /// This replica, which issues the token of a virtual-node pod it admits
    /// ([`sidecar_token::ISSUER_LABEL`]).
    pub issuer: &'a str,
}

/// Whether the pod (by its metadata) opted in: pod label `enabled`, or namespace label
/// `enabled` without a pod label `disabled`.
pub fn opted_in(
    pod: &ObjectMeta,
    config: &InjectionConfig,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> bool {
    match label_value(pod.labels.as_ref(), &config.inject_label) {
        Some("enabled") => true,
        Some("disabled") => false,
        _ => label_value(namespace_labels, &config.inject_label) == Some("enabled"),
    }
}

fn label_value<'a>(labels: Option<&'a BTreeMap<String, String>>, key: &str) -> Option<&'a str> {
    labels.and_then(|l| l.get(key)).map(String::as_str)
}

/// The sidecar's metrics port name, which the chart's PodMonitor scrapes.
pub const SIDECAR_METRICS_PORT_NAME: &str = "podprobe-metric";

/// What the sidecar is told in companion mode: its node, and to probe only on virtual nodes.
fn companion_env() -> [EnvVar; 2] {
    [
        EnvVar {
            name: "NODE_NAME".into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: None,
                    field_path: "spec.nodeName".into(),
                }),
                ..Default::default()
            }),
        },
        EnvVar {
            name: "PODPROBE_ONLY_ON_VIRTUAL_NODES".into(),
            value: Some("true".into()),
            value_from: None,
        },
    ]
}

/// The sidecar container in `shape`, independent of where it goes.
pub fn sidecar_container(config: &InjectionConfig, shape: Shape, native: bool) -> Container {
    let field_env = |name: &str, path: &str| EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: path.into(),
            }),
            ..Default::default()
        }),
    };
    let value_env = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    };
    let mut env = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("POD_UID", "metadata.uid"),
    ];
    match shape {
        // The downward-API file for the probes, the pod read only when probing needs its
        // containers' status: no watch held on the apiserver for the pod's life (a kubelet
        // keeps the conditions it does not own, so there is nothing to repair at once).
        Shape::Kubelet => env.extend([
            field_env("POD_IP", "status.podIP"),
            value_env("PODPROBE_SOURCE", "file".into()),
        ]),
        // No downward-API file: the probes and the pod's IP come from the apiserver. Virtual
        // nodes' providers write their own status over the pod's whole (azure-aci every 5 s):
        // each overwritten condition is written back at once, whether the probe's result
        // changed lately or not, or steady results would be absent most of the time
        // (docs/providers.md, "Settings"). `injection.config.args` can still choose another
        // policy (`--overwrite-repair` wins over the env).
        Shape::VirtualNode => env.extend([
            value_env("PODPROBE_SOURCE", "api".into()),
            value_env("PODPROBE_OVERWRITE_REPAIR", "immediate".into()),
        ]),
    }
    env.extend(
        config
            .metrics_port
            .map(|port| value_env("PODPROBE_METRICS_ADDR", format!("0.0.0.0:{port}"))),
    );
    let podinfo_mount = VolumeMount {
        name: config.podinfo_volume_name.clone(),
        mount_path: config.podinfo_mount_path.clone(),
        read_only: Some(true),
        ..Default::default()
    };
    Container {
        name: config.container_name.clone(),
        image: Some(config.image.clone()),
        image_pull_policy: config.image_pull_policy.clone(),
        command: (!config.command.is_empty()).then(|| config.command.clone()),
        args: (!config.args.is_empty()).then(|| config.args.clone()),
        env: Some(env),
        ports: config.metrics_port.map(|port| {
            vec![ContainerPort {
                name: Some(SIDECAR_METRICS_PORT_NAME.into()),
                container_port: port.into(),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]
        }),
        resources: Some(config.resources.clone()),
        security_context: Some(config.security_context.clone()),
        volume_mounts: Some(match shape {
            Shape::Kubelet => vec![podinfo_mount],
            Shape::VirtualNode => vec![],
        }),
        restart_policy: native.then(|| "Always".into()),
        ..Default::default()
    }
}

fn podinfo_volume(config: &InjectionConfig) -> Volume {
    Volume {
        name: config.podinfo_volume_name.clone(),
        downward_api: Some(DownwardAPIVolumeSource {
            items: Some(vec![DownwardAPIVolumeFile {
                path: "annotations".into(),
                field_ref: Some(ObjectFieldSelector {
                    api_version: None,
                    field_path: "metadata.annotations".into(),
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Append `value` to the array at `path`, creating the array when the pod has none (a `/-`
/// pointer into a missing array fails).
fn append(ops: &mut Vec<PatchOp>, path: &str, exists: bool, value: Value) {
    ops.push(if exists {
        PatchOp::Add {
            path: format!("{path}/-"),
            value,
        }
    } else {
        PatchOp::Add {
            path: path.into(),
            value: Value::Array(vec![value]),
        }
    });
}

fn json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// The sidecar's injection into one pod: the patch, and what the pod's creator should know
/// (admission warnings, which kubectl prints).
#[derive(Debug, Clone, Default)]
pub struct Injected {
    pub ops: Vec<PatchOp>,
    pub warnings: Vec<String>,
}

/// JSON patch ops injecting the sidecar; empty when the pod did not opt in or already has a
/// container of that name (admission reinvocation, or a hand-written sidecar).
pub fn inject_ops(pod: &Pod, config: &InjectionConfig, ctx: &InjectContext<'_>) -> Vec<PatchOp> {
    inject(pod, config, ctx).ops
}

/// On a virtual node, an exec probe the agent does not run goes through the provider's
/// `pods/exec`, which azure-aci answers with success whatever the command does: the creator
/// of an OpenKruise Game server would see every server idle.
fn pods_exec_warning(decision: &agent::Decision) -> Option<String> {
    let agent::Decision::Left { container, why } = decision else {
        return None;
    };
    Some(format!(
        "podprobe: exec probes on container {container:?} go through the virtual node provider's pods/exec, \
         which azure-aci answers with success whatever the command does (docs/providers.md): {why}"
    ))
}

/// The sidecar's injection into `pod` ([`inject_ops`]), with its warnings.
pub fn inject(pod: &Pod, config: &InjectionConfig, ctx: &InjectContext<'_>) -> Injected {
    let Some(spec) = &pod.spec else {
        return Injected::default();
    };
    if !opted_in(&pod.metadata, config, ctx.namespace_labels) {
        return Injected::default();
    }
    let name = config.container_name.as_str();
    let present = spec.containers.iter().any(|c| c.name == name)
        || spec
            .init_containers
            .iter()
            .flatten()
            .any(|c| c.name == name);
    if present {
        return Injected::default();
    }
    let shape = shape::of(spec, config, ctx.virtual_nodes);
    // Providers run init containers to completion before the others, and azure-aci refuses
    // them with resources: on a virtual node the sidecar is an ordinary container.
    let native =
        shape == Shape::Kubelet && config.native_sidecar.enabled(ctx.native_sidecars_supported);
    let mut sidecar = sidecar_container(config, shape, native);
    if ctx.companion {
        // The node is known only once the pod is bound: the sidecar reads it and stands
        // down where kruise-daemon probes (src/sidecar/executor.rs). One executor per pod.
        sidecar.env.get_or_insert_default().extend(companion_env());
    }
    // First: the token's ops remove by index, which appends after them do not disturb.
    // A pod bound at creation cannot be held by a scheduling gate (the apiserver refuses
    // gates beside spec.nodeName), and a write to it while its provider starts it can cost it
    // its first status (virtual-kubelet ≥ v1.13 then gets a conflict): it keeps the projected
    // token.
    let held = shape == Shape::VirtualNode && spec.node_name.is_none();
    let issued_secret = held.then(|| sidecar_token::secret_name(ctx.request_uid));
    let token = token::plan(spec, issued_secret.as_deref());
    let issued = token.is_some() && issued_secret.is_some();
    let mut ops = Vec::new();
    let mut volumes_exist = spec.volumes.is_some();
    if let Some(token) = token {
        ops.extend(token.ops);
        sidecar
            .volume_mounts
            .get_or_insert_default()
            .push(token.sidecar_mount);
        append(
            &mut ops,
            "/spec/volumes",
            volumes_exist,
            json(&token.volume),
        );
        volumes_exist = true;
        if let Some(renewal) = token.renewal {
            sidecar
                .volume_mounts
                .get_or_insert_default()
                .push(renewal.sidecar_mount);
            sidecar
                .env
                .get_or_insert_default()
                .push(renewal.sidecar_env);
            append(&mut ops, "/spec/volumes", true, json(&renewal.volume));
        }
    }
    // Ops on the pod's own containers by index: after the token's removals, before the
    // sidecar is appended.
    let agent = agent::plan(
        pod,
        config,
        ctx.exec_probe_containers,
        shape == Shape::VirtualNode,
    );
    ops.extend(agent.ops);
    let mut warnings = Vec::new();
    if shape == Shape::VirtualNode {
        warnings.extend(agent.decisions.iter().filter_map(pods_exec_warning));
    }
    let mut init_containers_exist = spec.init_containers.is_some();
    if let Some(parts) = agent.parts {
        sidecar.env.get_or_insert_default().push(parts.sidecar_env);
        sidecar
            .volume_mounts
            .get_or_insert_default()
            .extend(parts.sidecar_mounts);
        for volume in &parts.volumes {
            append(&mut ops, "/spec/volumes", volumes_exist, json(volume));
            volumes_exist = true;
        }
        // Before a native sidecar: init containers start in order.
        append(
            &mut ops,
            "/spec/initContainers",
            init_containers_exist,
            json(&parts.install),
        );
        init_containers_exist = true;
    }
    let container = json(&sidecar);
    if native {
        // Appended, so ordinary init containers are not delayed and the sidecar is up before
        // the app containers start.
        append(
            &mut ops,
            "/spec/initContainers",
            init_containers_exist,
            container,
        );
    } else {
        ops.push(PatchOp::Add {
            path: "/spec/containers/-".into(),
            value: container,
        });
    }
    if shape == Shape::Kubelet
        && !spec
            .volumes
            .iter()
            .flatten()
            .any(|v| v.name == config.podinfo_volume_name)
    {
        append(
            &mut ops,
            "/spec/volumes",
            volumes_exist,
            json(&podinfo_volume(config)),
        );
    }
    let existing: Vec<&str> = spec
        .readiness_gates
        .iter()
        .flatten()
        .map(|g| g.condition_type.as_str())
        .collect();
    let mut gates_exist = spec.readiness_gates.is_some();
    let all = config.readiness_gates.iter().any(|g| g == "*");
    for condition in ctx.probe_condition_types {
        let chosen = all || config.readiness_gates.contains(condition);
        if chosen && !existing.contains(&condition.as_str()) {
            let gate = PodReadinessGate {
                condition_type: condition.clone(),
            };
            append(&mut ops, "/spec/readinessGates", gates_exist, json(&gate));
            gates_exist = true;
        }
    }
    if config.share_process_namespace && spec.share_process_namespace != Some(true) {
        ops.push(PatchOp::Add {
            path: "/spec/shareProcessNamespace".into(),
            value: Value::Bool(true),
        });
    }
    if issued {
        ops.extend(sidecar_token::await_issue_ops(pod, ctx.issuer));
    } else if shape == Shape::VirtualNode {
        warnings.push(sidecar_token::KeptProjected::of(spec).warning());
        ops.extend(sidecar_token::kept_projected_ops(pod));
    }
    Injected { ops, warnings }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NativeSidecar;
    use k8s_openapi::api::core::v1::{ExecAction, Lifecycle, LifecycleHandler, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn config() -> InjectionConfig {
        InjectionConfig::from_yaml("image: podprobe:dev\n", "t").unwrap()
    }

    fn pod(pod_labels: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                labels: Some(labels(pod_labels)),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "main".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        }
    }

    fn applied(pod: &Pod, ops: &[PatchOp]) -> Pod {
        let mut doc = serde_json::to_value(pod).unwrap();
        crate::patch::apply(&mut doc, ops).unwrap();
        serde_json::from_value(doc).unwrap()
    }

    const ENABLED: &[(&str, &str)] = &[("podprobe.io/inject", "enabled")];

    /// Each env var's name and its field path, or its value.
    fn env_of(c: &Container) -> Vec<(&str, &str)> {
        let env = c.env.iter().flatten();
        env.map(|e| {
            let field = e.value_from.as_ref().and_then(|v| v.field_ref.as_ref());
            let shown = field.map_or(e.value.as_deref().unwrap_or(""), |f| &f.field_path);
            (e.name.as_str(), shown)
        })
        .collect()
    }

    #[test]
    fn opt_in_by_pod_or_namespace_and_opt_out_by_pod() {
        let c = config();
        let ns = labels(ENABLED);
        assert!(opted_in(&pod(ENABLED).metadata, &c, None));
        assert!(!opted_in(&pod(&[]).metadata, &c, None));
        assert!(opted_in(&pod(&[]).metadata, &c, Some(&ns)));
        assert!(!opted_in(
            &pod(&[("podprobe.io/inject", "disabled")]).metadata,
            &c,
            Some(&ns)
        ));
        let ctx = InjectContext::default();
        assert!(inject_ops(&pod(&[]), &c, &ctx).is_empty());
    }

    #[test]
    fn in_companion_mode_the_sidecar_learns_its_node_and_probes_only_on_virtual_nodes() {
        let p = pod(ENABLED);
        for companion in [false, true] {
            let ctx = InjectContext {
                native_sidecars_supported: true,
                companion,
                ..Default::default()
            };
            let out = applied(&p, &inject_ops(&p, &config(), &ctx));
            let sidecar = &out.spec.unwrap().init_containers.unwrap()[0];
            let env = env_of(sidecar);
            let told = env.contains(&("NODE_NAME", "spec.nodeName"))
                && env.contains(&("PODPROBE_ONLY_ON_VIRTUAL_NODES", "true"));
            assert_eq!(told, companion, "{env:?}");
        }
    }

    #[test]
    fn native_sidecar_with_env_volume_and_security_context() {
        let ctx = InjectContext {
            native_sidecars_supported: true,
            ..Default::default()
        };
        let p = pod(ENABLED);
        let out = applied(&p, &inject_ops(&p, &config(), &ctx));
        let spec = out.spec.unwrap();
        assert_eq!(spec.containers.len(), 1);
        let sidecar = &spec.init_containers.unwrap()[0];
        assert_eq!(sidecar.name, "podprobe");
        assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
        assert_eq!(
            sidecar.command.as_deref(),
            Some(&["/usr/local/bin/podprobe".to_owned()][..])
        );
        assert_eq!(
            env_of(sidecar),
            [
                ("POD_NAME", "metadata.name"),
                ("POD_NAMESPACE", "metadata.namespace"),
                ("POD_UID", "metadata.uid"),
                ("POD_IP", "status.podIP"),
                ("PODPROBE_SOURCE", "file"),
            ]
        );
        let mount = &sidecar.volume_mounts.as_ref().unwrap()[0];
        assert_eq!(
            (mount.mount_path.as_str(), mount.read_only),
            ("/etc/podinfo", Some(true))
        );
        let volumes = spec.volumes.unwrap();
        let volume = volumes.iter().find(|v| v.name == mount.name).unwrap();
        let item = &volume
            .downward_api
            .as_ref()
            .unwrap()
            .items
            .as_ref()
            .unwrap()[0];
        assert_eq!(
            (
                item.path.as_str(),
                item.field_ref.as_ref().unwrap().field_path.as_str()
            ),
            ("annotations", "metadata.annotations")
        );
        assert_eq!(
            sidecar.security_context.as_ref().unwrap().run_as_non_root,
            Some(true)
        );
        assert!(spec.readiness_gates.is_none());
        assert!(sidecar.ports.is_none(), "no metrics port unless configured");
    }

    #[test]
    fn a_pod_for_a_virtual_node_gets_the_shape_providers_accept() {
        let ctx = InjectContext {
            native_sidecars_supported: true,
            ..Default::default()
        };
        let mut p = with_generated_token(pod(ENABLED), None);
        p.spec.as_mut().unwrap().tolerations = Some(vec![
            serde_json::from_value(
                serde_json::json!({"key": "virtual-kubelet.io/provider", "operator": "Exists"}),
            )
            .unwrap(),
        ]);
        let spec = applied(&p, &inject_ops(&p, &config(), &ctx)).spec.unwrap();
        // A plain container, even where native sidecars are supported.
        let inits = spec.init_containers.unwrap();
        assert!(inits.iter().all(|c| c.name != "podprobe"), "{inits:?}");
        let sidecar = spec
            .containers
            .iter()
            .find(|c| c.name == "podprobe")
            .unwrap();
        assert_eq!(
            sidecar.command.as_deref(),
            Some(&[crate::config::DEFAULT_COMMAND.to_owned()][..])
        );
        assert_eq!(
            env_of(sidecar),
            [
                ("POD_NAME", "metadata.name"),
                ("POD_NAMESPACE", "metadata.namespace"),
                ("POD_UID", "metadata.uid"),
                ("PODPROBE_SOURCE", "api"),
                ("PODPROBE_OVERWRITE_REPAIR", "immediate"),
                ("PODPROBE_RENEW_TOKEN_DIR", token::RENEWAL_MOUNT_PATH),
            ]
        );
        // The issued token, and where the sidecar keeps it renewed.
        assert_eq!(
            mounts(sidecar),
            [
                (token::TOKEN_VOLUME, token::TOKEN_MOUNT_PATH),
                (token::RENEWAL_VOLUME, token::RENEWAL_MOUNT_PATH)
            ]
        );
        let volumes = spec.volumes.unwrap();
        let names: Vec<_> = volumes.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            names,
            ["own-token", token::TOKEN_VOLUME, token::RENEWAL_VOLUME]
        );
        let renewal = volumes[2].empty_dir.as_ref().unwrap();
        assert_eq!(renewal.medium.as_deref(), Some("Memory"));
        // The issued Secret is optional: a pod released without one still starts.
        let sources = volumes[1]
            .projected
            .as_ref()
            .unwrap()
            .sources
            .as_ref()
            .unwrap();
        let secret = sources.iter().find_map(|s| s.secret.as_ref()).unwrap();
        assert_eq!(secret.optional, Some(true));
        assert!(sources.iter().all(|s| s.service_account_token.is_none()));
    }

    #[test]
    fn metrics_port_opts_the_sidecar_into_serving_metrics() {
        let c =
            InjectionConfig::from_yaml("image: podprobe:dev\nmetricsPort: 9102\n", "t").unwrap();
        let sidecar = sidecar_container(&c, Shape::Kubelet, false);
        let addr = sidecar
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "PODPROBE_METRICS_ADDR")
            .and_then(|e| e.value.as_deref());
        assert_eq!(addr, Some("0.0.0.0:9102"));
        let port = &sidecar.ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.container_port),
            (Some(SIDECAR_METRICS_PORT_NAME), 9102)
        );
        // Kubernetes refuses port names over 15 characters (IANA service names).
        assert!(SIDECAR_METRICS_PORT_NAME.len() <= 15);
    }

    #[test]
    fn plain_container_when_cluster_lacks_native_sidecars_and_appends_to_existing_arrays() {
        let mut p = pod(ENABLED);
        let spec = p.spec.as_mut().unwrap();
        spec.init_containers = Some(vec![Container {
            name: "init".into(),
            ..Default::default()
        }]);
        spec.volumes = Some(vec![Volume {
            name: "data".into(),
            ..Default::default()
        }]);
        let ctx = InjectContext::default();
        let out = applied(&p, &inject_ops(&p, &config(), &ctx)).spec.unwrap();
        assert_eq!(out.containers[1].name, "podprobe");
        assert_eq!(out.containers[1].restart_policy, None);
        assert_eq!(out.init_containers.unwrap().len(), 1);
        let volumes: Vec<String> = out.volumes.unwrap().into_iter().map(|v| v.name).collect();
        assert_eq!(volumes, ["data", "podprobe-api-access", "podprobe-podinfo"]);

        let mut c = config();
        c.native_sidecar = NativeSidecar::Always;
        let out = applied(&p, &inject_ops(&p, &c, &ctx)).spec.unwrap();
        let inits: Vec<String> = out
            .init_containers
            .unwrap()
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(inits, ["init", "podprobe"]);
    }

    #[test]
    fn readiness_gates_only_for_chosen_conditions_the_pod_probes() {
        let types = vec!["game.io/healthy".to_string(), "game.io/idle".to_string()];
        let ctx = InjectContext {
            probe_condition_types: &types,
            ..Default::default()
        };
        let mut c = config();
        c.readiness_gates = vec!["game.io/healthy".into(), "game.io/absent".into()];
        let mut p = pod(ENABLED);
        let out = applied(&p, &inject_ops(&p, &c, &ctx)).spec.unwrap();
        let gates: Vec<String> = out
            .readiness_gates
            .unwrap()
            .into_iter()
            .map(|g| g.condition_type)
            .collect();
        assert_eq!(gates, ["game.io/healthy"]);

        c.readiness_gates = vec!["*".into()];
        p.spec.as_mut().unwrap().readiness_gates = Some(vec![PodReadinessGate {
            condition_type: "game.io/idle".into(),
        }]);
        let out = applied(&p, &inject_ops(&p, &c, &ctx)).spec.unwrap();
        let gates: Vec<String> = out
            .readiness_gates
            .unwrap()
            .into_iter()
            .map(|g| g.condition_type)
            .collect();
        assert_eq!(gates, ["game.io/idle", "game.io/healthy"]);
    }

    #[test]
    fn already_injected_pod_is_left_alone_and_process_namespace_is_shared_on_request() {
        let mut c = config();
        c.share_process_namespace = true;
        let ctx = InjectContext::default();
        let p = pod(ENABLED);
        let ops = inject_ops(&p, &c, &ctx);
        assert!(ops.contains(&PatchOp::Add {
            path: "/spec/shareProcessNamespace".into(),
            value: Value::Bool(true)
        }));
        let injected = applied(&p, &ops);
        assert!(inject_ops(&injected, &c, &ctx).is_empty());
    }

    fn with_command(mut p: Pod, command: Option<&[&str]>) -> Pod {
        let main = &mut p.spec.as_mut().unwrap().containers[0];
        main.command = command.map(|c| c.iter().map(|s| s.to_string()).collect());
        main.args = Some(vec!["7777".into()]);
        p
    }

    fn find<'a>(containers: &'a [Container], name: &str) -> &'a Container {
        containers.iter().find(|c| c.name == name).unwrap()
    }

    #[test]
    fn a_container_with_its_own_termination_message_path_has_the_agent_write_there() {
        let exec = vec!["main".to_string()];
        let ctx = InjectContext {
            native_sidecars_supported: true,
            exec_probe_containers: &exec,
            ..Default::default()
        };
        let mut p = with_command(pod(ENABLED), Some(&["/server"]));
        p.spec.as_mut().unwrap().containers[0].termination_message_path = Some("/why".into());
        let spec = applied(&p, &inject_ops(&p, &config(), &ctx)).spec.unwrap();
        let command = spec.containers[0].command.clone().unwrap();
        assert_eq!(
            command[2..],
            [
                "--socket",
                "/podprobe-agent-socket/agent.sock",
                "--termination-log",
                "/why",
                "--",
                "/server"
            ]
        );
    }

    #[test]
    fn the_container_exec_probes_target_runs_its_command_under_the_agent() {
        let exec = vec!["main".to_string()];
        let ctx = InjectContext {
            native_sidecars_supported: true,
            exec_probe_containers: &exec,
            ..Default::default()
        };
        let p = with_command(pod(ENABLED), Some(&["/server", "--port"]));
        let spec = applied(&p, &inject_ops(&p, &config(), &ctx)).spec.unwrap();
        let main = &spec.containers[0];
        assert_eq!(
            main.command.as_deref().unwrap(),
            [
                agent::AGENT_BINARY,
                "agent",
                "--socket",
                "/podprobe-agent-socket/agent.sock",
                "--",
                "/server",
                "--port"
            ]
        );
        assert_eq!(main.args.as_deref().unwrap(), ["7777"]);
        // Each agent mount of a container: (volume, path, read-only).
        let mounted = |c: &Container| -> Vec<(String, String, bool)> {
            let mounts = c.volume_mounts.iter().flatten();
            let mounts = mounts.filter(|m| m.name.starts_with(agent::AGENT_VOLUME));
            let seen = |m: &VolumeMount| {
                let read_only = m.read_only.unwrap_or(false);
                (m.name.clone(), m.mount_path.clone(), read_only)
            };
            mounts.map(seen).collect()
        };
        let binary = || (agent::AGENT_VOLUME.to_owned(), agent::AGENT_DIR.to_owned());
        let socket = "podprobe-agent-socket-0".to_owned();
        assert_eq!(
            mounted(main),
            [
                (binary().0, binary().1, true),
                (socket.clone(), agent::SOCKET_DIR.into(), false)
            ]
        );
        let inits = spec.init_containers.unwrap();
        let names: Vec<_> = inits.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, [agent::INSTALL_CONTAINER, "podprobe"]);
        let install = &inits[0];
        assert_eq!(
            install.command.as_deref().unwrap(),
            [
                crate::config::DEFAULT_COMMAND,
                "install-agent",
                agent::AGENT_BINARY
            ]
        );
        assert_eq!(install.security_context, Some(config().security_context));
        assert_eq!(install.restart_policy, None);
        assert_eq!(mounted(install), [(binary().0, binary().1, false)]);
        assert!(install.resources.is_some());
        // The sidecar reaches the socket alone, not the binary.
        let sidecar = &inits[1];
        let in_sidecar = (socket.clone(), "/podprobe-agent/main".to_owned(), true);
        assert_eq!(mounted(sidecar), [in_sidecar]);
        assert!(env_of(sidecar).contains(&(agent::AGENTS_ENV, "main")));
        let volumes = spec.volumes.unwrap();
        for name in [agent::AGENT_VOLUME, &socket] {
            let volume = volumes.iter().find(|v| v.name == name).unwrap();
            assert!(volume.empty_dir.is_some());
        }
    }

    #[test]
    fn no_agent_without_an_exec_probe_or_when_disabled_or_opted_out() {
        let exec = vec!["main".to_string()];
        let none: Vec<String> = vec![];
        let ctx = |exec_probe_containers| InjectContext {
            exec_probe_containers,
            ..Default::default()
        };
        let mut disabled = config();
        disabled.exec_agent = crate::config::ExecAgentChoice::Disabled;
        let with = with_command(pod(ENABLED), Some(&["/server"]));
        let without = with_command(pod(ENABLED), None);
        let mut taken = with.clone();
        taken.spec.as_mut().unwrap().volumes = Some(vec![Volume {
            name: "podprobe-agent".into(),
            ..Default::default()
        }]);
        let mut opted_out = with.clone();
        opted_out.metadata.annotations = Some(
            [(agent::OPT_OUT_ANNOTATION.to_owned(), "disabled".to_owned())]
                .into_iter()
                .collect(),
        );
        for (p, c, ctx) in [
            (&without, disabled.clone(), ctx(&exec)),
            (&with, config(), ctx(&none)),
            (&with, disabled, ctx(&exec)),
            (&taken, config(), ctx(&exec)),
            (&opted_out, config(), ctx(&exec)),
        ] {
            let spec = applied(p, &inject_ops(p, &c, &ctx)).spec.unwrap();
            let main = &spec.containers[0];
            assert_eq!(main.command, p.spec.as_ref().unwrap().containers[0].command);
            assert!(main.volume_mounts.is_none());
            let sidecar = find(&spec.containers, "podprobe");
            assert!(!env_of(sidecar).iter().any(|(n, _)| *n == agent::AGENTS_ENV));
            let volumes = spec.volumes.iter().flatten();
            let theirs = p.spec.as_ref().unwrap().volumes.iter().flatten().count();
            let agents = volumes.filter(|v| v.name.starts_with(agent::AGENT_VOLUME));
            assert_eq!(agents.count(), theirs);
        }
    }

    /// A container that runs its image's entrypoint: its postStart hook starts the agent beside
    /// it, on kubelet nodes; not on a virtual node, nor beside a postStart hook of its own.
    #[test]
    fn without_a_command_the_agent_starts_beside_the_entrypoint_on_kubelet_nodes_only() {
        let exec = vec!["main".to_string()];
        let ctx = InjectContext {
            exec_probe_containers: &exec,
            ..Default::default()
        };
        let without = with_command(pod(ENABLED), None);
        let beside = [
            agent::AGENT_BINARY,
            "agent",
            "--socket",
            "/podprobe-agent-socket/agent.sock",
            "--detach",
        ];
        let hook_of = |c: &Container| {
            let hook = c.lifecycle.as_ref()?.post_start.as_ref()?;
            hook.exec.as_ref()?.command.clone()
        };
        let spec = applied(&without, &inject_ops(&without, &config(), &ctx));
        let main = &spec.spec.as_ref().unwrap().containers[0];
        assert_eq!(main.command, None);
        assert_eq!(
            hook_of(main).as_deref(),
            Some(&beside.map(String::from)[..])
        );
        let mounts: Vec<_> = main
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| &m.mount_path)
            .collect();
        assert_eq!(mounts, [agent::AGENT_DIR, agent::SOCKET_DIR]);
        let sidecar = find(&spec.spec.as_ref().unwrap().containers, "podprobe");
        assert!(env_of(sidecar).contains(&(agent::AGENTS_ENV, "main")));
        // Admitted again (a webhook reinvocation): nothing more.
        assert!(agent::plan(&spec, &config(), &exec, false).ops.is_empty());

        // A preStop hook stays; the postStart hook is added beside it.
        let mut stopping = without.clone();
        stopping.spec.as_mut().unwrap().containers[0].lifecycle = Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(vec!["/drain".into()]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        let spec = applied(&stopping, &inject_ops(&stopping, &config(), &ctx))
            .spec
            .unwrap();
        let lifecycle = spec.containers[0].lifecycle.as_ref().unwrap();
        assert!(lifecycle.pre_stop.is_some());
        assert_eq!(
            hook_of(&spec.containers[0]).as_deref(),
            Some(&beside.map(String::from)[..])
        );

        // Its own postStart hook, or a virtual node: left, and why.
        let mut own_hook = stopping.clone();
        let lifecycle = own_hook.spec.as_mut().unwrap().containers[0]
            .lifecycle
            .as_mut()
            .unwrap();
        lifecycle.post_start = lifecycle.pre_stop.take();
        let mut on_virtual = without.clone();
        on_virtual.spec.as_mut().unwrap().node_selector =
            Some(labels(&[("type", "virtual-kubelet")]));
        for (p, why) in [
            (&own_hook, "postStart hook of its own"),
            (&on_virtual, "virtual node"),
        ] {
            let spec = applied(p, &inject_ops(p, &config(), &ctx)).spec.unwrap();
            assert_eq!(
                spec.containers[0].lifecycle,
                p.spec.as_ref().unwrap().containers[0].lifecycle
            );
            assert!(spec.containers[0].volume_mounts.is_none());
            let virtual_node = std::ptr::eq(p, &on_virtual);
            let plan = agent::plan(p, &config(), &exec, virtual_node);
            assert!(
                matches!(&plan.decisions[..], [agent::Decision::Left { why: w, .. }] if w.contains(why)),
                "{:?}",
                plan.decisions
            );
        }
    }

    #[test]
    fn on_a_virtual_node_auto_wraps_unless_kubelet_nodes_only_and_the_install_container_has_no_resources()
     {
        let exec = vec!["main".to_string()];
        let ctx = InjectContext {
            exec_probe_containers: &exec,
            ..Default::default()
        };
        let mut p = with_command(pod(ENABLED), Some(&["/server"]));
        p.spec.as_mut().unwrap().node_selector = Some(labels(&[("type", "virtual-kubelet")]));
        let mut kubelet_nodes = config();
        kubelet_nodes.exec_agent = crate::config::ExecAgentChoice::KubeletNodes;
        let spec = applied(&p, &inject_ops(&p, &kubelet_nodes, &ctx))
            .spec
            .unwrap();
        assert_eq!(spec.containers[0].command.as_deref().unwrap(), ["/server"]);
        assert!(spec.init_containers.is_none());
        let mut always = config();
        always.exec_agent = crate::config::ExecAgentChoice::Always;
        for config in [config(), always] {
            let spec = applied(&p, &inject_ops(&p, &config, &ctx)).spec.unwrap();
            let install = find(
                spec.init_containers.as_deref().unwrap(),
                agent::INSTALL_CONTAINER,
            );
            assert_eq!(install.resources, None);
            assert_eq!(install.ports, None);
            assert_eq!(
                spec.containers[0].command.as_deref().unwrap()[0],
                agent::AGENT_BINARY
            );
            let sidecar = find(&spec.containers, "podprobe");
            assert!(env_of(sidecar).contains(&(agent::AGENTS_ENV, "main")));
        }
    }

    #[test]
    fn a_virtual_node_pod_whose_exec_probes_take_pods_exec_is_warned_a_kubelet_pod_is_not() {
        let exec = vec!["main".to_string()];
        let ctx = InjectContext {
            exec_probe_containers: &exec,
            ..Default::default()
        };
        let on_virtual = |command: Option<&[&str]>| {
            let mut p = with_command(pod(ENABLED), command);
            p.spec.as_mut().unwrap().node_selector = Some(labels(&[("type", "virtual-kubelet")]));
            p
        };
        let warned = inject(&on_virtual(None), &config(), &ctx).warnings;
        assert!(
            matches!(&warned[..], [w] if w.contains("\"main\"") && w.contains("pods/exec")
                && w.contains("no command in the pod spec")),
            "{warned:?}"
        );
        // Wrapped by the agent, or on a kubelet node (beside the entrypoint): no warning.
        let wrapped = inject(&on_virtual(Some(&["/server"])), &config(), &ctx);
        assert!(wrapped.warnings.is_empty(), "{:?}", wrapped.warnings);
        let kubelet = inject(&with_command(pod(ENABLED), None), &config(), &ctx);
        assert!(kubelet.warnings.is_empty(), "{:?}", kubelet.warnings);
    }

    /// What kube-apiserver's ServiceAccount plugin adds before the webhook.
    fn with_generated_token(mut p: Pod, automount: Option<bool>) -> Pod {
        let spec = p.spec.as_mut().unwrap();
        spec.automount_service_account_token = automount;
        let generated = serde_json::json!({"name": "kube-api-access-x7k2p", "projected": {
            "sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}});
        let own = serde_json::json!({"name": "own-token", "secret": {"secretName": "s"}});
        spec.volumes = Some(vec![
            serde_json::from_value(own).unwrap(),
            serde_json::from_value(generated).unwrap(),
        ]);
        let mount = |name: &str, path: &str| VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            read_only: Some(true),
            ..Default::default()
        };
        spec.containers[0].volume_mounts = Some(vec![
            mount("own-token", "/etc/own"),
            mount("kube-api-access-x7k2p", token::TOKEN_MOUNT_PATH),
        ]);
        spec.init_containers = Some(vec![Container {
            name: "init".into(),
            volume_mounts: Some(vec![mount(
                "kube-api-access-x7k2p",
                token::TOKEN_MOUNT_PATH,
            )]),
            ..Default::default()
        }]);
        p
    }

    fn mounts(c: &Container) -> Vec<(&str, &str)> {
        let mounts = c.volume_mounts.iter().flatten();
        mounts
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect()
    }

    #[test]
    fn the_token_is_mounted_in_the_sidecar_only() {
        let ctx = InjectContext {
            native_sidecars_supported: true,
            ..Default::default()
        };
        for automount in [None, Some(false)] {
            let p = with_generated_token(pod(ENABLED), automount);
            let spec = applied(&p, &inject_ops(&p, &config(), &ctx)).spec.unwrap();
            assert_eq!(spec.automount_service_account_token, Some(false));
            assert_eq!(mounts(&spec.containers[0]), [("own-token", "/etc/own")]);
            let inits = spec.init_containers.unwrap();
            assert_eq!(mounts(&inits[0]), []);
            assert_eq!(
                mounts(&inits[1]),
                [
                    ("podprobe-podinfo", "/etc/podinfo"),
                    (token::TOKEN_VOLUME, token::TOKEN_MOUNT_PATH)
                ]
            );
            let volumes: Vec<_> = spec.volumes.unwrap().into_iter().map(|v| v.name).collect();
            assert_eq!(
                volumes,
                ["own-token", token::TOKEN_VOLUME, "podprobe-podinfo"]
            );
        }
    }

    #[test]
    fn a_pod_that_asks_for_the_token_everywhere_keeps_it() {
        let ctx = InjectContext::default();
        let p = with_generated_token(pod(ENABLED), Some(true));
        let spec = applied(&p, &inject_ops(&p, &config(), &ctx)).spec.unwrap();
        assert_eq!(spec.automount_service_account_token, Some(true));
        assert_eq!(
            mounts(&spec.containers[0])[1],
            ("kube-api-access-x7k2p", token::TOKEN_MOUNT_PATH)
        );
        let volumes: Vec<_> = spec.volumes.unwrap().into_iter().map(|v| v.name).collect();
        assert_eq!(
            volumes,
            ["own-token", "kube-api-access-x7k2p", "podprobe-podinfo"]
        );
    }
}
