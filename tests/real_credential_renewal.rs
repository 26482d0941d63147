//! When the sidecar renews its own token (`--renew-token-dir`, what injection sets on virtual
//! nodes), on a real kube-apiserver: a token it holds for long is renewed a day after it was
//! issued, as the kubelet renews a projected token, not at 80 % of its lifetime.

mod support;

use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::PostParams;
use podprobe::credential::{Claims, MAX_JITTER};
use serde_json::json;
use support::*;

const LIMIT: Duration = Duration::from_secs(60);
const TWO_DAYS: i64 = 2 * 24 * 3600;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_day_token_is_renewed_a_day_after_it_was_issued() {
    let cluster = Cluster::start().await;
    let (pod, _flag) = cluster.create_flagged_pod("gs-r").await;
    // What the manager's Secret would hold with a two-day `sidecarTokenLifetime`.
    let request: TokenRequest = serde_json::from_value(json!({"spec": {
        "audiences": [],
        "expirationSeconds": TWO_DAYS,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
            "name": pod.metadata.name, "uid": pod.metadata.uid}
    }}))
    .unwrap();
    let issued = Api::<ServiceAccount>::namespaced(cluster.cp.client(), NS)
        .create_token_request(SIDECAR_SA, &PostParams::default(), &request)
        .await
        .unwrap();
    let token = issued.status.unwrap().token;
    let claims = Claims::of(&token).unwrap();
    assert_eq!(
        claims.expires.duration_since(claims.issued).as_secs(),
        TWO_DAYS,
        "issued as asked"
    );

    let renewal_dir = cluster.dir.path().join("renewed");
    std::fs::create_dir(&renewal_dir).unwrap();
    let sidecar = cluster.sidecar_with_token(
        "gs-r",
        &token,
        &["--renew-token-dir", renewal_dir.to_str().unwrap()],
    );
    sidecar.wait_log("renewing it at ", LIMIT).await;
    let log = sidecar.log();
    let due: jiff::Timestamp = testkit::child::logged_after(&log, "renewing it at ")
        .and_then(|t| t.parse().ok())
        .expect("the renewal's time in the sidecar's log");
    let a_day = claims.issued + jiff::SignedDuration::from_hours(24);
    assert!(
        due <= a_day && due >= a_day - MAX_JITTER,
        "renewal at {due}: a day after issue ({a_day}), up to {MAX_JITTER:?} earlier, not at 80 % of two days:\n{log}"
    );
}
