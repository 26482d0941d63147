//! `podprobe run`: the sidecar. Reads its pod (apiserver watch or downward-API file), keeps one
//! worker per probe in line with the annotation, and writes results as pod conditions.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::annotation::{self, PodContainers};
use crate::condition::writer::{ConditionWriter, WriterConfig};
use crate::condition::{ConditionBook, delete_conditions_patch};
use crate::events::EventSink;
use crate::metrics::Metrics;
use crate::pod::{self, PodIdentity, PodView, SourceKind};
use crate::probe::{ApiExec, ExecConfig, ExecMode, Prober};
use crate::runner::{ProbeId, Runner, RunnerConfig, TimingDefaults, WorkerReport};

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
    pub events: bool,
    pub metrics_addr: Option<SocketAddr>,
    /// Where exec probes run (`api` and `auto` exec into this pod with the sidecar's client).
    pub exec_mode: ExecMode,
}

#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
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
    let mut shutdown = std::pin::pin!(shutdown);
    let client = tokio::select! {
        client = connect() => client,
        () = &mut shutdown => return Ok(()),
    };

    let (source, why) = pod::choose_source(options.source, Some(&client), &options.identity).await;
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        pod = %format!("{}/{}", options.identity.namespace, options.identity.name),
        "podprobe reads its probes from {} ({why})",
        match source {
            SourceKind::Api => "the apiserver",
            _ => "the downward-API file",
        }
    );

    let (source_task, mut view_rx) = start_source(source, &client, &options);

    if source == SourceKind::File && options.identity.uid.is_none() {
        // The file carries no uid, and writing without the uid precondition could land on a
        // same-named replacement pod: nothing is written until POD_UID is provided.
        tracing::error!(
            "POD_UID is not set and the file source does not carry the pod's uid: no condition \
             will be written; set POD_UID from the downward API (fieldPath: metadata.uid)"
        );
    }
    let (uid_tx, uid_rx) = watch::channel(options.identity.uid.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &options.identity.namespace);
    let (writer, writer_task) = ConditionWriter::spawn(
        pods.clone(),
        options.identity.name.clone(),
        uid_rx,
        WriterConfig {
            coalesce: options.coalesce,
            ..WriterConfig::default()
        },
        metrics.clone(),
    );
    let mut events = event_sink(&client, &options);

    let mut sidecar = Sidecar {
        options: options.clone(),
        runner: None,
        book: None,
        last_annotation: None,
        probes: Vec::new(),
        metrics: metrics.clone(),
        exec: ExecConfig {
            mode: options.exec_mode,
            api: Some(ApiExec::new(
                client.clone(),
                &options.identity.namespace,
                options.identity.name.clone(),
            )),
        },
        writer: writer.clone(),
        pods,
        uid: options.identity.uid.clone(),
        stopped: false,
    };
    let (event_tx, mut event_rx) = mpsc::channel(1024);
    let mut refresh = tokio::time::interval(refresh_check_period(options.refresh_interval));
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        tokio::select! {
            changed = view_rx.changed() => {
                if changed.is_err() {
                    // The source ended: the pod is gone. Keep serving until SIGTERM.
                    sidecar.stop("the pod was deleted");
                    view_rx = watch::channel(PodView::default()).1;
                    continue;
                }
                let view = view_rx.borrow_and_update().clone();
                if view.uid.is_some() && sidecar.uid.is_none() {
                    sidecar.uid = view.uid.clone();
                    events.set_uid(view.uid.clone());
                    let _ = uid_tx.send(view.uid.clone());
                }
                sidecar.on_view(&view, &event_tx, &mut events).await;
            }
            Some(event) = event_rx.recv() => sidecar.on_event(event, &mut events),
            _ = refresh.tick() => sidecar.refresh(),
            () = &mut shutdown => break,
        }
    }

    tracing::info!("SIGTERM: stopping probes and flushing pending condition writes");
    sidecar.stop("shutting down");
    source_task.abort();
    if !writer.flush(SHUTDOWN_FLUSH).await {
        tracing::warn!("a condition write was still pending at shutdown");
    }
    writer_task.abort();
    Ok(())
}

/// Starts reading the pod from `source`; its views arrive on the receiver.
fn start_source(
    source: SourceKind,
    client: &Client,
    options: &SidecarOptions,
) -> (tokio::task::JoinHandle<()>, watch::Receiver<PodView>) {
    let (view_tx, view_rx) = watch::channel(PodView::default());
    let task = match source {
        SourceKind::Api => tokio::spawn(pod::watch_api(
            client.clone(),
            options.identity.clone(),
            view_tx,
        )),
        _ => tokio::spawn(pod::watch_file(
            options.annotations_file.clone(),
            options.file_poll,
            view_tx,
        )),
    };
    (task, view_rx)
}

/// Events on this pod, or none with `--events=false`.
fn event_sink(client: &Client, options: &SidecarOptions) -> EventSink {
    if !options.events {
        return EventSink::disabled();
    }
    let identity = &options.identity;
    let pod = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(identity.name.clone()),
        namespace: Some(identity.namespace.clone()),
        uid: identity.uid.clone(),
        ..Default::default()
    };
    EventSink::new(client.clone(), pod, Some(identity.name.clone()))
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

/// Connects to the apiserver, retrying with backoff: without a client the sidecar can write
/// nothing, but exiting would only crash-loop the pod.
async fn connect() -> Client {
    const MAX_WAIT: Duration = Duration::from_secs(60);
    let mut waits = ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(MAX_WAIT)
        .with_jitter()
        .without_max_times()
        .build();
    loop {
        match Client::try_default().await {
            Ok(client) => return client,
            Err(e) => {
                let wait = waits.next().unwrap_or(MAX_WAIT);
                tracing::error!(
                    "cannot configure a Kubernetes client (in-cluster service account or KUBECONFIG); retrying in {wait:?}: {e}"
                );
                tokio::time::sleep(wait).await;
            }
        }
    }
}

struct Sidecar {
    options: SidecarOptions,
    runner: Option<Runner>,
    book: Option<ConditionBook>,
    last_annotation: Option<String>,
    /// Probes currently running (for refresh and pruning).
    probes: Vec<ProbeId>,
    metrics: Metrics,
    exec: ExecConfig,
    writer: ConditionWriter,
    pods: Api<Pod>,
    uid: Option<String>,
    stopped: bool,
}

impl Sidecar {
    async fn on_view(
        &mut self,
        view: &PodView,
        event_tx: &mpsc::Sender<WorkerReport>,
        events: &mut EventSink,
    ) {
        if self.stopped {
            return;
        }
        if view.terminating {
            self.stop("the pod is terminating; conditions are left as they are");
            return;
        }
        if self.book.is_none() {
            self.book = Some(ConditionBook::from_pod_conditions(&view.conditions));
        }
        let runner = self.runner.get_or_insert_with(|| {
            let host = self
                .options
                .pod_ip
                .clone()
                .or_else(|| view.pod_ip.clone())
                .unwrap_or_else(|| "127.0.0.1".into());
            tracing::info!(%host, exec_mode = %self.options.exec_mode, "network probes aim at {host}; exec probes run in {} mode", self.options.exec_mode);
            let config = RunnerConfig {
                timing_defaults: self.options.timing_defaults,
                host,
                ..RunnerConfig::default()
            };
            Runner::new(
                Prober::new(self.options.user_agent.clone()).with_exec(self.exec.clone()),
                config,
                event_tx.clone(),
            )
        });
        for (container, status) in &view.statuses {
            runner.set_container(container, status.clone());
        }
        if view.annotation == self.last_annotation {
            return;
        }
        self.last_annotation = view.annotation.clone();
        let Some(value) = &view.annotation else {
            tracing::info!(
                "the pod has no {} annotation; nothing to probe",
                annotation::PODPROBE_ANNOTATION
            );
            self.apply(&[], &PodContainers::default()).await;
            return;
        };
        match annotation::parse(value, view.containers.as_ref()) {
            Ok(set) => {
                for invalid in &set.invalid {
                    tracing::warn!("skipping {invalid}");
                    events.invalid(&invalid.to_string());
                }
                let containers = view.containers.clone().unwrap_or_default();
                self.apply(&set.probes, &containers).await;
            }
            Err(e) => {
                tracing::error!("{e}; the last good probe set keeps running");
                events.invalid(&e.to_string());
            }
        }
    }

    async fn apply(&mut self, probes: &[annotation::ProbeSpec], containers: &PodContainers) {
        let Some(runner) = self.runner.as_mut() else {
            return;
        };
        let applied = runner.apply(probes, containers);
        if applied.started.len() + applied.restarted.len() + applied.stopped.len() > 0 {
            tracing::info!(
                started = ?applied.started,
                restarted = ?applied.restarted,
                stopped = ?applied.stopped,
                "probe set updated ({} running)",
                runner.len()
            );
        }
        let now: BTreeSet<_> = probes.iter().map(|p| p.condition_type.clone()).collect();
        let removed: Vec<ProbeId> = self
            .probes
            .iter()
            .filter(|p| !now.contains(&p.condition_type))
            .cloned()
            .collect();
        self.probes = probes.iter().map(ProbeId::of).collect();
        for probe in &removed {
            self.metrics.forget(probe);
        }
        if self.options.prune_conditions && !removed.is_empty() {
            self.prune(&removed).await;
        }
        self.metrics.set_ready(true);
    }

    /// `--prune-conditions`: deletes the conditions of probes that left the annotation.
    async fn prune(&mut self, removed: &[ProbeId]) {
        let Some(uid) = self.uid.clone() else { return };
        let types: Vec<&str> = removed.iter().map(|p| p.condition_type.as_str()).collect();
        let patch = delete_conditions_patch(&uid, &types);
        let params = kube::api::PatchParams::default();
        match self
            .pods
            .patch_status(
                &self.options.identity.name,
                &params,
                &kube::api::Patch::Strategic(&patch),
            )
            .await
        {
            Ok(_) => {
                self.metrics.write_ok();
                if let Some(book) = self.book.as_mut() {
                    for t in &types {
                        book.remove(t);
                    }
                }
                tracing::info!(conditions = ?types, "pruned conditions of removed probes");
            }
            Err(e) => {
                tracing::warn!(conditions = ?types, "cannot prune conditions of removed probes: {e}")
            }
        }
    }

    fn on_event(&mut self, event: WorkerReport, events: &mut EventSink) {
        if self.stopped {
            return;
        }
        match event {
            WorkerReport::Transition(t) => {
                self.metrics.state(&t.probe, t.state);
                tracing::info!(
                    probe = %t.probe.name,
                    condition = %t.probe.condition_type,
                    state = %t.state,
                    message = %t.message,
                    "probe result changed"
                );
                events.transition(&t);
                if let Some(condition) = self.book.as_mut().and_then(|b| b.record(&t)) {
                    self.writer.submit(condition);
                }
            }
            WorkerReport::Attempted {
                probe,
                outcome,
                duration,
            } => {
                let result = match outcome {
                    crate::probe::Outcome::Succeeded => "succeeded",
                    crate::probe::Outcome::Failed => "failed",
                };
                self.metrics.attempt(&probe, result, Some(duration));
            }
            WorkerReport::Errored { probe, error, .. } => {
                self.metrics.attempt(&probe, "errored", None);
                tracing::warn!(probe = %probe.name, condition = %probe.condition_type, "probe attempt errored, state unchanged: {error}");
                events.errored(&probe.condition_type, &probe.name, &error);
            }
        }
    }

    /// The `--refresh-interval` heartbeat of `lastProbeTime`.
    fn refresh(&mut self) {
        if self.stopped || self.options.refresh_interval.is_zero() {
            return;
        }
        let Some(book) = self.book.as_mut() else {
            return;
        };
        let now = jiff::Timestamp::now();
        for probe in &self.probes {
            if let Some(c) = book.refresh(&probe.condition_type, now, self.options.refresh_interval)
            {
                self.writer.submit(c);
            }
        }
    }

    fn stop(&mut self, why: &str) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if let Some(runner) = self.runner.as_mut() {
            runner.stop_all();
        }
        tracing::info!("stopped probing: {why}");
    }
}
