//! The fleet benchmark on the real control plane (see `podprobe_fleet` and docs/scale.md):
//!
//!     cargo run --release -p podprobe-fleet --example bench_fleet -- \
//!         --pods 1000 --flip-percent 1 --seconds 60 --manager podprobe --source api
//!
//! It builds `podprobe-fleet-sidecars` and `podprobe-manager` in the same profile, prints a
//! summary, appends a row to docs/perf/fleet.csv and the whole report to
//! docs/perf/fleet.jsonl (what `cargo run --example plot_perf` plots), and prints the report as
//! one JSON object on its last line. A program that prints figures, not a test.

use std::io::Write;
use std::path::Path;

use clap::Parser;
use podprobe_fleet::{FleetOptions, ManagerKind, Periods, Source, binaries};

#[derive(Debug, Parser)]
struct Args {
    /// Pods (and sidecars).
    #[arg(long, default_value_t = 1000)]
    pods: usize,
    /// Percent of the pods whose http probe's target flips every second.
    #[arg(long, default_value_t = 1.0)]
    flip_percent: f64,
    /// Length of the flipping window, seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Length of the baseline (no sidecars) and idle windows, seconds.
    #[arg(long, default_value_t = 20)]
    idle_seconds: u64,
    #[arg(long, value_enum, default_value_t = ManagerKind::Podprobe)]
    manager: ManagerKind,
    #[arg(long, value_enum, default_value_t = Source::Api)]
    source: Source,
    /// Sidecar instances per host process (default: 1 up to 200 pods, else enough for 200
    /// processes).
    #[arg(long)]
    per_process: Option<usize>,
    /// Virtual-kubelet nodes the pods are spread over.
    #[arg(long, default_value_t = 10)]
    nodes: usize,
    /// Period of the flipped http probe, seconds.
    #[arg(long, default_value_t = 5)]
    http_period: u32,
    #[arg(long, default_value_t = 10)]
    tcp_period: u32,
    #[arg(long, default_value_t = 30)]
    exec_period: u32,
    /// Label of this build in the CSV (e.g. `before`).
    #[arg(long, default_value = "this")]
    build: String,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let per_process = args.per_process.unwrap_or(if args.pods <= 200 {
        1
    } else {
        args.pods.div_ceil(200)
    });
    let options = FleetOptions {
        pods: args.pods,
        flip_percent: args.flip_percent,
        seconds: args.seconds,
        idle_seconds: args.idle_seconds,
        manager: args.manager,
        source: args.source,
        sidecars_per_process: per_process,
        nodes: args.nodes,
        periods: Periods {
            http: args.http_period,
            tcp: args.tcp_period,
            exec: args.exec_period,
        },
        sidecar_host: binaries::build("podprobe-fleet", "podprobe-fleet-sidecars"),
        manager_binary: binaries::build("podprobe-manager", "podprobe-manager"),
    };
    eprintln!("bench_fleet: {options:?}");
    let report = match podprobe_fleet::run(&options).await {
        Ok(report) => report,
        Err(e) => {
            eprintln!("bench_fleet: {e}");
            std::process::exit(1);
        }
    };
    println!("{}", report.summary());
    let csv_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/perf/fleet.csv");
    let new_file = !csv_path.exists();
    let mut csv = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&csv_path)
        .expect("docs/perf/fleet.csv");
    if new_file {
        writeln!(csv, "build,pods,source,manager,per_process,flip_percent,flips,lost,marker_p50_ms,marker_p99_ms,status_patches_per_flip,marker_writes_per_flip,all_marked_s,baseline_api_cores,idle_api_cores,flip_api_cores,api_rss_mib,etcd_db_mib,idle_etcd_cores,flip_etcd_cores,idle_sidecar_cores,sidecar_rss_mib_per_pod,flip_manager_cores,manager_rss_mib,pod_watchers,patch_status_p99_ms").unwrap();
    }
    let o = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.1}"));
    let r = &report;
    writeln!(
        csv,
        "{},{},{:?},{:?},{},{},{},{},{},{},{:.3},{:.3},{:.1},{:.4},{:.4},{:.4},{:.0},{:.1},{:.4},{:.4},{:.4},{:.3},{:.4},{:.1},{:.0},{}",
        args.build, r.pods, r.source, r.manager, r.sidecars_per_process, r.flip_percent, r.flips,
        r.lost, o(r.marker_latency_p50_ms), o(r.marker_latency_p99_ms), r.status_patches_per_flip,
        r.marker_writes_per_flip, r.all_marked_seconds, r.baseline.apiserver_cpu_cores,
        r.idle.apiserver_cpu_cores, r.flipping.apiserver_cpu_cores, r.flipping.apiserver_rss_mib,
        r.flipping.etcd_db_mib, r.idle.etcd_cpu_cores, r.flipping.etcd_cpu_cores,
        r.idle.sidecars_cpu_cores, r.idle.sidecar_rss_mib_per_pod, r.flipping.manager_cpu_cores,
        r.flipping.manager_rss_mib, r.idle.pod_watchers, o(r.flipping.patch_status_p99_ms),
    )
    .unwrap();
    let jsonl_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/perf/fleet.jsonl");
    let mut jsonl = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&jsonl_path)
        .expect("docs/perf/fleet.jsonl");
    let record = serde_json::json!({"build": args.build, "report": report});
    writeln!(jsonl, "{record}").unwrap();
    println!("{}", serde_json::to_string(&report).unwrap());
}
