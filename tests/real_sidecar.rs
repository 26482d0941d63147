//! `podprobe run`, the real binary, against a real kube-apiserver and etcd (testkit::real),
//! authenticated as in a pod: a token of the example's ServiceAccount bound to its pod, with
//! exactly the Role of `examples/sidecar-by-hand.yaml`. What the sidecar sent is read back from
//! the apiserver's own audit log and metrics.

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use kube::api::{DeleteParams, Patch, PatchParams};
use podprobe::demo::{GamePort, serve_health};
use serde_json::json;
use support::*;
use testkit::real::usage::{Connection, connections};

const LIMIT: Duration = Duration::from_secs(60);

/// The kubelet's conditions are exactly as they were: podprobe's merges leave them alone.
fn assert_kubelets_untouched(pod: &Pod, kubelet_conditions: &[PodCondition]) {
    for kubelet in kubelet_conditions {
        assert_eq!(
            condition(pod, &kubelet.type_),
            Some(kubelet),
            "kubelet's {} untouched",
            kubelet.type_
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_follow_exec_tcp_and_http_probes_with_a_pod_bound_token() {
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
    let before = cluster
        .create_pod(
            "gs-0",
            &annotation,
            json!([{"name": "http", "containerPort": http.port()}]),
        )
        .await;
    let kubelet_conditions = before.status.as_ref().unwrap().conditions.clone().unwrap();
    let sidecar = cluster.sidecar(&before, &[]).await;

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
    assert_kubelets_untouched(&pod, &kubelet_conditions);

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
    assert_kubelets_untouched(&pod, &kubelet_conditions);

    // What the apiserver received: uid-guarded patches of conditions only, from a token that
    // carries this pod's name and uid, all accepted.
    let uid = before.metadata.uid.clone().unwrap();
    let writes = cluster.sidecar_status_writes("gs-0");
    assert!(writes.len() >= 2, "{writes:?}");
    for write in &writes {
        assert_eq!(write.code(), 200, "{write:?}");
        let extra = &write.user.extra;
        assert_eq!(
            extra.get("authentication.kubernetes.io/pod-name"),
            Some(&vec!["gs-0".to_owned()])
        );
        assert_eq!(
            extra.get("authentication.kubernetes.io/pod-uid"),
            Some(&vec![uid.clone()])
        );
        let body = write.request_object.as_ref().expect("request body audited");
        assert_eq!(body["metadata"], json!({"uid": uid}), "{body}");
        let status = body["status"].as_object().unwrap();
        assert!(status.keys().all(|k| k == "conditions"), "{body}");
    }

    // Its events passed the real events.k8s.io/v1 validation.
    let reasons: Vec<String> = cluster
        .events()
        .await
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    for reason in ["KruiseProbeSucceeded", "KruiseProbeFailed"] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "{reason} in {reasons:?}"
        );
    }
    // Nothing refused, but the exec mode's own discovery: `auto` tries pods/exec, which the
    // example's Role does not grant, and falls back to running the command locally. (A 429 is
    // the apiserver's flow control on a loaded machine, retried: not a refusal.)
    let refused = cluster.audit_by_sidecar(|e| {
        e.code() >= 400 && e.code() != 429 && !e.is("get", "pods/exec", None)
    });
    assert!(refused.is_empty(), "refused requests: {refused:#?}");
    assert!(
        sidecar.log().contains("falling back to local"),
        "{}",
        sidecar.log()
    );
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
    let pod = cluster.create_pod("steady", &annotation, json!([])).await;
    let port = free_port();
    let _sidecar = cluster
        .sidecar(&pod, &["--metrics-addr", &format!("127.0.0.1:{port}")])
        .await;
    cluster
        .wait_pod("steady", LIMIT, |p| {
            (0..3).all(|i| has_status(p, &format!("c/{i}"), "True"))
        })
        .await;
    let start_attempts = attempts(port, "c/0").await;
    // One attempt later every write of the initial results has been answered.
    wait_attempts(port, "c/0", start_attempts + 1).await;
    let writes = cluster.sidecar_status_writes("steady").len();
    assert!(
        (1..=3).contains(&writes),
        "initial results: at most one write per probe, got {writes}"
    );
    let metric_before = cluster
        .cp
        .request_count("PATCH", "pods", "status")
        .await
        .unwrap();

    // 20 periods of identical results: not one write.
    wait_attempts(port, "c/0", start_attempts + 20).await;
    assert_eq!(
        cluster.sidecar_status_writes("steady").len(),
        writes,
        "steady state must not write"
    );

    // One transition: exactly one write, as the audit log and the apiserver's metrics count.
    std::fs::remove_file(&flags[1]).unwrap();
    cluster
        .wait_pod("steady", LIMIT, |p| has_status(p, "c/1", "False"))
        .await;
    let after = attempts(port, "c/1").await;
    wait_attempts(port, "c/1", after + 3).await;
    assert_eq!(cluster.sidecar_status_writes("steady").len(), writes + 1);
    let metric_after = cluster
        .cp
        .request_count("PATCH", "pods", "status")
        .await
        .unwrap();
    assert_eq!(
        metric_after - metric_before,
        1,
        "apiserver_request_total{{verb=PATCH,resource=pods,subresource=status}}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apiserver_refuses_a_whole_status_patch_for_one_unqualified_condition_type() {
    // The premise of the next test, shown on the real server: one condition type that is not
    // a qualified name makes kube-apiserver reject every condition of the patch with 422.
    let cluster = Cluster::start().await;
    cluster.create_pod("premise", "[]", json!([])).await;
    let patch = json!({"status": {"conditions": [
        {"type": "game.kruise.io/fine", "status": "True"},
        {"type": "not a qualified name!", "status": "True"}
    ]}});
    let error = cluster
        .pods()
        .patch_status(
            "premise",
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
        .expect_err("the apiserver must refuse it");
    let kube::Error::Api(status) = error else {
        panic!("{error:?}")
    };
    assert_eq!(status.code, 422, "{status:?}");
    println!(
        "kube-apiserver: {}",
        serde_json::to_string(&status).unwrap()
    );
    assert!(
        status.message.contains("not a qualified name!"),
        "{}",
        status.message
    );
    let pod: Pod = cluster.pods().get("premise").await.unwrap();
    assert!(condition(&pod, "game.kruise.io/fine").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_with_an_unqualified_condition_type_is_invalid_and_holds_back_nothing() {
    let cluster = Cluster::start().await;
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "up").unwrap();
    let annotation = array(&[
        file_probe("bad", "not a qualified name!", &flag),
        file_probe("good", "game.kruise.io/good", &flag),
    ]);
    let pod = cluster.create_pod("gs-q", &annotation, json!([])).await;
    let sidecar = cluster.sidecar(&pod, &[]).await;
    cluster
        .wait_pod("gs-q", LIMIT, |p| {
            has_status(p, "game.kruise.io/good", "True")
        })
        .await;
    assert!(
        sidecar.log().contains("is not a qualified name"),
        "{}",
        sidecar.log()
    );
    let invalid = cluster
        .events()
        .await
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("PodProbeInvalid"))
        .expect("a PodProbeInvalid event");
    assert!(
        invalid
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("not a qualified name"),
        "{invalid:?}"
    );
    let refused = cluster.audit_by_sidecar(|e| e.code() == 422);
    assert!(refused.is_empty(), "{refused:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_named_replacement_pod_is_never_written() {
    let cluster = Cluster::start().await;
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "up").unwrap();
    let annotation = array(&[file_probe("p", "c/p", &flag)]);
    let old = cluster.create_pod("gs-r", &annotation, json!([])).await;
    let old_uid = old.metadata.uid.clone().unwrap();
    // A pod-bound token dies with its pod (that case is the next test); a plain token of the
    // same account shows the uid precondition alone, and the sidecar keeps writing as the old
    // pod.
    let sidecar = cluster.sidecar_outliving(&old, &annotation).await;
    cluster
        .wait_pod("gs-r", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;

    cluster.delete_now("gs-r").await;
    let new = cluster.create_pod("gs-r", &annotation, json!([])).await;
    assert_ne!(new.metadata.uid.as_deref(), Some(old_uid.as_str()));
    std::fs::remove_file(&flag).unwrap();
    // A PATCH carries no preconditions: kube-apiserver refuses the differing uid in the body
    // as a change of an immutable field (422), where a precondition would give 409.
    let refused = cluster
        .wait_audit("the old sidecar's refused write", LIMIT, |e| {
            e.is("patch", "pods/status", Some("gs-r")) && e.code() == 422
        })
        .await;
    assert!(refused.user.username.ends_with(SIDECAR_SA), "{refused:?}");
    let pod: Pod = cluster.pods().get("gs-r").await.unwrap();
    assert!(
        condition(&pod, "c/p").is_none(),
        "the replacement pod got the old pod's condition"
    );
    sidecar.wait_log("uid differs", LIMIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pods_token_stops_working_and_the_sidecar_says_why() {
    let cluster = Cluster::start().await;
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "up").unwrap();
    let annotation = array(&[file_probe("p", "c/p", &flag)]);
    let pod = cluster.create_pod("gs-t", &annotation, json!([])).await;
    let sidecar = cluster.file_source_sidecar(&pod, &annotation, &[]).await;
    cluster
        .wait_pod("gs-t", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;
    cluster.delete_now("gs-t").await;
    std::fs::remove_file(&flag).unwrap();
    sidecar
        .wait_log(
            "a pod-bound token stops working when its pod is deleted",
            LIMIT,
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_is_a_404_to_a_token_not_bound_to_it_and_the_sidecar_says_why() {
    let cluster = Cluster::start().await;
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "up").unwrap();
    let annotation = array(&[file_probe("p", "c/p", &flag)]);
    let pod = cluster.create_pod("gs-g", &annotation, json!([])).await;
    // A token not bound to the pod outlives it, so the write reaches the pod's lookup.
    let sidecar = cluster.sidecar_outliving(&pod, &annotation).await;
    cluster
        .wait_pod("gs-g", LIMIT, |p| has_status(p, "c/p", "True"))
        .await;
    cluster.delete_now("gs-g").await;
    std::fs::remove_file(&flag).unwrap();
    cluster
        .wait_audit("the write to the deleted pod", LIMIT, |e| {
            e.is("patch", "pods/status", Some("gs-g")) && e.code() == 404
        })
        .await;
    sidecar.wait_log("the pod no longer exists", LIMIT).await;
    assert!(!sidecar.log().contains("panicked"), "{}", sidecar.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_its_pod_is_deleted_the_sidecar_idles_unready_until_sigterm() {
    let cluster = Cluster::start().await;
    let ProbedPod {
        mut sidecar,
        metrics_port: port,
        ..
    } = cluster.probed_pod("gs-x", "c/p").await;
    assert_eq!(status_code(port, "/readyz").await, Some(200));

    cluster.delete_now("gs-x").await;
    sidecar.wait_log("pod deleted; stopping", LIMIT).await;
    sidecar.wait_log("stopped probing", LIMIT).await;
    assert_eq!(
        status_code(port, "/readyz").await,
        Some(503),
        "not probing: not ready"
    );
    assert_eq!(status_code(port, "/healthz").await, Some(200), "alive");
    // A loop polling its ended pod source burns a whole core; idle, the sidecar uses next to
    // nothing. CPU use is a rate, so it takes a window of time to observe.
    let before = cpu_time(sidecar.pid());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = cpu_time(sidecar.pid()) - before;
    assert!(
        used < Duration::from_millis(200),
        "{used:?} of CPU in 2 s after the pod was deleted"
    );
    let status = sidecar
        .terminate(Duration::from_secs(5))
        .expect("exited after SIGTERM");
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminating_pod_is_no_longer_probed_and_sigterm_exits_0() {
    let cluster = Cluster::start().await;
    let ProbedPod {
        mut sidecar,
        metrics_port: port,
        flag,
        ..
    } = cluster.probed_pod("gs-d", "c/p").await;

    // A graceful delete of a pod on a node: the real apiserver keeps it, with a
    // deletionTimestamp, until the kubelet confirms.
    cluster
        .pods()
        .delete("gs-d", &DeleteParams::default())
        .await
        .unwrap();
    sidecar
        .wait_log("stopped probing: the pod is terminating", LIMIT)
        .await;
    let frozen = attempts(port, "c/p").await;
    let writes = cluster.sidecar_status_writes("gs-d").len();
    std::fs::remove_file(&flag).unwrap();
    // Absence over time can only be observed by letting time pass: 3 periods.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        attempts(port, "c/p").await,
        frozen,
        "no attempts after termination began"
    );
    assert_eq!(cluster.sidecar_status_writes("gs-d").len(), writes);
    let pod: Pod = cluster.pods().get("gs-d").await.unwrap();
    assert!(pod.metadata.deletion_timestamp.is_some());
    assert!(has_status(&pod, "c/p", "True"));
    let status = sidecar
        .terminate(Duration::from_secs(5))
        .expect("exited after SIGTERM");
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_patch_rights_the_sidecar_explains_the_403_and_keeps_probing() {
    let cluster = Cluster::start().await;
    // An account that may read pods but not write their status.
    cluster
        .cp
        .create_service_account(NS, "read-only")
        .await
        .unwrap();
    let mut kubectl = cluster.cp.kubectl().unwrap();
    let out = kubectl
        .args([
            "-n",
            NS,
            "create",
            "role",
            "read-pods",
            "--verb=get,list,watch",
            "--resource=pods",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cluster
        .cp
        .kubectl()
        .unwrap()
        .args([
            "-n",
            NS,
            "create",
            "rolebinding",
            "read-pods",
            "--role=read-pods",
        ])
        .arg(format!("--serviceaccount={NS}:read-only"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "up").unwrap();
    let pod = cluster
        .create_pod_as(
            "gs-x",
            &array(&[file_probe("p", "c/p", &flag)]),
            json!([]),
            "read-only",
        )
        .await;
    let token = cluster.cp.pod_token("read-only", &pod).await.unwrap();
    let sidecar = cluster.sidecar_with_token("gs-x", &token, &[]);
    sidecar
        .wait_log("RBAC does not allow `patch pods/status`", LIMIT)
        .await;
    let pod: Pod = cluster.pods().get("gs-x").await.unwrap();
    assert!(condition(&pod, "c/p").is_none());
    assert!(!sidecar.log().contains("panicked"), "{}", sidecar.log());
}

/// Not a timed test: it asserts the count (one status patch per transition, as kube-apiserver's
/// own `apiserver_request_total` counts it) and prints what a transition costs the apiserver
/// (every request by verb and resource) and the PATCH latency the apiserver measured.
/// Twenty transitions: twenty status patches as the apiserver counts them, and Events only
/// within the budget (`--event-burst 5`, refill far beyond the test): the condition is always
/// written, the Events stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_transition_is_one_status_patch_as_the_apiserver_counts_it() {
    const TRANSITIONS: u64 = 20;
    const EVENT_BURST: usize = 5;
    let cluster = Cluster::start().await;
    let (pod, flag) = cluster.create_flagged_pod("gs-n").await;
    let port = free_port();
    let burst = EVENT_BURST.to_string();
    let _sidecar = cluster
        .sidecar(
            &pod,
            &[
                "--metrics-addr",
                &format!("127.0.0.1:{port}"),
                "--event-burst",
                &burst,
            ],
        )
        .await;
    wait_counter(port, "podprobe_status_writes_total", 1).await;
    let attempts_now = attempts(port, "c/p").await;
    wait_attempts(port, "c/p", attempts_now + 1).await;
    let before = cluster.cp.metrics().await.unwrap();

    for i in 1..=TRANSITIONS {
        if i % 2 == 1 {
            std::fs::remove_file(&flag).unwrap();
        } else {
            std::fs::write(&flag, "up").unwrap();
        }
        wait_counter(port, "podprobe_status_writes_total", 1 + i).await;
    }
    // One more attempt: the last write's request is complete on the apiserver's side too.
    let attempts_now = attempts(port, "c/p").await;
    wait_attempts(port, "c/p", attempts_now + 1).await;
    let after = cluster.cp.metrics().await.unwrap();

    use testkit::real::metrics::*;
    let delta = request_delta(&request_counts(&before), &request_counts(&after));
    let patches = delta
        .get(&("PATCH".into(), "pods".into(), "status".into()))
        .copied()
        .unwrap_or(0);
    println!("apiserver requests during {TRANSITIONS} transitions (per transition):");
    for ((verb, resource, sub), n) in &delta {
        println!(
            "  {verb:6} {resource}{}{sub}: {n} ({:.2})",
            if sub.is_empty() { "" } else { "/" },
            *n as f64 / TRANSITIONS as f64
        );
    }
    let buckets = bucket_delta(
        &duration_buckets(&before, "PATCH", "pods", "status"),
        &duration_buckets(&after, "PATCH", "pods", "status"),
    );
    let ms = |q| quantile(&buckets, q).map_or(f64::NAN, |s| s * 1000.0);
    println!(
        "PATCH pods/status latency (apiserver_request_duration_seconds): p50 {:.1} ms, p99 {:.1} ms",
        ms(0.5),
        ms(0.99)
    );
    assert_eq!(patches, TRANSITIONS, "status patches: {delta:?}");

    // 21 results (the first and 20 transitions) and five Events: the budget's burst. The
    // fifth went out at the fourth transition, long before this reads the audit log.
    let events = cluster.audit_by_sidecar(|e| {
        (e.is("create", "events", None) || e.is("patch", "events", None)) && e.code() < 300
    });
    assert_eq!(events.len(), EVENT_BURST, "event writes: {events:#?}");
}

/// Waits until the sidecar's counter `name` (no labels) reaches `n`.
async fn wait_counter(port: u16, name: &str, n: u64) {
    let value = |text: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0)
    };
    let wait = async {
        while value(&metrics(port).await.unwrap_or_default()) < n {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(LIMIT, wait)
        .await
        .unwrap_or_else(|_| panic!("{name} did not reach {n}"));
}

/// The established connections process `pid` (a sidecar) holds to the apiserver.
fn apiserver_connections(pid: nix::unistd::Pid, apiserver: SocketAddr) -> Vec<Connection> {
    connections(pid.as_raw() as u32)
        .into_iter()
        .filter(|c| c.remote == apiserver)
        .collect()
}

/// Records every connection the sidecar holds to the apiserver, reading its descriptors every
/// 5 ms, until the returned stop is set: a second connection lives at least a request's round
/// trip, many readings.
fn record_connections(
    sidecar: &Sidecar,
    apiserver: SocketAddr,
) -> (
    Arc<AtomicBool>,
    tokio::task::JoinHandle<BTreeSet<Connection>>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let pid = sidecar.pid();
    let stopped = stop.clone();
    let task = tokio::task::spawn_blocking(move || {
        let mut seen = BTreeSet::new();
        while !stopped.load(Ordering::Relaxed) {
            seen.extend(apiserver_connections(pid, apiserver));
            std::thread::sleep(Duration::from_millis(5));
        }
        seen
    });
    (stop, task)
}

/// Waits until the sidecar holds exactly `n` connections to the apiserver.
async fn wait_connections(sidecar: &Sidecar, apiserver: SocketAddr, n: usize) -> Vec<Connection> {
    let held = async {
        loop {
            let held = apiserver_connections(sidecar.pid(), apiserver);
            if held.len() == n {
                return held;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(LIMIT, held).await.unwrap_or_else(|_| {
        panic!(
            "the sidecar did not come to {n} apiserver connections: {:?}",
            apiserver_connections(sidecar.pid(), apiserver)
        )
    })
}

/// Its pod's watch, twenty status patches and their Events share one connection to the
/// apiserver (HTTP/2, multiplexed), and no write opens a second one. With kube-rs' default
/// HTTP/1.1 client each write in flight beside the watch took a connection of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_writes_and_events_share_one_apiserver_connection() {
    const TRANSITIONS: u64 = 20;
    let cluster = Cluster::start().await;
    let apiserver = cluster.cp.address();
    let (pod, flag) = cluster.create_flagged_pod("gs-c").await;
    let port = free_port();
    let sidecar = cluster
        .sidecar_direct(
            &pod,
            &[
                "--metrics-addr",
                &format!("127.0.0.1:{port}"),
                "--event-burst",
                "100",
            ],
        )
        .await;
    wait_counter(port, "podprobe_status_writes_total", 1).await;
    assert!(
        sidecar
            .log()
            .contains("reads its probes from the apiserver")
    );
    // `--exec-mode auto` asked pods/exec once (an HTTP/1.1 upgrade, refused by the Role): that
    // connection closes on its own, the watch's stays.
    sidecar.wait_log("falling back to local", LIMIT).await;
    let held = wait_connections(&sidecar, apiserver, 1).await;

    let (stop, recorder) = record_connections(&sidecar, apiserver);
    for i in 1..=TRANSITIONS {
        if i % 2 == 1 {
            std::fs::remove_file(&flag).unwrap();
        } else {
            std::fs::write(&flag, "up").unwrap();
        }
        wait_counter(port, "podprobe_status_writes_total", 1 + i).await;
    }
    // Every transition's Event is out too (created, or patched into a series).
    let event_writes = || {
        cluster
            .audit_by_sidecar(|e| {
                (e.is("create", "events", None) || e.is("patch", "events", None)) && e.code() < 300
            })
            .len() as u64
    };
    wait_until(LIMIT, "an Event per transition", || {
        event_writes() > TRANSITIONS
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let seen = recorder.await.unwrap();
    assert_eq!(
        seen,
        held.into_iter().collect(),
        "every request on the watch's connection"
    );
}

/// With the file source the sidecar only writes: its connection closes a few seconds after the
/// last write, so an idle fleet holds none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_source_sidecar_closes_its_connection_after_its_writes() {
    let cluster = Cluster::start().await;
    let apiserver = cluster.cp.address();
    let flag = cluster.dir.path().join("flag");
    std::fs::write(&flag, "up").unwrap();
    let annotation = array(&[file_probe("p", "c/p", &flag)]);
    let pod = cluster.create_pod("gs-f", &annotation, json!([])).await;
    let annotations = cluster.annotations_file(&annotation);
    let uid = pod.metadata.uid.clone().unwrap();
    let port = free_port();
    let sidecar = cluster
        .sidecar_direct(
            &pod,
            &[
                "--source",
                "file",
                "--annotations-file",
                annotations.to_str().unwrap(),
                "--pod-uid",
                &uid,
                "--metrics-addr",
                &format!("127.0.0.1:{port}"),
            ],
        )
        .await;
    wait_counter(port, "podprobe_status_writes_total", 1).await;
    wait_connections(&sidecar, apiserver, 0).await;

    // A transition opens one for its patch and Event, and it closes again.
    let (stop, recorder) = record_connections(&sidecar, apiserver);
    std::fs::remove_file(&flag).unwrap();
    wait_counter(port, "podprobe_status_writes_total", 2).await;
    let written = std::time::Instant::now();
    wait_connections(&sidecar, apiserver, 0).await;
    println!(
        "the connection closed {:.1?} after the write was answered",
        written.elapsed()
    );
    stop.store(true, Ordering::Relaxed);
    let seen = recorder.await.unwrap();
    assert_eq!(seen.len(), 1, "one connection for the write: {seen:?}");
}
