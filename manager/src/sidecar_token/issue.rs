//! The issuer: for each pod labelled pending, a token bound to it in its Secret, then the
//! pod released. Every replica runs it, so injection and issue work without a leader, in both
//! modes; each issues the pods its own webhook admitted (they carry its name,
//! [`ISSUER_LABEL`]), and those of another replica only once [`TAKEOVER`] has passed since the
//! pod's creation (that replica went away), so a burst costs one TokenRequest, one Secret and
//! one release per pod. A replica that finds the Secret written by another waits, with
//! backoff, while that one releases the pod.
//!
//! What can go wrong shows on the pod, as Events: a refusal (no RoleBinding or ServiceAccount
//! yet: a `helm upgrade` that adds a namespace may land after its pods) is asked again with
//! backoff for [`REFUSAL_GRACE`] from the pod's creation, then the pod is released without its
//! token; so is a pod whose Secret exists already after that time (another pod's, named by
//! this one: never taken as this pod's).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Resource};
use podprobe_ops::backoff::{AlreadyBackedOff, Failure, Policy, WatchRetry};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{GATE, ISSUER_LABEL, LABEL, PENDING, REFUSED};
use crate::inject::TOKEN_VOLUME;
use crate::metrics::Metrics;
use crate::patch::escape;
use crate::retries::{PerObject, Retries};

/// How long after a pod's creation a refused TokenRequest is asked again before the pod is
/// released without its token: its gate then holds it at most about this long (the last wait
/// of the backoff, at most 30 s, comes on top), with a Warning Event on it meanwhile.
pub const REFUSAL_GRACE: Duration = Duration::from_secs(30);

/// How long after a pod's creation it is left to the replica that admitted it: past that, any
/// replica issues it (the one that admitted it stopped, or is stuck).
pub const TAKEOVER: Duration = Duration::from_secs(10);

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

/// Why a token could not be written.
#[derive(Debug, thiserror::Error)]
enum TokenError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// A Secret of that name exists. Another replica may have written it for this pod a moment
    /// ago (it then releases the pod, which leaves the pending pods); or the pod names a Secret
    /// that is not its own. The manager may not read Secrets, so it cannot tell which, and
    /// never takes a Secret it did not just write as this pod's.
    #[error("a Secret named {secret} exists already and was not written for this pod")]
    Taken { secret: String },
}

/// How often the pending gauge is read from the issuer's cache.
const GAUGE_EVERY: Duration = Duration::from_secs(5);
/// When a release the apiserver refused is tried again.
const RELEASE_RETRY: Duration = Duration::from_secs(30);

struct Context {
    client: Client,
    /// The lifetime asked for (`sidecarTokenLifetime`; the apiserver may cap it,
    /// `--service-account-max-token-expiration`). The token is bound to the pod, so it stops
    /// working when the pod is deleted; the sidecar renews it at 80 % of its lifetime
    /// (src/credential.rs), since a provider copies the Secret once, at start.
    lifetime: Duration,
    /// This replica's [`ISSUER_LABEL`] value; `None` takes every pod (`release-gates`).
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

fn pod_id(pod: &Pod) -> String {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    format!("{ns}/{name}")
}

/// The Secret injection named in the pod's token volume.
fn issued_secret(pod: &Pod) -> Option<String> {
    let volume = pod
        .spec
        .as_ref()?
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == TOKEN_VOLUME)?;
    let sources = volume.projected.as_ref()?.sources.as_ref()?;
    sources
        .iter()
        .find_map(|s| Some(s.secret.as_ref()?.name.clone()))
}

/// Whether the apiserver refused for good (no retry helps): not allowed, or no such account.
fn refused(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403 || s.code == 404 || s.code == 422)
}

async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action, IssueError> {
    let (Some(ns), Some(name), Some(uid)) = (
        pod.metadata.namespace.as_deref(),
        pod.metadata.name.as_deref(),
        pod.metadata.uid.as_deref(),
    ) else {
        return Ok(Action::await_change());
    };
    let id = format!("{ns}/{name}");
    if pod.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some()
    {
        // Bound already (its gate lifted by someone else, or the label set by hand): a write
        // now could cost it its first status on virtual-kubelet ≥ v1.13. Not ours to touch.
        tracing::debug!(pod = %id, "labelled {LABEL}={PENDING} but bound already: left alone");
        return Ok(Action::await_change());
    }
    if let Some(left) = left_to_its_issuer(&pod, ctx.issuer.as_deref()) {
        tracing::debug!(pod = %id, "admitted by another replica: left to it for {left:?} more");
        return Ok(Action::requeue(left));
    }
    // Taking over another replica's pod: this replica's watch may lag (it reconnects after a
    // dropped connection), and the pod be released already. Its live state decides.
    if !is_mine(&pod, ctx.issuer.as_deref()) {
        // A list by name: the manager may list pods, not get them.
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
        let by_name = ListParams::default().fields(&format!("metadata.name={name}"));
        let live = pods
            .list(&by_name)
            .await
            .map_err(|source| IssueError::Api {
                pod: id.clone(),
                what: "reading the pod before taking it over",
                source,
            })?;
        let still_pending = live.items.first().is_some_and(|p| {
            p.metadata.uid.as_deref() == Some(uid)
                && p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL))
                    .map(String::as_str)
                    == Some(PENDING)
        });
        if !still_pending {
            return Ok(Action::await_change());
        }
        tracing::info!(pod = %id, "taking over the sidecar's token from the replica that admitted the pod, {TAKEOVER:?} after its creation");
    }
    let api_error = |what| {
        let pod = id.clone();
        move |source| IssueError::Api { pod, what, source }
    };
    let oref = ObjectRef::from_obj(&*pod);
    let outcome = match issued_secret(&pod) {
        None => Err(format!("it has no {TOKEN_VOLUME} volume naming a Secret")),
        Some(secret) if ctx.written.lock().contains_key(&oref) => Ok(secret),
        Some(secret) => match write_token(&ctx, &pod, ns, name, uid, &secret).await {
            Ok(()) => {
                ctx.written.lock().insert(oref.clone(), ());
                Ok(secret)
            }
            Err(TokenError::Taken { .. }) if within_grace(&pod) => {
                return Err(IssueError::Taken { pod: id });
            }
            Err(e @ TokenError::Taken { .. }) => Err(e.to_string()),
            Err(TokenError::Api(e)) if refused(&e) && within_grace(&pod) => {
                if ctx.warned.lock().insert(oref.clone(), ()).is_none() {
                    ctx.warn(
                        &pod,
                        "SidecarTokenRefused",
                        format!(
                            "the sidecar's token was refused ({e}); asked again until {REFUSAL_GRACE:?} after the pod's creation, then the pod is released without it"
                        ),
                    )
                    .await;
                }
                return Err(IssueError::Refused { pod: id, source: e });
            }
            Err(TokenError::Api(e)) if refused(&e) => Err(e.to_string()),
            Err(TokenError::Api(e)) => return Err(api_error("issuing the sidecar's token")(e)),
        },
    };
    let (released, outcome_label) = match &outcome {
        Ok(secret) => {
            tracing::info!(pod = %id, %secret, "issued the sidecar's token, bound to the pod; releasing it");
            (Value::Null, "issued")
        }
        Err(why) => {
            tracing::warn!(pod = %id, "cannot issue the sidecar's token ({why}); releasing the pod without it (its token volume is optional): it runs, and its sidecar cannot reach the apiserver. Labelled {LABEL}={REFUSED}");
            ctx.warn(
                &pod,
                "SidecarTokenNotIssued",
                format!("released without the sidecar's token: {why}; its sidecar cannot reach the apiserver, so nothing probes this pod. Fix the cause and recreate the pod"),
            )
            .await;
            (Value::String(REFUSED.into()), "refused")
        }
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let release = release_patch(&pod, uid, released);
    match pods.patch(name, &PatchParams::default(), &release).await {
        Ok(_) => {
            ctx.retries.answered(&oref);
            ctx.written.lock().remove(&oref);
            ctx.warned.lock().remove(&oref);
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
        Err(e) => Err(api_error("releasing the pod")(e)),
    }
}

/// Whether this replica (`me`; `None`: `release-gates`, which takes every pod) admitted `pod`.
fn is_mine(pod: &Pod, me: Option<&str>) -> bool {
    let Some(me) = me else {
        return true;
    };
    let labels = pod.metadata.labels.as_ref();
    labels.and_then(|l| l.get(ISSUER_LABEL)).map(String::as_str) == Some(me)
}

/// How much longer `pod` is left to the replica that admitted it, if it is another's and
/// [`TAKEOVER`] has not passed since its creation.
fn left_to_its_issuer(pod: &Pod, me: Option<&str>) -> Option<Duration> {
    if is_mine(pod, me) {
        return None;
    }
    let created = pod.metadata.creation_timestamp.as_ref()?.0;
    let age = jiff::Timestamp::now().duration_since(created);
    let left = jiff::SignedDuration::try_from(TAKEOVER).ok()? - age;
    left.is_positive().then(|| left.unsigned_abs())
}

/// Whether a refusal of `pod`'s token may still be asked again ([`REFUSAL_GRACE`]).
fn within_grace(pod: &Pod) -> bool {
    let Some(created) = &pod.metadata.creation_timestamp else {
        return false;
    };
    let age = jiff::Timestamp::now().duration_since(created.0);
    age < jiff::SignedDuration::try_from(REFUSAL_GRACE).unwrap_or_default()
}

/// A token of the pod's service account bound to the pod, into the Secret the pod mounts.
async fn write_token(
    ctx: &Context,
    pod: &Pod,
    ns: &str,
    name: &str,
    uid: &str,
    secret: &str,
) -> Result<(), TokenError> {
    let account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.as_deref())
        .unwrap_or("default");
    let seconds = i64::try_from(ctx.lifetime.as_secs()).unwrap_or(i64::MAX);
    let request = podprobe_ops::token::bound_to_pod(name, uid, seconds);
    let issued = Api::<ServiceAccount>::namespaced(ctx.client.clone(), ns)
        .create_token_request(account, &PostParams::default(), &request)
        .await?;
    let Some(status) = issued.status.filter(|s| !s.token.is_empty()) else {
        return Err(TokenError::Api(kube::Error::Service(
            format!("the TokenRequest for {ns}/{account} came back without a token").into(),
        )));
    };
    let asked = jiff::SignedDuration::try_from(ctx.lifetime).unwrap_or(jiff::SignedDuration::MAX);
    let expires = status.expiration_timestamp.0;
    if expires.duration_since(jiff::Timestamp::now()) < asked - jiff::SignedDuration::from_mins(10)
    {
        tracing::info!(
            pod = %format!("{ns}/{name}"),
            "the apiserver capped the sidecar's token at {expires} (asked {:?}: --service-account-max-token-expiration); the sidecar renews it at 80 % of that",
            ctx.lifetime
        );
    }
    let token = status.token;
    let secret_name = secret.to_owned();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(secret_name.clone()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".into(),
                "podprobe-manager".into(),
            )])),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: name.into(),
                uid: uid.into(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        // Never changed once written: nobody, the manager included, may swap the token a
        // provider copies, and the kubelet need not watch it.
        immutable: Some(true),
        data: Some(BTreeMap::from([
            ("token".into(), ByteString(token.into_bytes())),
            ("namespace".into(), ByteString(ns.as_bytes().to_vec())),
        ])),
        ..Default::default()
    };
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), ns);
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(TokenError::Taken {
            secret: secret_name,
        }),
        Err(e) => Err(e.into()),
    }
}

/// The pod released: its gate lifted (if it still has it), the label removed (`Null`) or set
/// to [`REFUSED`]; guarded by the uid, so a same-named replacement is never touched.
fn release_patch(pod: &Pod, uid: &str, label: Value) -> Patch<Value> {
    let mut ops = vec![json!({"op": "test", "path": "/metadata/uid", "value": uid})];
    let gates = pod.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref());
    if let Some(i) = gates.and_then(|g| g.iter().position(|g| g.name == GATE)) {
        let path = format!("/spec/schedulingGates/{i}");
        ops.push(json!({"op": "test", "path": format!("{path}/name"), "value": GATE}));
        ops.push(json!({"op": "remove", "path": path}));
    }
    let label_path = format!("/metadata/labels/{}", escape(LABEL));
    ops.push(match label {
        Value::Null => json!({"op": "remove", "path": label_path}),
        value => json!({"op": "replace", "path": label_path, "value": value}),
    });
    Patch::Json(serde_json::from_value(Value::Array(ops)).expect("a JSON patch"))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::InjectionConfig;
    use crate::inject::{InjectContext, inject_ops};

    fn injected_virtual_pod() -> Pod {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "games", "uid": "u-1",
                         "labels": {"podprobe.io/inject": "enabled"}},
            "spec": {"serviceAccountName": "podprobe-sidecar",
                     "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                     "schedulingGates": [{"name": "other.io/gate"}],
                     "containers": [{"name": "main", "image": "game"}]}
        }))
        .unwrap();
        let config = InjectionConfig::from_yaml("image: podprobe:dev\n", "t").unwrap();
        let ctx = InjectContext {
            request_uid: "9f0c1e2d-aaaa-bbbb-cccc-000000000001",
            issuer: "manager-0",
            ..Default::default()
        };
        let mut doc = serde_json::to_value(&pod).unwrap();
        crate::patch::apply(&mut doc, &inject_ops(&pod, &config, &ctx)).unwrap();
        serde_json::from_value(doc).unwrap()
    }

    #[test]
    fn injection_names_the_secret_holds_the_pod_and_release_undoes_only_that() {
        let pod = injected_virtual_pod();
        assert_eq!(
            issued_secret(&pod).as_deref(),
            Some("podprobe-token-9f0c1e2daaaabbbbcccc000000000001")
        );
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get(LABEL).map(String::as_str), Some(PENDING));
        let gates: Vec<_> = pod
            .spec
            .as_ref()
            .unwrap()
            .scheduling_gates
            .iter()
            .flatten()
            .map(|g| g.name.as_str())
            .collect();
        assert_eq!(gates, ["other.io/gate", GATE]);

        let Patch::Json(patch) = release_patch(&pod, "u-1", Value::Null) else {
            unreachable!()
        };
        let mut doc = serde_json::to_value(&pod).unwrap();
        json_patch::patch(&mut doc, &patch).unwrap();
        let released: Pod = serde_json::from_value(doc).unwrap();
        let gates: Vec<_> = released
            .spec
            .unwrap()
            .scheduling_gates
            .into_iter()
            .flatten()
            .map(|g| g.name)
            .collect();
        assert_eq!(gates, ["other.io/gate"]);
        assert!(!released.metadata.labels.unwrap().contains_key(LABEL));

        // A same-named replacement (another uid) is left alone.
        let Patch::Json(patch) = release_patch(&pod, "u-2", Value::String(REFUSED.into())) else {
            unreachable!()
        };
        let mut doc = serde_json::to_value(&pod).unwrap();
        assert!(json_patch::patch(&mut doc, &patch).is_err());
    }

    #[test]
    fn a_pod_is_left_to_the_replica_that_admitted_it_until_the_takeover() {
        let mut pod = injected_virtual_pod();
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(
            labels.get(ISSUER_LABEL).map(String::as_str),
            Some("manager-0")
        );
        let created = |ago: i64| {
            let at = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(ago);
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at))
        };
        pod.metadata.creation_timestamp = created(3);
        assert_eq!(left_to_its_issuer(&pod, Some("manager-0")), None, "its own");
        assert_eq!(left_to_its_issuer(&pod, None), None, "release-gates");
        let left = left_to_its_issuer(&pod, Some("manager-1")).unwrap();
        assert!(
            left > Duration::from_secs(5) && left <= Duration::from_secs(7),
            "{left:?}"
        );
        pod.metadata.creation_timestamp = created(11);
        assert_eq!(
            left_to_its_issuer(&pod, Some("manager-1")),
            None,
            "taken over"
        );
    }

    #[test]
    fn a_virtual_node_pod_that_keeps_the_projected_token_says_so_and_why() {
        use crate::inject::inject;
        let config = InjectionConfig::from_yaml("image: podprobe:dev\n", "t").unwrap();
        let bound: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "labels": {"podprobe.io/inject": "enabled"}},
            "spec": {"nodeName": "vk-1",
                     "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                     "containers": [{"name": "main"}]}
        }))
        .unwrap();
        let mut automount = bound.clone();
        let spec = automount.spec.as_mut().unwrap();
        spec.node_name = None;
        spec.automount_service_account_token = Some(true);
        automount.metadata.labels = None;
        // The second opted in by its namespace, without labels of its own.
        let namespace = [("podprobe.io/inject".to_owned(), "enabled".to_owned())].into();
        let ctx = InjectContext {
            namespace_labels: Some(&namespace),
            ..Default::default()
        };
        for (pod, why) in [
            (&bound, "spec.nodeName"),
            (&automount, "automountServiceAccountToken"),
        ] {
            let injected = inject(pod, &config, &ctx);
            let mut doc = serde_json::to_value(pod).unwrap();
            crate::patch::apply(&mut doc, &injected.ops).unwrap();
            let injected_pod: Pod = serde_json::from_value(doc).unwrap();
            assert_eq!(issued_secret(&injected_pod), None);
            assert!(injected_pod.spec.unwrap().scheduling_gates.is_none());
            assert_eq!(
                injected_pod
                    .metadata
                    .labels
                    .unwrap()
                    .get(LABEL)
                    .map(String::as_str),
                Some(super::super::PROJECTED),
                "{why}"
            );
            assert_eq!(injected.warnings.len(), 1, "{why}");
            assert!(
                injected.warnings[0].contains(why),
                "{}",
                injected.warnings[0]
            );
        }

        // An unbound pod gets an issued token, and no warning.
        let mut unbound = bound.clone();
        unbound.spec.as_mut().unwrap().node_name = None;
        let injected = inject(&unbound, &config, &InjectContext::default());
        assert!(injected.warnings.is_empty(), "{:?}", injected.warnings);
    }
}
