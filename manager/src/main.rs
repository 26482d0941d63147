//! `podprobe-manager`: parse flags, dispatch ([`podprobe_manager::cli::main`]), exit.

use clap::Parser;
use podprobe_manager::cli::Cli;

fn main() {
    std::process::exit(podprobe_manager::cli::main(Cli::parse()));
}
