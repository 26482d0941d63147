//! Pods left unprobed: opted in to the sidecar, selected by a PodProbeMarker, and running
//! without it.
//!
//! The pod webhook fails open (`failurePolicy: Ignore`, the chart's default: a manager outage
//! must not stop pod creation), so a pod created while no replica answered runs without the
//! sidecar, as does one created before its namespace opted in or by a path the webhook does not
//! see. Nothing probes such a pod and it gets no markers: under the idle recipe it keeps a
//! deletion cost between idle and busy servers. A running pod cannot be given a container, so
//! the remedy is to recreate it; what this module adds is that somebody hears of it.
//!
//! Every [`SWEEP_INTERVAL`] the leader reads its caches (pods, PodProbeMarkers, namespace labels;
//! no apiserver read) and reports each such pod once per leadership term: a Warning Event
//! on the pod (reason [`REASON`]), and the gauge `podprobe_manager_pods_without_sidecar` with
//! the current count.
//! A sweep, not the pod controller's reconcile: a namespace that opts in later changes no pod,
//! and the check must see it too.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::annotate;
use crate::cache::{PpmCache, namespace_labels};
use crate::config::InjectionConfig;
use crate::crd::PodProbeMarker;
use crate::inject::opted_in;
use crate::metrics::{Metrics, Readiness};
use crate::pods::CachedPod;

/// How often the caches are swept: a pod admitted without its sidecar is reported within
/// about this long after the manager leads (or after its namespace opted in).
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(30);
/// The Event's reason (`kubectl get events --field-selector reason=SidecarMissing`).
pub const REASON: &str = "SidecarMissing";
/// The Events' `reportingController` (the chart's policy checks it).
pub const REPORTING_CONTROLLER: &str = "podprobe-manager";
/// Events published per sweep at most: a namespace of thousands of pods that opts in after
/// they started is reported over a few minutes rather than in one burst of writes. The gauge
/// and the log count all of them at once.
const EVENTS_PER_SWEEP: usize = 200;
/// The Events API's limit on a note (`note`: at most 1 kB).
const NOTE_MAX: usize = 1024;

/// Why `pod` should run the sidecar and does not: the names of the PodProbeMarkers selecting
/// it, or `None` when it runs the sidecar, did not opt in, is not selected, or has ended.
pub fn missing_sidecar(
    pod: &CachedPod,
    namespace_ppms: &[PodProbeMarker],
    config: &InjectionConfig,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> Option<Vec<String>> {
    if !pod.is_active()
        || pod.runs_sidecar(&config.container_name)
        || !opted_in(&pod.metadata, config, namespace_labels)
    {
        return None;
    }
    let probes = annotate::compute(&pod.to_pod(), namespace_ppms)?;
    Some(
        probes
            .marker_list
            .split(',')
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect(),
    )
}

/// The Event's message: what is wrong, why it may have happened, what to do. At most
/// [`NOTE_MAX`] bytes, as the Events API takes.
fn note(pod: &CachedPod, config: &InjectionConfig, markers: &[String]) -> String {
    let label = &config.inject_label;
    let by_pod = pod
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.get(label).is_some_and(|v| v == "enabled"));
    let opted = if by_pod {
        format!("the pod's label {label}=enabled")
    } else {
        format!("its namespace's label {label}=enabled")
    };
    let mut names = markers
        .iter()
        .take(3)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if markers.len() > 3 {
        names.push_str(&format!(" and {} more", markers.len() - 3));
    }
    let mut note = format!(
        "no {} container although it opted in ({opted}) and PodProbeMarker {names} select it: \
         nothing runs its probes and it gets no markers. podprobe-manager's pod webhook did not \
         inject it: the webhook was unreachable when the pod was created, the pod predates the \
         opt-in, or the webhook's selectors (chart values webhook.namespaceSelector, \
         webhook.objectSelector) do not select the pod. A running pod cannot be given a \
         container: recreate it once the webhook selects it (e.g. kubectl rollout restart)",
        config.container_name,
    );
    if note.len() > NOTE_MAX {
        let mut end = NOTE_MAX;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
    note
}

/// What one sweep needs.
pub struct Sweep {
    pub pods: Store<CachedPod>,
    pub ppms: Arc<PpmCache>,
    pub namespaces: Store<Namespace>,
    pub config: InjectionConfig,
    pub metrics: Arc<Metrics>,
    client: Client,
    /// Pods (by uid) whose Event was published in this leadership term; forgotten once they
    /// are gone or fixed.
    reported: BTreeSet<String>,
    /// The last count logged, so the log says when it changes rather than every sweep.
    logged: Option<usize>,
}

impl std::fmt::Debug for Sweep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweep")
            .field("reported", &self.reported.len())
            .finish_non_exhaustive()
    }
}

impl Sweep {
    pub fn new(
        client: Client,
        pods: Store<CachedPod>,
        ppms: Arc<PpmCache>,
        namespaces: Store<Namespace>,
        config: InjectionConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            pods,
            ppms,
            namespaces,
            config,
            metrics,
            client,
            reported: BTreeSet::new(),
            logged: None,
        }
    }

    /// The pods without their sidecar now, each with the PodProbeMarkers selecting it.
    fn find(&self) -> Vec<(Arc<CachedPod>, Vec<String>)> {
        // What each namespace gives its pods, read once per namespace and sweep.
        type Given = (Option<BTreeMap<String, String>>, Arc<Vec<PodProbeMarker>>);
        let mut namespaces: BTreeMap<String, Given> = BTreeMap::new();
        let mut found = Vec::new();
        for pod in self.pods.state() {
            let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
            if !namespaces.contains_key(ns) {
                let given = (
                    namespace_labels(&self.namespaces, ns),
                    self.ppms.namespace(ns),
                );
                namespaces.insert(ns.to_owned(), given);
            }
            let (labels, ppms) = &namespaces[ns];
            if let Some(markers) = missing_sidecar(&pod, ppms, &self.config, labels.as_ref()) {
                found.push((pod, markers));
            }
        }
        found
    }

    /// One sweep: count, log when the count changed, publish the Events not yet published.
    pub async fn run_once(&mut self) {
        let found = self.find();
        self.metrics.pods_without_sidecar.set(found.len() as i64);
        let now: BTreeSet<String> = found
            .iter()
            .filter_map(|(p, _)| p.metadata.uid.clone())
            .collect();
        self.reported.retain(|uid| now.contains(uid));
        if self.logged != Some(found.len()) {
            let names: Vec<String> = found.iter().take(5).map(|(p, _)| p.key()).collect();
            if found.is_empty() {
                tracing::info!("every pod that opted in to the sidecar runs it");
            } else {
                tracing::warn!(
                    count = found.len(),
                    pods = %names.join(", "),
                    "pods opted in to the sidecar and selected by a PodProbeMarker run without it: nothing probes them (Events {REASON} on each; recreate them)"
                );
            }
            self.logged = Some(found.len());
        }
        // A Recorder per sweep: one that remembers an Event patches it into a series when the
        // same pod is reported again within minutes (it left the result and came back), and
        // the manager may only create Events.
        let recorder = Recorder::new(
            self.client.clone(),
            Reporter {
                controller: REPORTING_CONTROLLER.into(),
                instance: Some(crate::leader::replica_name()),
            },
        );
        let (mut published, mut failed) = (0, 0);
        for (pod, markers) in &found {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            if published == EVENTS_PER_SWEEP {
                break;
            }
            if self.reported.contains(&uid) {
                continue;
            }
            let event = Event {
                type_: EventType::Warning,
                reason: REASON.into(),
                note: Some(note(pod, &self.config, markers)),
                action: "CheckSidecar".into(),
                secondary: None,
            };
            match recorder.publish(&event, &pod.object_ref(&())).await {
                Ok(()) => {
                    published += 1;
                    self.reported.insert(uid);
                }
                Err(e) => {
                    // The pod is tried again next sweep; the others go on (one pod whose
                    // Event is refused must not silence the rest). One line per sweep.
                    if failed == 0 {
                        tracing::warn!(pod = %pod.key(), "cannot publish the {REASON} Event: {e}");
                    }
                    failed += 1;
                }
            }
        }
        if failed > 1 {
            tracing::warn!(
                "{failed} {REASON} Events refused in this sweep; tried again next sweep"
            );
        }
    }

    /// Sweep every [`SWEEP_INTERVAL`] until `shutdown`, once the pod cache has its first list
    /// (`pods_listed`) and the PodProbeMarker and namespace caches theirs (`ready`, the
    /// manager's readiness).
    pub async fn run(
        mut self,
        mut pods_listed: watch::Receiver<bool>,
        ready: Arc<Readiness>,
        shutdown: CancellationToken,
    ) {
        let synced = async {
            let _ = pods_listed.wait_for(|l| *l).await;
            ready.wait().await;
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = synced => {}
        }
        let mut tick = tokio::time::interval(SWEEP_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            // A sweep's Events end with leadership: a new leader reports afresh.
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.run_once() => {}
            }
        }
        self.metrics.pods_without_sidecar.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config() -> InjectionConfig {
        InjectionConfig::from_yaml("image: podprobe:dev\n", "test").unwrap()
    }

    fn ppm() -> PodProbeMarker {
        serde_json::from_value(json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
            "metadata": {"name": "idle", "namespace": "games"},
            "spec": {"selector": {"matchLabels": {"app": "game"}}, "probes": [{
                "name": "idle", "containerName": "main", "podConditionType": "game.io/idle",
                "probe": {"exec": {"command": ["/idle.sh"]}}
            }]}
        }))
        .unwrap()
    }

    fn pod(labels: serde_json::Value, containers: &[&str], phase: &str) -> CachedPod {
        let containers: Vec<_> = containers
            .iter()
            .map(|n| json!({"name": n, "image": "x"}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "gs-0", "namespace": "games", "uid": "u-1", "labels": labels},
            "spec": {"containers": containers},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn opted_namespace() -> BTreeMap<String, String> {
        BTreeMap::from([("podprobe.io/inject".to_owned(), "enabled".to_owned())])
    }

    #[test]
    fn an_opted_in_selected_pod_without_the_sidecar_is_found_with_its_markers() {
        let p = pod(json!({"app": "game"}), &["main"], "Running");
        assert_eq!(
            missing_sidecar(&p, &[ppm()], &config(), Some(&opted_namespace())),
            Some(vec!["idle".to_owned()])
        );
        let by_label = pod(
            json!({"app": "game", "podprobe.io/inject": "enabled"}),
            &["main"],
            "Pending",
        );
        assert!(missing_sidecar(&by_label, &[ppm()], &config(), None).is_some());
        assert!(note(&by_label, &config(), &["idle".into()]).contains("the pod's label"));
        assert!(note(&p, &config(), &["idle".into()]).contains("its namespace's label"));
    }

    #[test]
    fn the_note_names_three_markers_at_most_and_fits_the_events_api() {
        let p = pod(json!({"app": "game"}), &["main"], "Running");
        let long: Vec<String> = (0..5).map(|i| format!("{i}{}", "m".repeat(250))).collect();
        let note = note(&p, &config(), &long);
        assert!(note.len() <= NOTE_MAX, "{}", note.len());
        assert!(note.contains(&long[2]) && !note.contains(&long[3]));
        let short = super::note(
            &p,
            &config(),
            &["a".into(), "b".into(), "c".into(), "d".into()],
        );
        assert!(short.contains("a, b, c and 1 more select it"), "{short}");
    }

    #[test]
    fn pods_with_the_sidecar_not_opted_in_not_selected_or_ended_are_not() {
        let ns = opted_namespace();
        let cases = [
            (
                "runs it",
                pod(json!({"app": "game"}), &["main", "podprobe"], "Running"),
            ),
            (
                "opted out",
                pod(
                    json!({"app": "game", "podprobe.io/inject": "disabled"}),
                    &["main"],
                    "Running",
                ),
            ),
            (
                "not selected",
                pod(json!({"app": "web"}), &["main"], "Running"),
            ),
            ("ended", pod(json!({"app": "game"}), &["main"], "Succeeded")),
        ];
        for (what, p) in cases {
            assert_eq!(
                missing_sidecar(&p, &[ppm()], &config(), Some(&ns)),
                None,
                "{what}"
            );
        }
        let p = pod(json!({"app": "game"}), &["main"], "Running");
        assert_eq!(
            missing_sidecar(&p, &[ppm()], &config(), None),
            None,
            "namespace not opted in"
        );
        assert_eq!(
            missing_sidecar(&p, &[], &config(), Some(&ns)),
            None,
            "no PodProbeMarker"
        );
    }
}
