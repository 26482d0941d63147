//! Every command of `podprobe-manager`, dispatched in one place: the offline ones print what
//! [`super::run`] returns; `run`, `check-webhooks` and `release-gates` get a runtime (and `run`
//! and `release-gates` their logging).

use podprobe_ops::entry::{LogFormat, init_logging};

use super::{Cli, Command, ReleaseGatesArgs, run};
use crate::check::{self, CheckError, CheckWebhooksArgs};
use crate::run::RunArgs;

/// Runs the parsed command line; the process's exit code.
pub fn main(cli: Cli) -> i32 {
    match &cli.command {
        Command::Run(args) => serve(args),
        Command::CheckWebhooks(args) => check_webhooks(args),
        Command::ReleaseGates(args) => release_gates(args),
        offline => match run(offline) {
            Ok(printed) => {
                for note in &printed.notes {
                    eprintln!("note: {note}");
                }
                print!("{}", printed.stdout);
                0
            }
            Err(e) => {
                eprintln!("error: {e}");
                e.exit_code()
            }
        },
    }
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
    if let Err(e) = init_logging(&args.log_level, args.log_format) {
        eprintln!("error: {e}");
        return 2;
    }
    let Some(runtime) = runtime(tokio::runtime::Builder::new_multi_thread()) else {
        return 1;
    };
    match runtime.block_on(crate::run::main(args)) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            2
        }
    }
}

fn check_webhooks(args: &CheckWebhooksArgs) -> i32 {
    // One request a second: one thread is plenty.
    let Some(runtime) = runtime(tokio::runtime::Builder::new_current_thread()) else {
        return 1;
    };
    match runtime.block_on(check::main(args)) {
        Ok(took) => {
            println!(
                "the apiserver reached the PodProbeMarker webhook (after {:.1} s)",
                took.as_secs_f64()
            );
            0
        }
        Err(e @ CheckError::Client(_)) => {
            eprintln!("error: {e}");
            2
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

fn release_gates(args: &ReleaseGatesArgs) -> i32 {
    if let Err(e) = init_logging("info", LogFormat::Text) {
        eprintln!("error: {e}");
        return 2;
    }
    let Some(runtime) = runtime(tokio::runtime::Builder::new_current_thread()) else {
        return 1;
    };
    runtime.block_on(async {
        let client = match crate::run::default_client().await {
            Ok(client) => client,
            Err(e) => {
                eprintln!("error: cannot reach the apiserver: {e}");
                return 2;
            }
        };
        let metrics = std::sync::Arc::new(crate::metrics::Metrics::new(false));
        match crate::sidecar_token::issue::issue_pending_once(
            client,
            metrics,
            args.sidecar_token_lifetime,
            args.timeout,
        )
        .await
        {
            Ok(0) => {
                println!("no pod waits for its sidecar's token");
                0
            }
            Ok(n) => {
                println!("released {n} pods that waited for their sidecar's token");
                0
            }
            Err(e @ crate::sidecar_token::issue::OnceError::NotPermitted(_)) => {
                println!("no pod to release: {e}");
                0
            }
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        }
    })
}
