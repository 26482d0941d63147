//! `podprobe-manager` on a real kube-apiserver with nothing but the chart's RBAC: the chart is
//! installed by the real helm with its webhooks pointed at the manager (`webhook.url`), the
//! manager runs in-process with a token of the chart's ServiceAccount and the chart's
//! injection config, and everything goes through the real admission chain.

mod cluster;
mod installed;
mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use podprobe_manager::crd::PodProbeMarker;
use podprobe_manager::webhook::Mode;
use serde_json::json;
use support::{LIST, PODPROBE, TV03_PODPROBE, annotation, app_pod, label, ppm, tv03_ppm, wait_pod};

use installed::{NS, Running, install_and_run, install_with, start_control_plane};

const LIMIT: Duration = Duration::from_secs(30);
const MANAGER_USER: &str = "system:serviceaccount:podprobe-system:podprobe-manager";

/// Sets the probe's condition as the sidecar would (admin stands in for it here).
async fn set_condition(client: &Client, name: &str, status: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let patch = json!({"status": {"conditions": [
        {"type": "game.kruise.io/healthy", "status": status, "reason": "PodProbeSucceeded"}
    ]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
}

/// TV-03's PodProbeMarker, created and then in the webhook's cache.
async fn create_tv03(admin: &Client, manager: &podprobe_manager::run::Manager) {
    Api::<PodProbeMarker>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &ppm(&tv03_ppm()))
        .await
        .unwrap();
    let cache = manager.ppms.clone();
    support::eventually(LIMIT, "PPM cached", || !cache.namespace(NS).is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ppms_pods_markers_and_leases_through_the_real_admission_chain() {
    let Running { cp, manager, .. } =
        install_and_run(start_control_plane().await, Mode::Standalone).await;
    let admin = cp.client();
    let ppms: Api<PodProbeMarker> = Api::namespaced(admin.clone(), NS);

    // The validating webhook, called by the apiserver, refuses an invalid PodProbeMarker.
    let mut invalid = tv03_ppm();
    invalid["metadata"]["name"] = json!("invalid");
    invalid["spec"]["probes"][0]["podConditionType"] = json!("Ready");
    let Err(kube::Error::Api(refused)) = ppms.create(&PostParams::default(), &ppm(&invalid)).await
    else {
        panic!("an invalid PodProbeMarker was admitted")
    };
    assert_eq!(refused.code, 400, "{refused:?}");
    assert!(
        refused.message.contains("spec.probes[0].podConditionType"),
        "{}",
        refused.message
    );
    // So is a marker that would rewrite the probes annotation or the selector's own label, and
    // a timeout past the sidecar's cap.
    let mut reserved = tv03_ppm();
    reserved["spec"]["probes"][0]["probe"]["timeoutSeconds"] = json!(301);
    reserved["metadata"]["name"] = json!("reserved");
    reserved["spec"]["probes"][0]["markerPolicy"][0]["labels"] = json!({"app": "idle"});
    reserved["spec"]["probes"][0]["markerPolicy"][1]["annotations"] =
        json!({"kruise.io/podprobe": "[]"});
    let Err(kube::Error::Api(refused)) = ppms.create(&PostParams::default(), &ppm(&reserved)).await
    else {
        panic!("a PodProbeMarker with reserved marker keys was admitted")
    };
    assert_eq!(refused.code, 400, "{refused:?}");
    for field in [
        "markerPolicy[0].labels",
        "markerPolicy[1].annotations",
        "probe.timeoutSeconds",
    ] {
        assert!(refused.message.contains(field), "{}", refused.message);
    }
    create_tv03(&admin, &manager).await;

    // A pod through the real admission chain: the annotation byte for byte as OpenKruise
    // writes it (TV-03), the native sidecar and the readiness gate.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let mut pod = app_pod("gs-1", "test");
    pod.spec.as_mut().unwrap().node_name = Some("vk-1".into());
    pod.spec.as_mut().unwrap().service_account_name = Some("podprobe-sidecar".into());
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    assert_eq!(
        annotation(&created, PODPROBE).as_deref(),
        Some(TV03_PODPROBE)
    );
    assert_eq!(annotation(&created, LIST).as_deref(), Some("ppm-test"));
    let spec = created.spec.as_ref().unwrap();
    let init = spec.init_containers.as_ref().expect("the sidecar");
    // After the exec agent's install container, if any.
    let sidecar = init.last().unwrap();
    assert_eq!(sidecar.name, "podprobe");
    assert_eq!(
        sidecar.restart_policy.as_deref(),
        Some("Always"),
        "a native sidecar"
    );
    let gates: Vec<&str> = spec
        .readiness_gates
        .iter()
        .flatten()
        .map(|g| g.condition_type.as_str())
        .collect();
    assert_eq!(gates, ["game.kruise.io/healthy"]);

    // The kubelet's part: running and initialized (matchedPods counts only such pods).
    let kubelet = json!({"status": {"phase": "Running", "conditions": [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Initialized", "status": "True"}
    ]}});
    pods.patch_status("gs-1", &PatchParams::default(), &Patch::Strategic(&kubelet))
        .await
        .unwrap();

    // Markers follow the condition, the opposite policy's keys go.
    set_condition(&admin, "gs-1", "True").await;
    wait_pod(&pods, "gs-1", "Succeeded marker", |p| {
        label(p, "server-healthy").as_deref() == Some("true")
    })
    .await;
    set_condition(&admin, "gs-1", "False").await;
    wait_pod(&pods, "gs-1", "Failed marker", |p| {
        label(p, "server-healthy").as_deref() == Some("false")
    })
    .await;

    // An edit of the PodProbeMarker reaches the running pod.
    let edit = json!({"spec": {"probes": [{
        "name": "healthy", "containerName": "main",
        "probe": {"exec": {"command": ["/bin/sh", "-c", "/healthy.sh"]}, "periodSeconds": 5},
        "podConditionType": "game.kruise.io/healthy",
        "markerPolicy": [{"state": "Succeeded", "labels": {"server-healthy": "true"}},
                         {"state": "Failed", "labels": {"server-healthy": "false"}}]
    }]}});
    ppms.patch("ppm-test", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    wait_pod(&pods, "gs-1", "propagated", |p| {
        annotation(p, PODPROBE).is_some_and(|a| a.contains(r#""periodSeconds":5"#))
    })
    .await;

    // Status: observedGeneration and matchedPods.
    let status = async {
        loop {
            let ppm = ppms.get("ppm-test").await.unwrap();
            if let Some(st) = &ppm.status
                && st.matched_pods == 1
                && Some(st.observed_generation) == ppm.metadata.generation
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    if tokio::time::timeout(LIMIT, status).await.is_err() {
        let ppm = ppms.get("ppm-test").await.unwrap();
        let writes: Vec<String> = cp
            .audit()
            .unwrap()
            .into_iter()
            .filter(|e| e.is("patch", "podprobemarkers/status", None))
            .map(|e| format!("{} -> {} {:?}", e.request_uri, e.code(), e.request_object))
            .collect();
        panic!(
            "PPM status not kept: {:?} (generation {:?}); status writes: {writes:#?}",
            ppm.status, ppm.metadata.generation
        );
    }

    // The Lease it leads by.
    let lease = Api::<Lease>::namespaced(admin.clone(), cluster::RELEASE_NS)
        .get("podprobe-manager")
        .await
        .unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("manager-0")
    );

    // The chart's RBAC covered every call the manager made: no 401 or 403. (A 404, e.g. the
    // Lease before it was first created, is an answer; a 429 is the apiserver's flow control
    // on a loaded machine, which the manager retries: neither is a refusal by RBAC.)
    let refused: Vec<String> = cp
        .audit()
        .unwrap()
        .into_iter()
        .filter(|e| e.user.username == MANAGER_USER && matches!(e.code(), 401 | 403))
        .map(|e| format!("{} {} -> {}", e.verb, e.request_uri, e.code()))
        .collect();
    assert!(refused.is_empty(), "refused: {refused:#?}");
    manager.shutdown().await;
}

/// Pod Security "restricted" enforced in the pod's namespace by the real admission plugin: a
/// pod whose own containers meet it is admitted with the sidecar as injected by default; a pod
/// whose own container does not is refused for that container alone, never for the sidecar.
/// And the service-account token is mounted into the sidecar alone. Then the same under
/// "baseline", with a game container that sets no security context at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_injected_pod_passes_pod_security_restricted_and_baseline_and_only_its_sidecar_holds_the_token()
 {
    let Running { cp, manager, .. } =
        install_and_run(start_control_plane().await, Mode::Standalone).await;
    let admin = cp.client();
    let restricted = json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest"}}});
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .patch(NS, &PatchParams::default(), &Patch::Merge(&restricted))
        .await
        .unwrap();
    create_tv03(&admin, &manager).await;

    // The game container meets "restricted" on its own (no pod-level securityContext, so
    // the sidecar's must too).
    let game_pod = |name: &str, seccomp: bool| {
        let mut context = json!({"runAsNonRoot": true, "runAsUser": 1000,
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}});
        if seccomp {
            context["seccompProfile"] = json!({"type": "RuntimeDefault"});
        }
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NS, "labels": {"app": "test"}},
            "spec": {"nodeName": "vk-1", "serviceAccountName": "podprobe-sidecar",
                "containers": [{"name": "main", "image": "game:1", "command": ["/game"],
                                "securityContext": context}]}
        }))
        .unwrap();
        pod
    };
    let compliant = game_pod("gs-restricted", true);
    cp.wait_admission(&compliant, |p| annotation(p, PODPROBE).is_some())
        .await
        .unwrap_or_else(|e| panic!("not admitted with its probes (webhook, Pod Security): {e}"));
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let created = match pods.create(&PostParams::default(), &compliant).await {
        Ok(pod) => pod,
        Err(e) => panic!("an injected pod refused under \"restricted\": {e}"),
    };
    let spec = created.spec.as_ref().unwrap();
    // The exec probe's container gives its command: it runs under the exec agent, which
    // the init container installs, both within "restricted".
    let inits = spec.init_containers.as_ref().expect("the sidecar");
    let names: Vec<&str> = inits.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["podprobe-agent-install", "podprobe"]);
    let sidecar = &inits[1];
    let main_command = spec.containers[0].command.as_deref().unwrap();
    assert_eq!(
        main_command,
        [
            "/podprobe-agent/podprobe",
            "agent",
            "--socket",
            "/podprobe-agent-socket/agent.sock",
            "--",
            "/game"
        ]
    );
    // The pod's token is the sidecar's alone, through the real ServiceAccount plugin (which
    // ran before the webhook and again after it).
    let token_path = "/var/run/secrets/kubernetes.io/serviceaccount";
    let mounted = |c: &k8s_openapi::api::core::v1::Container| {
        let mounts = c.volume_mounts.iter().flatten();
        mounts
            .filter(|m| m.mount_path == token_path)
            .map(|m| m.name.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(mounted(sidecar), ["podprobe-api-access"]);
    assert_eq!(mounted(&spec.containers[0]), Vec::<String>::new());
    assert_eq!(spec.automount_service_account_token, Some(false));
    let seccomp = sidecar
        .security_context
        .as_ref()
        .unwrap()
        .seccomp_profile
        .as_ref();
    assert_eq!(seccomp.map(|p| p.type_.as_str()), Some("RuntimeDefault"));

    // The control: the plugin enforces, and names only the game's container.
    refused_for_main(
        &pods,
        &game_pod("gs-unrestricted", false),
        "restricted",
        "seccompProfile",
    )
    .await;

    // "baseline": a game container as most are written, with no security context, gets the
    // sidecar and the agent; one adding a capability is refused for itself alone.
    let baseline = json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "baseline"}}});
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .patch(NS, &PatchParams::default(), &Patch::Merge(&baseline))
        .await
        .unwrap();
    let plain_pod = |name: &str, net_admin: bool| {
        let mut main = json!({"name": "main", "image": "game:1", "command": ["/game"]});
        if net_admin {
            main["securityContext"] = json!({"capabilities": {"add": ["NET_ADMIN"]}});
        }
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NS, "labels": {"app": "test"}},
            "spec": {"nodeName": "vk-1", "serviceAccountName": "podprobe-sidecar",
                     "containers": [main]}
        }))
        .unwrap();
        pod
    };
    // Pod Security reads the namespace's level from a cache: until it has "baseline" it
    // refuses this pod as "restricted" would (no seccomp profile, may run as root).
    let admitted = async {
        loop {
            match pods
                .create(&PostParams::default(), &plain_pod("gs-baseline", false))
                .await
            {
                Ok(pod) => return pod,
                Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("restricted") => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("an injected pod refused under \"baseline\": {e}"),
            }
        }
    };
    let admitted = tokio::time::timeout(LIMIT, admitted)
        .await
        .expect("Pod Security never applied \"baseline\"");
    let spec = admitted.spec.as_ref().unwrap();
    let inits = spec.init_containers.as_ref().expect("the sidecar");
    let names: Vec<&str> = inits.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["podprobe-agent-install", "podprobe"]);
    assert_eq!(
        spec.containers[0].command.as_deref().unwrap()[..2],
        ["/podprobe-agent/podprobe", "agent"]
    );
    refused_for_main(
        &pods,
        &plain_pod("gs-net-admin", true),
        "baseline",
        "NET_ADMIN",
    )
    .await;
}

/// Creates `pod` and asserts Pod Security `level` refused it for its container `main` alone
/// (for `violation`), never naming podprobe's containers.
async fn refused_for_main(pods: &Api<Pod>, pod: &Pod, level: &str, violation: &str) {
    let Err(kube::Error::Api(refused)) = pods.create(&PostParams::default(), pod).await else {
        panic!("a pod violating {violation} was admitted: Pod Security is not enforcing {level:?}")
    };
    println!("{}", refused.message);
    assert!(
        refused.code == 403
            && refused
                .message
                .contains(&format!("violates PodSecurity \"{level}:latest\""))
            && refused.message.contains(violation)
            && refused.message.contains("\"main\"")
            && !refused.message.contains("podprobe"),
        "{refused:?}"
    );
}

/// Not a timed test: prints what the pod webhook adds to a pod create through the real
/// apiserver (p50/p99 of 100 creates with and without it), asserting only that every pod was
/// admitted as it should be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_latency_added_to_pod_creates() {
    const N: usize = 100;
    let Running { cp, manager, .. } =
        install_and_run(start_control_plane().await, Mode::Standalone).await;
    let admin = cp.client();
    create_tv03(&admin, &manager).await;
    // The same pods in a namespace the webhook does not select.
    cp.create_namespace("plain").await.unwrap();

    let before = cp.metrics().await.unwrap();
    let mut timings = Vec::new();
    for ns in [NS, "plain"] {
        let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
        let mut ms = Vec::with_capacity(N);
        for i in 0..N {
            let mut pod = app_pod(&format!("p-{i}"), "test");
            pod.metadata.namespace = Some(ns.into());
            let start = Instant::now();
            let created = pods.create(&PostParams::default(), &pod).await.unwrap();
            ms.push(start.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(annotation(&created, PODPROBE).is_some(), ns == NS);
        }
        ms.sort_by(f64::total_cmp);
        timings.push((ns, ms[N / 2], ms[N * 99 / 100]));
    }
    // Where the time goes: the webhook call as the apiserver times it, and the manager's own
    // answer time (request head to response).
    use testkit::real::metrics::{bucket_delta, histogram_buckets, quantile};
    let after = cp.metrics().await.unwrap();
    let call = |m: &str| {
        histogram_buckets(
            m,
            "apiserver_admission_webhook_admission_duration_seconds",
            &[("name", "pods.podprobe.io"), ("type", "admit")],
        )
    };
    let calls = bucket_delta(&call(&before), &call(&after));
    // One call per create: the injected sidecar brings its own token mount and the pod's
    // automount is off, so the ServiceAccount plugin changes nothing after the webhook and
    // `reinvocationPolicy: IfNeeded` does not call it again (it did while the plugin mounted
    // the token into the sidecar).
    assert_eq!(calls.last().map(|b| b.1), Some(N as u64), "webhook calls");
    let own = support::http_get(manager.metrics_addr.unwrap(), "/metrics")
        .await
        .1;
    let answers = histogram_buckets(
        &own,
        "podprobe_manager_webhook_duration_seconds",
        &[("path", "/mutate-pods")],
    );
    let ms = |b: &[(f64, u64)], q| quantile(b, q).map_or(f64::NAN, |s| s * 1000.0);
    println!(
        "webhook call as kube-apiserver times it (coarse buckets): p50 {:.2} ms p99 {:.2} ms; \
         the manager's answer: p50 {:.3} ms p99 {:.3} ms",
        ms(&calls, 0.5),
        ms(&calls, 0.99),
        ms(&answers, 0.5),
        ms(&answers, 0.99)
    );
    let (_, with_p50, with_p99) = timings[0];
    let (_, without_p50, without_p99) = timings[1];
    println!(
        "pod create through kube-apiserver, {N} each: with the webhook p50 {with_p50:.2} ms \
         p99 {with_p99:.2} ms; without p50 {without_p50:.2} ms p99 {without_p99:.2} ms; \
         added p50 {:.2} ms p99 {:.2} ms",
        with_p50 - without_p50,
        with_p99 - without_p99
    );
    manager.shutdown().await;
}

/// The names of the pods with a `SidecarMissing` Event, and each Event's note.
async fn sidecar_missing_events(admin: &Client) -> Vec<(String, String)> {
    let events: Api<Event> = Api::all(admin.clone());
    let mut found: Vec<(String, String)> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("SidecarMissing"))
        .map(|e| {
            let regarding = e.regarding.unwrap_or_default();
            assert_eq!(e.type_.as_deref(), Some("Warning"));
            (
                format!(
                    "{}/{}",
                    regarding.namespace.unwrap_or_default(),
                    regarding.name.unwrap_or_default()
                ),
                e.note.unwrap_or_default(),
            )
        })
        .collect();
    found.sort();
    found
}

/// The manager's `podprobe_manager_pods_without_sidecar`.
async fn pods_without_sidecar(manager: &podprobe_manager::run::Manager) -> Option<u64> {
    let (_, body) = support::http_get(manager.metrics_addr.unwrap(), "/metrics").await;
    body.lines()
        .find_map(|l| l.strip_prefix("podprobe_manager_pods_without_sidecar "))
        .and_then(|v| v.trim().parse().ok())
}

fn has_sidecar(pod: &Pod) -> bool {
    podprobe_manager::pods::runs_sidecar(pod, "podprobe")
}

/// The chart's pod webhook fails open: a pod created while no manager replica answers is
/// admitted without its sidecar, and nothing probes it. The manager, back, reports each such
/// pod (opted in, selected by a PodProbeMarker, no sidecar) within a minute: a Warning Event
/// on the pod and a gauge, with the chart's RBAC. So is a pod whose namespace opts in after it
/// started. Pods with the sidecar, opted out or selected by nothing are not reported, and a
/// reported pod's deletion lowers the gauge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_admitted_without_their_sidecar_are_reported() {
    const REPORTED: Duration = Duration::from_secs(60);
    let installed = install_with(start_control_plane().await, Mode::Standalone, &[]).await;
    let admin = installed.cp.client();
    let first = installed.start_manager().await;
    create_tv03(&admin, &first).await;
    // Namespace `late` has a PodProbeMarker but has not opted in yet.
    installed.cp.create_namespace("late").await.unwrap();
    let mut late_ppm = tv03_ppm();
    late_ppm["metadata"]["namespace"] = json!("late");
    Api::<PodProbeMarker>::namespaced(admin.clone(), "late")
        .create(&PostParams::default(), &ppm(&late_ppm))
        .await
        .unwrap();
    let mut early = app_pod("early", "test");
    early.metadata.namespace = Some("late".into());
    let early = Api::<Pod>::namespaced(admin.clone(), "late")
        .create(&PostParams::default(), &early)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let injected = pods
        .create(&PostParams::default(), &app_pod("injected", "test"))
        .await
        .unwrap();
    assert!(has_sidecar(&injected), "the webhook injects while it runs");
    assert!(!has_sidecar(&early), "namespace late is not opted in");

    // The manager is down: the apiserver admits pods unchanged (failurePolicy Ignore).
    first.shutdown().await;
    let missed = pods
        .create(&PostParams::default(), &app_pod("missed", "test"))
        .await
        .unwrap();
    assert!(
        !has_sidecar(&missed),
        "admitted while the webhook was unreachable"
    );
    let mut opted_out = app_pod("opted-out", "test");
    opted_out
        .metadata
        .labels
        .get_or_insert_default()
        .insert("podprobe.io/inject".into(), "disabled".into());
    pods.create(&PostParams::default(), &opted_out)
        .await
        .unwrap();
    pods.create(&PostParams::default(), &app_pod("unselected", "web"))
        .await
        .unwrap();

    let second = installed.start_manager().await;
    let events = testkit::wait::until_some(REPORTED, "test/missed reported", async || {
        let events = sidecar_missing_events(&admin).await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["test/missed"], "{events:#?}");
    let note = &events[0].1;
    assert!(
        note.contains("PodProbeMarker ppm-test select it") && note.contains("recreate it"),
        "{note}"
    );
    assert_eq!(pods_without_sidecar(&second).await, Some(1));

    // Namespace `late` opts in: its pod, started before, is reported at the next sweep.
    Api::<Namespace>::all(admin.clone())
        .patch(
            "late",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"podprobe.io/inject": "enabled"}}})),
        )
        .await
        .unwrap();
    testkit::wait::until_some(REPORTED, "late/early reported", async || {
        let events = sidecar_missing_events(&admin).await;
        (events.len() > 1).then_some(events)
    })
    .await;
    let names: Vec<String> = sidecar_missing_events(&admin)
        .await
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["late/early", "test/missed"]);
    assert_eq!(pods_without_sidecar(&second).await, Some(2));

    // A pod recreated (here: deleted) is no longer counted.
    pods.delete("missed", &Default::default()).await.unwrap();
    testkit::wait::until_some(REPORTED, "the gauge back to 1", async || {
        (pods_without_sidecar(&second).await == Some(1)).then_some(())
    })
    .await;
    second.shutdown().await;
}
