//! The `podprobe` command line: parse flags, build, run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use podprobe::check::{self, CheckOptions, OutputFormat};
use podprobe::runner::TimingDefaults;

/// Runs OpenKruise PodProbeMarker probes (the kruise.io/podprobe annotation) from inside a pod
/// and writes their results as pod conditions.
#[derive(Debug, Parser)]
#[command(name = "podprobe", version, propagate_version = true)]
struct Cli {
    /// Log filter, e.g. `info`, `debug`, `podprobe=debug` (RUST_LOG syntax; RUST_LOG wins).
    #[arg(long, global = true, default_value = "info", env = "PODPROBE_LOG")]
    log_level: String,

    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a pod's probes on this machine and print the conditions the sidecar would write.
    ///
    /// FILE is a Pod manifest (YAML or JSON) carrying the kruise.io/podprobe annotation, or the
    /// bare annotation JSON array; `-` reads standard input. Exit codes: 0 all probes ended
    /// Succeeded, 1 otherwise, 2 bad input (unreadable file, invalid annotation or probe).
    Check {
        /// Pod manifest or annotation JSON (`-` for stdin).
        file: PathBuf,

        /// Attempt each probe until it publishes a state (thresholds apply), or until
        /// successThreshold + failureThreshold + 2 attempts passed without one (state Unknown,
        /// message = last error), then exit. Without it, run until Ctrl-C and print every
        /// transition.
        #[arg(long)]
        once: bool,

        /// Output format: `text`, or `json` (one object per transition, then the conditions).
        #[arg(long, short, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,

        /// Address network probes (tcpSocket, httpGet, grpc) aim at.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,

        /// Defaults for unset timing fields: `kruise` (kruise-daemon minimums: 1 s period,
        /// 1 s delay, thresholds 1) or `kubernetes` (kubelet: 10 s period, threshold 3, ...).
        #[arg(long, value_enum, default_value_t = TimingDefaults::Kruise)]
        timing_defaults: TimingDefaults,

        /// User-Agent of HTTP probes (kubelet sends kube-probe/<major>.<minor>).
        #[arg(long, default_value = podprobe::probe::http::DEFAULT_USER_AGENT)]
        user_agent: String,
    },

    /// Watch real probes flip: start local target servers, run the example game-server pod's
    /// probes against them, and take targets down and back up. Needs no cluster.
    Demo {
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
    },

    /// Print the version.
    Version,
}

fn init_logging(level: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log_level, cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("podprobe: cannot start the async runtime: {e}");
            return ExitCode::from(70);
        }
    };
    runtime.block_on(async {
        match cli.command {
            Command::Check {
                file,
                once,
                output,
                host,
                timing_defaults,
                user_agent,
            } => {
                let options = CheckOptions {
                    file,
                    once,
                    output,
                    host,
                    timing_defaults,
                    user_agent,
                };
                check::run(options).await.unwrap_or_else(|e| {
                    eprintln!("podprobe check: {e}");
                    ExitCode::from(2)
                })
            }
            Command::Demo { output } => podprobe::demo::run(output).await.unwrap_or_else(|e| {
                eprintln!("podprobe demo: {e}");
                ExitCode::FAILURE
            }),
            Command::Version => {
                println!("podprobe {}", env!("CARGO_PKG_VERSION"));
                ExitCode::SUCCESS
            }
        }
    })
}
