//! `podprobe check`: run a pod's probes on this machine and show the conditions the sidecar
//! would write, without a cluster.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;

use crate::annotation::{self, AnnotationError, InvalidProbe, PodContainers, ProbeSet};
use crate::condition::ConditionBook;
use crate::probe::exec::agent::DEFAULT_AGENT_DIR;
use crate::probe::{AgentExec, ExecConfig, ExecMode, Prober};
use crate::runner::{
    ProbeId, ProbeState, Runner, RunnerConfig, TimingDefaults, Transition, WorkerReport,
};

/// How `check` prints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OutputFormat {
    /// One aligned line per transition, then the conditions.
    #[default]
    Text,
    /// One JSON object per line per transition, then `{"conditions": [...]}`.
    Json,
}

#[derive(Debug, Clone)]
pub struct CheckOptions {
    pub file: PathBuf,
    pub once: bool,
    pub output: OutputFormat,
    pub host: String,
    pub timing_defaults: TimingDefaults,
    pub user_agent: String,
    /// Where exec probes run (`local` by default; `check` has no pod to exec into, so `api` is
    /// unavailable and `auto` means procfs, else local).
    pub exec_mode: ExecMode,
}

/// Bad input that leaves nothing to run: `check` exits 2.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a Pod manifest (YAML or JSON) nor a {key} JSON array: {reason}", key = annotation::PODPROBE_ANNOTATION)]
    Parse { path: String, reason: String },
    #[error("{path}: the pod has no {key} annotation", key = annotation::PODPROBE_ANNOTATION)]
    NoAnnotation { path: String },
    #[error("{path}: {source}")]
    Annotation {
        path: String,
        #[source]
        source: AnnotationError,
    },
    #[error("{path}: {} invalid probe(s):\n{}", .invalid.len(), list(.invalid))]
    InvalidProbes {
        path: String,
        invalid: Vec<InvalidProbe>,
    },
    #[error("{path}: the annotation holds no probes")]
    Empty { path: String },
}

fn list(invalid: &[InvalidProbe]) -> String {
    invalid
        .iter()
        .map(|i| format!("  - {i}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Reads a Pod manifest (YAML or JSON) or a raw annotation array from `path` (`-` = stdin).
pub fn load(path: &Path) -> Result<(ProbeSet, PodContainers), CheckError> {
    let shown = path.display().to_string();
    let mut text = String::new();
    let read = if path == Path::new("-") {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(path).map(|t| text = t)
    };
    read.map_err(|source| CheckError::Read {
        path: shown.clone(),
        source,
    })?;
    load_str(&text, &shown)
}

/// [`load`] on text already read; `shown` names the source in errors.
pub fn load_str(text: &str, shown: &str) -> Result<(ProbeSet, PodContainers), CheckError> {
    let annotation_error = |source| CheckError::Annotation {
        path: shown.to_owned(),
        source,
    };
    let (set, containers) = if text.trim_start().starts_with('[') {
        let set = annotation::parse(text, None).map_err(annotation_error)?;
        (set, PodContainers::default())
    } else {
        let pod = parse_pod(text).map_err(|reason| CheckError::Parse {
            path: shown.to_owned(),
            reason,
        })?;
        annotation::from_pod(&pod)
            .ok_or_else(|| CheckError::NoAnnotation {
                path: shown.to_owned(),
            })?
            .map_err(annotation_error)?
    };
    // Like the sidecar, run what is valid; the invalid ones are reported (and make `check`
    // exit 2). Only when nothing is valid there is nothing to run.
    if set.probes.is_empty() && !set.invalid.is_empty() {
        return Err(CheckError::InvalidProbes {
            path: shown.to_owned(),
            invalid: set.invalid,
        });
    }
    if set.probes.is_empty() {
        return Err(CheckError::Empty {
            path: shown.to_owned(),
        });
    }
    Ok((set, containers))
}

fn parse_pod(text: &str) -> Result<Pod, String> {
    let value: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
    match value.get("kind").and_then(|k| k.as_str()) {
        Some("Pod") | None => {}
        Some(other) => return Err(format!("kind is {other:?}, expected Pod")),
    }
    if !value.is_object() {
        return Err("expected an object".into());
    }
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// Prints transitions and conditions in the chosen format.
#[derive(Debug)]
pub struct Printer<W> {
    out: W,
    format: OutputFormat,
}

impl<W: Write> Printer<W> {
    pub fn new(out: W, format: OutputFormat) -> Self {
        Printer { out, format }
    }

    pub fn transition(&mut self, t: &Transition) -> std::io::Result<()> {
        match self.format {
            OutputFormat::Text => writeln!(
                self.out,
                "{}  {:<40} {:<9}  {}",
                crate::condition::kube_time(t.at).0,
                format!("{} ({})", t.probe.condition_type, t.probe.name),
                t.state.to_string(),
                one_line(&t.message)
            ),
            OutputFormat::Json => {
                let line = serde_json::json!({
                    "name": t.probe.name,
                    "podConditionType": t.probe.condition_type,
                    "state": t.state,
                    "message": t.message,
                    "at": crate::condition::kube_time(t.at),
                });
                writeln!(self.out, "{line}")
            }
        }?;
        self.out.flush()
    }

    pub fn note(&mut self, text: &str) -> std::io::Result<()> {
        if self.format == OutputFormat::Text {
            writeln!(self.out, "{text}")?;
            self.out.flush()?;
        }
        Ok(())
    }

    pub fn conditions(&mut self, book: &ConditionBook) -> std::io::Result<()> {
        let conditions: Vec<_> = book.iter().collect();
        match self.format {
            OutputFormat::Text => {
                writeln!(self.out, "\nconditions the sidecar would write:")?;
                for c in conditions {
                    writeln!(
                        self.out,
                        "  {:<28} {:<7} {:<17} {}",
                        c.type_,
                        c.status,
                        c.reason.as_deref().unwrap_or(""),
                        one_line(c.message.as_deref().unwrap_or(""))
                    )?;
                }
            }
            OutputFormat::Json => writeln!(
                self.out,
                "{}",
                serde_json::json!({ "conditions": conditions })
            )?,
        }
        self.out.flush()
    }
}

/// Messages can hold newlines (exec stdout); text output keeps one line per event.
fn one_line(message: &str) -> String {
    let flat = message.trim_end().replace('\n', "\\n");
    if flat.is_empty() { "-".into() } else { flat }
}

/// Runs `check` and returns the process exit code: 0 all Succeeded, 1 otherwise, 2 when some
/// probes were invalid (the valid ones still ran).
pub async fn run(options: CheckOptions) -> Result<ExitCode, CheckError> {
    let (set, containers) = load(&options.file)?;
    if !set.invalid.is_empty() {
        eprintln!(
            "podprobe check: {}: {} invalid probe(s) skipped, the other {} run:\n{}",
            options.file.display(),
            set.invalid.len(),
            set.probes.len(),
            list(&set.invalid)
        );
    }
    let some_invalid = !set.invalid.is_empty();
    let (tx, mut rx) = mpsc::channel(256);
    let config = RunnerConfig {
        timing_defaults: options.timing_defaults,
        host: options.host.clone(),
        start_jitter: !options.once,
        skip_initial_delay: options.once,
    };
    let mut runner = Runner::new(
        Prober::new(options.user_agent.clone()).with_exec(ExecConfig {
            mode: options.exec_mode,
            api: None,
            agent: AgentExec {
                dir: DEFAULT_AGENT_DIR.into(),
                containers: Vec::new(),
            },
        }),
        config,
        tx,
    );
    runner.apply(&set.probes, &containers);
    let mut printer = Printer::new(std::io::stdout().lock(), options.output);
    let mut book = ConditionBook::default();
    let io_error = |e: std::io::Error| tracing::warn!("cannot write output: {e}");

    if !options.once {
        loop {
            tokio::select! {
                event = rx.recv() => match event {
                    Some(WorkerReport::Transition(t)) => {
                        book.record(&t);
                        printer.transition(&t).unwrap_or_else(io_error);
                    }
                    Some(WorkerReport::Errored { probe, error, .. }) => {
                        tracing::warn!(probe = %probe.name, condition = %probe.condition_type, "attempt errored, state unchanged: {error}");
                    }
                    Some(WorkerReport::Attempted { .. }) => {}
                    None => break,
                },
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        runner.stop_all();
        printer.conditions(&book).unwrap_or_else(io_error);
        return Ok(if some_invalid {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        });
    }

    let outcome = run_once(&set, &mut rx, options.timing_defaults).await;
    runner.stop_all();
    for t in &outcome {
        book.record(t);
        printer.transition(t).unwrap_or_else(io_error);
    }
    printer.conditions(&book).unwrap_or_else(io_error);
    let all_succeeded = outcome.iter().all(|t| t.state == ProbeState::Succeeded);
    Ok(if some_invalid {
        ExitCode::from(2)
    } else if all_succeeded {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `--once`: each probe's first published state, or `Unknown` with the last error after
/// `successThreshold + failureThreshold + 2` attempts without one. Results in annotation order.
async fn run_once(
    set: &ProbeSet,
    rx: &mut mpsc::Receiver<WorkerReport>,
    defaults: TimingDefaults,
) -> Vec<Transition> {
    struct Pending {
        id: ProbeId,
        budget: u32,
        attempts: u32,
        last_error: Option<String>,
        result: Option<Transition>,
    }
    let mut pending: Vec<Pending> = set
        .probes
        .iter()
        .map(|p| {
            let timing = crate::runner::Timing::effective(&p.timing, defaults);
            Pending {
                id: ProbeId::of(p),
                budget: timing.success_threshold + timing.failure_threshold + 2,
                attempts: 0,
                last_error: None,
                result: None,
            }
        })
        .collect();
    while pending.iter().any(|p| p.result.is_none()) {
        let Some(event) = rx.recv().await else { break };
        let id = match &event {
            WorkerReport::Transition(t) => &t.probe,
            WorkerReport::Attempted { probe, .. } | WorkerReport::Errored { probe, .. } => probe,
        };
        let Some(p) = pending
            .iter_mut()
            .find(|p| p.id == *id && p.result.is_none())
        else {
            continue;
        };
        match event {
            WorkerReport::Transition(t) => p.result = Some(t),
            WorkerReport::Errored { error, at, .. } => {
                tracing::warn!(probe = %p.id.name, condition = %p.id.condition_type, "attempt errored, state unchanged: {error}");
                p.last_error = Some(error);
                p.attempts += 1;
                if p.attempts >= p.budget {
                    p.result = Some(Transition {
                        probe: p.id.clone(),
                        state: ProbeState::Unknown,
                        message: p.last_error.clone().unwrap_or_default(),
                        at,
                    });
                }
            }
            // Workers report a transition before the attempt that caused it, so a probe that
            // publishes on its last budgeted attempt is already resolved here.
            WorkerReport::Attempted { .. } => {
                p.attempts += 1;
                if p.attempts >= p.budget {
                    p.result = Some(Transition {
                        probe: p.id.clone(),
                        state: ProbeState::Unknown,
                        message: p
                            .last_error
                            .clone()
                            .unwrap_or_else(|| "no state after the attempt budget".into()),
                        at: jiff::Timestamp::now(),
                    });
                }
            }
        }
    }
    pending.into_iter().filter_map(|p| p.result).collect()
}
