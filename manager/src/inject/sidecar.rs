//! The sidecar container itself, and the downward-API volume it reads its probes from on
//! kubelet nodes: what injection adds, independent of where in the pod it goes.

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, DownwardAPIVolumeFile, DownwardAPIVolumeSource, EnvVar, EnvVarSource,
    ObjectFieldSelector, Volume, VolumeMount,
};

use super::shape::Shape;
use crate::config::InjectionConfig;

/// The sidecar's metrics port name, which the chart's PodMonitor scrapes.
pub const SIDECAR_METRICS_PORT_NAME: &str = "podprobe-metric";

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: path.into(),
            }),
            ..Default::default()
        }),
    }
}

fn value_env(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    }
}

/// What the sidecar is told in companion mode: its node, and to probe only on virtual nodes.
pub fn companion_env() -> [EnvVar; 2] {
    [
        field_env("NODE_NAME", "spec.nodeName"),
        value_env("PODPROBE_ONLY_ON_VIRTUAL_NODES", "true".into()),
    ]
}

/// The sidecar's environment in `shape`: who it is, where its probes come from.
fn env(config: &InjectionConfig, shape: Shape) -> Vec<EnvVar> {
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
    env
}

/// The sidecar container in `shape`, independent of where it goes; `native`: a restartable
/// init container.
pub fn sidecar_container(config: &InjectionConfig, shape: Shape, native: bool) -> Container {
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
        env: Some(env(config, shape)),
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

/// The downward-API volume holding the pod's annotations, which the sidecar reads its probes
/// from on kubelet nodes.
pub fn podinfo_volume(config: &InjectionConfig) -> Volume {
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
