//! The sidecar's loop: follows the pod's views, keeps one worker per probe in line with the
//! annotation, turns results into conditions for the writer, refreshes them, and writes back
//! what [`Drift`] finds overwritten.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::drift::{Drift, Found};
use super::{SidecarOptions, event_sink, refresh_check_period};
use crate::annotation::{self, PodContainers};
use crate::apiserver::Clients;
use crate::condition::ConditionBook;
use crate::condition::writer::{ApiserverAnswered, ConditionWriter, WriterConfig};
use crate::events::EventSink;
use crate::metrics::Metrics;
use crate::pod::{PodView, ReadTriggers, StatusReads};
use crate::probe::{ApiExec, ExecConfig, Prober};
use crate::runner::{ProbeId, Runner, RunnerConfig, WorkerReport};

pub(super) struct Sidecar {
    options: SidecarOptions,
    runner: Option<Runner>,
    /// Results published, and the pod's conditions as last seen.
    book: ConditionBook,
    /// Overwrites of the published conditions, and when to write them back.
    drift: Drift,
    last_annotation: Option<String>,
    /// The containers and ports the probes were last applied with (the file source learns
    /// them from its first status read).
    last_containers: Option<PodContainers>,
    /// The file source's status reads, and when probes' attempts ask for one.
    status_reads: Option<(StatusReads, ReadTriggers)>,
    /// Probes currently running.
    probes: Vec<ProbeId>,
    metrics: Metrics,
    exec: ExecConfig,
    /// The only writer of the pod's status.
    writer: ConditionWriter,
    writer_task: JoinHandle<()>,
    /// The pod's uid: from `POD_UID`, else from the first view. The writer waits for it.
    uid: watch::Sender<Option<String>>,
    events: EventSink,
    reports: mpsc::Sender<WorkerReport>,
    stopped: bool,
}

impl Sidecar {
    pub(super) fn new(
        clients: &Clients,
        options: SidecarOptions,
        metrics: Metrics,
        answered: ApiserverAnswered,
        status_reads: Option<StatusReads>,
    ) -> (Self, mpsc::Receiver<WorkerReport>) {
        let client = &clients.requests;
        let identity = &options.identity;
        let (uid, uid_rx) = watch::channel(identity.uid.clone());
        let pods: Api<Pod> = Api::namespaced(client.clone(), &identity.namespace);
        let (writer, writer_task) = ConditionWriter::spawn(
            pods,
            identity.name.clone(),
            uid_rx,
            WriterConfig {
                coalesce: options.coalesce,
                ..WriterConfig::default()
            },
            metrics.clone(),
            answered,
        );
        let exec = ExecConfig {
            mode: options.exec_mode,
            api: Some(ApiExec::new(
                clients.upgrades.clone(),
                &identity.namespace,
                identity.name.clone(),
            )),
            agent: options.exec_agent.clone(),
        };
        let (reports, reports_rx) = mpsc::channel(1024);
        let drift = Drift::new(options.overwrite_repair);
        let sidecar = Sidecar {
            events: event_sink(client, &options),
            options,
            runner: None,
            book: ConditionBook::default(),
            drift,
            last_annotation: None,
            last_containers: None,
            status_reads: status_reads.map(|reads| (reads, ReadTriggers::default())),
            probes: Vec::new(),
            metrics,
            exec,
            writer,
            writer_task,
            uid,
            reports,
            stopped: false,
        };
        (sidecar, reports_rx)
    }

    /// Probes, writes and repairs until `shutdown`. When the pod's source ends (the pod is
    /// gone) probing stops and the loop waits for `shutdown` alone.
    pub(super) async fn run_until(
        &mut self,
        views: watch::Receiver<PodView>,
        mut reports: mpsc::Receiver<WorkerReport>,
        mut shutdown: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) {
        let mut views = Some(views);
        let mut refresh =
            tokio::time::interval(refresh_check_period(self.options.refresh_interval));
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let repair_due = self.drift.next_due();
            tokio::select! {
                view = next_view(&mut views) => match view {
                    Some(view) => self.on_view(&view),
                    None => self.stop("the pod was deleted"),
                },
                Some(report) = reports.recv() => self.on_report(report),
                _ = refresh.tick() => self.refresh(),
                () = sleep_until(repair_due) => self.repair_due(),
                () = &mut shutdown => return,
            }
        }
    }

    /// Stops probing and gives pending writes up to `flush` to land.
    pub(super) async fn shut_down(mut self, flush: Duration) {
        self.stop("shutting down");
        if !self.writer.flush(flush).await {
            tracing::warn!("a condition write was still pending at shutdown");
        }
        self.writer_task.abort();
    }

    fn on_view(&mut self, view: &PodView) {
        if self.stopped {
            return;
        }
        if view.uid.is_some() && self.uid.borrow().is_none() {
            self.events.set_uid(view.uid.clone());
            self.uid.send_replace(view.uid.clone());
        }
        if view.terminating {
            self.stop("the pod is terminating; conditions are left as they are");
            return;
        }
        self.drift.view(
            view.conditions.as_deref(),
            &view.status_writers,
            view.resource_version.as_ref(),
            &mut self.book,
        );
        let runner = self.runner(view);
        for (container, status) in &view.statuses {
            runner.set_container(container, status.clone());
        }
        if view.annotation != self.last_annotation || view.containers != self.last_containers {
            self.last_annotation = view.annotation.clone();
            self.last_containers = view.containers.clone();
            self.apply_annotation(view);
        }
        self.metrics.set_ready(true);
        self.check_conditions(Instant::now());
    }

    fn runner(&mut self, view: &PodView) -> &mut Runner {
        self.runner.get_or_insert_with(|| {
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
                self.reports.clone(),
            )
        })
    }

    fn apply_annotation(&mut self, view: &PodView) {
        let Some(value) = &view.annotation else {
            tracing::info!(
                "the pod has no {} annotation; nothing to probe",
                annotation::PODPROBE_ANNOTATION
            );
            self.apply(&[], &PodContainers::default());
            return;
        };
        match annotation::parse(value, view.containers.as_ref()) {
            Ok(set) => {
                for invalid in &set.invalid {
                    tracing::warn!("skipping {invalid}");
                    self.events.invalid(&invalid.to_string());
                }
                let containers = view.containers.clone().unwrap_or_default();
                self.apply(&set.probes, &containers);
            }
            Err(e) => {
                tracing::error!("{e}; the last good probe set keeps running");
                self.events.invalid(&e.to_string());
            }
        }
    }

    fn apply(&mut self, probes: &[annotation::ProbeSpec], containers: &PodContainers) {
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
        let previous =
            std::mem::replace(&mut self.probes, probes.iter().map(ProbeId::of).collect());
        for probe in &self.probes {
            self.metrics.track(probe);
        }
        for probe in previous
            .iter()
            .filter(|p| applied.stopped.contains(&p.condition_type))
        {
            self.metrics.forget(probe);
        }
        if let Some((_, triggers)) = &mut self.status_reads {
            for condition_type in applied.stopped.iter().chain(&applied.restarted) {
                triggers.forget(condition_type);
            }
        }
        for condition_type in &applied.stopped {
            self.book.forget(condition_type);
            self.drift.forget(condition_type);
            if self.options.prune_conditions {
                // Through the writer, so a result still waiting there cannot bring it back.
                self.writer.delete(condition_type);
                tracing::info!(condition = %condition_type, "pruning the condition of a removed probe");
            }
        }
    }

    fn on_report(&mut self, report: WorkerReport) {
        // A report still queued from a probe that has since been removed is not news.
        if self.stopped || !self.probes.contains(report.probe()) {
            return;
        }
        match report {
            WorkerReport::Transition(t) => {
                self.metrics.state(&t.probe, t.state);
                tracing::info!(
                    probe = %t.probe.name,
                    condition = %t.probe.condition_type,
                    state = %t.state,
                    message = %t.message,
                    "probe result changed"
                );
                self.events.transition(&t);
                if let Some(condition) = self.book.record(&t) {
                    self.drift.changed(&t.probe.condition_type, Instant::now());
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
                if let Some((reads, triggers)) = &mut self.status_reads
                    && triggers.attempted(&probe.condition_type, outcome)
                {
                    reads.request();
                }
            }
            WorkerReport::Errored { probe, error, .. } => {
                self.metrics.attempt(&probe, "errored", None);
                if let Some((reads, triggers)) = &mut self.status_reads
                    && triggers.errored(&probe.condition_type, Instant::now())
                {
                    reads.request();
                }
                tracing::warn!(probe = %probe.name, condition = %probe.condition_type, "probe attempt errored, state unchanged: {error}");
                self.events
                    .errored(&probe.condition_type, &probe.name, &error);
            }
        }
    }

    /// The `--refresh-interval` heartbeat of `lastProbeTime`.
    fn refresh(&mut self) {
        if self.stopped || self.options.refresh_interval.is_zero() {
            return;
        }
        let types = self.probes.iter().map(|p| p.condition_type.as_str());
        let now = jiff::Timestamp::now();
        for c in self.book.refresh(types, now, self.options.refresh_interval) {
            self.writer.submit(c);
        }
    }

    fn owned(&self) -> Vec<String> {
        self.probes
            .iter()
            .map(|p| p.condition_type.clone())
            .collect()
    }

    /// Compares every owned condition with the pod as last seen; schedules repairs.
    fn check_conditions(&mut self, now: Instant) {
        if self.stopped {
            return;
        }
        let owned = self.owned();
        let writer = &self.writer;
        let found = self
            .drift
            .check(&owned, &self.book, |c| writer.progress(c), now);
        self.tell(found);
    }

    fn repair_due(&mut self) {
        let now = Instant::now();
        let owned = self.owned();
        let writer = &self.writer;
        let (write_backs, found) = self
            .drift
            .due(&owned, &self.book, |c| writer.progress(c), now);
        for condition in write_backs {
            self.writer.write_back(condition);
        }
        self.tell(found);
    }

    /// Counts, logs and tells (one Event per streak) the overwrites found; counts how long
    /// overwritten conditions were absent.
    fn tell(&mut self, found: Vec<Found>) {
        for (condition_type, absent) in self.drift.take_absent() {
            self.metrics.absent(&condition_type, absent);
        }
        for Found {
            condition_type,
            who,
            wait,
            streak,
        } in found
        {
            self.metrics.overwritten(&condition_type);
            if streak == 1 {
                tracing::warn!(condition = %condition_type,
                    "{who} removed or changed condition {condition_type}; writing it back in {wait:?}");
                self.events.overwritten(&condition_type, &who);
            } else {
                tracing::debug!(condition = %condition_type, streak,
                    "condition {condition_type} overwritten again by {who}; writing it back in {wait:?}");
            }
        }
    }

    fn stop(&mut self, why: &str) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        self.drift.stop();
        self.metrics.set_ready(false);
        if let Some(runner) = self.runner.as_mut() {
            runner.stop_all();
        }
        tracing::info!("stopped probing: {why}");
    }
}

/// The next view, or `None` once when the source ends; after that, never (the sender is gone
/// for good, and polling a closed channel again would return at once, forever).
async fn next_view(views: &mut Option<watch::Receiver<PodView>>) -> Option<PodView> {
    let Some(receiver) = views else {
        return std::future::pending().await;
    };
    if receiver.changed().await.is_err() {
        *views = None;
        return None;
    }
    Some(receiver.borrow_and_update().clone())
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
