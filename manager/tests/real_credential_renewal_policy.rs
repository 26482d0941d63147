//! The chart's policy on the sidecar's token renewal (templates/admission-policy-token.yaml)
//! on a real kube-apiserver, rendered by the real helm with the sidecar's RBAC and applied by
//! kubectl: a sidecar whose token is bound to its pod may mint a new token of its account bound
//! to that pod, for a year at most, and nothing else its Role would allow (`create
//! serviceaccounts/token` of its account): a token bound to a neighbour running as the same
//! account, to no pod, or for longer; nor may a token bound to no pod mint one.

mod cluster;

use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{Value, json};
use testkit::real::ControlPlane;

const NS: &str = "games";
const SA: &str = "podprobe-sidecar";
const POLICY: &str = "podprobe-sidecar-token-renewal";
const NOT_ITS_POD: &str = "only tokens bound to its own pod";
const A_YEAR_AT_MOST: &str = "valid for a year at most";
const YEAR: i64 = 365 * 24 * 3600;

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

fn bound_to(pod: &Pod) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid})
}

/// A TokenRequest of the sidecar's account as `client`: `None` when issued, else the
/// refusal's message.
async fn mint(client: &Client, bound: Option<Value>, seconds: i64) -> Option<String> {
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": {"audiences": [], "boundObjectRef": bound, "expirationSeconds": seconds}
    }))
    .unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    match accounts
        .create_token_request(SA, &PostParams::default(), &request)
        .await
    {
        Ok(issued) => {
            assert!(issued.status.is_some_and(|s| !s.token.is_empty()));
            None
        }
        Err(kube::Error::Api(e)) if e.code == 403 => Some(e.message),
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_renews_only_its_own_pods_credential() {
    let cp = ControlPlane::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    cp.create_namespace(NS).await.unwrap();
    cluster::apply_sidecar_policy(&cp, &[NS], "templates/admission-policy-token.yaml");
    let own = pod(&cp, "gs-0").await;
    let neighbour = pod(&cp, "gs-1").await;
    let sidecar = cp.client_for_token(&cp.pod_token(SA, &own).await.unwrap());
    let unbound = cp.client_for_token(&cp.service_account_token(NS, SA).await.unwrap());

    // The policy is enforced asynchronously: until the neighbour's token is refused.
    let deadline = Instant::now() + Duration::from_secs(60);
    let for_the_neighbour = loop {
        let refusal = mint(&sidecar, Some(bound_to(&neighbour)), YEAR).await;
        if refusal.is_some() || Instant::now() > deadline {
            break refusal;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let refused = |refusal: &Option<String>, why| cluster::refused_by(refusal, POLICY, why);
    assert!(
        refused(&for_the_neighbour, NOT_ITS_POD),
        "bound to a neighbour: {for_the_neighbour:?}"
    );
    let unbound_request = mint(&sidecar, None, YEAR).await;
    assert!(
        refused(&unbound_request, NOT_ITS_POD),
        "bound to no pod: {unbound_request:?}"
    );
    let longer = mint(&sidecar, Some(bound_to(&own)), 2 * YEAR).await;
    assert!(refused(&longer, A_YEAR_AT_MOST), "two years: {longer:?}");
    let by_unbound = mint(&unbound, Some(bound_to(&own)), YEAR).await;
    assert!(
        refused(&by_unbound, NOT_ITS_POD),
        "asked with a token bound to no pod: {by_unbound:?}"
    );
    assert_eq!(
        mint(&sidecar, Some(bound_to(&own)), YEAR).await,
        None,
        "its own pod, a year"
    );
}
