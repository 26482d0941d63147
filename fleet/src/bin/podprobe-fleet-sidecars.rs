//! Hosts some of the fleet benchmark's sidecars (podprobe_fleet::sidecars): one instance of
//! the real sidecar per pod listed in the spec file, until SIGTERM.
//!
//!     podprobe-fleet-sidecars SPEC.json

use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(spec) = std::env::args_os().nth(1) else {
        eprintln!("usage: podprobe-fleet-sidecars SPEC.json");
        return ExitCode::from(2);
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    // One thread, as the sidecar's own binary runs.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    match runtime.block_on(podprobe_fleet::sidecars::host(spec.into())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("podprobe-fleet-sidecars: {e}");
            ExitCode::FAILURE
        }
    }
}
