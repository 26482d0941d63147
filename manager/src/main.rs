//! `podprobe-manager`: parse flags, run, print.

use clap::Parser;
use podprobe_manager::cli::{Cli, Command, run};
use podprobe_manager::run::{LogFormat, RunArgs};

fn main() {
    let cli = Cli::parse();
    if let Command::Run(args) = &cli.command {
        std::process::exit(serve(args));
    }
    if let Command::CheckWebhooks(args) = &cli.command {
        std::process::exit(check_webhooks(args));
    }
    match run(&cli.command) {
        Ok(printed) => {
            for note in &printed.notes {
                eprintln!("note: {note}");
            }
            print!("{}", printed.stdout);
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(e.exit_code());
        }
    }
}

fn init_logging(args: &RunArgs) -> Result<(), String> {
    let filter = match tracing_subscriber::EnvFilter::try_from_default_env() {
        Ok(filter) => filter,
        Err(_) => tracing_subscriber::EnvFilter::try_new(&args.log_level)
            .map_err(|e| format!("--log-level {:?}: {e}", args.log_level))?,
    };
    // Colours only for a person at a terminal; container logs stay plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

/// The runtime `builder` makes, or `None` after saying why it could not.
fn runtime(mut builder: tokio::runtime::Builder) -> Option<tokio::runtime::Runtime> {
    match builder.enable_all().build() {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            None
        }
    }
}

fn serve(args: &RunArgs) -> i32 {
    if let Err(e) = init_logging(args) {
        eprintln!("error: {e}");
        return 2;
    }
    let Some(runtime) = runtime(tokio::runtime::Builder::new_multi_thread()) else {
        return 1;
    };
    match runtime.block_on(podprobe_manager::run::main(args)) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            2
        }
    }
}

fn check_webhooks(args: &podprobe_manager::check::CheckWebhooksArgs) -> i32 {
    // One request a second: one thread is plenty.
    let Some(runtime) = runtime(tokio::runtime::Builder::new_current_thread()) else {
        return 1;
    };
    match runtime.block_on(podprobe_manager::check::main(args)) {
        Ok(took) => {
            println!(
                "the apiserver reached the PodProbeMarker webhook (after {:.1} s)",
                took.as_secs_f64()
            );
            0
        }
        Err(e @ podprobe_manager::check::CheckError::Client(_)) => {
            eprintln!("error: {e}");
            2
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}
