//! Renders the benchmarks' figures (`docs/perf/*.csv`, written by `bench_sidecar`,
//! `bench_probes` and podprobe-manager's `bench_manager` and `bench_kruise_daemon`; `docs/perf/fleet.jsonl`, written by
//! podprobe-fleet's `bench_fleet`) as SVG plots next to them, for `docs/performance.md` and
//! `docs/scale.md`.
//!
//!     cargo run --example plot_perf
//!
//! A program, not a test. A missing CSV is reported and its plot skipped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde_json::Value;

type Plot = Result<(), Box<dyn std::error::Error>>;

fn perf_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/perf")
}

/// A figures file of `docs/perf/`, or `None` (said on stderr) when its benchmark has not run.
fn read_figures(name: &str) -> Option<String> {
    let path = perf_dir().join(name);
    std::fs::read_to_string(&path)
        .inspect_err(|e| eprintln!("{}: {e}; run its benchmark first", path.display()))
        .ok()
}

/// The rows of one of our CSV files (a header line, then comma-separated fields, no quoting).
fn rows(name: &str) -> Option<Vec<Vec<String>>> {
    let text = read_figures(name)?;
    Some(
        text.lines()
            .skip(1)
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.split(',').map(str::to_owned).collect())
            .collect(),
    )
}

fn number(row: &[String], i: usize) -> f64 {
    row[i].parse().unwrap_or(f64::NAN)
}

/// One line through `points`, with a title and axis names.
fn line_chart(file: &str, title: &str, x: &str, y: &str, points: &[(f64, f64)]) -> Plot {
    let path = perf_dir().join(file);
    let root = SVGBackend::new(&path, (640, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let x_max = points.iter().map(|p| p.0).fold(0.0, f64::max) * 1.05;
    let y_max = points.iter().map(|p| p.1).fold(0.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart.configure_mesh().x_desc(x).y_desc(y).draw()?;
    chart.draw_series(LineSeries::new(points.iter().copied(), &BLUE))?;
    chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, BLUE.filled())))?;
    root.present()?;
    println!("wrote {}", path.display());
    Ok(())
}

/// Several labelled lines through their points, with a legend.
fn lines_chart(
    file: &str,
    title: &str,
    x: &str,
    y: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Plot {
    let path = perf_dir().join(file);
    let root = SVGBackend::new(&path, (640, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let all = || series.iter().flat_map(|(_, points)| points.iter());
    let x_max = all().map(|p| p.0).fold(0.0, f64::max) * 1.05;
    let y_max = all().map(|p| p.1).fold(0.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart.configure_mesh().x_desc(x).y_desc(y).draw()?;
    for (n, (label, points)) in series.iter().enumerate() {
        let color = Palette99::pick(n).to_rgba();
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    println!("wrote {}", path.display());
    Ok(())
}

/// One bar per labelled value.
fn bar_chart(file: &str, title: &str, y: &str, bars: &[(String, f64)]) -> Plot {
    let path = perf_dir().join(file);
    let root = SVGBackend::new(&path, (640, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let y_max = bars.iter().map(|b| b.1).fold(0.0, f64::max) * 1.15;
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(labels.into_segmented(), 0.0..y_max)?;
    chart.configure_mesh().y_desc(y).draw()?;
    chart.draw_series(bars.iter().map(|(label, v)| {
        let start = SegmentValue::Exact(label);
        let end = SegmentValue::CenterOf(label);
        let mut bar = Rectangle::new([(start, 0.0), (end, *v)], BLUE.filled());
        bar.set_margin(0, 0, 8, 8);
        bar
    }))?;
    root.present()?;
    println!("wrote {}", path.display());
    Ok(())
}

fn main() -> Plot {
    if let Some(sidecar) = rows("sidecar.csv") {
        let by = |i: usize| -> Vec<(f64, f64)> {
            sidecar
                .iter()
                .map(|r| (number(r, 0), number(r, i)))
                .collect()
        };
        line_chart(
            "sidecar_rss.svg",
            "podprobe run: RSS by number of probes",
            "probes",
            "RSS (MiB)",
            &by(1),
        )?;
        line_chart(
            "sidecar_cpu.svg",
            "podprobe run: CPU by number of probes (period 1 s)",
            "probes",
            "CPU (ms per s)",
            &by(4),
        )?;
    }
    if let Some(probes) = rows("probe_cpu.csv") {
        let bars: Vec<(String, f64)> = probes
            .iter()
            .map(|r| (r[0].clone(), (number(r, 3) + number(r, 4)) * 1000.0))
            .collect();
        bar_chart(
            "probe_cpu.svg",
            "CPU per attempt by probe kind",
            "CPU (µs per attempt)",
            &bars,
        )?;
    }
    if let Some(manager) = rows("manager_markers.csv") {
        let rate: Vec<(f64, f64)> = manager
            .iter()
            .map(|r| (number(r, 0), number(r, 3)))
            .collect();
        let patches: Vec<(f64, f64)> = manager
            .iter()
            .map(|r| (number(r, 0), number(r, 4) / number(r, 1)))
            .collect();
        line_chart(
            "manager_rate.svg",
            "podprobe-manager: marker changes handled per second",
            "pods",
            "changes per second",
            &rate,
        )?;
        line_chart(
            "manager_patches.svg",
            "podprobe-manager: pod patches per condition change",
            "pods",
            "patches per change",
            &patches,
        )?;
    }
    kruise_daemon_plots()?;
    fleet_plots()
}

/// The mean of `column` by pod count (column 2) for each series `key` names, over every run.
fn means_by_pods(
    rows: &[Vec<String>],
    key: impl Fn(&[String]) -> String,
    column: usize,
) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut runs: BTreeMap<String, BTreeMap<u64, Vec<f64>>> = BTreeMap::new();
    for row in rows {
        runs.entry(key(row))
            .or_default()
            .entry(number(row, 2) as u64)
            .or_default()
            .push(number(row, column));
    }
    runs.into_iter()
        .map(|(name, by_pods)| {
            let points = by_pods
                .into_iter()
                .map(|(pods, v)| (pods as f64, v.iter().sum::<f64>() / v.len() as f64))
                .collect();
            (name, points)
        })
        .collect()
}

/// `kruise_daemon.csv` (podprobe-manager's `bench_kruise_daemon`): CPU per attempt by pod
/// count for each executor and handler, and each executor's memory.
fn kruise_daemon_plots() -> Plot {
    let Some(rows) = rows("kruise_daemon.csv") else {
        return Ok(());
    };
    lines_chart(
        "kruise_daemon_cpu.svg",
        "CPU per probe attempt on the node: kruise-daemon vs podprobe",
        "pods (one probe each, period 1 s)",
        "CPU (ms per attempt)",
        &means_by_pods(&rows, |r| format!("{} {}", r[0], r[1]), 6),
    )?;
    lines_chart(
        "kruise_daemon_memory.svg",
        "Executor memory on the node: kruise-daemon RSS vs the sidecars' sum",
        "pods",
        "memory (MiB)",
        &means_by_pods(&rows, |r| r[0].clone(), 9),
    )
}

/// `docs/perf/fleet.jsonl`: one `{"build", "report"}` object per bench_fleet run; the runs of
/// build `this` without an outage (an outage run's windows are cut short by it).
fn fleet_reports() -> Option<Vec<Value>> {
    let text = read_figures("fleet.jsonl")?;
    Some(
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["build"] == "this" && v["report"]["outage"].is_null())
            .map(|v| v["report"].clone())
            .collect(),
    )
}

/// `report[window][key]` as a number (0 when absent).
fn figure(report: &Value, window: &str, key: &str) -> f64 {
    report[window][key].as_f64().unwrap_or(0.0)
}

/// (pods, figure) of the 1 %-flip runs with this source and manager, by pods.
fn by_pods(
    reports: &[Value],
    source: &str,
    manager: &str,
    window: &str,
    key: &str,
) -> Vec<(f64, f64)> {
    let mut points: Vec<(f64, f64)> = reports
        .iter()
        .filter(|r| r["source"] == source && r["manager"] == manager && r["flip_percent"] == 1.0)
        .map(|r| (r["pods"].as_f64().unwrap_or(0.0), figure(r, window, key)))
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points
}

fn fleet_plots() -> Plot {
    let Some(reports) = fleet_reports() else {
        return Ok(());
    };
    let series = |label: &str, source: &str, manager: &str, window: &str, key: &str| {
        (
            label.to_owned(),
            by_pods(&reports, source, manager, window, key),
        )
    };
    let cpu = "apiserver_cpu_cores";
    lines_chart(
        "fleet_apiserver_cpu.svg",
        "kube-apiserver CPU by pods (podprobe-manager)",
        "pods",
        "cores",
        &[
            series("no sidecars", "api", "podprobe", "baseline", cpu),
            series("idle, --source api", "api", "podprobe", "idle", cpu),
            series("idle, --source file", "file", "podprobe", "idle", cpu),
            series("1 % flipping/s, api", "api", "podprobe", "flipping", cpu),
            series("1 % flipping/s, file", "file", "podprobe", "flipping", cpu),
        ],
    )?;
    let rss = "apiserver_rss_mib";
    lines_chart(
        "fleet_apiserver_rss.svg",
        "kube-apiserver memory by pods (podprobe-manager)",
        "pods",
        "RSS (MiB)",
        &[
            series("no sidecars", "api", "podprobe", "baseline", rss),
            series("idle, --source api", "api", "podprobe", "idle", rss),
            series("idle, --source file", "file", "podprobe", "idle", rss),
        ],
    )?;
    lines_chart(
        "fleet_manager.svg",
        "Manager CPU while 1 % of the pods flip per second",
        "pods",
        "cores",
        &[
            series(
                "podprobe-manager",
                "api",
                "podprobe",
                "flipping",
                "manager_cpu_cores",
            ),
            series(
                "kruise-manager",
                "api",
                "kruise",
                "flipping",
                "manager_cpu_cores",
            ),
        ],
    )?;
    // Latency by flip rate: the 1 000-pod podprobe-manager runs.
    let mut by_rate: Vec<&Value> = reports
        .iter()
        .filter(|r| r["pods"] == 1000 && r["source"] == "api" && r["manager"] == "podprobe")
        .collect();
    let rate = |r: &Value| r["flip_percent"].as_f64().unwrap_or(0.0) * 10.0;
    by_rate.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
    let latency = |label: &str, key: &str| {
        let points = by_rate
            .iter()
            .map(|r| (rate(r), r[key].as_f64().unwrap_or(0.0)))
            .collect();
        (label.to_owned(), points)
    };
    lines_chart(
        "fleet_latency.svg",
        "Status patch answered → marker seen, 1 000 pods",
        "flips per second",
        "ms",
        &[
            latency("p50", "marker_latency_p50_ms"),
            latency("p99", "marker_latency_p99_ms"),
        ],
    )
}
