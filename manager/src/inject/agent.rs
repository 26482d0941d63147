//! The exec agent: where the pod allows it, the containers that exec probes target run their
//! own command under `podprobe agent`, which runs the sidecar's exec probes inside them (the
//! sidecar's `agent` exec mode: no apiserver request, no privilege, the container's own mount
//! namespace, cgroup, user, environment and working directory).
//!
//! What it changes in the pod:
//! - an `emptyDir` volume, [`AGENT_VOLUME`], mounted at [`AGENT_DIR`] in the wrapped containers
//!   (read-write: the agent binds its socket there) and in the sidecar (read-only);
//! - an init container, [`INSTALL_CONTAINER`], that copies the static `podprobe` binary from the
//!   sidecar's image onto the volume (`podprobe install-agent`) and exits;
//! - each wrapped container's `command` becomes
//!   `[/podprobe-agent/podprobe, agent, --socket, /podprobe-agent/<name>.sock, --, <command>...]`;
//!   its `args` are appended after it by the runtime, as before;
//! - the sidecar gets `PODPROBE_EXEC_AGENTS=<names>`.
//!
//! A container without a `command` in the pod spec runs its image's entrypoint, which admission
//! cannot see without reading the image's config from its registry: it is not wrapped, and its
//! exec probes keep the sidecar's other modes (`render` and `kubectl podprobe explain` say so).
//!
//! The init container has the sidecar's security context (Pod Security "restricted") and, on
//! a virtual node, no resources: azure-aci refuses init containers with resources.

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, PodSpec, Volume, VolumeMount,
};
use serde_json::Value;

use crate::config::{ExecAgentChoice, InjectionConfig};
use crate::patch::PatchOp;

pub const AGENT_VOLUME: &str = "podprobe-agent";
pub const AGENT_DIR: &str = "/podprobe-agent";
pub const INSTALL_CONTAINER: &str = "podprobe-agent-install";
/// The agent binary on the volume.
pub const AGENT_BINARY: &str = "/podprobe-agent/podprobe";
/// The sidecar's list of containers with an agent.
pub const AGENTS_ENV: &str = "PODPROBE_EXEC_AGENTS";

/// What happens to one container that exec probes target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Its command runs under the agent.
    Wrapped { container: String },
    /// Not wrapped, and why; its exec probes use the sidecar's other modes.
    Left { container: String, why: String },
}

impl Decision {
    /// A line for `podprobe-manager render`.
    pub fn note(&self) -> String {
        match self {
            Decision::Wrapped { container } => format!(
                "exec probes on container {container:?} run through podprobe's exec agent in it (its command is wrapped by {AGENT_BINARY}; no apiserver request per attempt)"
            ),
            Decision::Left { container, why } => format!(
                "exec probes on container {container:?} go through the sidecar's other exec modes (pods/exec as installed): {why}"
            ),
        }
    }
}

/// The agent's part of the injection.
#[derive(Debug, Default)]
pub struct AgentPlan {
    /// Patch ops on the pod's containers (commands and mounts).
    pub ops: Vec<PatchOp>,
    /// The init container, the volume, the sidecar's mount and env; `None` when nothing is
    /// wrapped.
    pub parts: Option<AgentParts>,
    pub decisions: Vec<Decision>,
}

#[derive(Debug)]
pub struct AgentParts {
    pub install: Container,
    pub volume: Volume,
    pub sidecar_mount: VolumeMount,
    pub sidecar_env: EnvVar,
}

/// The agent's plan for `spec`, whose exec probes target `exec_containers`. `virtual_node`:
/// the pod may run on a virtual node (no resources on the init container).
pub fn plan(
    spec: &PodSpec,
    config: &InjectionConfig,
    exec_containers: &[String],
    virtual_node: bool,
) -> AgentPlan {
    let mut plan = AgentPlan::default();
    let mut targets: Vec<&str> = exec_containers.iter().map(String::as_str).collect();
    targets.sort_unstable();
    targets.dedup();
    let mut wrapped = Vec::new();
    for name in targets {
        let Some((index, container)) = spec
            .containers
            .iter()
            .enumerate()
            .find(|(_, c)| c.name == name)
        else {
            continue;
        };
        let left = |why: &str| Decision::Left {
            container: name.to_owned(),
            why: why.to_owned(),
        };
        let command = container.command.as_deref().unwrap_or_default();
        let decision = if config.exec_agent == ExecAgentChoice::Disabled {
            left("execAgent is disabled in the injection config")
        } else if command.is_empty() {
            left(
                "the container has no command in the pod spec, so it runs its image's entrypoint, which admission cannot see; give it its command (the image's ENTRYPOINT and CMD) to run exec probes through the agent",
            )
        } else if command.first().map(String::as_str) == Some(AGENT_BINARY) {
            continue;
        } else {
            wrap(&mut plan.ops, index, name, command, container);
            wrapped.push(name.to_owned());
            Decision::Wrapped {
                container: name.to_owned(),
            }
        };
        plan.decisions.push(decision);
    }
    if !wrapped.is_empty() {
        plan.parts = Some(parts(config, &wrapped, virtual_node));
    }
    plan
}

fn mount(read_only: bool) -> VolumeMount {
    VolumeMount {
        name: AGENT_VOLUME.into(),
        mount_path: AGENT_DIR.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// The ops wrapping container `index` (`name`) whose command is `command`.
fn wrap(ops: &mut Vec<PatchOp>, index: usize, name: &str, command: &[String], c: &Container) {
    let socket = format!("{AGENT_DIR}/{name}.sock");
    let mut wrapped: Vec<String> = [AGENT_BINARY, "agent", "--socket", &socket, "--"]
        .map(String::from)
        .to_vec();
    wrapped.extend(command.iter().cloned());
    let base = format!("/spec/containers/{index}");
    ops.push(PatchOp::Add {
        path: format!("{base}/command"),
        value: serde_json::to_value(wrapped).unwrap_or(Value::Null),
    });
    let mount = serde_json::to_value(mount(false)).unwrap_or(Value::Null);
    ops.push(if c.volume_mounts.is_some() {
        PatchOp::Add {
            path: format!("{base}/volumeMounts/-"),
            value: mount,
        }
    } else {
        PatchOp::Add {
            path: format!("{base}/volumeMounts"),
            value: Value::Array(vec![mount]),
        }
    });
}

fn parts(config: &InjectionConfig, wrapped: &[String], virtual_node: bool) -> AgentParts {
    let mut command = config.command.clone();
    command.extend(["install-agent".to_owned(), AGENT_BINARY.to_owned()]);
    let install = Container {
        name: INSTALL_CONTAINER.into(),
        image: Some(config.image.clone()),
        image_pull_policy: config.image_pull_policy.clone(),
        command: Some(command),
        // The copy takes a few milliseconds: the sidecar's share is plenty.
        resources: (!virtual_node).then(|| config.resources.clone()),
        security_context: Some(config.security_context.clone()),
        volume_mounts: Some(vec![mount(false)]),
        ..Default::default()
    };
    AgentParts {
        install,
        volume: Volume {
            name: AGENT_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
        sidecar_mount: mount(true),
        sidecar_env: EnvVar {
            name: AGENTS_ENV.into(),
            value: Some(wrapped.join(",")),
            value_from: None,
        },
    }
}
