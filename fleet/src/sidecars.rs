//! The fleet's sidecars: the real sidecar code (`podprobe::sidecar`, what `podprobe run`
//! runs), one instance per pod, hosted by `podprobe-fleet-sidecars` processes.
//!
//! One instance per process is what a cluster runs. Beyond a few hundred pods this machine's
//! memory and scheduler would be spent on process overhead, so a process then hosts several
//! instances. The apiserver cannot tell: every instance builds its own clients from its own
//! pod's kubeconfig (its own pod-bound token) as `podprobe run` does (`podprobe::apiserver`),
//! so it has its own connection, TLS session, watch on its own pod, and writer; nothing
//! between instances is shared but the process' runtime and allocator. What does change is the per-pod memory figure (the runtime and allocator are
//! shared; bench_sidecar measures one sidecar per process) and CPU scheduling.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use podprobe::events::EventBudget;
use podprobe::pod::{PodIdentity, SourceKind};
use podprobe::probe::{AgentExec, ExecMode};
use podprobe::runner::TimingDefaults;
use podprobe::sidecar::{RepairPolicy, SidecarOptions};

use crate::FleetError;
use crate::children::Children;
use crate::pods::FleetPod;
use crate::report::Source;

/// What one host process runs: its instances' pods, the source they read and their Events'
/// burst (`--event-burst`; the refill is the command line's default).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct HostSpec {
    pub source: Source,
    pub event_burst: NonZeroU32,
    #[serde(default)]
    pub overwrite_repair: RepairPolicy,
    pub pods: Vec<FleetPod>,
}

/// `podprobe run`'s options for one pod, with the command line's defaults but the source and
/// the Events' burst. Exec probes run through the pod's exec agent where injection wrapped its
/// container (what the injected sidecar's `PODPROBE_EXEC_AGENTS` says, `auto` mode), else in
/// the host's own process tree (`local`): there is no container to enter.
pub fn options(
    pod: &FleetPod,
    source: Source,
    event_burst: NonZeroU32,
    overwrite_repair: RepairPolicy,
) -> SidecarOptions {
    SidecarOptions {
        identity: PodIdentity {
            name: pod.name.clone(),
            namespace: crate::cluster::NS.to_owned(),
            uid: Some(pod.uid.clone()),
        },
        pod_ip: Some(pod.ip.clone()),
        source: match source {
            Source::Api => SourceKind::Api,
            Source::File => SourceKind::File,
        },
        annotations_file: pod.annotations_file.clone(),
        file_poll: Duration::from_secs(10),
        timing_defaults: TimingDefaults::Kruise,
        user_agent: podprobe::probe::http::DEFAULT_USER_AGENT.to_owned(),
        refresh_interval: Duration::from_secs(600),
        coalesce: Duration::from_millis(200),
        prune_conditions: false,
        events: Some(EventBudget {
            burst: event_burst,
            ..EventBudget::default()
        }),
        metrics_addr: None,
        // The fleet is standalone mode's: no kruise-daemon to leave pods to.
        only_on_virtual_nodes: false,
        node_name: None,
        renew_token_dir: None,
        exec_mode: match pod.agent_dir {
            Some(_) => ExecMode::Auto,
            None => ExecMode::Local,
        },
        exec_agent: match &pod.agent_dir {
            Some(dir) => AgentExec {
                dir: dir.clone(),
                containers: vec![crate::agents::CONTAINER.to_owned()],
            },
            None => AgentExec::default(),
        },
        overwrite_repair,
    }
}

/// The host processes; killed when dropped (and by the kernel if the bench dies).
#[derive(Debug)]
pub struct Hosts {
    children: Children,
}

impl Hosts {
    /// Starts `pods` in processes of `per_process` instances each: at `rate` sidecars a
    /// second at most (one host process at a time), as a fleet's pods start when their
    /// controllers and nodes pace them, or every process at once (`None`). Processes already
    /// started are killed when a later one cannot start.
    #[allow(clippy::too_many_arguments)] // what a host runs, and the pace
    pub async fn start(
        binary: &Path,
        work: &Path,
        pods: &[FleetPod],
        per_process: usize,
        source: Source,
        event_burst: NonZeroU32,
        overwrite_repair: RepairPolicy,
        rate: Option<NonZeroU32>,
    ) -> Result<Hosts, FleetError> {
        let per_process = per_process.max(1);
        let gap = rate.map(|r| Duration::from_secs_f64(per_process as f64 / f64::from(r.get())));
        let mut hosts = Hosts {
            children: Children::new("sidecar host"),
        };
        for (n, chunk) in pods.chunks(per_process).enumerate() {
            if let Some(gap) = gap.filter(|_| n > 0) {
                tokio::time::sleep(gap).await;
            }
            let spec = HostSpec {
                source,
                event_burst,
                overwrite_repair,
                pods: chunk.to_vec(),
            };
            let path = work.join(format!("host-{n}.json"));
            std::fs::write(&path, serde_json::to_vec(&spec)?)?;
            let log = work.join(format!("host-{n}.log"));
            hosts
                .children
                .spawn(binary, &[path.display().to_string()], log)?;
        }
        Ok(hosts)
    }

    pub fn pids(&self) -> Vec<u32> {
        self.children.pids()
    }

    /// Fails when a host process has exited (a sidecar never exits on its own).
    pub fn check_running(&mut self) -> Result<(), FleetError> {
        self.children.check_running()
    }
}

/// The host process' body: every instance of `spec`, each with its own client, until SIGTERM.
pub async fn host(spec: PathBuf) -> Result<(), FleetError> {
    let spec: HostSpec = serde_json::from_slice(&std::fs::read(&spec)?)?;
    let mut tasks = tokio::task::JoinSet::new();
    for pod in spec.pods {
        let kubeconfig = kube::config::Kubeconfig::read_from(&pod.kubeconfig)
            .map_err(|e| FleetError::Setup(format!("{}: {e}", pod.kubeconfig.display())))?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(|e| FleetError::Setup(format!("{}: {e}", pod.kubeconfig.display())))?;
        let options = options(&pod, spec.source, spec.event_burst, spec.overwrite_repair);
        tasks.spawn(async move {
            let name = options.identity.name.clone();
            let stop = async {
                podprobe_ops::entry::termination().await;
            };
            if let Err(e) = podprobe::sidecar::run_with_config(options, config, stop).await {
                tracing::error!(pod = name, "sidecar ended: {e}");
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}
