//! What the virtual-kubelet library does to podprobe's conditions, on the real control plane
//! (docs/providers.md):
//!
//!     cargo run --release -p podprobe-fleet --example bench_providers -- \
//!         --manager podprobe --pods-per-group 5 --seconds 600
//!
//! Two node agents built from the library: its mock provider (notifies) and `vk-replacer`
//! (does not: the library's 5 s copy of a status without podprobe's conditions). On each, pods
//! whose sidecars repair overwrites under each policy (`backoff`, `immediate`); every pod's
//! http probe flips every `--flip-every` seconds on average and the manager writes markers.
//! Prints a table per group and condition, and the report as one JSON object on its last line.
//! A program that prints figures, not a test.

use std::time::Duration;

use clap::Parser;
use podprobe_fleet::ManagerKind;
use podprobe_fleet::providers::{ProvidersOptions, run};

#[derive(Debug, Parser)]
struct Args {
    /// Pods per provider and policy (four groups).
    #[arg(long, default_value_t = 5)]
    pods_per_group: usize,
    /// Length of the measured window, seconds.
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// Mean seconds between two flips of one pod's probe.
    #[arg(long, default_value_t = 20)]
    flip_every: u64,
    #[arg(long, value_enum, default_value_t = ManagerKind::Podprobe)]
    manager: ManagerKind,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let options = ProvidersOptions {
        pods_per_group: args.pods_per_group,
        seconds: args.seconds,
        flip_every: Duration::from_secs(args.flip_every),
        manager: args.manager,
        sidecar_host: testkit::workspace::binary("podprobe-fleet", "podprobe-fleet-sidecars"),
        manager_binary: testkit::workspace::binary("podprobe-manager", "podprobe-manager"),
    };
    match run(&options).await {
        Ok(report) => {
            println!("{}", report.summary());
            println!(
                "{}",
                serde_json::to_string(&report).expect("a report serializes")
            );
        }
        Err(e) => {
            eprintln!("bench_providers: {e}");
            std::process::exit(1);
        }
    }
}
