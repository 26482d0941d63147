//! Sidecar injection: the JSON patch ops that add the podprobe sidecar to a pod at admission.
//!
//! [`inject`] reads top to bottom as the steps it takes, in the order their ops must apply:
//! whether the pod wants a sidecar, which shape its node needs ([`shape`]), the token moved to
//! the sidecar alone ([`token`]; its removals by index go first), the exec agent placed in the
//! probed containers ([`agent`]), the sidecar itself ([`sidecar`]) and its downward-API
//! volume, the readiness gates, and the gate that holds a virtual-node pod until its token is
//! issued ([`crate::sidecar_token`]).

pub mod agent;
pub mod placement;
mod pod_patch;
pub mod shape;
mod sidecar;
mod token;

pub use sidecar::{SIDECAR_METRICS_PORT_NAME, sidecar_container};

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodReadinessGate, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::config::InjectionConfig;
use crate::patch::PatchOp;
use crate::sidecar_token;
use pod_patch::{PodPatch, SpecArray};
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

/// The sidecar's injection into `pod` ([`inject_ops`]), with its warnings.
pub fn inject(pod: &Pod, config: &InjectionConfig, ctx: &InjectContext<'_>) -> Injected {
    let Some(spec) = wants_a_sidecar(pod, config, ctx) else {
        return Injected::default();
    };
    let shape = shape::of(spec, config, ctx.virtual_nodes);
    // Providers run init containers to completion before the others, and azure-aci refuses
    // them with resources: on a virtual node the sidecar is an ordinary container.
    let native =
        shape == Shape::Kubelet && config.native_sidecar.enabled(ctx.native_sidecars_supported);
    let mut sidecar = sidecar_container(config, shape, native);
    if ctx.companion {
        // The node is known only once the pod is bound: the sidecar reads it and stands
        // down where kruise-daemon probes (src/sidecar/executor.rs). One executor per pod.
        sidecar
            .env
            .get_or_insert_default()
            .extend(sidecar::companion_env());
    }
    let mut patch = PodPatch::of(spec);
    let issued = move_token(&mut patch, &mut sidecar, spec, shape, ctx);
    let mut warnings = place_agent(&mut patch, &mut sidecar, pod, config, ctx, shape);
    add_sidecar(&mut patch, sidecar, native);
    if shape == Shape::Kubelet {
        add_podinfo_volume(&mut patch, spec, config);
    }
    add_readiness_gates(&mut patch, spec, config, ctx.probe_condition_types);
    if config.share_process_namespace && spec.share_process_namespace != Some(true) {
        patch.add("/spec/shareProcessNamespace", Value::Bool(true));
    }
    if issued {
        patch.extend(sidecar_token::await_issue_ops(pod, ctx.issuer));
    } else if shape == Shape::VirtualNode {
        warnings.push(sidecar_token::KeptProjected::of(spec).warning());
        patch.extend(sidecar_token::kept_projected_ops(pod));
    }
    Injected {
        ops: patch.ops,
        warnings,
    }
}

/// The pod's spec, if it opted in and has no container of the sidecar's name yet.
fn wants_a_sidecar<'a>(
    pod: &'a Pod,
    config: &InjectionConfig,
    ctx: &InjectContext<'_>,
) -> Option<&'a PodSpec> {
    let spec = pod.spec.as_ref()?;
    let name = config.container_name.as_str();
    let mut containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let present = containers.any(|c| c.name == name);
    (opted_in(&pod.metadata, config, ctx.namespace_labels) && !present).then_some(spec)
}

/// The token moved to the sidecar alone; with a token to issue (a virtual-node pod not bound
/// yet), the Secret it will be in. Returns whether the pod waits for an issued token.
///
/// First of the steps: the token's ops remove by index, which appends after them do not
/// disturb. A pod bound at creation cannot be held by a scheduling gate (the apiserver refuses
/// gates beside spec.nodeName), and a write to it while its provider starts it can cost it its
/// first status (virtual-kubelet ≥ v1.13 then gets a conflict): it keeps the projected token.
fn move_token(
    patch: &mut PodPatch,
    sidecar: &mut Container,
    spec: &PodSpec,
    shape: Shape,
    ctx: &InjectContext<'_>,
) -> bool {
    let held = shape == Shape::VirtualNode && spec.node_name.is_none();
    let issued_secret = held.then(|| sidecar_token::secret_name(ctx.request_uid));
    let Some(token) = token::plan(spec, issued_secret.as_deref()) else {
        return false;
    };
    patch.extend(token.ops);
    let mounts = sidecar.volume_mounts.get_or_insert_default();
    mounts.push(token.sidecar_mount);
    patch.append(SpecArray::Volumes, &token.volume);
    if let Some(renewal) = token.renewal {
        mounts.push(renewal.sidecar_mount);
        sidecar
            .env
            .get_or_insert_default()
            .push(renewal.sidecar_env);
        patch.append(SpecArray::Volumes, &renewal.volume);
    }
    issued_secret.is_some()
}

/// The exec agent in the containers exec probes target: ops on the pod's own containers by
/// index (after the token's removals, before the sidecar is appended), its volumes and install
/// container, and what the sidecar needs to reach it. Returns the admission warnings.
fn place_agent(
    patch: &mut PodPatch,
    sidecar: &mut Container,
    pod: &Pod,
    config: &InjectionConfig,
    ctx: &InjectContext<'_>,
    shape: Shape,
) -> Vec<String> {
    let virtual_node = shape == Shape::VirtualNode;
    let agent = agent::plan(pod, config, ctx.exec_probe_containers, virtual_node);
    patch.extend(agent.ops);
    let mut warnings = Vec::new();
    if virtual_node {
        warnings.extend(agent.decisions.iter().filter_map(pods_exec_warning));
    }
    if let Some(parts) = agent.parts {
        sidecar.env.get_or_insert_default().push(parts.sidecar_env);
        let mounts = sidecar.volume_mounts.get_or_insert_default();
        mounts.extend(parts.sidecar_mounts);
        for volume in &parts.volumes {
            patch.append(SpecArray::Volumes, volume);
        }
        // Before a native sidecar: init containers start in order.
        patch.append(SpecArray::InitContainers, &parts.install);
    }
    warnings
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

/// The sidecar: a native sidecar appended to the init containers (so ordinary ones are not
/// delayed and it is up before the app containers start), or an ordinary container.
fn add_sidecar(patch: &mut PodPatch, sidecar: Container, native: bool) {
    if native {
        patch.append(SpecArray::InitContainers, &sidecar);
    } else {
        let value = serde_json::to_value(&sidecar).unwrap_or(Value::Null);
        patch.add("/spec/containers/-", value);
    }
}

/// The downward-API volume the sidecar reads its probes from, unless the pod has one of that
/// name.
fn add_podinfo_volume(patch: &mut PodPatch, spec: &PodSpec, config: &InjectionConfig) {
    let name = &config.podinfo_volume_name;
    if !spec.volumes.iter().flatten().any(|v| &v.name == name) {
        patch.append(SpecArray::Volumes, &sidecar::podinfo_volume(config));
    }
}

/// A readiness gate for each probe condition the configuration chooses (`"*"`: all) that the
/// pod does not gate on yet.
fn add_readiness_gates(
    patch: &mut PodPatch,
    spec: &PodSpec,
    config: &InjectionConfig,
    probe_condition_types: &[String],
) {
    let existing: Vec<&str> = spec
        .readiness_gates
        .iter()
        .flatten()
        .map(|g| g.condition_type.as_str())
        .collect();
    let all = config.readiness_gates.iter().any(|g| g == "*");
    for condition in probe_condition_types {
        let chosen = all || config.readiness_gates.contains(condition);
        if chosen && !existing.contains(&condition.as_str()) {
            let gate = PodReadinessGate {
                condition_type: condition.clone(),
            };
            patch.append(SpecArray::ReadinessGates, &gate);
        }
    }
}

#[cfg(test)]
mod tests;
