//! Renders the benchmarks' figures (`docs/perf/*.csv`, written by `bench_sidecar`,
//! `bench_probes` and podprobe-manager's `bench_manager`) as SVG plots next to them, for
//! `docs/performance.md`.
//!
//!     cargo run --example plot_perf
//!
//! A program, not a test. A missing CSV is reported and its plot skipped.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

type Plot = Result<(), Box<dyn std::error::Error>>;

fn perf_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/perf")
}

/// The rows of one of our CSV files (a header line, then comma-separated fields, no quoting).
fn rows(name: &str) -> Option<Vec<Vec<String>>> {
    let path = perf_dir().join(name);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: {e}; run its benchmark first", path.display());
            return None;
        }
    };
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
    Ok(())
}
