//! The sidecar's view of its own pod: a watch on the apiserver (annotation, container statuses,
//! uid, deletion) or the downward-API annotations file ([`file`]) with the pod's status read
//! when it matters ([`status`]), published as [`PodView`]s.

mod file;
mod status;

pub use file::{read_annotations_file, watch_file};
pub use status::{Read, ReadTriggers, StatusReader, StatusReads};

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::runtime::watcher;
use kube::{Api, Client};
use podprobe_ops::backoff::WatchRetry;
use tokio::sync::watch;

use crate::annotation::{self, PODPROBE_ANNOTATION, PodContainers};
use crate::condition::writer::ApiserverAnswered;
use crate::failures::{FailureRun, Loudness};
use crate::resource_version::ResourceVersion;
use crate::runner::ContainerView;

/// Where the pod's annotation comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// The apiserver when it answers and RBAC allows reading the pod, else the file.
    Auto,
    /// A watch on this pod through the apiserver (also yields container statuses and uid).
    Api,
    /// The downward-API annotations file.
    File,
}

/// Who this sidecar is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    pub name: String,
    pub namespace: String,
    /// `POD_UID`; when unset, the uid of the first pod seen is taken as ours.
    pub uid: Option<String>,
}

/// What the sidecar knows of its pod at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodView {
    pub uid: Option<String>,
    /// The `kruise.io/podprobe` value, if any.
    pub annotation: Option<String>,
    /// Probe-able containers and their ports (apiserver source only).
    pub containers: Option<PodContainers>,
    /// Per container, what its status says (apiserver source only).
    pub statuses: BTreeMap<String, ContainerView>,
    pub pod_ip: Option<String>,
    /// `deletionTimestamp` is set, or the pod is gone.
    pub terminating: bool,
    /// The pod's current conditions; `None` when the source does not show them (the file).
    pub conditions: Option<Vec<PodCondition>>,
    /// Who wrote the pod's status, from `managedFields` (apiserver source only).
    pub status_writers: Vec<StatusWriter>,
    /// The pod's `resourceVersion` in this view (apiserver source only): tells a view older
    /// than the sidecar's own last write from one that shows the pod after it. Not part of
    /// what makes a view news ([`PodView::differs_from`]).
    pub resource_version: Option<ResourceVersion>,
}

/// One field manager of the pod's status subresource, from `managedFields`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatusWriter {
    pub manager: String,
    pub time: Option<jiff::Timestamp>,
    /// The condition types whose entries it owns (`f:status.f:conditions.k:{"type":...}`).
    pub condition_types: BTreeSet<String>,
}

impl StatusWriter {
    fn from_managed_fields(entry: &ManagedFieldsEntry) -> Option<Self> {
        if entry.subresource.as_deref() != Some("status") {
            return None;
        }
        let condition_types = entry
            .fields_v1
            .as_ref()
            .and_then(|f| f.0.get("f:status")?.get("f:conditions")?.as_object())
            .map(|keys| {
                keys.keys()
                    .filter_map(|k| condition_type_of_key(k))
                    .collect()
            })
            .unwrap_or_default();
        Some(StatusWriter {
            manager: entry.manager.clone().unwrap_or_default(),
            time: entry.time.as_ref().map(|t| t.0),
            condition_types,
        })
    }
}

/// `k:{"type":"X"}` (a list entry by its merge key in a fieldsV1 set) → `X`.
fn condition_type_of_key(key: &str) -> Option<String> {
    let fields: serde_json::Value = serde_json::from_str(key.strip_prefix("k:")?).ok()?;
    Some(fields.get("type")?.as_str()?.to_owned())
}

impl PodView {
    /// Reads a pod as the apiserver returns it.
    pub fn from_pod(pod: &Pod) -> Self {
        let annotation = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PODPROBE_ANNOTATION).cloned());
        let containers = pod.spec.as_ref().map(PodContainers::from_spec);
        let status = pod.status.as_ref();
        let mut statuses = BTreeMap::new();
        if let (Some(containers), Some(status)) = (&containers, status) {
            let all: Vec<&ContainerStatus> = status
                .container_statuses
                .iter()
                .flatten()
                .chain(status.init_container_statuses.iter().flatten())
                .collect();
            for name in containers.ports.keys() {
                let view = all
                    .iter()
                    .find(|s| &s.name == name)
                    .map_or(ContainerView::Absent, |s| container_view(s));
                statuses.insert(name.clone(), view);
            }
        }
        PodView {
            uid: pod.metadata.uid.clone(),
            annotation,
            containers,
            statuses,
            pod_ip: status
                .and_then(|s| s.pod_ip.clone())
                .filter(|ip| !ip.is_empty()),
            terminating: !podprobe_protocol::pod::is_active(pod),
            conditions: Some(
                status
                    .and_then(|s| s.conditions.clone())
                    .unwrap_or_default(),
            ),
            status_writers: pod
                .metadata
                .managed_fields
                .iter()
                .flatten()
                .filter_map(StatusWriter::from_managed_fields)
                .collect(),
            resource_version: pod
                .metadata
                .resource_version
                .clone()
                .map(ResourceVersion::new),
        }
    }

    /// Whether `other` says something this view does not. The resourceVersion does not count:
    /// it changes with every write to the pod, most of which (kruise-manager's markers,
    /// fields the sidecar does not read) change nothing the sidecar acts on.
    pub fn differs_from(&self, other: &PodView) -> bool {
        // Destructured so that a field added to the view is not left out by mistake.
        let PodView {
            uid,
            annotation,
            containers,
            statuses,
            pod_ip,
            terminating,
            conditions,
            status_writers,
            resource_version: _,
        } = self;
        *uid != other.uid
            || *annotation != other.annotation
            || *containers != other.containers
            || *statuses != other.statuses
            || *pod_ip != other.pod_ip
            || *terminating != other.terminating
            || *conditions != other.conditions
            || *status_writers != other.status_writers
    }

    /// Reads the downward-API annotations (no spec, no status).
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Self {
        PodView {
            annotation: annotations.get(PODPROBE_ANNOTATION).cloned(),
            ..PodView::default()
        }
    }
}

fn container_view(status: &ContainerStatus) -> ContainerView {
    let container_id = status.container_id.clone().filter(|id| !id.is_empty());
    match status.state.as_ref().and_then(|s| s.running.as_ref()) {
        Some(running) => ContainerView::Running {
            container_id,
            started_at: running.started_at.as_ref().map(|t| t.0),
            started: status.started,
        },
        None => ContainerView::NotRunning { container_id },
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error("cannot read pod {namespace}/{name} through the apiserver: {source}")]
    Get {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot read the downward-API annotations file {path}: {source}")]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the downward-API annotations file {path} is malformed: {source}")]
    ParseFile {
        path: PathBuf,
        #[source]
        source: annotation::DownwardApiError,
    },
}

/// Decides `auto`: the apiserver when this pod can be read through it, else the file.
/// Returns the source and why, for the first log line.
pub async fn choose_source(
    kind: SourceKind,
    client: Option<&Client>,
    identity: &PodIdentity,
) -> (SourceKind, String) {
    match kind {
        SourceKind::Api => (SourceKind::Api, "--source api".into()),
        SourceKind::File => (SourceKind::File, "--source file".into()),
        SourceKind::Auto => {
            let Some(client) = client else {
                return (
                    SourceKind::File,
                    "no Kubernetes client configuration (not in a cluster, no KUBECONFIG)".into(),
                );
            };
            let pods: Api<Pod> = Api::namespaced(client.clone(), &identity.namespace);
            match pods.get(&identity.name).await {
                Ok(_) => (
                    SourceKind::Api,
                    "the apiserver answers and RBAC allows get pods".into(),
                ),
                Err(e) => (
                    SourceKind::File,
                    format!("reading the pod through the apiserver failed: {e}"),
                ),
            }
        }
    }
}

/// Watches this pod through the apiserver (field selector on its name, its namespace only;
/// kube-rs's watcher, retried as `podprobe_ops::backoff` says) and publishes views. Pods with another uid (a
/// same-named replacement) are not ours and are ignored. When the apiserver answers again
/// after the watch failed, `answered` releases writes waiting out their backoff. Returns when
/// the pod is deleted.
pub async fn watch_api(
    client: Client,
    identity: PodIdentity,
    tx: watch::Sender<PodView>,
    answered: ApiserverAnswered,
) {
    let pods: Api<Pod> = Api::namespaced(client, &identity.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", identity.name));
    let mut our_uid = identity.uid.clone();
    let mut failing = FailingWatch::default();
    let mut events = std::pin::pin!(watcher(pods, config).retry_backoff());
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                failing.failed(&identity.name, &e);
                continue;
            }
        };
        // Init is said before each list is asked for: not an answer.
        if !matches!(event, watcher::Event::Init) && failing.answered(&identity.name) {
            answered.notify();
        }
        let (pod, relisted) = match event {
            watcher::Event::Apply(pod) => (pod, false),
            watcher::Event::InitApply(pod) => (pod, true),
            watcher::Event::Delete(pod) => {
                if our_uid.is_none() || pod.metadata.uid == our_uid {
                    tracing::info!(pod = %identity.name, "pod deleted; stopping");
                    tx.send_modify(|v| v.terminating = true);
                    return;
                }
                continue;
            }
            watcher::Event::Init | watcher::Event::InitDone => continue,
        };
        match (&our_uid, &pod.metadata.uid) {
            (Some(ours), Some(theirs)) if ours != theirs => {
                tracing::warn!(
                    pod = %identity.name,
                    our_uid = %ours,
                    seen_uid = %theirs,
                    "a pod with this name but another uid exists (a replacement); ignoring it"
                );
                continue;
            }
            (None, Some(theirs)) => our_uid = Some(theirs.clone()),
            _ => {}
        }
        publish(&tx, PodView::from_pod(&pod), relisted);
    }
}

/// Makes `view` the current one, and news to the sidecar's loop when it says something new or
/// comes from a (re)list. A view the loop finds older than the sidecar's own last write is
/// left for a newer one to settle, and the watch delivers every change in order, so the view
/// of that write comes as news; a relist after the watch fell behind (410 Gone) can skip it
/// and show a pod that, but for its resourceVersion, reads as the stale view the loop holds.
fn publish(tx: &watch::Sender<PodView>, view: PodView, relisted: bool) {
    tx.send_if_modified(|current| {
        let changed = relisted || current.differs_from(&view);
        *current = view;
        changed
    });
}

/// The watch's failures in a row, logged as [`FailureRun`] says.
#[derive(Debug, Default)]
struct FailingWatch(FailureRun);

impl FailingWatch {
    fn failed(&mut self, pod: &str, error: &watcher::Error) {
        match self.0.failed() {
            Loudness::First => {
                tracing::warn!(pod = %pod, "watching the pod failed, retrying with backoff: {error}")
            }
            Loudness::Still { attempts, over } => {
                tracing::warn!(pod = %pod, "watching the pod still fails ({attempts} attempts over {over:.0?}), retrying with backoff: {error}")
            }
            Loudness::Quiet => {
                tracing::debug!(pod = %pod, "watching the pod failed, retrying with backoff: {error}")
            }
        }
    }

    /// Records an answer; whether the watch was failing until now.
    fn answered(&mut self, pod: &str) -> bool {
        let Some((attempts, over)) = self.0.succeeded() else {
            return false;
        };
        tracing::info!(pod = %pod, "the apiserver answers the pod watch again after {attempts} failed attempts over {over:.1?}");
        true
    }
}

#[cfg(test)]
mod watch_tests {
    use super::*;

    #[test]
    fn only_the_first_answer_after_failures_releases_writes() {
        let mut failing = FailingWatch::default();
        assert!(!failing.answered("p"), "nothing failed");
        failing.failed("p", &watcher::Error::NoResourceVersion);
        failing.failed("p", &watcher::Error::NoResourceVersion);
        assert!(failing.answered("p"));
        assert!(!failing.answered("p"), "already answered");
    }

    fn pod(resource_version: &str, conditions: &[&str]) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.resource_version = Some(resource_version.into());
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            conditions: Some(
                conditions
                    .iter()
                    .map(|c| PodCondition {
                        type_: (*c).into(),
                        status: "True".into(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn a_new_resource_version_alone_is_no_news_unless_relisted() {
        let (tx, mut rx) = watch::channel(PodView::default());
        publish(&tx, PodView::from_pod(&pod("10", &["a"])), false);
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();

        // A write to the pod that changes nothing the view holds: no news, but the view kept
        // is the newest, version included.
        publish(&tx, PodView::from_pod(&pod("11", &["a"])), false);
        assert!(!rx.has_changed().unwrap());
        assert_eq!(
            rx.borrow().resource_version,
            Some(ResourceVersion::new("11"))
        );

        // A relist may have skipped changes in between: news whatever it shows.
        publish(&tx, PodView::from_pod(&pod("15", &["a"])), true);
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();

        publish(&tx, PodView::from_pod(&pod("16", &[])), false);
        assert!(rx.has_changed().unwrap(), "the condition is gone");
    }
}
