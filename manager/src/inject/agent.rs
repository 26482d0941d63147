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
//! - each container with a command has it wrapped: its `command` becomes
//!   `[/podprobe-agent/podprobe, agent, --socket, /podprobe-agent-socket/agent.sock, --,
//!   <command>...]` (with `--termination-log <path>` before `--` for a container that sets
//!   its own `terminationMessagePath`); its `args` are appended after it by the runtime;
//! - the sidecar gets `PODPROBE_EXEC_AGENTS=<names>`.
//!
//! A container without a `command` in the pod spec runs its image's entrypoint, which admission
//! cannot see without reading the image's config from its registry: there is nothing to wrap.
//! Its `postStart` hook starts the agent beside that entrypoint instead (`podprobe agent
//! --socket … --detach`, as openkruise/agents starts its in-container daemon), with the same
//! volumes and mounts: the container's PID 1 stays its own. Not where the pod may run on a
//! virtual node (azure-aci refuses a container with a lifecycle hook; providers run none), nor
//! in a container with a `postStart` hook of its own: those keep the sidecar's other exec
//! modes, and `render` and `kubectl podprobe explain` say so.
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
use serde_json::{Value, json};

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
/// Where the agent in a container serves (in its [`SOCKET_DIR`]).
const AGENT_SOCKET: &str = "/podprobe-agent-socket/agent.sock";
/// The sidecar's list of containers with an agent.
pub const AGENTS_ENV: &str = "PODPROBE_EXEC_AGENTS";

/// What happens to one container that exec probes target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Its command runs under the agent.
    Wrapped { container: String },
    /// It runs its image's entrypoint; its `postStart` hook starts the agent beside it.
    Beside { container: String },
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
            Decision::Beside { container } => format!(
                "exec probes on container {container:?} run through podprobe's exec agent in it, started beside its image's entrypoint by its postStart hook ({AGENT_BINARY} agent --detach; no apiserver request per attempt)"
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
    let pod_facts = PodFacts {
        virtual_node,
        opted_out,
        taken: taken.as_deref(),
    };
    for name in targets {
        let containers = spec.containers.iter().enumerate();
        let Some((index, container)) = containers.into_iter().find(|(_, c)| c.name == name) else {
            continue;
        };
        let Some(decision) = decide(container, config, &pod_facts) else {
            continue;
        };
        match &decision {
            Decision::Left { .. } => {}
            Decision::Beside { .. } => start_beside(&mut plan.ops, index, container),
            Decision::Wrapped { .. } => {
                let command = container.command.as_deref().unwrap_or_default();
                wrap(&mut plan.ops, index, command, container);
            }
        }
        if !matches!(decision, Decision::Left { .. }) {
            wrapped.push((index, name.to_owned()));
        }
        plan.decisions.push(decision);
    }
    if !wrapped.is_empty() {
        plan.parts = Some(parts(config, &wrapped, virtual_node));
    }
    plan
}

/// What [`decide`] needs to know of the pod beyond the container.
struct PodFacts<'a> {
    /// The pod may run on a virtual node.
    virtual_node: bool,
    /// The pod's [`OPT_OUT_ANNOTATION`] is `disabled`.
    opted_out: bool,
    /// A volume of the pod the agent's volumes would clash with.
    taken: Option<&'a str>,
}

/// Where the agent goes in `container`, which exec probes target; `None`: it runs the agent
/// already (wrapped, or started beside its entrypoint).
fn decide(container: &Container, config: &InjectionConfig, pod: &PodFacts<'_>) -> Option<Decision> {
    let name = &container.name;
    let left = |why: String| {
        Some(Decision::Left {
            container: name.clone(),
            why,
        })
    };
    let command = container.command.as_deref().unwrap_or_default();
    match (config.exec_agent, pod.virtual_node) {
        _ if command.first().map(String::as_str) == Some(AGENT_BINARY) => None,
        _ if starts_agent_beside(container) => None,
        (ExecAgentChoice::Disabled, _) => {
            left("execAgent is disabled in the injection config".into())
        }
        _ if pod.opted_out => left(format!(
            "the pod's annotation {OPT_OUT_ANNOTATION} is \"disabled\": its commands stay as they are"
        )),
        (ExecAgentChoice::KubeletNodes, true) => left(
            "the pod may run on a virtual node, and execAgent is kubeletNodes (for a provider that runs no init containers): its exec probes go through pods/exec".into(),
        ),
        (_, true) if command.is_empty() => left(
            "the container has no command in the pod spec, so the agent would start beside its image's entrypoint from a postStart hook, and the pod may run on a virtual node, whose providers run no such hook (azure-aci refuses the pod); give it its command (the image's ENTRYPOINT and CMD) to run exec probes through the agent".into(),
        ),
        _ if command.is_empty() && has_post_start(container) => left(
            "the container has no command in the pod spec and has a postStart hook of its own, beside which the agent cannot start; give it its command (the image's ENTRYPOINT and CMD) to run exec probes through the agent".into(),
        ),
        _ if let Some(volume) = pod.taken => {
            left(format!("the pod already has a volume named {volume:?}"))
        }
        _ if mounts_at(container, AGENT_DIR) || mounts_at(container, SOCKET_DIR) => left(format!(
            "the container already mounts something at {AGENT_DIR} or {SOCKET_DIR}"
        )),
        _ if command.is_empty() => Some(Decision::Beside {
            container: name.clone(),
        }),
        _ => Some(Decision::Wrapped {
            container: name.clone(),
        }),
    }
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
    let mut wrapped: Vec<String> = [AGENT_BINARY, "agent", "--socket", AGENT_SOCKET]
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
    mount_agent(ops, index, c);
}

/// The ops starting the agent beside container `index`'s own process: its `postStart` hook.
fn start_beside(ops: &mut Vec<PatchOp>, index: usize, c: &Container) {
    let base = format!("/spec/containers/{index}");
    let hook = json!({"exec": {"command": beside_command()}});
    ops.push(match &c.lifecycle {
        Some(_) => PatchOp::Add {
            path: format!("{base}/lifecycle/postStart"),
            value: hook,
        },
        None => PatchOp::Add {
            path: format!("{base}/lifecycle"),
            value: json!({ "postStart": hook }),
        },
    });
    mount_agent(ops, index, c);
}

/// The `postStart` command that starts the agent beside a container's own process.
fn beside_command() -> [String; 5] {
    [AGENT_BINARY, "agent", "--socket", AGENT_SOCKET, "--detach"].map(String::from)
}

/// Whether `c` starts the agent beside its process already (a pod admitted twice).
fn starts_agent_beside(c: &Container) -> bool {
    let hook = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref());
    let command = hook
        .and_then(|h| h.exec.as_ref())
        .and_then(|e| e.command.as_ref());
    command.is_some_and(|c| c[..] == beside_command())
}

fn has_post_start(c: &Container) -> bool {
    c.lifecycle.as_ref().is_some_and(|l| l.post_start.is_some())
}

/// The ops mounting the agent's binary and container `index`'s socket directory in it.
fn mount_agent(ops: &mut Vec<PatchOp>, index: usize, c: &Container) {
    let base = format!("/spec/containers/{index}");
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
