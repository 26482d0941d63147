//! What the issuer decides about a pod, with no I/O: whether a pending pod is this replica's
//! to issue now, which Secret it names, what a write's outcome means for the pod, and the
//! objects the issuer writes (the token's Secret, the pod's release). The clock is an
//! argument, so every rule is tested at the times that matter.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::Patch;
use serde_json::{Value, json};

use super::{GATE, ISSUER_LABEL, LABEL, PENDING, TOKEN_VOLUME};
use crate::patch::escape;

/// How long after a pod's creation a refused TokenRequest is asked again before the pod is
/// released without its token: its gate then holds it at most about this long (the last wait
/// of the backoff, at most 30 s, comes on top), with a Warning Event on it meanwhile.
pub const REFUSAL_GRACE: Duration = Duration::from_secs(30);

/// How long after a pod's creation it is left to the replica that admitted it: past that, any
/// replica issues it (the one that admitted it stopped, or is stuck).
pub const TAKEOVER: Duration = Duration::from_secs(10);

/// A pod's namespace, name and uid: what every request about it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodId<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
}

impl std::fmt::Display for PodId<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// `namespace/name`, for logs, of any pod the issuer lists.
pub fn pod_id(pod: &Pod) -> String {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    format!("{ns}/{name}")
}

/// What the issuer does with a pending pod when it looks at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstLook<'a> {
    /// Nothing, now or later unless it changes: why, for the debug log.
    Leave(&'static str),
    /// Another replica admitted it: left to that one this much longer.
    LeftToItsIssuer(Duration),
    /// Another replica admitted it and had its time: issued here if the live pod is still
    /// pending (this replica's watch may lag behind that replica's release).
    TakeOver(PodId<'a>),
    /// This replica's to issue.
    Issue(PodId<'a>),
}

/// What `me` (a replica's [`ISSUER_LABEL`] value; `None`: `release-gates`, which takes every
/// pod) does with the pending `pod` at `now`.
pub fn first_look<'a>(pod: &'a Pod, me: Option<&str>, now: Timestamp) -> FirstLook<'a> {
    let meta = &pod.metadata;
    let (Some(namespace), Some(name), Some(uid)) = (
        meta.namespace.as_deref(),
        meta.name.as_deref(),
        meta.uid.as_deref(),
    ) else {
        return FirstLook::Leave("not a pod of the apiserver (no namespace, name or uid)");
    };
    if meta.deletion_timestamp.is_some() {
        return FirstLook::Leave("being deleted");
    }
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some()
    {
        // Its gate lifted by someone else, or the label set by hand: a write now could cost
        // it its first status on virtual-kubelet ≥ v1.13.
        return FirstLook::Leave("bound already: not the issuer's to touch");
    }
    if let Some(left) = left_to_its_issuer(pod, me, now) {
        return FirstLook::LeftToItsIssuer(left);
    }
    let id = PodId {
        namespace,
        name,
        uid,
    };
    if is_mine(pod, me) {
        FirstLook::Issue(id)
    } else {
        FirstLook::TakeOver(id)
    }
}

/// Whether `live` (the pod read by name just now) is still the pod `uid`, still pending.
pub fn still_pending(live: Option<&Pod>, uid: &str) -> bool {
    live.is_some_and(|p| {
        p.metadata.uid.as_deref() == Some(uid)
            && p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL))
                .map(String::as_str)
                == Some(PENDING)
    })
}

/// The Secret injection named in the pod's token volume.
pub fn issued_secret(pod: &Pod) -> Option<String> {
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

/// Whether this replica (`me`; `None`: `release-gates`, which takes every pod) admitted `pod`.
pub fn is_mine(pod: &Pod, me: Option<&str>) -> bool {
    let Some(me) = me else {
        return true;
    };
    let labels = pod.metadata.labels.as_ref();
    labels.and_then(|l| l.get(ISSUER_LABEL)).map(String::as_str) == Some(me)
}

/// How much longer `pod` is left to the replica that admitted it, if it is another's and
/// [`TAKEOVER`] has not passed since its creation.
pub fn left_to_its_issuer(pod: &Pod, me: Option<&str>, now: Timestamp) -> Option<Duration> {
    if is_mine(pod, me) {
        return None;
    }
    let created = pod.metadata.creation_timestamp.as_ref()?.0;
    let left = SignedDuration::try_from(TAKEOVER).ok()? - now.duration_since(created);
    left.is_positive().then(|| left.unsigned_abs())
}

/// Whether a refusal of `pod`'s token may still be asked again at `now` ([`REFUSAL_GRACE`]).
pub fn within_grace(pod: &Pod, now: Timestamp) -> bool {
    let Some(created) = &pod.metadata.creation_timestamp else {
        return false;
    };
    now.duration_since(created.0) < SignedDuration::try_from(REFUSAL_GRACE).unwrap_or_default()
}

/// Whether the apiserver refused for good (no retry helps): not allowed, or no such account.
pub fn refused(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403 || s.code == 404 || s.code == 422)
}

/// Why a token could not be written.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// A Secret of that name exists. Another replica may have written it for this pod a moment
    /// ago (it then releases the pod, which leaves the pending pods); or the pod names a Secret
    /// that is not its own. The manager may not read Secrets, so it cannot tell which, and
    /// never takes a Secret it did not just write as this pod's.
    #[error("a Secret named {secret} exists already and was not written for this pod")]
    Taken { secret: String },
}

/// What a try at the pod's token means for the pod.
#[derive(Debug)]
pub enum Verdict {
    /// Release it: with its token (`Ok`, the Secret's name) or without, and why (`Err`).
    Release(Result<String, String>),
    /// The Secret is taken, maybe by another replica about to release the pod: look again.
    LookAgainTaken,
    /// Refused within the grace: ask again, and say so on the pod once.
    AskAgain(kube::Error),
    /// Failed on the way (not a refusal): try again with backoff.
    Retry(kube::Error),
}

/// The verdict on `pod` after writing `secret` gave `written` at `now`; `None` for `secret`:
/// the pod names no Secret (nothing to write).
pub fn verdict(
    pod: &Pod,
    secret: Option<String>,
    written: Result<(), TokenError>,
    now: Timestamp,
) -> Verdict {
    let Some(secret) = secret else {
        return Verdict::Release(Err(format!(
            "it has no {TOKEN_VOLUME} volume naming a Secret"
        )));
    };
    match written {
        Ok(()) => Verdict::Release(Ok(secret)),
        Err(TokenError::Taken { .. }) if within_grace(pod, now) => Verdict::LookAgainTaken,
        Err(TokenError::Api(e)) if refused(&e) && within_grace(pod, now) => Verdict::AskAgain(e),
        Err(TokenError::Api(e)) if !refused(&e) => Verdict::Retry(e),
        Err(e) => Verdict::Release(Err(e.to_string())),
    }
}

/// Whether the apiserver capped a token asked for `asked` that `expires` (at `now`): more than
/// ten minutes short, beyond the request's own latency.
pub fn capped(expires: Timestamp, asked: Duration, now: Timestamp) -> bool {
    let asked = SignedDuration::try_from(asked).unwrap_or(SignedDuration::MAX);
    expires.duration_since(now) < asked - SignedDuration::from_mins(10)
}

/// The Secret holding `token` for the pod `id`, owned by the pod so it goes with it.
pub fn token_secret(id: PodId<'_>, secret: &str, token: String) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(secret.to_owned()),
            namespace: Some(id.namespace.into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".into(),
                "podprobe-manager".into(),
            )])),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: id.name.into(),
                uid: id.uid.into(),
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
            (
                "namespace".into(),
                ByteString(id.namespace.as_bytes().to_vec()),
            ),
        ])),
        ..Default::default()
    }
}

/// The pod released: its gate lifted (if it still has it), the label removed (`Null`) or set
/// to `REFUSED`; guarded by the uid, so a same-named replacement is never touched.
pub fn release_patch(pod: &Pod, uid: &str, label: Value) -> Patch<Value> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn now() -> Timestamp {
        "2026-12-02T06:00:00Z".parse().unwrap()
    }

    /// A pending pod as injection leaves it, admitted by `manager-0`, created `age` ago.
    fn pending(age: i64) -> Pod {
        let created = now() - SignedDuration::from_secs(age);
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "games", "uid": "u-1",
                         "labels": {LABEL: PENDING, ISSUER_LABEL: "manager-0"}},
            "spec": {"schedulingGates": [{"name": GATE}], "containers": [{"name": "main"}],
                     "volumes": [{"name": TOKEN_VOLUME, "projected": {"sources": [
                         {"secret": {"name": "podprobe-token-1", "optional": true}}]}}]}
        }))
        .unwrap();
        pod.metadata.creation_timestamp = Some(Time(created));
        pod
    }

    const ID: PodId<'static> = PodId {
        namespace: "games",
        name: "p",
        uid: "u-1",
    };

    #[test]
    fn a_pod_is_left_to_the_replica_that_admitted_it_until_the_takeover() {
        let young = pending(3);
        assert_eq!(
            first_look(&young, Some("manager-0"), now()),
            FirstLook::Issue(ID)
        );
        assert_eq!(
            first_look(&young, None, now()),
            FirstLook::Issue(ID),
            "release-gates"
        );
        assert_eq!(
            first_look(&young, Some("manager-1"), now()),
            FirstLook::LeftToItsIssuer(Duration::from_secs(7))
        );
        let old = pending(11);
        assert_eq!(
            first_look(&old, Some("manager-1"), now()),
            FirstLook::TakeOver(ID)
        );
        assert_eq!(
            first_look(&old, Some("manager-0"), now()),
            FirstLook::Issue(ID)
        );
    }

    #[test]
    fn deleted_bound_or_unnamed_pods_are_left_alone() {
        let mut deleting = pending(3);
        deleting.metadata.deletion_timestamp = Some(Time(now()));
        let mut bound = pending(3);
        bound.spec.as_mut().unwrap().node_name = Some("vk-1".into());
        let mut unnamed = pending(3);
        unnamed.metadata.uid = None;
        for (pod, why) in [(deleting, "deleted"), (bound, "bound"), (unnamed, "no uid")] {
            let look = first_look(&pod, Some("manager-0"), now());
            assert!(matches!(look, FirstLook::Leave(_)), "{why}: {look:?}");
        }
    }

    #[test]
    fn a_takeover_needs_the_same_pod_still_pending() {
        let pod = pending(11);
        assert!(still_pending(Some(&pod), "u-1"));
        assert!(
            !still_pending(Some(&pod), "u-2"),
            "a same-named replacement"
        );
        assert!(!still_pending(None, "u-1"), "deleted");
        let mut released = pod.clone();
        released.metadata.labels.as_mut().unwrap().remove(LABEL);
        assert!(!still_pending(Some(&released), "u-1"));
    }

    fn api(code: u16) -> kube::Error {
        let status =
            kube::core::Status::failure(&format!("code {code}"), "Refused").with_code(code);
        kube::Error::Api(Box::new(status))
    }

    fn taken() -> Result<(), TokenError> {
        Err(TokenError::Taken {
            secret: "podprobe-token-1".into(),
        })
    }

    #[test]
    fn refusals_and_taken_secrets_are_asked_again_only_within_the_grace() {
        let secret = || Some("podprobe-token-1".to_owned());
        let (young, old) = (pending(3), pending(31));
        let shown = |v: Verdict| format!("{v:?}");
        let v = verdict(&young, secret(), Ok(()), now());
        assert!(
            matches!(&v, Verdict::Release(Ok(s)) if s == "podprobe-token-1"),
            "{v:?}"
        );
        let v = verdict(&young, None, Ok(()), now());
        assert!(
            matches!(&v, Verdict::Release(Err(why)) if why.contains(TOKEN_VOLUME)),
            "{v:?}"
        );
        assert!(matches!(
            verdict(&young, secret(), taken(), now()),
            Verdict::LookAgainTaken
        ));
        let v = verdict(&old, secret(), taken(), now());
        assert!(
            matches!(&v, Verdict::Release(Err(why)) if why.contains("exists already")),
            "{v:?}"
        );
        for code in [403, 404, 422] {
            let v = verdict(&young, secret(), Err(api(code).into()), now());
            assert!(matches!(v, Verdict::AskAgain(_)), "{code}: {}", shown(v));
            let v = verdict(&old, secret(), Err(api(code).into()), now());
            assert!(
                matches!(v, Verdict::Release(Err(_))),
                "{code}: {}",
                shown(v)
            );
        }
        for pod in [&young, &old] {
            let v = verdict(pod, secret(), Err(api(500).into()), now());
            assert!(matches!(v, Verdict::Retry(_)), "{}", shown(v));
        }
    }

    #[test]
    fn a_token_more_than_ten_minutes_short_was_capped() {
        let hour = Duration::from_secs(3600);
        let at = |mins: i64| now() + SignedDuration::from_mins(mins);
        assert!(!capped(at(60), hour, now()));
        assert!(!capped(at(51), hour, now()));
        assert!(capped(at(49), hour, now()));
    }

    #[test]
    fn the_secret_is_the_pods_own_and_immutable() {
        let secret = token_secret(ID, "podprobe-token-1", "t0k3n".into());
        let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Pod", "u-1"));
        assert_eq!(secret.metadata.namespace.as_deref(), Some("games"));
        assert_eq!(secret.immutable, Some(true));
        let data = secret.data.unwrap();
        assert_eq!(data["token"].0, b"t0k3n");
        assert_eq!(data["namespace"].0, b"games");
    }
}
