//! The `podprobe` command line: parse flags, build, run.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

mod args;
use args::{Exec, Output, Source, Timing};
use podprobe::check::{self, CheckOptions};
use podprobe::events::EventBudget;
use podprobe::exec_agent;
use podprobe::pod::PodIdentity;
use podprobe::probe::AgentExec;
use podprobe::sidecar::{self, RepairPolicy, SidecarOptions};
use podprobe_ops::entry::{self, LogFlags};

/// Runs OpenKruise PodProbeMarker probes (the kruise.io/podprobe annotation) from inside a pod
/// and writes their results as pod conditions.
#[derive(Debug, Parser)]
#[command(name = "podprobe", version, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    log: LogFlags,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run as the sidecar: read this pod's kruise.io/podprobe annotation, run its probes and
    /// write the results as pod conditions (strategic-merge patch of pods/status, guarded by the
    /// pod's uid). Uses the in-cluster service account, or KUBECONFIG.
    Run(Box<RunArgs>),

    /// Run a pod's probes on this machine and print the conditions the sidecar would write.
    ///
    /// FILE is a Pod manifest (YAML or JSON) carrying the kruise.io/podprobe annotation, or the
    /// bare annotation JSON array; `-` reads standard input. Invalid probes are reported and
    /// skipped, the others run. Exit codes: 0 all probes ended Succeeded, 1 otherwise, 2 bad
    /// input (unreadable file, invalid annotation, or any invalid probe).
    Check(CheckArgs),

    /// Watch real probes flip: start local target servers, run the example game-server pod's
    /// probes against them, and take targets down and back up. Needs no cluster.
    #[cfg(feature = "demo")]
    Demo {
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = Output::Text)]
        output: Output,
    },

    Agent(exec_agent::AgentArgs),

    /// Copy the exec agent to DEST (mode 0755): the injected init container runs this to put
    /// the agent on the volume the app containers share with the sidecar. The agent is
    /// `podprobe-agent` beside this binary, as the sidecar image has it (`podprobe agent`
    /// alone, a fraction of this binary's size and memory), or this binary where it has no
    /// such neighbour.
    InstallAgent {
        /// Where the copy goes, e.g. /podprobe-agent/podprobe.
        dest: PathBuf,
    },

    /// Print the version.
    Version,
}

/// Flags of `podprobe check`.
#[derive(Debug, clap::Args)]
struct CheckArgs {
    /// Pod manifest or annotation JSON (`-` for stdin).
    file: PathBuf,

    /// Attempt each probe until it publishes a state (thresholds apply), or until
    /// successThreshold + failureThreshold + 2 attempts passed without one (state Unknown,
    /// message = last error), then exit. Without it, run until Ctrl-C and print every
    /// transition.
    #[arg(long)]
    once: bool,

    /// Output format: `text`, or `json` (one object per transition, then the conditions).
    #[arg(long, short, value_enum, default_value_t = Output::Text)]
    output: Output,

    /// Address network probes (tcpSocket, httpGet, grpc) aim at.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,

    /// Defaults for unset timing fields: `kruise` (kruise-daemon minimums: 1 s period,
    /// 1 s delay, thresholds 1) or `kubernetes` (kubelet: 10 s period, threshold 3, ...).
    #[arg(long, value_enum, default_value_t = Timing::Kruise)]
    timing_defaults: Timing,

    /// User-Agent of HTTP probes (kubelet sends kube-probe/<major>.<minor>).
    #[arg(long, default_value = podprobe::probe::http::DEFAULT_USER_AGENT)]
    user_agent: String,

    /// Where exec probes run: `local` (this machine), `procfs` (chrooted into another
    /// process' root; see `podprobe run --help`) or `auto` (procfs, else local). `api` needs
    /// a pod and is unavailable here; `agent` asks /podprobe-agent/<container>/agent.sock.
    #[arg(long, value_enum, default_value_t = Exec::Local)]
    exec_mode: Exec,
}

impl From<CheckArgs> for CheckOptions {
    fn from(args: CheckArgs) -> Self {
        CheckOptions {
            file: args.file,
            once: args.once,
            output: args.output.into(),
            host: args.host,
            timing_defaults: args.timing_defaults.into(),
            user_agent: args.user_agent,
            exec_mode: args.exec_mode.into(),
        }
    }
}

impl From<RunArgs> for SidecarOptions {
    fn from(args: RunArgs) -> Self {
        SidecarOptions {
            identity: PodIdentity {
                name: args.pod_name,
                namespace: args.pod_namespace,
                uid: args.pod_uid.filter(|u| !u.is_empty()),
            },
            pod_ip: args.pod_ip.filter(|ip| !ip.is_empty()),
            source: args.source.into(),
            annotations_file: args.annotations_file,
            file_poll: args.file_poll_interval,
            timing_defaults: args.timing_defaults.into(),
            user_agent: args.user_agent,
            refresh_interval: args.refresh_interval,
            coalesce: args.coalesce_window,
            prune_conditions: args.prune_conditions,
            events: args.events.then_some(EventBudget {
                burst: args.event_burst,
                refill: args.event_refill,
            }),
            metrics_addr: args.metrics_addr,
            overwrite_repair: args.overwrite_repair.into(),
            only_on_virtual_nodes: args.only_on_virtual_nodes,
            node_name: args.node_name.filter(|n| !n.is_empty()),
            renew_token_dir: args.renew_token_dir,
            exec_mode: args.exec_mode.into(),
            exec_agent: AgentExec {
                dir: args.exec_agent_dir,
                containers: args
                    .exec_agents
                    .into_iter()
                    .filter(|c| !c.is_empty())
                    .collect(),
            },
        }
    }
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// This pod's name (downward API `metadata.name`).
    #[arg(long, env = "POD_NAME")]
    pod_name: String,

    /// This pod's namespace (downward API `metadata.namespace`).
    #[arg(long, env = "POD_NAMESPACE")]
    pod_namespace: String,

    /// This pod's uid (downward API `metadata.uid`); when unset, learnt from the apiserver.
    /// Conditions are written only to the pod with this uid.
    #[arg(long, env = "POD_UID")]
    pod_uid: Option<String>,

    /// This pod's IP (downward API `status.podIP`): where network probes aim. Falls back to the
    /// IP in the pod status, then 127.0.0.1.
    #[arg(long, env = "POD_IP")]
    pod_ip: Option<String>,

    /// Where the probes come from: `api` (a watch on this pod; also gives container statuses),
    /// `file` (the downward-API annotations file), or `auto` (api when the pod can be read, else
    /// file; a log line at start says which and why).
    #[arg(long, value_enum, default_value_t = Source::Auto, env = "PODPROBE_SOURCE")]
    source: Source,

    /// The downward-API annotations file (kubelet's key="value" format).
    #[arg(
        long,
        default_value = "/etc/podinfo/annotations",
        env = "PODPROBE_ANNOTATIONS_FILE"
    )]
    annotations_file: PathBuf,

    /// How often the annotations file is checked for changes inotify does not report (a file
    /// behind a symlink to another directory, a filesystem without events, a directory that
    /// appears late): its inode, size and times are compared, and it is read only when they
    /// changed. Changes inotify reports are read at once.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    file_poll_interval: Duration,

    /// Defaults for unset timing fields: `kruise` (kruise-daemon minimums) or `kubernetes`.
    #[arg(long, value_enum, default_value_t = Timing::Kruise)]
    timing_defaults: Timing,

    /// User-Agent of HTTP probes.
    #[arg(long, default_value = podprobe::probe::http::DEFAULT_USER_AGENT)]
    user_agent: String,

    /// Rewrite an unchanged condition's lastProbeTime this often (kruise-daemon: 10m); `0s` =
    /// never. Steady state otherwise writes nothing.
    #[arg(long, default_value = "600s", value_parser = humantime::parse_duration)]
    refresh_interval: Duration,

    /// Condition changes within this window go out in one patch.
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    coalesce_window: Duration,

    /// Delete the conditions of probes removed from the annotation (default: leave them).
    #[arg(long)]
    prune_conditions: bool,

    /// Emit Kubernetes Events (KruiseProbeSucceeded/Failed on transitions, PodProbeInvalid and
    /// PodProbeError warnings); `--events=false` turns them off.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    events: bool,

    /// Events of one type (Normal, Warning) this pod's sidecar may publish at once before
    /// `--event-refill` applies: client-go's spam filter, which the kubelet's and
    /// kruise-daemon's probe events go through (25).
    #[arg(long, default_value = "25")]
    event_burst: std::num::NonZeroU32,

    /// Once the burst is spent, one Event per type per this interval (client-go: 5m). A pod
    /// flipping all day then writes one Event every 5 minutes instead of one per transition.
    /// `0s`: no limit.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    event_refill: Duration,

    /// Serve /metrics (Prometheus), /healthz and /readyz on this address, e.g. 0.0.0.0:9102.
    /// Off by default.
    #[arg(long, env = "PODPROBE_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,

    /// Where exec probes run. `agent`: through podprobe's exec agent in the target container
    /// (`--exec-agents`). `procfs`: chrooted into the target container's main
    /// process (needs `shareProcessNamespace: true` and CAP_SYS_CHROOT; CAP_SYS_PTRACE, or the
    /// target's uid and every capability the target holds). `api`: pods/exec through the
    /// apiserver (RBAC `create pods/exec`). `local`: in the sidecar's container. `auto`: agent
    /// for the containers that have one, else procfs, else api, else local, per target
    /// container; the choice and the reason are logged.
    #[arg(long, value_enum, default_value_t = Exec::Auto, env = "PODPROBE_EXEC_MODE")]
    exec_mode: Exec,

    /// Containers of this pod that have podprobe's exec agent, wrapping their command or
    /// beside their entrypoint (comma-separated; the manager's injection sets it). `auto` runs their exec probes
    /// through the agent: in the container, as the kubelet would, without an apiserver request.
    #[arg(long, env = "PODPROBE_EXEC_AGENTS", value_delimiter = ',')]
    exec_agents: Vec<String>,

    /// Where the exec agents' sockets are (`<container>/agent.sock`): each a volume the
    /// sidecar shares with the container whose agent serves it.
    #[arg(long, env = "PODPROBE_EXEC_AGENT_DIR", default_value = podprobe::probe::exec::agent::DEFAULT_AGENT_DIR)]
    exec_agent_dir: PathBuf,

    /// How soon a condition another writer removed or changed (a virtual-kubelet provider
    /// replacing the pod's status) is written back. `after-change`: as `immediate` for 30 s
    /// after the probe's result changed, so the managers see every change, as `backoff`
    /// otherwise. `backoff`: the first overwrite at once, then 1 s, 2 s, 4 s … up to 1 m while
    /// overwrites keep coming within 30 s of a repair. `immediate`: every overwrite at once, at
    /// most one write per condition per second. docs/providers.md has what each costs and
    /// keeps under which provider.
    #[arg(long, value_enum, default_value_t = Repair::AfterChange, env = "PODPROBE_OVERWRITE_REPAIR")]
    overwrite_repair: Repair,

    /// Probe only when this pod's node is labelled type=virtual-kubelet, as OpenKruise
    /// classifies serverless pods; on any other node OpenKruise's kruise-daemon probes the pod,
    /// and the sidecar stands down: it logs why and probes and writes nothing until it stops.
    /// Reads the node once (`get nodes`); if it cannot, it probes. The manager's injection
    /// sets this in companion mode.
    #[arg(long, env = "PODPROBE_ONLY_ON_VIRTUAL_NODES")]
    only_on_virtual_nodes: bool,

    /// This pod's node (downward API `spec.nodeName`), for `--only-on-virtual-nodes`.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,

    /// Renew this pod's service-account token before it expires, as the kubelet renews a
    /// projected one: at 80 % of its lifetime or a day after it was issued, whichever comes
    /// first (up to 10 s earlier, at random), a TokenRequest of the same account bound to
    /// this pod (RBAC `create serviceaccounts/token`), written into this directory (a volume
    /// that outlives a restart of the container), where the client reads it. For a token
    /// nothing else refreshes: the one podprobe-manager issues for a virtual node, which the
    /// manager's injection sets this for. Unset: the token is used as mounted.
    #[arg(long, env = "PODPROBE_RENEW_TOKEN_DIR")]
    renew_token_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Repair {
    AfterChange,
    Backoff,
    Immediate,
}

impl From<Repair> for RepairPolicy {
    fn from(r: Repair) -> Self {
        match r {
            Repair::AfterChange => RepairPolicy::AfterChange,
            Repair::Backoff => RepairPolicy::Backoff,
            Repair::Immediate => RepairPolicy::Immediate,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cli.log.init();
    entry::on_one_thread("podprobe", async {
        match cli.command {
            Command::Check(args) => check::run(args.into()).await.unwrap_or_else(|e| {
                eprintln!("podprobe check: {e}");
                ExitCode::from(2)
            }),
            Command::Run(args) => {
                let stop = async {
                    entry::termination().await;
                };
                match sidecar::run((*args).into(), stop).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        tracing::error!("{e}");
                        ExitCode::FAILURE
                    }
                }
            }
            #[cfg(feature = "demo")]
            Command::Demo { output } => {
                podprobe::demo::run(output.into())
                    .await
                    .unwrap_or_else(|e| {
                        eprintln!("podprobe demo: {e}");
                        ExitCode::FAILURE
                    })
            }
            Command::Agent(args) => args.run().await,
            Command::InstallAgent { dest } => match exec_agent::install(&dest) {
                Ok(source) => {
                    eprintln!(
                        "podprobe install-agent: copied {} to {}",
                        source.display(),
                        dest.display()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("podprobe install-agent: {e}");
                    ExitCode::FAILURE
                }
            },
            Command::Version => {
                println!("podprobe {}", env!("CARGO_PKG_VERSION"));
                ExitCode::SUCCESS
            }
        }
    })
}
