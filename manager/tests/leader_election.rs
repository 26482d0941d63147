//! Two managers campaign on one Lease: exactly one leads; killing it (no release) hands over
//! within the lease duration; a graceful shutdown releases the lease at once.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use podprobe_manager::run::LeaderOptions;
use podprobe_manager::webhook::Mode;
use support::*;
use testkit::real::ControlPlane;

const LEASE: Duration = Duration::from_secs(2);

fn leader(identity: &str) -> Option<LeaderOptions> {
    Some(LeaderOptions {
        namespace: "kube-system".into(),
        name: "podprobe-manager".into(),
        identity: identity.into(),
        lease_duration: LEASE,
    })
}

async fn lease(cp: &ControlPlane) -> Option<Lease> {
    let leases = kube::Api::<Lease>::namespaced(cp.client(), "kube-system");
    leases
        .get_opt("podprobe-manager")
        .await
        .expect("read the lease")
}

async fn holder(cp: &ControlPlane) -> Option<String> {
    lease(cp).await.and_then(|l| l.spec?.holder_identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leads_and_a_killed_leader_is_replaced_within_the_lease_duration() {
    // The manager's caches need the PodProbeMarker CRD.
    let cluster = Tv03Cluster::start().await;
    let cp = &cluster.cp;
    let dir = tempfile::tempdir().unwrap();
    let a = start_manager(cp.client(), dir.path(), Mode::Standalone, leader("a"), None).await;
    a.manager.wait_leader().await;
    let b = start_manager(cp.client(), dir.path(), Mode::Standalone, leader("b"), None).await;
    // b keeps following while a renews.
    tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
    assert!(a.manager.is_leader());
    assert!(!b.manager.is_leader());
    assert_eq!(holder(cp).await.as_deref(), Some("a"));

    let killed = Instant::now();
    a.manager.kill();
    tokio::time::timeout(LEASE * 2, b.manager.wait_leader())
        .await
        .expect("b leads");
    let handover = killed.elapsed();
    // Expiry is measured from b's last sight of a renewal (≤ one retry period before the
    // kill), plus one retry period to notice.
    assert!(
        handover <= LEASE + LEASE.mul_f64(2.0 * 2.0 / 15.0) + Duration::from_millis(300),
        "handover took {handover:?}"
    );
    assert!(
        handover >= LEASE - LEASE.mul_f64(2.0 / 15.0),
        "took over a live lease after {handover:?}"
    );
    assert_eq!(holder(cp).await.as_deref(), Some("b"));
    let transitions = lease(cp).await.and_then(|l| l.spec?.lease_transitions);
    assert_eq!(transitions, Some(1));

    // A graceful shutdown releases: a third candidate takes over at once.
    let c = start_manager(cp.client(), dir.path(), Mode::Standalone, leader("c"), None).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!c.manager.is_leader());
    let released = Instant::now();
    b.manager.shutdown().await;
    assert_eq!(holder(cp).await, None, "released on shutdown");
    tokio::time::timeout(LEASE, c.manager.wait_leader())
        .await
        .expect("c leads after the release");
    assert!(released.elapsed() < LEASE, "{:?}", released.elapsed());
}
