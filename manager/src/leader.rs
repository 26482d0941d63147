//! Leader election on a `coordination.k8s.io/v1` Lease (kube-runtime 5 ships none).
//!
//! client-go's algorithm in small: every `retry_period` the candidate reads the Lease; the
//! holder renews `renewTime`; another candidate takes over when the holder field is empty
//! (released) or the record has not changed for `leaseDurationSeconds` *as measured on the
//! candidate's own clock since it last saw the record change* (so clock skew between replicas
//! does not matter). Every write is a PUT carrying the read `resourceVersion`, so two candidates
//! racing for an expired lease cannot both win: the loser gets 409 and stays a follower. A leader
//! that cannot renew for `renew_deadline` steps down by itself, before anyone else may take over.
//! On shutdown the leader releases the lease (empty holder) so a successor starts at once.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Lease settings.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This candidate's identity (unique per process).
    pub identity: String,
    /// How long a lease is valid without renewal (`leaseDurationSeconds`, whole seconds ≥ 1).
    pub lease_duration: Duration,
    /// How often to try to acquire or renew.
    pub retry_period: Duration,
    /// A leader that could not renew for this long steps down (must be < `lease_duration`).
    pub renew_deadline: Duration,
}

impl LeaseConfig {
    /// Timings derived from the lease duration as client-go's defaults relate (15 s / 10 s /
    /// 2 s): renew deadline 2/3, retry period 2/15 of it.
    pub fn new(namespace: &str, name: &str, identity: &str, lease_duration: Duration) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration,
            retry_period: lease_duration.mul_f64(2.0 / 15.0),
            renew_deadline: lease_duration.mul_f64(2.0 / 3.0),
        }
    }
}

/// This replica's pod name (`POD_NAME`, else the host name, which a pod's is), or
/// `podprobe-manager`.
pub fn replica_name() -> String {
    std::env::var("POD_NAME")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_owned())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "podprobe-manager".into())
}

/// A default identity: the pod name (or host name) plus the process id and start time.
pub fn default_identity() -> String {
    let host = replica_name();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{host}_{}_{nanos:08x}", std::process::id())
}

/// One candidate.
#[derive(Debug)]
pub struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    /// The record last seen (holder, renewTime, resourceVersion) and when it was first seen.
    observed: Option<(ObservedRecord, Instant)>,
}

type ObservedRecord = (Option<String>, Option<MicroTime>, Option<String>);

fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

fn duration_seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

impl Elector {
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
        }
    }

    /// Try to become or stay the leader once; `Ok(true)` when this candidate holds the lease.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let me = self.config.identity.clone();
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(duration_seconds(self.config.lease_duration)),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let record = (
            holder.clone(),
            spec.renew_time.clone(),
            lease.metadata.resource_version.clone(),
        );
        if self.observed.as_ref().is_none_or(|(r, _)| *r != record) {
            self.observed = Some((record, Instant::now()));
        }
        let spec = lease.spec.get_or_insert_with(Default::default);
        let valid_for = Duration::from_secs(
            spec.lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .unwrap_or(self.config.lease_duration.as_secs()),
        );
        let since_change = self
            .observed
            .as_ref()
            .map(|(_, at)| at.elapsed())
            .unwrap_or_default();
        if holder.as_deref() == Some(me.as_str()) {
            spec.renew_time = Some(now());
            spec.lease_duration_seconds = Some(duration_seconds(self.config.lease_duration));
        } else if holder.is_none() || since_change > valid_for {
            spec.holder_identity = Some(me);
            spec.acquire_time = Some(now());
            spec.renew_time = Some(now());
            spec.lease_duration_seconds = Some(duration_seconds(self.config.lease_duration));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        } else {
            return Ok(false);
        }
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Give the lease up if this candidate holds it.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now());
        self.api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
            .map(|_| ())
    }

    /// Campaign until `shutdown`, publishing leadership on `leading`; releases the lease at the
    /// end when held.
    pub async fn run(mut self, leading: watch::Sender<bool>, shutdown: CancellationToken) {
        let mut last_renewal: Option<Instant> = None;
        loop {
            let is_leader = match self.try_acquire_or_renew().await {
                Ok(true) => {
                    last_renewal = Some(Instant::now());
                    true
                }
                Ok(false) => false,
                Err(e) => {
                    tracing::warn!(lease = %self.config.name, "lease: {e}");
                    // Keep leading through short apiserver trouble, never past the deadline.
                    last_renewal.is_some_and(|t| t.elapsed() < self.config.renew_deadline)
                }
            };
            if !is_leader {
                last_renewal = None;
            }
            leading.send_if_modified(|was| {
                let changed = *was != is_leader;
                if changed {
                    tracing::info!(
                        identity = %self.config.identity,
                        lease = %format!("{}/{}", self.config.namespace, self.config.name),
                        "{}",
                        if is_leader { "became the leader" } else { "lost leadership" }
                    );
                }
                *was = is_leader;
                changed
            });
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
        }
        if *leading.borrow() {
            leading.send_replace(false);
            if let Err(e) = self.release().await {
                tracing::warn!("cannot release the lease: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Against a real kube-apiserver's Lease storage (resourceVersion conflicts included). The
    //! expiry is measured on the candidate's `Instant` of its last observed change; the tests
    //! move that observation back instead of waiting, which is what the passing of time does
    //! to it.

    use super::*;
    use testkit::real::ControlPlane;

    const NS: &str = "podprobe-system";

    async fn server() -> ControlPlane {
        let cp = ControlPlane::start().await.expect("a control plane");
        cp.create_namespace(NS).await.expect("the namespace");
        cp
    }

    fn elector(cp: &ControlPlane, identity: &str, lease: Duration) -> Elector {
        Elector::new(
            cp.client(),
            LeaseConfig::new(NS, "podprobe-manager", identity, lease),
        )
    }

    async fn spec(cp: &ControlPlane) -> LeaseSpec {
        Api::<Lease>::namespaced(cp.client(), NS)
            .get("podprobe-manager")
            .await
            .expect("the lease exists")
            .spec
            .unwrap_or_default()
    }

    /// Creates the lease as held by `holder` (released when empty), renewed just now.
    async fn held_by(cp: &ControlPlane, holder: &str, transitions: i32, seconds: i32) {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some("podprobe-manager".into()),
                namespace: Some(NS.into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(seconds),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(transitions),
                ..Default::default()
            }),
        };
        Api::<Lease>::namespaced(cp.client(), NS)
            .create(&PostParams::default(), &lease)
            .await
            .expect("create the lease");
    }

    /// What the passing of `d` does to the candidate's view of the record.
    fn age_observation(e: &mut Elector, d: Duration) {
        let (_, at) = e.observed.as_mut().expect("a record was observed");
        *at -= d;
    }

    #[tokio::test]
    async fn acquires_a_missing_lease() {
        let api = server().await;
        let mut a = elector(&api, "a", Duration::from_secs(15));
        assert!(a.try_acquire_or_renew().await.unwrap());
        let s = spec(&api).await;
        assert_eq!(s.holder_identity.as_deref(), Some("a"));
        assert_eq!(s.lease_duration_seconds, Some(15));
        assert_eq!(s.lease_transitions, Some(0));
        assert!(s.acquire_time.is_some() && s.renew_time.is_some());
    }

    #[tokio::test]
    async fn acquires_a_released_lease() {
        let api = server().await;
        held_by(&api, "", 2, 1).await;
        let mut a = elector(&api, "a", Duration::from_secs(15));
        assert!(a.try_acquire_or_renew().await.unwrap());
        let s = spec(&api).await;
        assert_eq!(s.holder_identity.as_deref(), Some("a"));
        assert_eq!(s.lease_transitions, Some(3));
        assert_eq!(s.lease_duration_seconds, Some(15));
    }

    #[tokio::test]
    async fn the_holder_renews() {
        let api = server().await;
        let mut a = elector(&api, "a", Duration::from_secs(15));
        assert!(a.try_acquire_or_renew().await.unwrap());
        let before = spec(&api).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(a.try_acquire_or_renew().await.unwrap());
        let after = spec(&api).await;
        assert_eq!(after.holder_identity.as_deref(), Some("a"));
        assert!(after.renew_time.unwrap().0 > before.renew_time.unwrap().0);
        assert_eq!(
            after.acquire_time, before.acquire_time,
            "renewal is no acquisition"
        );
        assert_eq!(after.lease_transitions, Some(0));
    }

    #[tokio::test]
    async fn refuses_while_another_holders_lease_is_valid() {
        let api = server().await;
        held_by(&api, "b", 0, 15).await;
        let mut a = elector(&api, "a", Duration::from_secs(15));
        assert!(!a.try_acquire_or_renew().await.unwrap());
        age_observation(&mut a, Duration::from_secs(14));
        assert!(
            !a.try_acquire_or_renew().await.unwrap(),
            "14 s of 15 s: still valid"
        );
        assert_eq!(spec(&api).await.holder_identity.as_deref(), Some("b"));
        // The holder renews: the record changed, the candidate's wait starts over.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut b = elector(&api, "b", Duration::from_secs(15));
        assert!(b.try_acquire_or_renew().await.unwrap());
        assert!(!a.try_acquire_or_renew().await.unwrap());
        age_observation(&mut a, Duration::from_secs(14));
        assert!(!a.try_acquire_or_renew().await.unwrap());
        assert_eq!(spec(&api).await.holder_identity.as_deref(), Some("b"));
    }

    #[tokio::test]
    async fn takes_over_an_expired_lease() {
        let api = server().await;
        held_by(&api, "b", 4, 15).await;
        let mut a = elector(&api, "a", Duration::from_secs(10));
        assert!(!a.try_acquire_or_renew().await.unwrap());
        // The lease's own duration (15 s) counts, not the candidate's (10 s).
        age_observation(&mut a, Duration::from_secs(12));
        assert!(!a.try_acquire_or_renew().await.unwrap());
        age_observation(&mut a, Duration::from_secs(4));
        assert!(a.try_acquire_or_renew().await.unwrap());
        let s = spec(&api).await;
        assert_eq!(s.holder_identity.as_deref(), Some("a"));
        assert_eq!(s.lease_transitions, Some(5));
        assert_eq!(s.lease_duration_seconds, Some(10));
    }

    #[tokio::test]
    async fn run_leads_and_releases_on_shutdown() {
        let api = server().await;
        let a = elector(&api, "a", Duration::from_secs(1));
        let (tx, mut leading) = watch::channel(false);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(a.run(tx, shutdown.clone()));
        tokio::time::timeout(Duration::from_secs(5), leading.wait_for(|l| *l))
            .await
            .expect("leads within 5 s")
            .unwrap();
        assert_eq!(spec(&api).await.holder_identity.as_deref(), Some("a"));
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("stops within 5 s")
            .unwrap();
        assert!(!*leading.borrow());
        let s = spec(&api).await;
        assert_eq!(s.holder_identity, None, "released");
        // A successor takes it at once.
        let mut b = elector(&api, "b", Duration::from_secs(15));
        assert!(b.try_acquire_or_renew().await.unwrap());
        assert_eq!(spec(&api).await.lease_transitions, Some(1));
    }
}
