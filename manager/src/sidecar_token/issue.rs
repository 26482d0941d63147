//! The issuer: for each pod labelled pending, a token bound to it in its Secret, then the
//! pod released. Every replica runs it, so injection and issue work without a leader, in both
//! modes; each issues the pods its own webhook admitted (they carry its name,
//! [`ISSUER_LABEL`](super::ISSUER_LABEL)), and those of another replica only once [`TAKEOVER`] has passed since the
//! pod's creation (that replica went away), so a burst costs one TokenRequest, one Secret and
//! one release per pod. A replica that finds the Secret written by another waits, with
//! backoff, while that one releases the pod.
//!
//! What can go wrong shows on the pod, as Events: a refusal (no RoleBinding or ServiceAccount
//! yet: a `helm upgrade` that adds a namespace may land after its pods) is asked again with
//! backoff for [`REFUSAL_GRACE`] from the pod's creation, then the pod is released without its
//! token; so is a pod whose Secret exists already after that time (another pod's, named by
//! this one: never taken as this pod's).

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use kube::api::{ListParams, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Resource};
use podprobe_ops::backoff::{AlreadyBackedOff, Failure, Policy, WatchRetry};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::decide::{
    FirstLook, PodId, TokenError, Verdict, capped, first_look, issued_secret, pod_id,
    release_patch, still_pending, token_secret, verdict,
};
use super::{LABEL, PENDING, REFUSED};
use crate::metrics::Metrics;
use crate::retries::{PerObject, Retries};

pub use super::decide::{REFUSAL_GRACE, TAKEOVER};

#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error("pod {pod}: {what}: {source}")]
    Api {
        pod: String,
        what: &'static str,
        source: kube::Error,
    },
    #[error(
        "pod {pod}: the sidecar's token was refused ({source}); asking again until {REFUSAL_GRACE:?} after the pod's creation"
    )]
    Refused { pod: String, source: kube::Error },
    #[error(
        "pod {pod}: the Secret it names exists already; looking again until {REFUSAL_GRACE:?} after the pod's creation (another replica may be releasing it)"
    )]
    Taken { pod: String },
}

impl IssueError {
    fn failure(&self) -> Failure {
        match self {
            IssueError::Api { source, .. } => Failure::of(source),
            IssueError::Refused { .. } | IssueError::Taken { .. } => {
                Failure::Refused { retry_after: None }
            }
        }
    }
}

/// How often the pending gauge is read from the issuer's cache.
const GAUGE_EVERY: Duration = Duration::from_secs(5);
/// When a release the apiserver refused is tried again.
const RELEASE_RETRY: Duration = Duration::from_secs(30);

struct Context {
    client: Client,
    /// The lifetime asked for (`sidecarTokenLifetime`; the apiserver may cap it,
    /// `--service-account-max-token-expiration`). The token is bound to the pod, so it stops
    /// working when the pod is deleted; the sidecar renews it at 80 % of its lifetime or daily
    /// (src/credential.rs), since a provider copies the Secret once, at start.
    lifetime: Duration,
    /// This replica's [`ISSUER_LABEL`](super::ISSUER_LABEL) value; `None` takes every pod (`release-gates`).
    issuer: Option<String>,
    metrics: Arc<Metrics>,
    retries: Arc<Retries<Pod>>,
    /// Pods whose Secret this replica created and has not released yet: a release that
    /// failed is tried again without taking the Secret's existence for another pod's.
    written: Arc<PerObject<Pod, ()>>,
    /// Pods told of a refusal that is asked again: told once, not at every retry.
    warned: Arc<PerObject<Pod, ()>>,
}

impl Context {
    /// A Warning Event on `pod`. A Recorder per Event, as the unprobed sweep does: one that
    /// remembers would patch a repeated Event into a series, and the manager may only create
    /// Events.
    async fn warn(&self, pod: &Pod, reason: &str, note: String) {
        let events = Recorder::new(self.client.clone(), crate::events::reporter());
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "IssueSidecarToken".into(),
            secondary: None,
        };
        if let Err(e) = events.publish(&event, &pod.object_ref(&())).await {
            tracing::warn!(pod = ?pod.metadata.name, "cannot publish the {reason} Event: {e}");
        }
    }
}

/// Runs the issuer until `shutdown`.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    lifetime: Duration,
    issuer: String,
    shutdown: CancellationToken,
) {
    let pods: Api<Pod> = Api::all(client.clone());
    let selector = format!("{LABEL}={PENDING}");
    // The watch holds exactly the pending pods: released ones leave its selector.
    let (pending, writer) = reflector::store();
    let retries = Arc::new(Retries::new(Policy::WATCH));
    let written = Arc::new(PerObject::default());
    let warned = Arc::new(PerObject::default());
    let stream = watcher(pods, watcher::Config::default().labels(&selector))
        .retry_backoff()
        .reflect(writer)
        .inspect_ok({
            let (retries, written, warned) = (retries.clone(), written.clone(), warned.clone());
            let cache = pending.clone();
            move |event| {
                retries.observe(event, &cache);
                written.observe(event, &cache);
                warned.observe(event, &cache);
            }
        })
        .applied_objects();
    // The controller would back its trigger stream off again, by kube-rs's default (up to a
    // minute) unless told: the watch would then stay away that long after an outage.
    let controller =
        Controller::for_stream(stream, pending.clone()).trigger_backoff(AlreadyBackedOff);
    let gauge = metrics.sidecar_tokens_pending.clone();
    let gauge_stop = shutdown.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(GAUGE_EVERY);
        loop {
            tokio::select! {
                _ = gauge_stop.cancelled() => return,
                _ = every.tick() => {
                    gauge.set(i64::try_from(pending.state().len()).unwrap_or(i64::MAX));
                }
            }
        }
    });
    controller
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(
            reconcile,
            error_policy,
            Arc::new(Context {
                client,
                lifetime,
                issuer: Some(issuer),
                metrics,
                retries,
                written,
                warned,
            }),
        )
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// What [`issue_pending_once`] leaves behind: the pods still waiting at its deadline.
#[derive(Debug, thiserror::Error)]
pub enum OnceError {
    #[error("cannot list the pods waiting for their sidecar's token: {0}")]
    List(#[source] kube::Error),
    /// The account may not list pods: it has no injection grants, so no pod waits for it
    /// (the chart's hook after `injection.enabled=false` on a release that had it off too).
    #[error(
        "this service account may not list pods ({0}): it has no injection grants, so it gated no pod"
    )]
    NotPermitted(#[source] kube::Error),
    #[error(
        "{} pods still wait for their sidecar's token after {took:?}: {}",
        pods.len(),
        pods.join(", ")
    )]
    StillWaiting { pods: Vec<String>, took: Duration },
}

/// How often [`issue_pending_once`] looks at the pods still waiting.
const ONCE_EVERY: Duration = Duration::from_secs(2);

/// Issues the token of every pod still held by the gate and releases it, as the issuer does,
/// until none waits or `timeout` has passed: what the chart's uninstall hook runs, so that no
/// pod waits behind the gate for an issuer that is going away. A refused token is asked again
/// until [`REFUSAL_GRACE`] after the pod's creation, then the pod is released without it,
/// with its Event. Returns how many pods it found waiting.
pub async fn issue_pending_once(
    client: Client,
    metrics: Arc<Metrics>,
    lifetime: Duration,
    timeout: Duration,
) -> Result<usize, OnceError> {
    let pods: Api<Pod> = Api::all(client.clone());
    let selector = ListParams::default().labels(&format!("{LABEL}={PENDING}"));
    let ctx = Arc::new(Context {
        client,
        lifetime,
        issuer: None,
        metrics,
        retries: Arc::new(Retries::new(Policy::WATCH)),
        written: Arc::new(PerObject::default()),
        warned: Arc::new(PerObject::default()),
    });
    let started = tokio::time::Instant::now();
    let mut seen = std::collections::BTreeSet::new();
    loop {
        let listed = pods.list(&selector).await.map_err(|e| match e {
            kube::Error::Api(ref s) if s.code == 403 => OnceError::NotPermitted(e),
            e => OnceError::List(e),
        })?;
        // A bound or deleted pod is not the issuer's to release (see `reconcile`).
        let waiting: Vec<Pod> = listed
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| p.spec.as_ref().is_none_or(|s| s.node_name.is_none()))
            .collect();
        let names: Vec<String> = waiting.iter().map(pod_id).collect();
        if waiting.is_empty() {
            return Ok(seen.len());
        }
        if started.elapsed() >= timeout {
            return Err(OnceError::StillWaiting {
                pods: names,
                took: started.elapsed(),
            });
        }
        seen.extend(names);
        for pod in waiting {
            let id = pod_id(&pod);
            if let Err(e) = reconcile(Arc::new(pod), ctx.clone()).await {
                tracing::info!(pod = %id, "{e}; looking again in {ONCE_EVERY:?}");
            }
        }
        tokio::time::sleep(ONCE_EVERY).await;
    }
}

async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action, IssueError> {
    let id = match first_look(&pod, ctx.issuer.as_deref(), Timestamp::now()) {
        FirstLook::Leave(why) => {
            tracing::debug!(pod = %pod_id(&pod), "labelled {LABEL}={PENDING}, left alone: {why}");
            return Ok(Action::await_change());
        }
        FirstLook::LeftToItsIssuer(left) => {
            tracing::debug!(pod = %pod_id(&pod), "admitted by another replica: left to it for {left:?} more");
            return Ok(Action::requeue(left));
        }
        FirstLook::TakeOver(id) => {
            if !still_pending_live(&ctx, id).await? {
                return Ok(Action::await_change());
            }
            tracing::info!(pod = %id, "taking over the sidecar's token from the replica that admitted the pod, {TAKEOVER:?} after its creation");
            id
        }
        FirstLook::Issue(id) => id,
    };
    let oref = ObjectRef::from_obj(&*pod);
    let secret = issued_secret(&pod);
    let written = match &secret {
        Some(_) if ctx.written.lock().contains_key(&oref) => Ok(()),
        Some(secret) => {
            let written = write_token(&ctx, &pod, id, secret).await;
            if written.is_ok() {
                ctx.written.lock().insert(oref.clone(), ());
            }
            written
        }
        None => Ok(()),
    };
    match verdict(&pod, secret, written, Timestamp::now()) {
        Verdict::Release(outcome) => release(&ctx, &pod, id, &oref, outcome).await,
        Verdict::LookAgainTaken => Err(IssueError::Taken {
            pod: id.to_string(),
        }),
        Verdict::AskAgain(e) => {
            if ctx.warned.lock().insert(oref, ()).is_none() {
                let note = format!(
                    "the sidecar's token was refused ({e}); asked again until {REFUSAL_GRACE:?} after the pod's creation, then the pod is released without it"
                );
                ctx.warn(&pod, "SidecarTokenRefused", note).await;
            }
            Err(IssueError::Refused {
                pod: id.to_string(),
                source: e,
            })
        }
        Verdict::Retry(source) => Err(IssueError::Api {
            pod: id.to_string(),
            what: "issuing the sidecar's token",
            source,
        }),
    }
}

/// Whether the pod another replica admitted is, read live, still pending: this replica's
/// watch may lag (it reconnects after a dropped connection), and the pod be released already.
async fn still_pending_live(ctx: &Context, id: PodId<'_>) -> Result<bool, IssueError> {
    // A list by name: the manager may list pods, not get them.
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), id.namespace);
    let by_name = ListParams::default().fields(&format!("metadata.name={}", id.name));
    let live = pods
        .list(&by_name)
        .await
        .map_err(|source| IssueError::Api {
            pod: id.to_string(),
            what: "reading the pod before taking it over",
            source,
        })?;
    Ok(still_pending(live.items.first(), id.uid))
}

/// The pod released with its token (`Ok`: the Secret's name) or without it (`Err`: why, said
/// in the log and on the pod).
async fn release(
    ctx: &Context,
    pod: &Pod,
    id: PodId<'_>,
    oref: &ObjectRef<Pod>,
    outcome: Result<String, String>,
) -> Result<Action, IssueError> {
    let (label, outcome_label) = match &outcome {
        Ok(secret) => {
            tracing::info!(pod = %id, %secret, "issued the sidecar's token, bound to the pod; releasing it");
            (Value::Null, "issued")
        }
        Err(why) => {
            tracing::warn!(pod = %id, "cannot issue the sidecar's token ({why}); releasing the pod without it (its token volume is optional): it runs, and its sidecar cannot reach the apiserver. Labelled {LABEL}={REFUSED}");
            ctx.warn(
                pod,
                "SidecarTokenNotIssued",
                format!("released without the sidecar's token: {why}; its sidecar cannot reach the apiserver, so nothing probes this pod. Fix the cause and recreate the pod"),
            )
            .await;
            (Value::String(REFUSED.into()), "refused")
        }
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), id.namespace);
    let release = release_patch(pod, id.uid, label);
    match pods.patch(id.name, &PatchParams::default(), &release).await {
        Ok(_) => {
            ctx.retries.answered(oref);
            ctx.written.lock().remove(oref);
            ctx.warned.lock().remove(oref);
            ctx.metrics.sidecar_token(outcome_label);
            Ok(Action::await_change())
        }
        // Deleted meanwhile.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Action::await_change()),
        // A `test` that no longer holds (replaced, or released by another replica: the watch
        // brings the change), or a release the apiserver refuses: looked at again later, and
        // said, since a pod left gated does not run.
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 422 => {
            tracing::warn!(pod = %id, "the pod's release was refused ({}); trying again in {RELEASE_RETRY:?}", s.message);
            Ok(Action::requeue(RELEASE_RETRY))
        }
        Err(source) => Err(IssueError::Api {
            pod: id.to_string(),
            what: "releasing the pod",
            source,
        }),
    }
}

/// A token of the pod's service account bound to the pod, into the Secret the pod mounts.
async fn write_token(
    ctx: &Context,
    pod: &Pod,
    id: PodId<'_>,
    secret: &str,
) -> Result<(), TokenError> {
    let account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.as_deref())
        .unwrap_or("default");
    let seconds = i64::try_from(ctx.lifetime.as_secs()).unwrap_or(i64::MAX);
    let request = podprobe_ops::token::bound_to_pod(id.name, id.uid, seconds);
    let issued = Api::<ServiceAccount>::namespaced(ctx.client.clone(), id.namespace)
        .create_token_request(account, &PostParams::default(), &request)
        .await?;
    let Some(status) = issued.status.filter(|s| !s.token.is_empty()) else {
        return Err(TokenError::Api(kube::Error::Service(
            format!(
                "the TokenRequest for {}/{account} came back without a token",
                id.namespace
            )
            .into(),
        )));
    };
    let expires = status.expiration_timestamp.0;
    if capped(expires, ctx.lifetime, Timestamp::now()) {
        tracing::info!(
            pod = %id,
            "the apiserver capped the sidecar's token at {expires} (asked {:?}: --service-account-max-token-expiration); the sidecar renews it at 80 % of that",
            ctx.lifetime
        );
    }
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), id.namespace);
    let object = token_secret(id, secret, status.token);
    match secrets.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(TokenError::Taken {
            secret: secret.to_owned(),
        }),
        Err(e) => Err(e.into()),
    }
}

fn error_policy(pod: Arc<Pod>, error: &IssueError, ctx: Arc<Context>) -> Action {
    let wait = ctx
        .retries
        .failed(ObjectRef::from_obj(&*pod), error.failure());
    match error {
        // With two replicas the second finds every pod's Secret written by the first, which
        // is about to release the pod: routine, not worth a warning per pod of a burst.
        IssueError::Taken { .. } => tracing::debug!("{error}; looking again in {wait:.1?}"),
        _ => tracing::warn!("{error}; retrying in {wait:.1?}"),
    }
    Action::requeue(wait)
}
