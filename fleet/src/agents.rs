//! The fleet's exec agents (`--exec agent`): the pods as a kubelet node's pods whose game
//! container gives its command, so the chart's default injection wraps that command with
//! `podprobe agent`; then one real agent per pod, the shipped static `podprobe-agent` binary
//! the pod's install container copies, serving the sidecar's exec probes over its socket.
//!
//! An agent stands where the wrapped container would run: its command is `sleep infinity`
//! (the game server), its socket in the pod's own directory, where the sidecar instance of
//! that pod looks for it. The agents start, and their sockets exist, before any sidecar: a
//! container's main process starts before a sidecar's first probe reaches it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use testkit::real::cpu_group::CpuGroup;

use crate::FleetError;
use crate::children::Children;
use crate::pods::FleetPod;

/// Where the fleet's exec probes run.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ExecPath {
    /// In the sidecar's own process tree (`--exec-mode local`): the pods are a serverless
    /// provider's, on virtual-kubelet nodes, with no container to enter.
    #[default]
    Local,
    /// Through the exec agent injection wraps the game container with by default: the pods are
    /// a kubelet node's and give their command.
    Agent,
}

/// The game container's command in the fleet's pods with `--exec agent`.
pub const GAME_COMMAND: &str = "/usr/local/bin/game";
/// The container the fleet's probes target (the PodProbeMarker's `containerName`).
pub const CONTAINER: &str = "main";
/// The agents' cgroup's name, before the bench's pid.
const GROUP_PREFIX: &str = "podprobe-fleet-agents-";
/// What each agent runs in place of the game server: killed with its agent.
const GAME_SERVER: [&str; 6] = ["setpriv", "--pdeathsig", "KILL", "--", "sleep", "infinity"];
/// What injection makes the wrapped container's command start with.
const WRAPPED: [&str; 2] = ["/podprobe-agent/podprobe", "agent"];

/// Fails unless the webhook wrapped the game container with the exec agent and told the
/// sidecar so: what the chart's defaults do for a kubelet node's pod that gives its command.
pub fn check_wrapped(pod: &Pod) -> Result<(), FleetError> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let containers = pod.spec.as_ref().map(|s| &s.containers[..]).unwrap_or(&[]);
    let command = containers
        .iter()
        .find(|c| c.name == CONTAINER)
        .and_then(|c| c.command.clone())
        .unwrap_or_default();
    if !command.starts_with(&WRAPPED.map(str::to_owned)) {
        return Err(FleetError::Setup(format!(
            "{name}: the webhook did not wrap container {CONTAINER} with the exec agent; its \
             command is {command:?}"
        )));
    }
    // The sidecar is a native sidecar (an init container) where the pod's shape allows.
    let init = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[]);
    let told = containers
        .iter()
        .chain(init)
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == "PODPROBE_EXEC_AGENTS")
        .and_then(|e| e.value.as_deref());
    if told != Some(CONTAINER) {
        return Err(FleetError::Setup(format!(
            "{name}: the injected sidecar's PODPROBE_EXEC_AGENTS is {told:?}, not {CONTAINER:?}"
        )));
    }
    Ok(())
}

/// The running agents; killed when dropped (and by the kernel if the bench dies: each agent
/// and its command have `--pdeathsig`).
#[derive(Debug)]
pub struct Agents {
    // Field order is drop order: the agents are killed before their cgroup is removed (a
    // cgroup with processes cannot be).
    children: Children,
    /// Counts the agents' CPU and their commands'.
    cpu: Option<Arc<CpuGroup>>,
}

impl Agents {
    /// Starts an agent for every pod that has an agent directory, and returns once every
    /// socket exists.
    pub async fn start(
        binary: &Path,
        work: &Path,
        pods: &[FleetPod],
    ) -> Result<Agents, FleetError> {
        // A bench killed before its cleanup leaves its empty group behind.
        CpuGroup::remove_stale(GROUP_PREFIX);
        let cpu = CpuGroup::create(&format!("{GROUP_PREFIX}{}", std::process::id()))?;
        let mut agents = Agents::none();
        let mut sockets = Vec::new();
        for pod in pods {
            let Some(dir) = &pod.agent_dir else { continue };
            let socket = podprobe::probe::exec::agent::socket_path(dir, CONTAINER);
            let socket_dir = socket.parent().unwrap_or(dir);
            std::fs::create_dir_all(socket_dir)?;
            let log = work.join(&pod.name).join("agent.log");
            let mut args = vec!["agent".to_owned(), "--socket".to_owned()];
            args.push(socket.display().to_string());
            args.push("--".to_owned());
            args.extend(GAME_SERVER.map(str::to_owned));
            let pid = agents.children.spawn(binary, &args, log)?;
            // Before its socket exists, so before any probe: every probe command it runs
            // counts (its game server may have started outside the group; it sleeps).
            cpu.add(pid)?;
            sockets.push((socket, pid));
        }
        agents.wait_for(&sockets).await?;
        // Each agent serves from a probe server it starts as its child, which may have
        // started before the agent joined the group: every probe command is the server's.
        for pid in agents.children.pids() {
            let children = format!("/proc/{pid}/task/{pid}/children");
            let children = std::fs::read_to_string(children).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                cpu.add(child)?;
            }
        }
        agents.cpu = Some(Arc::new(cpu));
        Ok(agents)
    }

    /// No agents (`--exec local`).
    pub fn none() -> Agents {
        Agents {
            children: Children::new("exec agent"),
            cpu: None,
        }
    }

    /// Waits for each agent's socket: (socket, the agent's pid).
    async fn wait_for(&mut self, sockets: &[(PathBuf, u32)]) -> Result<(), FleetError> {
        let limit = Duration::from_secs(30) + Duration::from_millis(20 * sockets.len() as u64);
        let started = Instant::now();
        let mut missing = sockets.to_vec();
        loop {
            missing.retain(|(s, _)| !s.exists());
            if missing.is_empty() {
                return Ok(());
            }
            self.check_running()?;
            if started.elapsed() > limit {
                let (socket, pid) = &missing[0];
                return Err(FleetError::Setup(format!(
                    "{} agents had no socket after {limit:?}, e.g. {} (agent pid {pid}); its log ends:\n{}",
                    missing.len(),
                    socket.display(),
                    self.children.log_tail(*pid, 10)
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pids(&self) -> Vec<u32> {
        self.children.pids()
    }

    /// What counts the CPU of the agents and of every command they ran (none without agents).
    pub fn cpu(&self) -> Option<Arc<CpuGroup>> {
        self.cpu.clone()
    }

    /// Fails when an agent has exited: its command runs until it is killed.
    pub fn check_running(&mut self) -> Result<(), FleetError> {
        self.children.check_running()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(command: &[&str], agents: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "fleet-0"},
            "spec": {"containers": [
                {"name": "main", "command": command},
                {"name": "podprobe", "env": agents.map(|v| vec![
                    serde_json::json!({"name": "PODPROBE_EXEC_AGENTS", "value": v})])
                    .unwrap_or_default()},
            ]}
        }))
        .unwrap()
    }

    #[test]
    fn a_wrapped_pod_whose_sidecar_knows_passes() {
        let wrapped = pod(
            &[WRAPPED[0], WRAPPED[1], "--socket", "/s", "--", GAME_COMMAND],
            Some(CONTAINER),
        );
        check_wrapped(&wrapped).unwrap();
    }

    #[test]
    fn an_unwrapped_pod_or_an_uninformed_sidecar_fails() {
        let unwrapped = pod(&[GAME_COMMAND], Some(CONTAINER));
        let err = check_wrapped(&unwrapped).unwrap_err().to_string();
        assert!(err.contains("did not wrap"), "{err}");
        let uninformed = pod(&[WRAPPED[0], WRAPPED[1], "--", GAME_COMMAND], None);
        let err = check_wrapped(&uninformed).unwrap_err().to_string();
        assert!(err.contains("PODPROBE_EXEC_AGENTS is None"), "{err}");
    }
}
