//! What both binaries do around their long-running command: logging set up from `--log-level`
//! and `--log-format`, and the wait for the signal that ends them.

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Text (colours only on a terminal).
    Text,
    /// One JSON object a line, for log collectors.
    Json,
}

/// `--log-level` and `--log-format`: the podprobe binaries' global logging flags.
#[derive(Debug, Clone, clap::Args)]
pub struct LogFlags {
    /// Log filter, e.g. `info`, `debug`, `podprobe=debug` (RUST_LOG syntax; RUST_LOG wins).
    #[arg(long, global = true, default_value = "info", env = "PODPROBE_LOG")]
    pub log_level: String,

    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl LogFlags {
    /// Starts logging as the flags say; a filter that is not valid is said, and logging runs
    /// at `info`: a typo in a log filter must not stop the process (a crash-looping sidecar
    /// probes nothing).
    pub fn init(&self) {
        if let Err(e) = init_logging(&self.log_level, self.log_format) {
            let _ = init_logging("info", self.log_format);
            tracing::warn!("{e}; logging at info");
        }
    }
}

/// Runs `work` to its exit code on a runtime of one thread (both podprobe binaries: a sidecar
/// or an exec agent waits on sockets, signals and child processes, never on the CPU, and every
/// extra thread is memory in every pod); exit code 70 when the runtime cannot start.
pub fn on_one_thread(
    who: &str,
    work: impl std::future::Future<Output = std::process::ExitCode>,
) -> std::process::ExitCode {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(work),
        Err(e) => {
            eprintln!("{who}: cannot start the async runtime: {e}");
            std::process::ExitCode::from(70)
        }
    }
}

/// Logs to stderr at `level` (`RUST_LOG` wins when set) in `format`. A `level` that is not a
/// valid filter is an error naming the flag.
pub fn init_logging(level: &str, format: LogFormat) -> Result<(), String> {
    let filter = match tracing_subscriber::EnvFilter::try_from_default_env() {
        Ok(filter) => filter,
        Err(_) => tracing_subscriber::EnvFilter::try_new(level)
            .map_err(|e| format!("--log-level {level:?}: {e}"))?,
    };
    // Colours only for a person at a terminal; container logs stay plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

/// Resolves with the name of the signal that asks the process to stop: SIGTERM (what the
/// kubelet sends) or SIGINT (Ctrl-C). If SIGTERM cannot be listened for, a warning says so and
/// only Ctrl-C counts.
pub async fn termination() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigterm = signal(SignalKind::terminate())
        .inspect_err(|e| {
            tracing::warn!("cannot listen for SIGTERM ({e}); only Ctrl-C stops this process")
        })
        .ok();
    let sigterm_received = async {
        match &mut sigterm {
            Some(sigterm) => sigterm.recv().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = sigterm_received => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    }
}
