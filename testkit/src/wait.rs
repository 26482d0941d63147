//! The waits every test file needs, in one place: a condition polled until it holds (or an
//! async probe until it finds something), and a pod watched until it is as wanted. Each
//! panics with what was awaited (the pod's wait with what was seen), so a failing test says
//! why.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;

/// Polls `check` every 20 ms until it holds; panics naming `what` after `limit`.
pub async fn until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let wait = async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(limit, wait).await.is_err() {
        panic!("not within {limit:?}: {what}");
    }
}

/// Asks `probe` (an apiserver read, say) every 50 ms until it answers `Some`; panics naming
/// `what` after `limit`.
pub async fn until_some<T>(
    limit: Duration,
    what: &str,
    mut probe: impl AsyncFnMut() -> Option<T>,
) -> T {
    let wait = async {
        loop {
            if let Some(found) = probe().await {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(limit, wait)
        .await
        .unwrap_or_else(|_| panic!("not within {limit:?}: {what}"))
}

/// Watches pod `name` until `check` holds (the pod then) or `limit` passes (`None`).
pub async fn watch_pod(
    pods: &Api<Pod>,
    name: &str,
    limit: Duration,
    check: impl Fn(&Pod) -> bool,
) -> Option<Pod> {
    let cond = kube::runtime::wait::await_condition(pods.clone(), name, |p: Option<&Pod>| {
        p.is_some_and(&check)
    });
    tokio::time::timeout(limit, cond).await.ok()?.ok()?
}

/// [`watch_pod`], panicking after `limit` with `what` and the pod's metadata and status then.
pub async fn pod(
    pods: &Api<Pod>,
    name: &str,
    what: &str,
    limit: Duration,
    check: impl Fn(&Pod) -> bool,
) -> Pod {
    if let Some(pod) = watch_pod(pods, name, limit, check).await {
        return pod;
    }
    let now = pods.get(name).await.ok();
    panic!(
        "pod {name}: {what}: not reached within {limit:?}; the pod now: {:#?}",
        now.map(|p| (p.metadata.labels, p.metadata.annotations, p.status))
    )
}
