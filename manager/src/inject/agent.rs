//! The exec agent: where the pod allows it, the containers that exec probes target run their
//! own command under `podprobe agent`, which runs the sidecar's exec probes inside them (the
//! sidecar's `agent` exec mode: no apiserver request, no privilege, the container's own mount
//! namespace, cgroup, user, environment and working directory).
//!
//! What it changes in the pod:
//! - an `emptyDir` [`AGENT_VOLUME`] holding the static `podprobe` binary, which the init
//!   container [`INSTALL_CONTAINER`] copies there from the sidecar's image (`podprobe
//!   install-agent`) and is the only one to write: the wrapped containers mount it read-only at
//!   [`AGENT_DIR`];
//! - per wrapped container, an `emptyDir` `podprobe-agent-socket-<index>` for its agent's
//!   socket, mounted read-write in that container at [`SOCKET_DIR`] and read-only in the
//!   sidecar at `/podprobe-agent/<container>`: no container reaches another one's agent, and
//!   none can change the binary another runs;
//! - each wrapped container's `command` becomes
//!   `[/podprobe-agent/podprobe, agent, --socket, /podprobe-agent-socket/agent.sock, --,
//!   <command>...]` (with `--termination-log <path>` before `--` for a container that sets
//!   its own `terminationMessagePath`); its `args` are appended after it by the runtime;
//! - the sidecar gets `PODPROBE_EXEC_AGENTS=<names>`.
//!
//! A container without a `command` in the pod spec runs its image's entrypoint, which admission
//! cannot see without reading the image's config from its registry: it is not wrapped, and its
//! exec probes keep the sidecar's other modes (`render` and `kubectl podprobe explain` say so).
//!
//! On a virtual node the pod starts only if its provider runs init containers and shares
//! `emptyDir` volumes between containers: azure-aci's code does (its init containers must have
//! no resources, ports or probes, so this one has none there), and Alibaba ECI documents both.
//! It is also where the agent matters most: a provider's exec is an apiserver request and a
//! call to the provider's API per attempt, quota-bound on ECI, and on azure-aci it reports no
//! exit status, so an exec probe through it reads success whatever the command does. So
//! `execAgent: auto` wraps in pods for virtual nodes too; `kubeletNodes` leaves them to
//! pods/exec, for a provider that runs no init containers.
//!
//! The init container has the sidecar's security context (Pod Security "restricted").

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, Pod, PodSpec, Volume, VolumeMount,
};
use serde_json::Value;

use crate::config::{DEFAULT_COMMAND, ExecAgentChoice, InjectionConfig};
use crate::patch::PatchOp;

/// The volume of the agent's binary.
pub const AGENT_VOLUME: &str = "podprobe-agent";
/// Where wrapped containers (read-only) and the install container see the binary, and where
/// the sidecar sees the wrapped containers' socket directories.
pub const AGENT_DIR: &str = "/podprobe-agent";
/// Where a wrapped container sees its own socket directory.
pub const SOCKET_DIR: &str = "/podprobe-agent-socket";
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
    /// The init container, the volumes, the sidecar's mounts and env; `None` when nothing is
    /// wrapped.
    pub parts: Option<AgentParts>,
    pub decisions: Vec<Decision>,
}

#[derive(Debug)]
pub struct AgentParts {
    pub install: Container,
    pub volumes: Vec<Volume>,
    pub sidecar_mounts: Vec<VolumeMount>,
    pub sidecar_env: EnvVar,
}

/// The pod annotation by which a pod keeps its commands as they are (`disabled`), whatever
/// `execAgent` says: a game server whose operator wants nothing but its own process as PID 1.
pub const OPT_OUT_ANNOTATION: &str = "podprobe.io/exec-agent";

/// The agent's plan for `pod`, whose exec probes target `exec_containers`. `virtual_node`:
/// the pod may run on a virtual node.
pub fn plan(
    pod: &Pod,
    config: &InjectionConfig,
    exec_containers: &[String],
    virtual_node: bool,
) -> AgentPlan {
    let mut plan = AgentPlan::default();
    let Some(spec) = &pod.spec else {
        return plan;
    };
    let opted_out = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(OPT_OUT_ANNOTATION))
        .is_some_and(|v| v == "disabled");
    let mut targets: Vec<&str> = exec_containers.iter().map(String::as_str).collect();
    targets.sort_unstable();
    targets.dedup();
    let mut wrapped = Vec::new();
    let taken = taken_volume(spec);
    for name in targets {
        let Some((index, container)) = spec
            .containers
            .iter()
            .enumerate()
            .find(|(_, c)| c.name == name)
        else {
            continue;
        };
        let left = |why: String| Decision::Left {
            container: name.to_owned(),
            why,
        };
        let command = container.command.as_deref().unwrap_or_default();
        let decision = match (config.exec_agent, virtual_node) {
            _ if command.first().map(String::as_str) == Some(AGENT_BINARY) => continue,
            (ExecAgentChoice::Disabled, _) => {
                left("execAgent is disabled in the injection config".into())
            }
            _ if opted_out => left(format!(
                "the pod's annotation {OPT_OUT_ANNOTATION} is \"disabled\": its commands stay as they are"
            )),
            (ExecAgentChoice::KubeletNodes, true) => left(
                "the pod may run on a virtual node, and execAgent is kubeletNodes (for a provider that runs no init containers): its exec probes go through pods/exec".into(),
            ),
            _ if command.is_empty() => left(
                "the container has no command in the pod spec, so it runs its image's entrypoint, which admission cannot see; give it its command (the image's ENTRYPOINT and CMD) to run exec probes through the agent".into(),
            ),
            _ if let Some(volume) = &taken => {
                left(format!("the pod already has a volume named {volume:?}"))
            }
            _ if mounts_at(container, AGENT_DIR) || mounts_at(container, SOCKET_DIR) => {
                left(format!(
                    "the container already mounts something at {AGENT_DIR} or {SOCKET_DIR}"
                ))
            }
            _ => {
                wrap(&mut plan.ops, index, command, container);
                wrapped.push((index, name.to_owned()));
                Decision::Wrapped {
                    container: name.to_owned(),
                }
            }
        };
        plan.decisions.push(decision);
    }
    if !wrapped.is_empty() {
        plan.parts = Some(parts(config, &wrapped, virtual_node));
    }
    plan
}

/// The name of a volume of `spec` that the agent's volumes would clash with.
fn taken_volume(spec: &PodSpec) -> Option<String> {
    let volumes = spec.volumes.iter().flatten();
    volumes
        .map(|v| &v.name)
        .find(|n| n.starts_with(AGENT_VOLUME))
        .cloned()
}

fn mounts_at(container: &Container, path: &str) -> bool {
    let mounts = container.volume_mounts.iter().flatten();
    mounts
        .map(|m| m.mount_path.trim_end_matches('/'))
        .any(|p| p == path)
}

fn socket_volume(index: usize) -> String {
    format!("{AGENT_VOLUME}-socket-{index}")
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// The kubelet's `terminationMessagePath` when a container sets none, and the agent's default.
const DEFAULT_TERMINATION_LOG: &str = "/dev/termination-log";

/// The ops wrapping container `index` whose command is `command`.
fn wrap(ops: &mut Vec<PatchOp>, index: usize, command: &[String], c: &Container) {
    let socket = format!("{SOCKET_DIR}/agent.sock");
    let mut wrapped: Vec<String> = [AGENT_BINARY, "agent", "--socket", &socket]
        .map(String::from)
        .to_vec();
    // Where the agent explains a command that cannot start; the kubelet's default when unset.
    if let Some(path) = c
        .termination_message_path
        .as_ref()
        .filter(|p| *p != DEFAULT_TERMINATION_LOG)
    {
        wrapped.extend(["--termination-log".to_owned(), path.clone()]);
    }
    wrapped.push("--".to_owned());
    wrapped.extend(command.iter().cloned());
    let base = format!("/spec/containers/{index}");
    ops.push(PatchOp::Add {
        path: format!("{base}/command"),
        value: serde_json::to_value(wrapped).unwrap_or(Value::Null),
    });
    let mounts = [
        mount(AGENT_VOLUME, AGENT_DIR, true),
        mount(&socket_volume(index), SOCKET_DIR, false),
    ]
    .map(|m| serde_json::to_value(m).unwrap_or(Value::Null));
    if c.volume_mounts.is_some() {
        for m in mounts {
            ops.push(PatchOp::Add {
                path: format!("{base}/volumeMounts/-"),
                value: m,
            });
        }
    } else {
        ops.push(PatchOp::Add {
            path: format!("{base}/volumeMounts"),
            value: Value::Array(mounts.to_vec()),
        });
    }
}

fn parts(config: &InjectionConfig, wrapped: &[(usize, String)], virtual_node: bool) -> AgentParts {
    // The sidecar binary; an empty `command` leaves the image's entrypoint to the sidecar,
    // which is that binary too.
    let mut command = if config.command.is_empty() {
        vec![DEFAULT_COMMAND.to_owned()]
    } else {
        config.command.clone()
    };
    command.extend(["install-agent".to_owned(), AGENT_BINARY.to_owned()]);
    let install = Container {
        name: INSTALL_CONTAINER.into(),
        image: Some(config.image.clone()),
        image_pull_policy: config.image_pull_policy.clone(),
        command: Some(command),
        // The copy takes a few milliseconds: the sidecar's share is plenty.
        resources: (!virtual_node).then(|| config.resources.clone()),
        security_context: Some(config.security_context.clone()),
        volume_mounts: Some(vec![mount(AGENT_VOLUME, AGENT_DIR, false)]),
        ..Default::default()
    };
    let empty_dir = |name: String| Volume {
        name,
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    };
    let mut volumes = vec![empty_dir(AGENT_VOLUME.into())];
    volumes.extend(wrapped.iter().map(|(i, _)| empty_dir(socket_volume(*i))));
    let sidecar_mounts = wrapped
        .iter()
        .map(|(i, name)| mount(&socket_volume(*i), &format!("{AGENT_DIR}/{name}"), true))
        .collect();
    let names: Vec<&str> = wrapped.iter().map(|(_, n)| n.as_str()).collect();
    AgentParts {
        install,
        volumes,
        sidecar_mounts,
        sidecar_env: EnvVar {
            name: AGENTS_ENV.into(),
            value: Some(names.join(",")),
            value_from: None,
        },
    }
}
