//! `podprobe run`, the real binary, against the real kube-apiserver behind the fault proxy and
//! real local targets: faults (statuses, resets, ended watches, an outage) and the sidecar's
//! own sources and lifecycle. The write path as kube-apiserver counts it is `real_sidecar.rs`.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use support::*;
use testkit::Fault;

const LIMIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_never_lose_or_reorder_results() {
    let cluster = Cluster::start().await;
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "v0").unwrap();
    let annotation = array(&[file_probe("p", "c/p", &flag)]);
    let pod = cluster.create_pod("gs-f", &annotation, json!([])).await;
    let port = free_port();
    let _sidecar = cluster
        .sidecar(
            &pod,
            &[
                "--coalesce-window",
                "50ms",
                "--metrics-addr",
                &format!("127.0.0.1:{port}"),
            ],
        )
        .await;
    cluster
        .wait_pod("gs-f", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;

    let faults = cluster.proxy.faults();
    faults.add(
        Fault::status(500)
            .method("PATCH")
            .path_contains("/status")
            .times(3),
    );
    faults.add(
        Fault::reset()
            .method("PATCH")
            .path_contains("/status")
            .times(2),
    );
    faults.add(
        Fault::too_many_requests(1)
            .method("PATCH")
            .path_contains("/status")
            .times(2),
    );
    faults.add(Fault::end_watch_after(1).watch().times(1));
    std::fs::write(&flag, "v1").unwrap();
    std::fs::remove_file(&flag).unwrap();
    cluster
        .wait_pod("gs-f", LIMIT, |p| has_status(p, "c/p", "False"))
        .await;

    // The apiserver goes away for a while; the probe flips twice meanwhile.
    cluster.proxy.stop().await;
    std::fs::write(&flag, "v2").unwrap();
    // Let the sidecar probe v2 (and fail to write it) a few times before the next change.
    let seen = attempts(port, "c/p").await;
    wait_attempts(port, "c/p", seen + 3).await;
    std::fs::write(&flag, "v3").unwrap();
    cluster.proxy.restart().await.unwrap();
    let pod = cluster
        .wait_pod("gs-f", Duration::from_secs(90), |p| {
            condition(p, "c/p")
                .is_some_and(|c| c.status == "True" && c.message.as_deref() == Some("v3"))
        })
        .await;
    assert_eq!(
        condition(&pod, "c/p").unwrap().reason.as_deref(),
        Some("PodProbeSucceeded")
    );

    // Successful writes of c/p only ever moved forward through the states the probe had. The
    // proxy journals a write once the apiserver answers it, which can be after watchers saw
    // it: wait for the last one's entry.
    let written = || -> Vec<String> {
        cluster
            .proxy
            .journal()
            .matching("PATCH", "pods/status")
            .iter()
            .filter(|e| e.status == 200)
            .filter_map(|e| {
                let c = e.json()["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == "c/p")?
                    .clone();
                Some(format!(
                    "{}:{}",
                    c["status"].as_str()?,
                    c["message"].as_str()?.trim_end()
                ))
            })
            .collect()
    };
    wait_until(LIMIT, "the journal entry of the v3 write", || {
        written().iter().any(|w| w == "True:v3")
    })
    .await;
    let written = written();
    let order = ["True:v0", "True:v1", "False:down", "True:v2", "True:v3"];
    let positions: Vec<usize> = written
        .iter()
        .map(|w| {
            order
                .iter()
                .position(|o| o == w)
                .unwrap_or_else(|| panic!("unexpected write {w} in {written:?}"))
        })
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "writes went backwards or repeated: {written:?}"
    );
    assert_eq!(written.last().map(String::as_str), Some("True:v3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_annotation_changes_take_effect_without_restart() {
    let cluster = Cluster::start().await;
    let a = cluster.dir.path().join("a");
    let b = cluster.dir.path().join("b");
    std::fs::write(&a, "a-up").unwrap();
    std::fs::write(&b, "b-up").unwrap();
    let pod = cluster
        .create_pod("gs-l", &array(&[file_probe("a", "c/a", &a)]), json!([]))
        .await;
    let sidecar = cluster.sidecar(&pod, &[]).await;
    cluster
        .wait_pod("gs-l", LIMIT, |p| has_status(p, "c/a", "True"))
        .await;

    // Added.
    cluster
        .set_annotation(
            "gs-l",
            &array(&[file_probe("a", "c/a", &a), file_probe("b", "c/b", &b)]),
        )
        .await;
    cluster
        .wait_pod("gs-l", LIMIT, |p| has_status(p, "c/b", "True"))
        .await;

    // Edited: c/b now runs a probe that fails.
    let edited = json!({"name": "b", "containerName": "main",
        "probe": {"exec": {"command": ["sh", "-c", "echo edited >&2; exit 3"]}, "periodSeconds": 1},
        "podConditionType": "c/b"})
    .to_string();
    cluster
        .set_annotation(
            "gs-l",
            &array(&[file_probe("a", "c/a", &a), edited.clone()]),
        )
        .await;
    let pod = cluster
        .wait_pod("gs-l", LIMIT, |p| has_status(p, "c/b", "False"))
        .await;
    assert_eq!(
        condition(&pod, "c/b").unwrap().message.as_deref(),
        Some("edited\n")
    );

    // Removed: c/a stops being probed and its condition is left as it was.
    cluster
        .set_annotation("gs-l", &array(std::slice::from_ref(&edited)))
        .await;
    let stopped = async {
        while !sidecar.log().contains(r#"stopped=["c/a"]"#) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(LIMIT, stopped)
        .await
        .expect("c/a stopped");
    std::fs::remove_file(&a).unwrap();
    let pod: Pod = cluster.pods().get("gs-l").await.unwrap();
    assert!(has_status(&pod, "c/a", "True"));

    // Invalid JSON: the last good set (c/b failing) keeps running; a warning event is emitted.
    cluster.set_annotation("gs-l", "[{not json").await;
    let warned = async {
        loop {
            let events = cluster.proxy.journal().matching("POST", "events");
            if events.iter().any(|e| e.body.contains("PodProbeInvalid")) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(LIMIT, warned)
        .await
        .expect("PodProbeInvalid event");
    let ok = json!({"name": "b", "containerName": "main",
        "probe": {"exec": {"command": ["sh", "-c", "echo fixed"]}, "periodSeconds": 1},
        "podConditionType": "c/b"})
    .to_string();
    cluster.set_annotation("gs-l", &array(&[ok, r#"{"name":"bad","containerName":"main","probe":{"tcpSocket":{"port":70000}},"podConditionType":"c/bad"}"#.to_owned()])).await;
    let pod = cluster
        .wait_pod("gs-l", LIMIT, |p| has_status(p, "c/b", "True"))
        .await;
    assert!(
        condition(&pod, "c/a").is_some_and(|c| c.status == "True"),
        "removed probe's condition left alone"
    );
    assert!(condition(&pod, "c/bad").is_none());
    assert!(
        sidecar.log().contains("probe.tcpSocket.port"),
        "{}",
        sidecar.log()
    );
}

/// The file source has no watch, yet probes by the same container rules as the watch: it reads
/// its pod while the container has not started (the probe waits, past its initial delay), and
/// when a probe starts failing (its container may be down: the probe says so), until the
/// restarted container has started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_source_reads_its_containers_status_when_probing_needs_it() {
    let cluster = Cluster::start().await;
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "up").unwrap();
    let mut probe: serde_json::Value =
        serde_json::from_str(&file_probe("p", "c/p", &flag)).unwrap();
    probe["probe"]["initialDelaySeconds"] = json!(3);
    let annotation = array(&[probe.to_string()]);
    // Created, not yet reported by a kubelet: no container status.
    let mut pod = game_pod("gs-r", &annotation, json!([]));
    pod.spec.as_mut().unwrap().service_account_name = Some(SIDECAR_SA.to_owned());
    let pod = cluster
        .pods()
        .create(&Default::default(), &pod)
        .await
        .unwrap();
    let sidecar = cluster.file_source_sidecar(&pod, &annotation, &[]).await;
    let reads = || cluster.proxy.journal().count("GET", "pods/gs-r");
    // Reads at start, 1 s and 3 s later, and 7 s later: the probe's initial delay (from the
    // sidecar's start, were the status unknown) is long past, and it has not run.
    wait_until(LIMIT, "four reads of the pod", || reads() >= 4).await;
    let pod = cluster.pods().get("gs-r").await.unwrap();
    assert!(
        condition(&pod, "c/p").is_none(),
        "probed a container that has not started"
    );

    let started_at = jiff::Timestamp::now();
    cluster
        .kubelet_reports_started("gs-r", "containerd://main-1", started_at)
        .await;
    let pod = cluster
        .wait_pod("gs-r", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;
    assert_probed_after_initial_delay(&pod, "c/p", started_at, 3);
    let settled_reads = reads();

    // The container stops (the kubelet's whole-status update), and so its probe fails: the
    // failure asks for a read, which says why.
    let mut status = cluster.pods().get_status("gs-r").await.unwrap();
    status
        .status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0]
        .state = Some(serde_json::from_value(json!({"terminated": {"exitCode": 1}})).unwrap());
    cluster
        .pods()
        .replace_status("gs-r", &Default::default(), &status)
        .await
        .unwrap();
    std::fs::remove_file(&flag).unwrap();
    let pod = cluster
        .wait_pod("gs-r", LIMIT, |p| {
            condition(p, "c/p")
                .is_some_and(|c| c.message.as_deref() == Some("Container(main) is Non-running"))
        })
        .await;
    assert!(has_status(&pod, "c/p", "False"));
    assert!(reads() > settled_reads);

    // Restarted: read again until it has started; Unknown first, then the new container's
    // result (in the log: the two can fall in one write's coalescing window).
    std::fs::write(&flag, "up").unwrap();
    cluster
        .kubelet_reports_started("gs-r", "containerd://main-2", jiff::Timestamp::now())
        .await;
    sidecar
        .wait_log("state=Unknown container restarted", LIMIT)
        .await;
    cluster
        .wait_pod("gs-r", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;
}

/// A restart no probe fails on: in a real pod, a procfs exec into a container whose process is
/// gone cannot run (here the command itself goes): an errored attempt, state unchanged. The
/// error asks for a read, which shows the new container, and the probe starts over with
/// `Unknown`. Without that read the worker would stay on the old container for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_source_reads_its_pod_when_an_attempt_cannot_run() {
    use std::os::unix::fs::PermissionsExt;
    let cluster = Cluster::start().await;
    let script = cluster.dir.path().join("alive.sh");
    let install = || {
        std::fs::write(&script, "#!/bin/sh\necho alive\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    install();
    let annotation = array(&[json!({"name": "p", "containerName": "main",
        "probe": {"exec": {"command": [script.to_str().unwrap()]}, "periodSeconds": 1},
        "podConditionType": "c/p"})
    .to_string()]);
    let pod = cluster.create_pod("gs-e", &annotation, json!([])).await;
    let sidecar = cluster.file_source_sidecar(&pod, &annotation, &[]).await;
    cluster
        .wait_pod("gs-e", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;
    let reads = || cluster.proxy.journal().count("GET", "pods/gs-e");
    let settled_reads = reads();

    cluster
        .kubelet_reports_started("gs-e", "containerd://main-2", jiff::Timestamp::now())
        .await;
    std::fs::remove_file(&script).unwrap();
    sidecar
        .wait_log("state=Unknown container restarted", LIMIT)
        .await;
    assert!(reads() > settled_reads);
    let log = sidecar.log();
    assert!(log.contains("probe attempt errored"), "{log}");
    assert!(!log.contains("state=Failed"), "a probe failed:\n{log}");

    install();
    cluster
        .wait_pod("gs-e", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;
}

/// A file-source sidecar that may not read its pod (RBAC answers 403) says so once, stops
/// reading, and probes on without its containers' status: a probe failing later asks for a
/// read that is never made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_source_sidecar_that_may_not_read_its_pod_probes_on() {
    let cluster = Cluster::start().await;
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "up").unwrap();
    let annotation = array(&[file_probe("p", "c/p", &flag)]);
    let pod = cluster.create_pod("gs-d", &annotation, json!([])).await;
    cluster
        .proxy
        .faults()
        .add(Fault::status(403).method("GET").path_contains("pods/gs-d"));
    let port = free_port();
    let sidecar = cluster
        .file_source_sidecar(
            &pod,
            &annotation,
            &["--metrics-addr", &format!("127.0.0.1:{port}")],
        )
        .await;
    cluster
        .wait_pod("gs-d", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;
    sidecar.wait_log("may not read its pod", LIMIT).await;

    // The failure would ask for a read 2 s later; five attempts (a second apart) later, none
    // was made.
    std::fs::remove_file(&flag).unwrap();
    cluster
        .wait_pod("gs-d", LIMIT, |p| has_status(p, "c/p", "False"))
        .await;
    let failed_at = attempts(port, "c/p").await;
    wait_attempts(port, "c/p", failed_at + 5).await;
    assert_eq!(cluster.proxy.journal().count("GET", "pods/gs-d"), 1);
    let text = metrics(port).await.unwrap();
    assert!(
        text.lines()
            .any(|l| l == "podprobe_pod_status_reads_total 1"),
        "{text}"
    );
    assert_eq!(sidecar.log().matches("may not read its pod").count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_not_running_and_restarted() {
    let cluster = Cluster::start().await;
    let annotation = array(&[json!({"name": "p", "containerName": "main",
        "probe": {"exec": {"command": ["echo", "alive"]}, "periodSeconds": 1, "initialDelaySeconds": 3},
        "podConditionType": "c/p"})
    .to_string()]);
    let pod = cluster.create_pod("gs-c", &annotation, json!([])).await;
    let _sidecar = cluster.sidecar(&pod, &[]).await;
    cluster
        .wait_pod("gs-c", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;

    // The kubelet reports container `main` terminated (a whole-status update, as it writes one).
    let mut pod = cluster.pods().get_status("gs-c").await.unwrap();
    let main = &mut pod
        .status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0];
    main.state = Some(serde_json::from_value(json!({"terminated": {"exitCode": 1}})).unwrap());
    cluster
        .pods()
        .replace_status("gs-c", &Default::default(), &pod)
        .await
        .unwrap();
    let pod = cluster
        .wait_pod("gs-c", LIMIT, |p| has_status(p, "c/p", "False"))
        .await;
    assert_eq!(
        condition(&pod, "c/p").unwrap().message.as_deref(),
        Some("Container(main) is Non-running")
    );

    // A new container started just now: Unknown "container restarted" first, then, after its
    // initial delay, the new container's result.
    let restarted_at = jiff::Timestamp::now();
    cluster
        .kubelet_reports_started("gs-c", "containerd://main-2", restarted_at)
        .await;
    let pod = cluster
        .wait_pod("gs-c", LIMIT, |p| has_status(p, "c/p", "Unknown"))
        .await;
    let unknown = condition(&pod, "c/p").unwrap();
    assert_eq!(unknown.message.as_deref(), Some("container restarted"));
    assert_eq!(unknown.reason.as_deref(), Some("PodProbeUnknown"));
    let pod = cluster
        .wait_pod("gs-c", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;
    assert_probed_after_initial_delay(&pod, "c/p", restarted_at, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_source_follows_atomic_data_swaps() {
    let cluster = Cluster::start().await;
    let pod = cluster.create_pod("gs-file", "[]", json!([])).await;
    let uid = pod.metadata.uid.clone().unwrap();
    // The kubelet's layout: annotations -> ..data/annotations, ..data -> ..<timestamp>/
    let dir = cluster.dir.path().join("podinfo");
    std::fs::create_dir(&dir).unwrap();
    let write_version = |n: u32, annotation: &str| {
        let version = dir.join(format!("..2026_11_22_00_00_0{n}"));
        std::fs::create_dir(&version).unwrap();
        let mut map = std::collections::BTreeMap::new();
        map.insert("kruise.io/podprobe".to_owned(), annotation.to_owned());
        map.insert("other".to_owned(), "x\"y".to_owned());
        std::fs::write(
            version.join("annotations"),
            podprobe::annotation::format_downward_api(&map),
        )
        .unwrap();
        let tmp = dir.join("..data_tmp");
        std::os::unix::fs::symlink(version.file_name().unwrap(), &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("..data")).unwrap();
    };
    let first = array(&[json!({"name": "one", "containerName": "main",
        "probe": {"exec": {"command": ["echo", "one"]}, "periodSeconds": 1},
        "podConditionType": "c/one"})
    .to_string()]);
    write_version(1, &first);
    std::os::unix::fs::symlink("..data/annotations", dir.join("annotations")).unwrap();
    let file = dir.join("annotations");
    let port = free_port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let _sidecar = cluster
        .sidecar(
            &pod,
            &[
                "--source",
                "file",
                "--annotations-file",
                file.to_str().unwrap(),
                "--pod-uid",
                &uid,
                "--file-poll-interval",
                "1h",
                "--metrics-addr",
                &metrics_addr,
            ],
        )
        .await;
    cluster
        .wait_pod("gs-file", LIMIT, |p| has_status(p, "c/one", "True"))
        .await;

    let second = array(&[json!({"name": "two", "containerName": "main",
        "probe": {"exec": {"command": ["sh", "-c", "echo two <&- >&2; exit 1"]}, "periodSeconds": 1},
        "podConditionType": "c/two"})
    .to_string()]);
    write_version(2, &second);
    let pod = cluster
        .wait_pod("gs-file", LIMIT, |p| has_status(p, "c/two", "False"))
        .await;
    assert_eq!(
        condition(&pod, "c/two").unwrap().message.as_deref(),
        Some("two\n")
    );
    // Read once at start and once for the swap; none for its own reads or the old directory's
    // removal.
    let text = metrics(port).await.expect("/metrics");
    assert!(
        text.contains("podprobe_annotation_file_reads_total 2\n"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_flushes_a_pending_write_and_exits_0() {
    let cluster = Cluster::start().await;
    let (pod, flag) = cluster.create_flagged_pod("gs-t").await;
    let port = free_port();
    let mut sidecar = cluster
        .sidecar(
            &pod,
            &[
                "--coalesce-window",
                "700ms",
                "--metrics-addr",
                &format!("127.0.0.1:{port}"),
            ],
        )
        .await;
    cluster
        .wait_pod("gs-t", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;

    std::fs::remove_file(&flag).unwrap();
    // The sidecar has seen the failure (its state gauge says Failed) but its write waits in the
    // coalescing window: SIGTERM now.
    let seen = async {
        loop {
            if metrics(port).await.is_some_and(|m| {
                m.contains("podprobe_probe_state{probe=\"p\",condition=\"c/p\"} 0")
            }) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(LIMIT, seen)
        .await
        .expect("failure seen");
    let status = sidecar
        .terminate(Duration::from_secs(5))
        .expect("exited after SIGTERM");
    assert!(
        status.success(),
        "exit status {status:?}\n{}",
        sidecar.log()
    );
    let pod: Pod = cluster.pods().get("gs-t").await.unwrap();
    assert!(
        has_status(&pod, "c/p", "False"),
        "the pending write was flushed: {:?}",
        condition(&pod, "c/p")
    );
}

/// A kubeconfig no client can be built from (a `tls-server-name` that is no server name) is
/// logged with what is wrong and retried with backoff: the sidecar keeps running, as it would
/// once the configuration is fixed, instead of exiting into a crash loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_kubeconfig_is_retried_with_its_reason_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        r#"apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", tls-server-name: "not a server name!"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"#,
    )
    .unwrap();
    let mut sidecar = start_sidecar(dir.path(), &kubeconfig, "gs-0", &[]);
    sidecar
        .wait_log(
            r#"tls-server-name "not a server name!" is not a valid server name"#,
            Duration::from_secs(30),
        )
        .await;
    assert!(sidecar.log().contains("retrying in"), "{}", sidecar.log());
    assert!(
        sidecar.child.try_wait().unwrap().is_none(),
        "the sidecar exited: {}",
        sidecar.log()
    );
}

/// `condition_type`'s last probe came at least `delay_seconds` after the container's
/// `started_at` (whole seconds on the wire: the delay counts from the truncated second).
fn assert_probed_after_initial_delay(
    pod: &Pod,
    condition_type: &str,
    started_at: jiff::Timestamp,
    delay_seconds: i64,
) {
    let started = podprobe::condition::kube_time(started_at).0;
    let probed = condition(pod, condition_type)
        .unwrap()
        .last_probe_time
        .clone()
        .unwrap()
        .0;
    assert!(
        probed.duration_since(started).as_secs() >= delay_seconds,
        "probed before the initial delay from startedAt: {started} → {probed}"
    );
}
