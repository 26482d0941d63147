//! `podprobe-agent`: podprobe's exec agent alone, what the injected init container copies into
//! every app container that gets the agent. It is `podprobe agent` with the same flags and
//! code ([`podprobe::exec_agent`]), without the sidecar's Kubernetes client, TLS, HTTP and gRPC
//! probes: a fraction of the sidecar's size on each pod's disk, and less memory in the game
//! container.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use podprobe::exec_agent::AgentArgs;
use podprobe_ops::entry::{self, LogFlags};

/// podprobe's exec agent, alone: runs the podprobe sidecar's exec probes inside an app
/// container (`podprobe agent`, the same flags as the sidecar binary's).
#[derive(Debug, Parser)]
#[command(name = "podprobe", version, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    log: LogFlags,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Agent(AgentArgs),

    /// Print the version.
    Version,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cli.log.init();
    let args = match cli.command {
        Command::Agent(args) => args,
        Command::Version => {
            println!("podprobe-agent {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
    };
    entry::on_one_thread("podprobe agent", args.run())
}
