//! What the fleet tests share: a small fleet as the suite runs it (podprobe-manager from the
//! chart, the api source, an http probe of period 1 s flipping 5 % of the pods a second).

use podprobe_fleet::{ExecPath, FleetOptions, ManagerKind, Periods, Source};

/// `pods` pods over 4 nodes, `per_process` sidecar instances per host process, no outage;
/// the caller sets the flipping window's length.
pub fn small_fleet(pods: usize, per_process: usize, seconds: u64) -> FleetOptions {
    FleetOptions {
        pods,
        flip_percent: 5.0,
        seconds,
        idle_seconds: 5,
        manager: ManagerKind::Podprobe,
        source: Source::Api,
        sidecars_per_process: per_process,
        event_burst: podprobe::events::EventBudget::default().burst,
        nodes: 4,
        periods: Periods {
            http: 1,
            tcp: 5,
            exec: 5,
        },
        sidecar_host: env!("CARGO_BIN_EXE_podprobe-fleet-sidecars").into(),
        manager_binary: testkit::workspace::binary("podprobe-manager", "podprobe-manager"),
        outage: None,
        start_rate: None,
        chart_values: Vec::new(),
        exec: ExecPath::Local,
    }
}
