//! The chart's Events policy (templates/admission-policy-events.yaml) on a real kube-apiserver,
//! rendered by the real helm with the sidecar's RBAC and applied by kubectl: the sidecar's
//! token, through kube-rs' Recorder as the sidecar uses it, writes Events about its own pod
//! (created, then patched as a series) and is refused Events about anything else. The Role
//! allows every one of these requests, so the policy is what decides.

mod cluster;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::PostParams;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource};
use serde_json::json;
use testkit::real::ControlPlane;

const NS: &str = "games";
const SA: &str = "podprobe-sidecar";
const POLICY: &str = "podprobe-sidecar-events";
const NOT_ITS_POD: &str = "only Events about its own pod";
const RELATED: &str = "no related object";

async fn pod(cp: &ControlPlane, name: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"serviceAccountName": SA, "containers": [{"name": "game", "image": "game:1"}]}
    }))
    .unwrap();
    Api::namespaced(cp.client(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

fn event(reason: &str, related: Option<ObjectReference>) -> Event {
    Event {
        type_: EventType::Normal,
        reason: reason.into(),
        note: Some("probe result".into()),
        action: "Probe".into(),
        secondary: related,
    }
}

/// The sidecar's Recorder (one per sidecar: it turns repeats into a series).
fn recorder(client: &Client) -> Recorder {
    let reporter = Reporter {
        controller: "podprobe".into(),
        instance: None,
    };
    Recorder::new(client.clone(), reporter)
}

/// `None` when the Event was written, else the refusal's message (only the policy's 403).
async fn publish(recorder: &Recorder, ev: &Event, about: &ObjectReference) -> Option<String> {
    match recorder.publish(ev, about).await {
        Ok(()) => None,
        Err(kube::Error::Api(e)) if e.code == 403 => Some(e.message),
        Err(e) => panic!("{e:?}"),
    }
}

fn denied_by(refusal: &Option<String>, validation: &str) -> bool {
    cluster::refused_by(refusal, POLICY, validation)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_writes_events_about_its_own_pod_only() {
    let cp = ControlPlane::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    cp.create_namespace(NS).await.unwrap();
    cluster::apply_sidecar_policy(&cp, &[NS], "templates/admission-policy-events.yaml");
    let own = pod(&cp, "gs-0").await;
    let neighbour = pod(&cp, "gs-1").await;
    let sidecar = recorder(&cp.client_for_token(&cp.pod_token(SA, &own).await.unwrap()));
    let own_ref = own.object_ref(&());
    let neighbour_ref = neighbour.object_ref(&());

    // Enforced asynchronously: until the neighbour's Event is refused.
    let deadline = Instant::now() + Duration::from_secs(60);
    let about_neighbour = loop {
        let refusal = publish(&sidecar, &event("Neighbour", None), &neighbour_ref).await;
        if refusal.is_some() || Instant::now() > deadline {
            break refusal;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        denied_by(&about_neighbour, NOT_ITS_POD),
        "{about_neighbour:?}"
    );

    let mut other_uid = own_ref.clone();
    other_uid.uid = Some("0b5e4d2c-1111-4a4a-8c8c-000000000001".into());
    let refusal = publish(&sidecar, &event("OtherUid", None), &other_uid).await;
    assert!(denied_by(&refusal, NOT_ITS_POD), "{refusal:?}");
    let mut config_map = own_ref.clone();
    config_map.kind = Some("ConfigMap".into());
    let refusal = publish(&sidecar, &event("NotAPod", None), &config_map).await;
    assert!(denied_by(&refusal, NOT_ITS_POD), "{refusal:?}");
    let refusal = publish(&sidecar, &event("Related", Some(neighbour_ref)), &own_ref).await;
    assert!(denied_by(&refusal, RELATED), "{refusal:?}");

    // Its own pod: created, then (the same Event again) patched as a series; with and without
    // the uid, as the sidecar sends them before and after it has read its pod.
    let mut without_uid = own_ref.clone();
    without_uid.uid = None;
    for about in [&own_ref, &own_ref, &without_uid] {
        assert_eq!(
            publish(&sidecar, &event("KruiseProbeSucceeded", None), about).await,
            None
        );
    }
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(cp.client(), NS);
    let stored = events.list(&Default::default()).await.unwrap().items;
    let series = stored
        .iter()
        .find(|e| e.reason.as_deref() == Some("KruiseProbeSucceeded") && e.series.is_some());
    assert!(
        series.is_some(),
        "the repeated Event is patched into a series: {stored:?}"
    );
}
