//! `podprobe-manager`: parse flags, run, print.

use clap::Parser;
use podprobe_manager::cli::{Cli, run};

fn main() {
    let cli = Cli::parse();
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
