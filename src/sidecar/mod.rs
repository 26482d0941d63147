//! `podprobe run`: the sidecar. Reads its pod (apiserver watch or downward-API file), keeps one
//! worker per probe in line with the annotation, and writes results as pod conditions.

mod drift;
pub mod executor;
mod probing;
mod repair;

pub use repair::RepairPolicy;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::apiserver::{self, Clients, Idle};
use crate::condition::writer::ApiserverAnswered;
use crate::credential;
use crate::events::{EventBudget, EventSink};
use crate::metrics::Metrics;
use crate::pod::{self, PodIdentity, PodView, SourceKind, StatusReader, StatusReads};
use crate::probe::{AgentExec, ExecMode};
use crate::runner::TimingDefaults;
use probing::Sidecar;

/// Everything `run` is configured with.
#[derive(Debug, Clone)]
pub struct SidecarOptions {
    pub identity: PodIdentity,
    /// `POD_IP`: where network probes aim (else the pod status' IP, else 127.0.0.1).
    pub pod_ip: Option<String>,
    pub source: SourceKind,
    pub annotations_file: PathBuf,
    pub file_poll: Duration,
    pub timing_defaults: TimingDefaults,
    pub user_agent: String,
    pub refresh_interval: Duration,
    pub coalesce: Duration,
    pub prune_conditions: bool,
    /// Events on this pod and their budget; `None` with `--events=false`.
    pub events: Option<EventBudget>,
    pub metrics_addr: Option<SocketAddr>,
    /// Where exec probes run (`api` and `auto` exec into this pod with the sidecar's client).
    pub exec_mode: ExecMode,
    /// The containers that have podprobe's exec agent, and the agents' sockets.
    pub exec_agent: AgentExec,
    /// How soon a condition another writer removed or changed is written back.
    pub overwrite_repair: RepairPolicy,
    /// Probe only on a node labelled `type=virtual-kubelet`; elsewhere OpenKruise's
    /// kruise-daemon probes the pod and the sidecar stands down ([`executor`]).
    pub only_on_virtual_nodes: bool,
    /// `NODE_NAME`: the node the pod runs on.
    pub node_name: Option<String>,
    /// Renew the pod-bound token before it expires, keeping it in this directory
    /// ([`credential`]); the manager's injection sets it where the token is issued once.
    pub renew_token_dir: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    #[error("cannot build the apiserver client: {0}")]
    Client(#[from] apiserver::ClientError),
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// How long SIGTERM waits for a pending condition write.
const SHUTDOWN_FLUSH: Duration = Duration::from_millis(900);

/// Runs the sidecar until `shutdown` resolves (SIGTERM). Returns `Ok` on a clean stop.
pub async fn run(
    options: SidecarOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), SidecarError> {
    // Where it renews its own token, the manager issued it into a Secret that the node's
    // provider copies into the pod: an empty token volume means the provider started this
    // container before it saw that Secret (an informer that lagged), and copies it no more.
    let hint = options.renew_token_dir.as_ref().map(|_| {
        "; this sidecar's token comes from the Secret podprobe-manager issued for its pod: \
         if its token volume is empty, a virtual node's provider that started the container \
         before it saw that Secret left it so and does not fill it later: recreate the pod \
         (alert PodProbeSidecarTokenFailing)"
    });
    run_with(options, configure(hint.unwrap_or_default()), shutdown).await
}

/// [`run`] with a configuration made by the caller instead of the in-cluster service account
/// or KUBECONFIG: for hosting several sidecars in one process (the fleet benchmark), each with
/// its own clients, connection and token, as separate pods would have.
pub async fn run_with_config(
    options: SidecarOptions,
    config: kube::Config,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), SidecarError> {
    run_with(options, std::future::ready(config), shutdown).await
}

async fn run_with(
    options: SidecarOptions,
    config: impl std::future::Future<Output = kube::Config>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), SidecarError> {
    let metrics = Metrics::new();
    // The endpoints stop when `run` returns, however it returns.
    let endpoints_stop = CancellationToken::new();
    let _stop_endpoints_on_return = endpoints_stop.clone().drop_guard();
    if let Some(addr) = options.metrics_addr {
        let local = metrics
            .clone()
            .serve(addr, endpoints_stop.clone())
            .await
            .map_err(|source| SidecarError::Metrics { addr, source })?;
        tracing::info!("serving /metrics, /healthz and /readyz on {local}");
    }
    if options.renew_token_dir.is_some() {
        // Until it holds a token it can renew: a sidecar its provider started without one
        // can write nothing, and its alert must not need it to.
        metrics.token_missing();
    }
    let mut shutdown = std::pin::pin!(shutdown);
    let mut config = tokio::select! {
        config = config => config,
        () = &mut shutdown => return Ok(()),
    };
    let renewal = options.renew_token_dir.as_deref().and_then(|dir| {
        credential::prepare(&mut config, dir)
            .inspect_err(|e| {
                tracing::error!(
                    "cannot renew the sidecar's token in {} ({e}); using it as given until it expires",
                    dir.display()
                );
            })
            .ok()
    });
    let (source, why, clients) = tokio::select! {
        chosen = source_and_clients(&options, &config) => chosen?,
        () = &mut shutdown => return Ok(()),
    };
    // The renewal stops when `run` returns, however it returns.
    let renewal_stop = CancellationToken::new();
    let _stop_renewal_on_return = renewal_stop.clone().drop_guard();
    if let Some(renewal) = renewal {
        tokio::spawn(credential::renew(
            clients.requests.clone(),
            renewal,
            metrics.clone(),
            renewal_stop,
        ));
    }
    // Before anything about probing is logged: a sidecar that stands down probes nothing.
    if options.only_on_virtual_nodes {
        let decided = tokio::select! {
            decided = executor::decide(&clients.requests, options.node_name.as_deref()) => decided,
            () = &mut shutdown => return Ok(()),
        };
        match decided {
            executor::Executor::KruiseDaemon { node } => {
                tracing::info!(
                    version = env!("CARGO_PKG_VERSION"),
                    pod = %format!("{}/{}", options.identity.namespace, options.identity.name),
                    "node {node} is not labelled type=virtual-kubelet: OpenKruise's kruise-daemon \
                     probes this pod there, so this sidecar stands down (it probes nothing and \
                     writes nothing until it stops)"
                );
                metrics.set_ready(true);
                shutdown.await;
                return Ok(());
            }
            executor::Executor::Sidecar { why } => {
                tracing::info!("this sidecar probes the pod: {why}")
            }
        }
    }
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        pod = %format!("{}/{}", options.identity.namespace, options.identity.name),
        "podprobe reads its probes from {} ({why})",
        match source {
            SourceKind::Api => "the apiserver",
            _ => "the downward-API file, and its containers' status from the apiserver when probing needs it",
        }
    );
    if source == SourceKind::File && options.identity.uid.is_none() {
        // The file carries no uid, and writing without the uid precondition could land on a
        // same-named replacement pod: nothing is written until POD_UID is provided.
        tracing::error!(
            "POD_UID is not set and the file source does not carry the pod's uid: no condition \
             will be written; set POD_UID from the downward API (fieldPath: metadata.uid)"
        );
    }
    let client = &clients.requests;
    let answered = ApiserverAnswered::default();
    let (source_task, views, status_reads) = tokio::select! {
        started = start_source(source, client, &options, &metrics, &answered) => started,
        () = &mut shutdown => return Ok(()),
    };
    let (mut sidecar, reports) = Sidecar::new(&clients, options, metrics, answered, status_reads);
    sidecar.run_until(views, reports, shutdown).await;

    tracing::info!("SIGTERM: stopping probes and flushing pending condition writes");
    source_task.abort();
    sidecar.shut_down(SHUTDOWN_FLUSH).await;
    Ok(())
}

/// How long the file source's first status read may hold up probing: past it, probes start
/// without their containers' status and take it when a later read brings it.
const FIRST_STATUS_READ: Duration = Duration::from_secs(5);

/// Starts reading the pod from `source`; its views arrive on the receiver. The file source
/// reads the pod's status once before probing starts (so probes begin with their containers'
/// state and named ports), then when [`StatusReads`] ask.
async fn start_source(
    source: SourceKind,
    client: &Client,
    options: &SidecarOptions,
    metrics: &Metrics,
    answered: &ApiserverAnswered,
) -> (
    tokio::task::JoinHandle<()>,
    watch::Receiver<PodView>,
    Option<StatusReads>,
) {
    let (view_tx, view_rx) = watch::channel(PodView::default());
    if source == SourceKind::Api {
        let task = tokio::spawn(pod::watch_api(
            client.clone(),
            options.identity.clone(),
            view_tx,
            answered.clone(),
        ));
        return (task, view_rx, None);
    }
    let mut reader = StatusReader::new(
        client.clone(),
        options.identity.clone(),
        view_tx.clone(),
        metrics.pod_status_reads(),
    );
    let first = tokio::time::timeout(FIRST_STATUS_READ, reader.read())
        .await
        .unwrap_or(pod::Read::Unsettled);
    // The annotation too, so the first view has both (its errors are the file watch's to tell).
    if let Ok(annotations) = pod::read_annotations_file(&options.annotations_file) {
        let annotation = PodView::from_annotations(&annotations).annotation;
        view_tx.send_modify(|view| view.annotation = annotation);
    }
    let wanted = StatusReads::default();
    let file = pod::watch_file(
        options.annotations_file.clone(),
        options.file_poll,
        view_tx,
        metrics.annotation_file_reads(),
    );
    let status = reader.run(first, wanted.clone());
    let task = tokio::spawn(async move {
        tokio::join!(file, status);
    });
    (task, view_rx, Some(wanted))
}

/// Events on this pod, or none with `--events=false`.
fn event_sink(client: &Client, options: &SidecarOptions) -> EventSink {
    let Some(budget) = options.events else {
        return EventSink::disabled();
    };
    let identity = &options.identity;
    let pod = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(identity.name.clone()),
        namespace: Some(identity.namespace.clone()),
        uid: identity.uid.clone(),
        ..Default::default()
    };
    EventSink::new(client.clone(), pod, Some(identity.name.clone()), budget)
}

/// How often due `lastProbeTime` refreshes are looked for: a tenth of the interval, within
/// 1 s..60 s (hourly when refreshes are off).
fn refresh_check_period(refresh_interval: Duration) -> Duration {
    if refresh_interval.is_zero() {
        Duration::from_secs(3600)
    } else {
        (refresh_interval / 10).clamp(Duration::from_secs(1), Duration::from_secs(60))
    }
}

/// Picks the pod's source and builds the clients its connection use calls for: a watch keeps
/// its connection open, the file source lets it close between writes
/// ([`apiserver::Idle`]).
async fn source_and_clients(
    options: &SidecarOptions,
    config: &kube::Config,
) -> Result<(SourceKind, String, Clients), SidecarError> {
    if options.source == SourceKind::File {
        let (source, why) = pod::choose_source(SourceKind::File, None, &options.identity).await;
        return Ok((
            source,
            why,
            Clients::new(config, Idle::CloseAfter(apiserver::IDLE_CLOSE))?,
        ));
    }
    let clients = Clients::new(config, Idle::Keep)?;
    let (source, why) =
        pod::choose_source(options.source, Some(&clients.requests), &options.identity).await;
    let clients = match source {
        SourceKind::File => Clients::new(config, Idle::CloseAfter(apiserver::IDLE_CLOSE))?,
        _ => clients,
    };
    Ok((source, why, clients))
}

/// The in-cluster service account's (or KUBECONFIG's) configuration, once clients can be built
/// from it (its CA and token readable), retrying with backoff: without it the sidecar can write
/// nothing, but exiting would only crash-loop the pod. `hint` ends each log line: the likely
/// cause, where one is known.
async fn configure(hint: &str) -> kube::Config {
    const MAX_WAIT: Duration = Duration::from_secs(60);
    let mut waits = ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(MAX_WAIT)
        .with_jitter()
        .without_max_times()
        .build();
    loop {
        let configured = match kube::Config::infer().await {
            Ok(config) => Clients::new(&config, Idle::CloseAfter(apiserver::IDLE_CLOSE))
                .map(|_| config)
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match configured {
            Ok(config) => return config,
            Err(e) => {
                let wait = waits.next().unwrap_or(MAX_WAIT);
                tracing::error!(
                    "cannot configure a Kubernetes client (in-cluster service account or KUBECONFIG); retrying in {wait:?}: {e}{hint}"
                );
                tokio::time::sleep(wait).await;
            }
        }
    }
}
