//! The command line of `podprobe-manager run` and the [`Options`] it maps to.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use podprobe_ops::entry::LogFormat;

use crate::config::InjectionConfig;
use crate::leader::default_identity;
use crate::pods::{MarkerScope, parse_selector};
use crate::webhook::Mode;

use super::RunError;

/// `--mode` on the command line (the webhooks' [`Mode`] stays free of clap).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ModeArg {
    /// No OpenKruise: podprobe writes the annotations, runs markers, status and propagation.
    Standalone,
    /// OpenKruise owns PPMs, annotations and markers; podprobe only injects the sidecar.
    Companion,
}

impl From<ModeArg> for Mode {
    fn from(mode: ModeArg) -> Self {
        match mode {
            ModeArg::Standalone => Mode::Standalone,
            ModeArg::Companion => Mode::Companion,
        }
    }
}

/// Flags of `podprobe-manager run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// `standalone`: no OpenKruise in the cluster; podprobe owns PodProbeMarkers, writes the
    /// kruise.io/podprobe and kruise.io/podprobemarker-list pod annotations (and keeps them in
    /// step with PodProbeMarker changes), applies markerPolicy labels/annotations and writes
    /// PodProbeMarker status. `companion`: OpenKruise (EnablePodProbeMarkerOnServerless) owns
    /// all of that; podprobe injects the sidecar and, for virtual-node pods, issues their
    /// sidecars' tokens (Secrets, the token label and scheduling gate, Events), and runs no
    /// marker or annotation controller.
    #[arg(long, value_enum, default_value_t = ModeArg::Standalone, env = "PODPROBE_MANAGER_MODE")]
    pub mode: ModeArg,

    /// Address of the HTTPS admission server (/mutate-pods, /validate-podprobemarkers).
    #[arg(long, default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,

    /// PEM certificate chain of the webhook server; re-read when the file changes (checked
    /// every --tls-reload-interval), so a rotated Secret needs no restart.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: PathBuf,

    /// PEM private key (PKCS#8, PKCS#1 or SEC1) matching --tls-cert; reloaded with it.
    #[arg(long, value_name = "FILE")]
    pub tls_key: PathBuf,

    /// How often the certificate and key files are checked for changes.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub tls_reload_interval: Duration,

    /// Sidecar injection config (YAML: image, resources, opt-in label, nativeSidecar,
    /// readinessGates, ...). Without it no sidecar is injected.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Plain-HTTP address for /metrics (Prometheus), /healthz and /readyz (ready once the
    /// PodProbeMarker and namespace caches have synced).
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,

    /// Run the controllers only on the replica holding a coordination.k8s.io Lease (webhooks
    /// serve on every replica). `--leader-election=false` for a single replica.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub leader_election: bool,

    /// Namespace of the Lease (defaults to the manager's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "podprobe-system")]
    pub leader_election_namespace: String,

    /// Name of the Lease.
    #[arg(long, default_value = "podprobe-manager")]
    pub leader_election_name: String,

    /// Lease duration: how long followers wait after the last renewal before taking over. The
    /// leader renews every 2/15 of it and steps down after failing to renew for 2/3 of it.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub leader_election_lease_duration: Duration,

    /// Label selector (key=value[,key=value]) of the nodes whose pods are serverless and get
    /// markers; pods running the podprobe sidecar get them on any node.
    #[arg(long, default_value = "type=virtual-kubelet", value_parser = parse_selector)]
    pub serverless_node_selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,

    /// Pods reconciled concurrently by the markers controller.
    #[arg(long, default_value_t = 16)]
    pub workers: u16,

    /// Log filter, e.g. `info`, `debug`, `podprobe_manager=debug` (RUST_LOG syntax; RUST_LOG
    /// wins when set).
    #[arg(long, default_value = "info", env = "PODPROBE_LOG")]
    pub log_level: String,

    /// Log format on stderr: `text` (colours only on a terminal) or `json` (one object a line,
    /// for log collectors).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Leader election settings; `None` in [`Options`] = always lead.
#[derive(Debug, Clone)]
pub struct LeaderOptions {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
}

/// Everything [`Manager::start`] needs (the binary builds it from [`RunArgs`]).
#[derive(Debug, Clone)]
pub struct Options {
    pub mode: Mode,
    pub webhook_addr: SocketAddr,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    pub tls_reload_interval: Duration,
    pub injection: Option<InjectionConfig>,
    pub metrics_addr: Option<SocketAddr>,
    pub leader: Option<LeaderOptions>,
    pub scope: MarkerScope,
    pub workers: u16,
}

impl Options {
    pub fn from_args(args: &RunArgs) -> Result<Self, RunError> {
        let injection = args
            .config
            .as_deref()
            .map(InjectionConfig::from_file)
            .transpose()?;
        let sidecar_name = injection
            .as_ref()
            .map(|c| c.container_name.clone())
            .unwrap_or_else(|| "podprobe".into());
        Ok(Self {
            mode: args.mode.into(),
            webhook_addr: args.webhook_addr,
            tls_cert: args.tls_cert.clone(),
            tls_key: args.tls_key.clone(),
            tls_reload_interval: args.tls_reload_interval,
            injection,
            metrics_addr: Some(args.metrics_addr),
            leader: args.leader_election.then(|| LeaderOptions {
                namespace: args.leader_election_namespace.clone(),
                name: args.leader_election_name.clone(),
                identity: default_identity(),
                lease_duration: args.leader_election_lease_duration,
            }),
            scope: MarkerScope {
                serverless_nodes: args.serverless_node_selector.clone(),
                sidecar_name,
            },
            workers: args.workers.max(1),
        })
    }
}
