//! The fleet benchmark on the real control plane (see `podprobe_fleet` and docs/scale.md):
//!
//!     cargo run --release -p podprobe-fleet --example bench_fleet -- \
//!         --pods 1000 --flip-percent 1 --seconds 60 --manager podprobe --source api
//!
//! With `--outage apiserver|etcd [--outage-after 30] [--outage-seconds 20]` it kills one of
//! them during the flips and measures the recovery (docs/scale.md, "Outages").
//!
//! It builds `podprobe-fleet-sidecars` in its own profile (`testkit::workspace::binary`) and
//! runs the shipped static `podprobe-manager` (`--manager-build`), prints a summary, appends the whole report to
//! docs/perf/fleet.jsonl (what `cargo run --example plot_perf` plots), and prints the report
//! as one JSON object on its last line. A program that prints figures, not a test.

use std::io::Write;
use std::path::Path;

use clap::Parser;
use std::time::Duration;

use podprobe_fleet::outage::RECOVERY_WINDOW;
use podprobe_fleet::{ExecPath, Fault, FleetOptions, ManagerKind, OutagePlan, Periods, Source};

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
    /// Each sidecar's Events burst (`podprobe run --event-burst`; default as the sidecar's, 25).
    /// A burst no run can spend stands in for the sidecar before its Events had a budget.
    #[arg(long, default_value = "25")]
    event_burst: std::num::NonZeroU32,
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
    /// Kill kube-apiserver or etcd during the flips and start it again (docs/scale.md, "Outages").
    #[arg(long, value_enum)]
    outage: Option<Fault>,
    /// Seconds from the first flip to the kill.
    #[arg(long, default_value_t = 30)]
    outage_after: u64,
    /// Seconds from the kill to starting it again. The flipping window is lengthened to
    /// cover the outage and the minute after recovery.
    #[arg(long, default_value_t = 20)]
    outage_seconds: u64,
    /// Which podprobe-manager binary runs: `shipped`, the static (musl) binary the image
    /// holds (hack/build-static.sh), or `release`, this host's release build (glibc's
    /// allocator; the figures before the shipped one was measured).
    #[arg(long, value_enum, default_value_t = ManagerBuild::Shipped)]
    manager_build: ManagerBuild,
    /// Start at most this many sidecars a second (one host process at a time), as a fleet's
    /// controllers and nodes pace its pods; unset, every sidecar starts at once.
    #[arg(long)]
    start_rate: Option<std::num::NonZeroU32>,
    /// A value of podprobe's chart, `KEY=VALUE` as `helm install --set` takes it (repeatable),
    /// e.g. `flowControl.enabled=false` for the fleet without its own priority level.
    #[arg(long = "chart-set", value_name = "KEY=VALUE")]
    chart_set: Vec<String>,
    /// Where the exec probe runs: `local`, in the sidecars (the pods on virtual-kubelet Node
    /// objects, nothing to enter); `agent`, through the exec agent the chart's defaults wrap
    /// the game container with (the pods on kubelet Node objects, giving their command; one
    /// real agent per pod, the shipped static binary).
    #[arg(long, value_enum, default_value_t = ExecPath::Local)]
    exec: ExecPath,
    /// Label of this build in the CSV (e.g. `before`).
    #[arg(long, default_value = "this")]
    build: String,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ManagerBuild {
    Shipped,
    Release,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let per_process = args.per_process.unwrap_or(if args.pods <= 200 {
        1
    } else {
        args.pods.div_ceil(200)
    });
    let outage = args.outage.map(|fault| OutagePlan {
        fault,
        after: Duration::from_secs(args.outage_after),
        length: Duration::from_secs(args.outage_seconds),
        recovery_window: RECOVERY_WINDOW,
    });
    // Flips go on through the outage and the minute after recovery (plus restart time).
    let seconds = match outage {
        Some(_) => args
            .seconds
            .max(args.outage_after + args.outage_seconds + RECOVERY_WINDOW.as_secs() + 10),
        None => args.seconds,
    };
    let options = FleetOptions {
        pods: args.pods,
        flip_percent: args.flip_percent,
        seconds,
        idle_seconds: args.idle_seconds,
        manager: args.manager,
        source: args.source,
        sidecars_per_process: per_process,
        event_burst: args.event_burst,
        nodes: args.nodes,
        periods: Periods {
            http: args.http_period,
            tcp: args.tcp_period,
            exec: args.exec_period,
        },
        sidecar_host: testkit::workspace::binary("podprobe-fleet", "podprobe-fleet-sidecars"),
        manager_binary: match args.manager_build {
            ManagerBuild::Shipped => testkit::real::node::images::shipped_binaries()
                .unwrap_or_else(|e| panic!("the shipped binaries: {e}"))
                .join("podprobe-manager"),
            ManagerBuild::Release => {
                testkit::workspace::binary("podprobe-manager", "podprobe-manager")
            }
        },
        outage,
        start_rate: args.start_rate,
        chart_values: args.chart_set.clone(),
        exec: args.exec,
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
    let jsonl_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/perf/fleet.jsonl");
    let mut jsonl = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&jsonl_path)
        .expect("docs/perf/fleet.jsonl");
    let manager_build = format!("{:?}", args.manager_build).to_lowercase();
    // When and how it was produced, so a figure quoted from the file can be traced.
    let command: Vec<String> = std::env::args().skip(1).collect();
    let record = serde_json::json!({"date": jiff::Timestamp::now().to_string(),
            "command": command.join(" "),
            "build": args.build, "manager_build": manager_build,
            "start_rate": args.start_rate, "chart_set": args.chart_set,
            "periods": options.periods, "report": report});
    writeln!(jsonl, "{record}").unwrap();
    println!("{}", serde_json::to_string(&report).unwrap());
}
