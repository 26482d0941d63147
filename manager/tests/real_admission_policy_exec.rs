//! The chart's pods/exec policy (templates/admission-policy-exec.yaml) on a real
//! kube-apiserver, rendered by the real helm with the sidecar's RBAC and applied by kubectl:
//! each of its validations denies the request it is there for, and a token's exec into its
//! own pod gets past admission. No kubelet runs here, so an admitted exec ends at "no host
//! assigned" instead of running: what counts is that the policy did not deny it. RBAC allows
//! every request below (the sidecar's Role, and in the second namespace a RoleBinding of the
//! same Role), so the policy is what decides. The node test `real_node_install.rs` runs an
//! allowed exec to the end.

mod cluster;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{AttachParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use testkit::real::ControlPlane;

const NS: &str = "games";
/// Another namespace with a pod of the same name, where the sidecar's account is granted the
/// Role too.
const OTHER_NS: &str = "lobby";
const SA: &str = "podprobe-sidecar";
const POLICY: &str = "podprobe-sidecar-pods-exec";
const NOT_ITS_NAMESPACE: &str = "exec only into pods of its own namespace";
const NOT_ITS_POD: &str = "exec only into its own pod";
const ITS_OWN_CONTAINER: &str = "other than its own";

async fn pod(cp: &ControlPlane, namespace: &str, name: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"serviceAccountName": SA, "containers": [{"name": "game", "image": "game:1"}]}
    }))
    .unwrap();
    Api::namespaced(cp.client(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

/// `sh -c :` in `namespace/name` as `client`: `None` when admission let it through (it then
/// fails for want of a node), else the refusal's message.
async fn exec(client: &Client, namespace: &str, name: &str) -> Option<String> {
    exec_in(client, namespace, name, "game").await
}

/// [`exec`] into `container`.
async fn exec_in(client: &Client, namespace: &str, name: &str, container: &str) -> Option<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = AttachParams::default().container(container).stderr(true);
    match pods.exec(name, ["sh", "-c", ":"], &params).await {
        Err(kube::Error::Api(e)) if e.code == 403 => Some(e.message),
        Err(kube::Error::Api(e)) => {
            assert!(
                e.message.contains("does not have a host assigned"),
                "{namespace}/{name}: {e:?}"
            );
            None
        }
        Err(other) => panic!("{namespace}/{name}: {other:?}"),
        Ok(_) => panic!("{namespace}/{name}: an exec ran with no node"),
    }
}

fn denied_by(refusal: &Option<String>, validation: &str) -> bool {
    cluster::refused_by(refusal, POLICY, validation)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_execs_only_into_its_own_pod() {
    let cp = ControlPlane::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for namespace in [NS, OTHER_NS] {
        cp.create_namespace(namespace).await.unwrap();
    }
    cluster::apply_sidecar_policy(&cp, &[NS, OTHER_NS], "templates/admission-policy-exec.yaml");
    // The games account gets the Role in the other namespace too: RBAC would allow it there.
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "games-sidecar"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SA},
        "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": NS}]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(cp.client(), OTHER_NS)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    let own = pod(&cp, NS, "gs-0").await;
    pod(&cp, NS, "gs-1").await;
    pod(&cp, OTHER_NS, "gs-0").await;
    let sidecar = cp.client_for_token(&cp.pod_token(SA, &own).await.unwrap());
    let unbound = cp.client_for_token(&cp.service_account_token(NS, SA).await.unwrap());

    // The policy is enforced asynchronously: until the neighbour is refused.
    let deadline = Instant::now() + Duration::from_secs(60);
    let neighbour = loop {
        let refusal = exec(&sidecar, NS, "gs-1").await;
        if refusal.is_some() || Instant::now() > deadline {
            break refusal;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        denied_by(&neighbour, NOT_ITS_POD),
        "a neighbour: {neighbour:?}"
    );
    let elsewhere = exec(&sidecar, OTHER_NS, "gs-0").await;
    assert!(
        denied_by(&elsewhere, NOT_ITS_NAMESPACE),
        "its pod's name in another namespace: {elsewhere:?}"
    );
    let unbound = exec(&unbound, NS, "gs-0").await;
    assert!(
        denied_by(&unbound, NOT_ITS_POD),
        "a token bound to no pod: {unbound:?}"
    );
    assert_eq!(exec(&sidecar, NS, "gs-0").await, None, "its own pod");
    let own_container = exec_in(&sidecar, NS, "gs-0", "podprobe").await;
    assert!(
        denied_by(&own_container, ITS_OWN_CONTAINER),
        "its own container: {own_container:?}"
    );
}

/// The bound SECURITY.md gives: an exec names no uid, so a deleted pod's token reaches a
/// same-named replacement while kube-apiserver still caches the token's review (10 s), and
/// never after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pods_token_reaches_its_replacement_for_seconds_only() {
    let cp = ControlPlane::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    cp.create_namespace(NS).await.unwrap();
    cluster::apply_sidecar_policy(&cp, &[NS], "templates/admission-policy-exec.yaml");
    let old = pod(&cp, NS, "gs-0").await;
    pod(&cp, NS, "gs-1").await;
    let old_token = cp.client_for_token(&cp.pod_token(SA, &old).await.unwrap());
    // Enforced once the neighbour is refused; the last request also caches the token.
    let deadline = Instant::now() + Duration::from_secs(60);
    while exec(&old_token, NS, "gs-1").await.is_none() {
        assert!(Instant::now() < deadline, "the policy is never enforced");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cached = Instant::now();
    let pods: Api<Pod> = Api::namespaced(cp.client(), NS);
    pods.delete("gs-0", &kube::api::DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    pod(&cp, NS, "gs-0").await;
    let within = exec(&old_token, NS, "gs-0").await;
    let after = cached.elapsed();
    println!("the replacement, {after:?} after the token was cached: {within:?}");
    assert!(
        after < Duration::from_secs(9),
        "too slow to be in the window: {after:?}"
    );
    assert_eq!(
        within, None,
        "inside the cache window the policy cannot tell"
    );

    // Once the cache entry expires the token is checked against the replacement: 401.
    let refused = loop {
        let pods: Api<Pod> = Api::namespaced(old_token.clone(), NS);
        let params = AttachParams::default().container("game").stderr(true);
        match pods.exec("gs-0", ["sh", "-c", ":"], &params).await {
            Err(kube::Error::Api(e)) if e.code == 401 => break cached.elapsed(),
            _ => {}
        }
        assert!(
            cached.elapsed() < Duration::from_secs(60),
            "the old token still works"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!("the old token is refused {refused:?} after it was cached");
    assert!(refused <= Duration::from_secs(30), "{refused:?}");
}
