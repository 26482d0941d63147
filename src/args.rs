//! The command line's values, kept out of the library: each maps onto the library's option with
//! `From`, so the library's types do not depend on clap. The doc comments are the per-value
//! help of `--help`.

use podprobe::check::OutputFormat;
use podprobe::pod::SourceKind;
use podprobe::probe::ExecMode;
use podprobe::runner::TimingDefaults;

/// `--source`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Source {
    /// The apiserver when it answers and RBAC allows reading the pod, else the file.
    Auto,
    /// A watch on this pod through the apiserver (also yields container statuses and uid).
    Api,
    /// The downward-API annotations file.
    File,
}

impl From<Source> for SourceKind {
    fn from(source: Source) -> Self {
        match source {
            Source::Auto => SourceKind::Auto,
            Source::Api => SourceKind::Api,
            Source::File => SourceKind::File,
        }
    }
}

/// `--exec-mode`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Exec {
    /// Per target container: agent when the container runs podprobe's exec agent, else procfs
    /// when its process is visible and chroot is permitted, else api when configured and
    /// allowed, else local. Logged once per container.
    Auto,
    /// Through podprobe's exec agent in the target container (`--exec-agent-dir`).
    Agent,
    /// chroot into the target container's main process (`shareProcessNamespace: true`).
    Procfs,
    /// The apiserver's `pods/exec` into the target container.
    Api,
    /// In the sidecar's own container.
    Local,
}

impl From<Exec> for ExecMode {
    fn from(exec: Exec) -> Self {
        match exec {
            Exec::Auto => ExecMode::Auto,
            Exec::Agent => ExecMode::Agent,
            Exec::Procfs => ExecMode::Procfs,
            Exec::Api => ExecMode::Api,
            Exec::Local => ExecMode::Local,
        }
    }
}

/// `--timing-defaults`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Timing {
    /// kruise-daemon's minimums: period, timeout, initial delay, thresholds all at least 1.
    Kruise,
    /// The kubelet's defaults for 0/unset: period 10 s, timeout 1 s, delay 0, success 1, failure 3.
    Kubernetes,
}

impl From<Timing> for TimingDefaults {
    fn from(timing: Timing) -> Self {
        match timing {
            Timing::Kruise => TimingDefaults::Kruise,
            Timing::Kubernetes => TimingDefaults::Kubernetes,
        }
    }
}

/// `--output`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Output {
    /// One aligned line per transition, then the conditions.
    Text,
    /// One JSON object per line per transition, then `{"conditions": [...]}`.
    Json,
}

impl From<Output> for OutputFormat {
    fn from(output: Output) -> Self {
        match output {
            Output::Text => OutputFormat::Text,
            Output::Json => OutputFormat::Json,
        }
    }
}
