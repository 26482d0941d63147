//! `podprobe run`, the real binary, against testkit's API server and real local targets.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use podprobe::demo::{GamePort, serve_health};
use serde_json::json;
use support::*;
use testkit::Fault;

const LIMIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_follow_exec_tcp_and_http_probes() {
    let cluster = Cluster::start().await;
    let flag = cluster.dir.path().join("idle");
    std::fs::write(&flag, "idle").unwrap();
    let mut game = GamePort::open(0).await.unwrap();
    let healthy = Arc::new(AtomicBool::new(true));
    let http = serve_health(healthy.clone()).await.unwrap();
    let annotation = array(&[
        file_probe("idle", "game.kruise.io/idle", &flag),
        json!({"name": "accepting", "containerName": "main",
               "probe": {"tcpSocket": {"port": game.addr.port()}, "periodSeconds": 1},
               "podConditionType": "game.kruise.io/accepting"})
        .to_string(),
        json!({"name": "healthy", "containerName": "main",
               "probe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1},
               "podConditionType": "game.kruise.io/healthy"})
        .to_string(),
    ]);
    let before = cluster.create_pod(
        "gs-0",
        &annotation,
        json!([{"name": "http", "containerPort": http.port()}]),
    );
    let kubelet_conditions = before.status.as_ref().unwrap().conditions.clone().unwrap();
    let sidecar = cluster.sidecar("gs-0", &[]);

    let pod = cluster
        .wait_pod("gs-0", LIMIT, |p| {
            has_status(p, "game.kruise.io/idle", "True")
                && has_status(p, "game.kruise.io/accepting", "True")
                && has_status(p, "game.kruise.io/healthy", "True")
        })
        .await;
    let idle = condition(&pod, "game.kruise.io/idle").unwrap().clone();
    assert_eq!(idle.reason.as_deref(), Some("PodProbeSucceeded"));
    assert_eq!(idle.message.as_deref(), Some("idle"));
    assert!(idle.last_probe_time.is_some() && idle.last_transition_time.is_some());
    let healthy_condition = condition(&pod, "game.kruise.io/healthy").unwrap();
    assert_eq!(
        healthy_condition.message.as_deref(),
        Some("ok: 3 players, tick 16ms")
    );
    for kubelet in &kubelet_conditions {
        assert_eq!(
            condition(&pod, &kubelet.type_),
            Some(kubelet),
            "kubelet's {} untouched",
            kubelet.type_
        );
    }

    // Only the message changes: written, lastTransitionTime kept.
    std::fs::write(&flag, "idle, map de_dust").unwrap();
    let pod = cluster
        .wait_pod("gs-0", LIMIT, |p| {
            condition(p, "game.kruise.io/idle")
                .is_some_and(|c| c.message.as_deref() == Some("idle, map de_dust"))
        })
        .await;
    let changed = condition(&pod, "game.kruise.io/idle").unwrap();
    assert_eq!(changed.status, "True");
    assert_eq!(changed.last_transition_time, idle.last_transition_time);

    // Each target goes down.
    std::fs::remove_file(&flag).unwrap();
    game.close();
    healthy.store(false, Ordering::Relaxed);
    let pod = cluster
        .wait_pod("gs-0", LIMIT, |p| {
            has_status(p, "game.kruise.io/idle", "False")
                && has_status(p, "game.kruise.io/accepting", "False")
                && has_status(p, "game.kruise.io/healthy", "False")
        })
        .await;
    let idle = condition(&pod, "game.kruise.io/idle").unwrap();
    assert_eq!(idle.reason.as_deref(), Some("PodProbeFailed"));
    assert_eq!(idle.message.as_deref(), Some("down\n"));
    assert!(
        condition(&pod, "game.kruise.io/accepting")
            .unwrap()
            .message
            .as_deref()
            .unwrap()
            .contains("connection refused")
    );
    assert_eq!(
        condition(&pod, "game.kruise.io/healthy")
            .unwrap()
            .message
            .as_deref(),
        Some("HTTP probe failed with statuscode: 503")
    );
    for kubelet in &kubelet_conditions {
        assert_eq!(condition(&pod, &kubelet.type_), Some(kubelet));
    }
    // Every write was a uid-guarded strategic merge of conditions only.
    for entry in cluster.api.journal().matching("PATCH", "pods/status") {
        assert!(
            entry
                .content_type
                .starts_with("application/strategic-merge-patch+json"),
            "{entry:?}"
        );
        let body = entry.json();
        assert_eq!(
            body["metadata"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            vec!["uid"]
        );
        assert_eq!(body["metadata"]["uid"], json!(before.metadata.uid));
        assert!(
            body["status"]
                .as_object()
                .unwrap()
                .keys()
                .all(|k| k == "conditions"),
            "{body}"
        );
    }
    drop(sidecar);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_state_writes_nothing_and_a_transition_writes_once() {
    let cluster = Cluster::start().await;
    let flags: Vec<_> = (0..3)
        .map(|i| {
            let f = cluster.dir.path().join(format!("flag-{i}"));
            std::fs::write(&f, "up").unwrap();
            f
        })
        .collect();
    let annotation = array(
        &flags
            .iter()
            .enumerate()
            .map(|(i, f)| file_probe(&format!("p{i}"), &format!("c/{i}"), f))
            .collect::<Vec<_>>(),
    );
    cluster.create_pod("steady", &annotation, json!([]));
    let port = free_port();
    let _sidecar = cluster.sidecar("steady", &["--metrics-addr", &format!("127.0.0.1:{port}")]);
    cluster
        .wait_pod("steady", LIMIT, |p| {
            (0..3).all(|i| has_status(p, &format!("c/{i}"), "True"))
        })
        .await;
    let start_attempts = attempts(port, "c/0").await;
    let writes = cluster.status_patches();
    assert!(
        writes <= 3,
        "initial results: at most one write per probe, got {writes}"
    );

    // 30 periods of identical results: not one write.
    wait_attempts(port, "c/0", start_attempts + 30).await;
    assert_eq!(
        cluster.status_patches(),
        writes,
        "steady state must not write"
    );

    // One transition: exactly one write.
    std::fs::remove_file(&flags[1]).unwrap();
    cluster
        .wait_pod("steady", LIMIT, |p| has_status(p, "c/1", "False"))
        .await;
    let after = attempts(port, "c/1").await;
    wait_attempts(port, "c/1", after + 3).await;
    assert_eq!(cluster.status_patches(), writes + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_named_replacement_pod_is_never_written() {
    let cluster = Cluster::start().await;
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "up").unwrap();
    let annotation = array(&[file_probe("p", "c/p", &flag)]);
    let old = cluster.create_pod("gs-r", &annotation, json!([]));
    let old_uid = old.metadata.uid.clone().unwrap();
    // The file source does not follow the pod, so the sidecar keeps writing as the old pod.
    let annotations = cluster.dir.path().join("annotations");
    std::fs::write(
        &annotations,
        format!(
            "kruise.io/podprobe={}",
            podprobe::annotation::go_quote(&annotation)
        ),
    )
    .unwrap();
    let sidecar = cluster.sidecar(
        "gs-r",
        &[
            "--source",
            "file",
            "--annotations-file",
            annotations.to_str().unwrap(),
            "--pod-uid",
            &old_uid,
        ],
    );
    cluster
        .wait_pod("gs-r", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;

    // The pod is replaced by a same-named one (new uid), then the probe flips.
    cluster
        .pods()
        .delete("gs-r", &kube::api::DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let new = cluster.create_pod("gs-r", &annotation, json!([]));
    assert_ne!(new.metadata.uid.as_deref(), Some(old_uid.as_str()));
    let rejected_before = conflicts(&cluster);
    std::fs::remove_file(&flag).unwrap();
    let wait = async {
        while conflicts(&cluster) == rejected_before {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(LIMIT, wait)
        .await
        .expect("the old sidecar tried to write");
    let pod: Pod = cluster.pods().get("gs-r").await.unwrap();
    assert!(
        condition(&pod, "c/p").is_none(),
        "the replacement pod got the old pod's condition"
    );
    assert!(sidecar.log().contains("uid differs"), "{}", sidecar.log());
}

fn conflicts(cluster: &Cluster) -> usize {
    cluster
        .api
        .journal()
        .matching("PATCH", "pods/status")
        .iter()
        .filter(|e| e.status == 422) // the uid guard, as kube-apiserver answers it
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_never_lose_or_reorder_results() {
    let cluster = Cluster::start().await;
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "v0").unwrap();
    let annotation = array(&[file_probe("p", "c/p", &flag)]);
    cluster.create_pod("gs-f", &annotation, json!([]));
    let port = free_port();
    let _sidecar = cluster.sidecar(
        "gs-f",
        &[
            "--coalesce-window",
            "50ms",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ],
    );
    cluster
        .wait_pod("gs-f", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;

    let faults = cluster.api.faults();
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
    cluster.api.stop().await;
    std::fs::write(&flag, "v2").unwrap();
    // Let the sidecar probe v2 (and fail to write it) a few times before the next change.
    let seen = attempts(port, "c/p").await;
    wait_attempts(port, "c/p", seen + 3).await;
    std::fs::write(&flag, "v3").unwrap();
    cluster.api.restart().await.unwrap();
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

    // Successful writes of c/p only ever moved forward through the states the probe had.
    let written: Vec<String> = cluster
        .api
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
        .collect();
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
    cluster.create_pod("gs-l", &array(&[file_probe("a", "c/a", &a)]), json!([]));
    let sidecar = cluster.sidecar("gs-l", &[]);
    cluster
        .wait_pod("gs-l", LIMIT, |p| has_status(p, "c/a", "True"))
        .await;

    // Added.
    cluster.set_annotation(
        "gs-l",
        &array(&[file_probe("a", "c/a", &a), file_probe("b", "c/b", &b)]),
    );
    cluster
        .wait_pod("gs-l", LIMIT, |p| has_status(p, "c/b", "True"))
        .await;

    // Edited: c/b now runs a probe that fails.
    let edited = json!({"name": "b", "containerName": "main",
        "probe": {"exec": {"command": ["sh", "-c", "echo edited >&2; exit 3"]}, "periodSeconds": 1},
        "podConditionType": "c/b"})
    .to_string();
    cluster.set_annotation(
        "gs-l",
        &array(&[file_probe("a", "c/a", &a), edited.clone()]),
    );
    let pod = cluster
        .wait_pod("gs-l", LIMIT, |p| has_status(p, "c/b", "False"))
        .await;
    assert_eq!(
        condition(&pod, "c/b").unwrap().message.as_deref(),
        Some("edited\n")
    );

    // Removed: c/a stops being probed and its condition is left as it was.
    cluster.set_annotation("gs-l", &array(std::slice::from_ref(&edited)));
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
    cluster.set_annotation("gs-l", "[{not json");
    let warned = async {
        loop {
            let events = cluster.api.journal().matching("POST", "events");
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
    cluster.set_annotation("gs-l", &array(&[ok, r#"{"name":"bad","containerName":"main","probe":{"tcpSocket":{"port":70000}},"podConditionType":"c/bad"}"#.to_owned()]));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_not_running_and_restarted() {
    let cluster = Cluster::start().await;
    let annotation = array(&[json!({"name": "p", "containerName": "main",
        "probe": {"exec": {"command": ["echo", "alive"]}, "periodSeconds": 1, "initialDelaySeconds": 3},
        "podConditionType": "c/p"})
    .to_string()]);
    cluster.create_pod("gs-c", &annotation, json!([]));
    let _sidecar = cluster.sidecar("gs-c", &[]);
    cluster
        .wait_pod("gs-c", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;

    cluster
        .api
        .update_pod_status(NS, "gs-c", |status| {
            let main = &mut status.container_statuses.as_mut().unwrap()[0];
            main.state =
                Some(serde_json::from_value(json!({"terminated": {"exitCode": 1}})).unwrap());
        })
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
    cluster.kubelet_reports_started("gs-c", "containerd://main-2", restarted_at);
    let pod = cluster
        .wait_pod("gs-c", LIMIT, |p| has_status(p, "c/p", "Unknown"))
        .await;
    let unknown = condition(&pod, "c/p").unwrap();
    assert_eq!(unknown.message.as_deref(), Some("container restarted"));
    assert_eq!(unknown.reason.as_deref(), Some("PodProbeUnknown"));
    let pod = cluster
        .wait_pod("gs-c", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;
    // startedAt has whole-second precision, so the delay counts from the truncated second.
    let started = podprobe::condition::kube_time(restarted_at).0;
    let probed = condition(&pod, "c/p")
        .unwrap()
        .last_probe_time
        .clone()
        .unwrap()
        .0;
    assert!(
        probed.duration_since(started).as_secs() >= 3,
        "probed before the initial delay: {started} → {probed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_source_follows_atomic_data_swaps() {
    let cluster = Cluster::start().await;
    let pod = cluster.create_pod("gs-file", "[]", json!([]));
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
    let _sidecar = cluster.sidecar(
        "gs-file",
        &[
            "--source",
            "file",
            "--annotations-file",
            file.to_str().unwrap(),
            "--pod-uid",
            &uid,
            "--file-poll-interval",
            "1h",
        ],
    );
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_flushes_a_pending_write_and_exits_0() {
    let cluster = Cluster::start().await;
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "up").unwrap();
    cluster.create_pod("gs-t", &array(&[file_probe("p", "c/p", &flag)]), json!([]));
    let port = free_port();
    let mut sidecar = cluster.sidecar(
        "gs-t",
        &[
            "--coalesce-window",
            "700ms",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ],
    );
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
