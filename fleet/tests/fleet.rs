//! The fleet benchmark at small N in the suite: 200 pods, each with its own sidecar instance
//! (the real sidecar code, 20 per process) and its own pod-bound token, watch and connection,
//! podprobe-manager installed by the chart, 5 % of the pods flipping their http probe every
//! second. The pods give their game container's command, so the chart's injection wraps it
//! with the exec agent: each pod's exec probe runs through its own real agent. Fails when a
//! flip's marker never shows, when a flip costs more than one status patch or more than one
//! marker write, when start-up costs more than one status patch per pod beyond the
//! conditions' first results, when an exec probe's condition is not True at the end (its
//! agent did not answer), when an idle sidecar writes anything or keeps reconnecting, or when
//! a sidecar holds more than its one connection to the apiserver. Like the real-node tests it needs the
//! shipped static binaries (built when missing), `setpriv` and, as root, a writable cgroup
//! filesystem (the agents' CPU is counted in a cgroup).

mod support;

use podprobe_fleet::ExecPath;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_flip_of_200_pods_is_one_status_patch_and_one_marker_write() {
    let options = podprobe_fleet::FleetOptions {
        exec: ExecPath::Agent,
        ..support::small_fleet(200, 20, 10)
    };
    let report = podprobe_fleet::run(&options)
        .await
        .unwrap_or_else(|e| panic!("fleet run: {e}"));
    eprintln!("{}", report.summary());
    assert!(
        report.flips >= 50,
        "too few flips to mean anything: {}",
        report.flips
    );
    assert_eq!(report.lost, 0, "flips lost or pods left wrong: {report:#?}");
    assert_eq!(
        report.unmarked_at_end, 0,
        "flips not marked by the end: {report:#?}"
    );
    assert_eq!(
        report.status_patches_per_flip_max, 1,
        "a flip cost more than one status patch"
    );
    assert_eq!(
        report.marker_writes_per_flip_max, 1,
        "a flip cost more than one marker write"
    );
    assert!(
        report.marker_latency_p99_ms.is_some(),
        "no marker latency measured"
    );
    // The sidecars never fall back from an agent that does not answer: a True exec condition
    // on every pod is every agent answering.
    assert_eq!(
        report.exec_not_true_at_end, 0,
        "exec probes not True at the end"
    );
    // Starting and reaping `true` costs the agents about a millisecond: far less than 0.1 ms
    // per expected attempt in the idle window is agents that stopped answering.
    let per_attempt = report.exec_agent_ms_per_attempt.unwrap_or_default();
    assert!(
        per_attempt > 0.1,
        "the agents' CPU in the idle window is {per_attempt:.3} ms per expected exec attempt: \
         they did not run the probes"
    );
    assert!(
        !report
            .flipping
            .requests_per_second
            .keys()
            .any(|k| k.ends_with("pods/exec")),
        "exec probes went through the apiserver: {:?}",
        report.flipping.requests_per_second
    );

    // Start-up: each pod's first results are transitions (three probes, each its condition);
    // a patch that carried none (refused, or nothing new) is what a retry storm is made of.
    let startup = report.startup_status_patches;
    assert!(
        startup.transitions >= 3 * report.pods,
        "{} condition transitions written at start-up for {} pods of three probes: {startup:?}",
        startup.transitions,
        report.pods
    );
    assert!(
        startup.beyond_transitions() <= report.pods,
        "more than one status patch per pod beyond the conditions' transitions at start-up: \
         {startup:?}"
    );

    // Idle: nothing changes, so a sidecar has nothing to write; its watch ends at most once
    // in a window much shorter than the watch's timeout, so more reads than pods is a loop.
    let idle = &report.idle_sidecar_requests;
    let writes: Vec<_> = idle
        .iter()
        .filter(|(what, _)| {
            !["get ", "list ", "watch "]
                .iter()
                .any(|r| what.starts_with(r))
        })
        .collect();
    assert!(writes.is_empty(), "idle sidecars wrote: {writes:?}");
    let reads: usize = idle.values().sum();
    assert!(
        reads <= report.pods,
        "{reads} requests from {} idle sidecars in {:.0} s (a reconnect loop?): {idle:?}",
        report.pods,
        report.idle.seconds
    );

    // One connection per sidecar, its watch's, which its writes share: idle and while flipping
    // (counted in the sidecars' processes; the apiserver's count also holds the bench's and
    // the manager's clients). Two sidecars in 200 of slack, not the half more per sidecar a
    // connection per write in flight gives.
    for (window, per) in [
        ("idle", report.idle_per_sidecar),
        ("flipping", report.flipping_per_sidecar),
    ] {
        let connections = per
            .unwrap_or_else(|| panic!("no footprint at the {window} window's end"))
            .sidecar_connections_per_sidecar;
        assert!(
            (0.99..=1.01).contains(&connections),
            "{connections:.3} apiserver connections per sidecar at the {window} window's end"
        );
    }
}
