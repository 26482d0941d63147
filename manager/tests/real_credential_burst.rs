//! A burst of virtual-node pods with two manager replicas running the token issuer, on a real
//! kube-apiserver with the chart's RBAC and policies: every replica watches every pod waiting
//! for its sidecar's token, and each issues only the pods its own webhook admitted (the
//! admitting replica's name is on the pod), taking another's over only after a grace. The
//! apiserver's audit log counts what the burst cost: one TokenRequest, one Secret and one
//! release per pod. Before, both replicas raced for every pod (two TokenRequests, a refused
//! Secret create and often a refused release each). The time from each pod's creation to its
//! release is printed, as figures (not asserted: a two-core machine running the whole control
//! plane and both replicas is no apiserver's host).

mod cluster;
mod installed;
mod support;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, PostParams};
use podprobe_manager::run::Manager;
use podprobe_manager::sidecar_token::{LABEL, PENDING};
use podprobe_manager::webhook::Mode;
use serde_json::json;
use testkit::real::AuditEvent;

use installed::{NS, listening_target, start_control_plane};

const PODS: usize = 1000;
/// Pods created at once, as a GameServerSet's controller scaling out does.
const AT_ONCE: usize = 16;
const MANAGER: &str = "system:serviceaccount:podprobe-system:podprobe-manager";

fn game_pod(i: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("burst-{i}"), "namespace": NS, "labels": {"app": "game"}},
        "spec": {"serviceAccountName": "podprobe-sidecar",
                 "tolerations": [{"key": "virtual-kubelet.io/provider",
                                  "operator": "Exists", "effect": "NoSchedule"}],
                 "containers": [{"name": "main", "image": "game:1", "command": ["/game"]}]}
    }))
    .unwrap()
}

/// `stageTimestamp` as a time.
fn at(event: &AuditEvent) -> jiff::Timestamp {
    event
        .stage_timestamp
        .as_deref()
        .and_then(|t| t.parse().ok())
        .expect("a stage timestamp")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_burst_costs_one_token_one_secret_and_one_release_per_pod() {
    let installed =
        installed::install_with(start_control_plane().await, Mode::Standalone, &[]).await;
    // The second replica: the chart's manager again, another identity, its webhook unused
    // (the webhook configuration names the first), its issuer watching the same pods.
    let mut second = installed.options.clone();
    second.webhook_addr = "127.0.0.1:0".parse().unwrap();
    second.metrics_addr = Some("127.0.0.1:0".parse().unwrap());
    second.leader.as_mut().unwrap().identity = "manager-1".into();
    let _replica_1 = Manager::start(installed.client.clone(), second)
        .await
        .unwrap();
    let running = installed.start().await;
    let _target = listening_target(&running).await;
    let cp = &running.cp;
    cp.wait_admission(&game_pod(0), |p| {
        support::label(p, LABEL).as_deref() == Some(PENDING)
    })
    .await
    .unwrap();

    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    let started = tokio::time::Instant::now();
    futures::stream::iter(0..PODS)
        .map(|i| {
            let pods = pods.clone();
            async move { pods.create(&PostParams::default(), &game_pod(i)).await }
        })
        .buffer_unordered(AT_ONCE)
        .try_for_each(|_| futures::future::ready(Ok(())))
        .await
        .unwrap();
    let created = started.elapsed();
    let pending = ListParams::default().labels(&format!("{LABEL}={PENDING}"));
    testkit::wait::until_some(
        Duration::from_secs(600),
        "every pod of the burst released",
        async || {
            let left = pods.list_metadata(&pending).await.unwrap().items.len();
            (left == 0).then_some(())
        },
    )
    .await;
    let released = started.elapsed();

    let audit = cp.audit().unwrap();
    let by_manager = |verb: &str, resource: &str| -> Vec<&AuditEvent> {
        audit
            .iter()
            .filter(|e| e.user.username == MANAGER && e.is(verb, resource, None))
            .collect()
    };
    let tokens = by_manager("create", "serviceaccounts/token");
    let secrets = by_manager("create", "secrets");
    // The issuer's releases: patches that take the token label off (the leader's other pod
    // writes, annotations and markers, are not the issuer's).
    let releases: Vec<&AuditEvent> = by_manager("patch", "pods")
        .into_iter()
        .filter(|e| {
            let body = e
                .request_object
                .as_ref()
                .map(|b| b.to_string())
                .unwrap_or_default();
            body.contains("podprobe.io~1sidecar-token")
        })
        .collect();
    let others = by_manager("patch", "pods").len() - releases.len();
    if others > 0 {
        let sample = by_manager("patch", "pods")
            .into_iter()
            .find(|e| {
                !e.request_object
                    .as_ref()
                    .is_some_and(|b| b.to_string().contains("podprobe.io~1sidecar-token"))
            })
            .and_then(|e| e.request_object.clone());
        eprintln!("{others} other pod patches by the manager, e.g. {sample:?}");
    }
    let refused = |events: &[&AuditEvent]| events.iter().filter(|e| e.code() >= 300).count();
    eprintln!(
        "{PODS} pods created in {created:.1?}, all released after {released:.1?}: {} TokenRequests, {} Secret creates ({} refused), {} pod patches ({} refused)",
        tokens.len(),
        secrets.len(),
        refused(&secrets),
        releases.len(),
        refused(&releases)
    );

    // Creation to release, per pod, from the apiserver's own clock.
    let created_at: std::collections::HashMap<&str, jiff::Timestamp> = audit
        .iter()
        .filter(|e| e.is("create", "pods", None) && e.code() == 201)
        .filter_map(|e| Some((e.object_ref.as_ref()?.name.as_str(), at(e))))
        .collect();
    let mut waits: Vec<jiff::SignedDuration> = releases
        .iter()
        .filter(|e| e.code() == 200)
        .filter_map(|e| {
            let name = e.object_ref.as_ref()?.name.as_str();
            Some(at(e).duration_since(*created_at.get(name)?))
        })
        .collect();
    waits.sort();
    let quantile = |q: f64| waits[((waits.len() as f64 - 1.0) * q).round() as usize];
    eprintln!(
        "creation to release: p50 {:#}, p99 {:#}, max {:#}",
        quantile(0.5),
        quantile(0.99),
        quantile(1.0)
    );

    assert_eq!(tokens.len(), PODS, "one TokenRequest per pod");
    assert_eq!(secrets.len(), PODS, "one Secret create per pod");
    assert_eq!(releases.len(), PODS, "one release per pod");
    assert_eq!(waits.len(), PODS, "every pod released once");
}
