//! `podprobe-manager`: parse flags, run, print.

use clap::Parser;
use podprobe_manager::cli::{Cli, Command, run};

fn main() {
    let cli = Cli::parse();
    if let Command::Run(args) = &cli.command {
        std::process::exit(serve(args));
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

fn serve(args: &podprobe_manager::run::RunArgs) -> i32 {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(podprobe_manager::run::main(args)) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            2
        }
    }
}
