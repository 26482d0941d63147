//! Pods left unprobed: opted in to the sidecar, selected by a PodProbeMarker, and running
//! without it; or running it with none of their probe conditions written.
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
//!
//! A pod may run the sidecar and still be unprobed: a sidecar without a token (a provider
//! that started it before the token's Secret existed, or replaced the projected token) or
//! refused by RBAC writes nothing, and a probe whose every attempt errors writes no condition.
//! Its own alerts need its metrics scraped, and it cannot write to its pod. So a pod that has
//! run the sidecar for [`SILENCE`] (past its probes' longest initial delay, counted from the
//! sweep that first saw it so) without any of its probe conditions gets a Warning Event
//! ([`CONDITIONS_REASON`]), counted by `podprobe_manager_pods_without_conditions`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use tokio::sync::watch;
use tokio::time::Instant;
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
/// The Event's reason for a pod that runs the sidecar and has none of its probe conditions.
pub const CONDITIONS_REASON: &str = "ProbeConditionsMissing";
/// How long a pod runs the sidecar with none of its probe conditions (past its probes' longest
/// initial delay) before it is reported: a first result takes a period or two.
pub const SILENCE: Duration = Duration::from_secs(300);
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

/// The probe conditions `pod` should have and has none of, with how long its probes may take
/// to give a first result ([`SILENCE`] past the longest initial delay); `None` unless it runs
/// the sidecar, is running, and a PodProbeMarker gives it a probe with a condition.
pub fn missing_conditions(
    pod: &CachedPod,
    namespace_ppms: &[PodProbeMarker],
    config: &InjectionConfig,
) -> Option<(Vec<String>, Duration)> {
    if pod.phase.as_deref() != Some("Running")
        || !pod.is_active()
        || !pod.runs_sidecar(&config.container_name)
    {
        return None;
    }
    let annotations = annotate::compute(&pod.to_pod(), namespace_ppms)?;
    let probes = crate::admission::probes(&annotations.probes);
    let conditions: BTreeSet<String> = probes
        .iter()
        .map(|p| p.pod_condition_type.clone())
        .filter(|c| !c.is_empty())
        .collect();
    if conditions.is_empty() || conditions.iter().any(|c| pod.condition(c).is_some()) {
        return None;
    }
    let delay = probes
        .iter()
        .filter_map(|p| p.probe.initial_delay_seconds)
        .max()
        .unwrap_or(0);
    let delay = Duration::from_secs(u64::try_from(delay).unwrap_or(0));
    Some((conditions.into_iter().collect(), SILENCE + delay))
}

/// The [`CONDITIONS_REASON`] Event's message: which conditions, the likely causes in the order
/// they happen, what to look at.
fn conditions_note(pod: &CachedPod, config: &InjectionConfig, conditions: &[String]) -> String {
    let token = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(crate::sidecar_token::LABEL))
        .map(String::as_str);
    let hint = match token {
        Some(crate::sidecar_token::PROJECTED) => {
            " This pod keeps its projected service-account token (label podprobe.io/sidecar-token=projected), which a virtual node's provider may drop: create it unbound, without automountServiceAccountToken: true."
        }
        Some(crate::sidecar_token::REFUSED) => {
            " This pod was released without its sidecar's token (label podprobe.io/sidecar-token=refused; its SidecarTokenNotIssued Event says why)."
        }
        _ => "",
    };
    let mut note = format!(
        "none of its probe conditions ({}) has been written since it runs, although its {} \
         container runs: the sidecar cannot write them (no token: its provider started it \
         before the token's Secret existed, alert PodProbeSidecarTokenFailing; RBAC or the \
         admission policy refuse it) or every probe attempt errors. Its log says which: \
         kubectl logs -c {}.{hint}",
        conditions.join(", "),
        config.container_name,
        config.container_name,
    );
    truncate(&mut note);
    note
}

fn truncate(note: &mut String) {
    if note.len() > NOTE_MAX {
        let mut end = NOTE_MAX;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
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
    truncate(&mut note);
    note
}

/// Why a pod is left unprobed, as a sweep finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Unprobed {
    /// No sidecar: the PodProbeMarkers selecting the pod.
    NoSidecar { markers: Vec<String> },
    /// The sidecar runs and none of the pod's probe conditions came.
    NoConditions { conditions: Vec<String> },
}

impl Unprobed {
    fn reason(&self) -> &'static str {
        match self {
            Unprobed::NoSidecar { .. } => REASON,
            Unprobed::NoConditions { .. } => CONDITIONS_REASON,
        }
    }
}

/// What one sweep needs.
pub struct Sweep {
    pub pods: Store<CachedPod>,
    pub ppms: Arc<PpmCache>,
    pub namespaces: Store<Namespace>,
    pub config: InjectionConfig,
    pub metrics: Arc<Metrics>,
    client: Client,
    /// Pods (by uid) and reasons whose Event was published in this leadership term;
    /// forgotten once they are gone or fixed.
    reported: BTreeSet<(String, &'static str)>,
    /// Since when each running pod (by uid) has had its sidecar and none of its conditions.
    quiet_since: BTreeMap<String, Instant>,
    /// The last counts logged, so the log says when they change rather than every sweep.
    logged: (Option<usize>, Option<usize>),
}

impl std::fmt::Debug for Sweep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweep")
            .field("reported", &self.reported.len())
            .field("quiet", &self.quiet_since.len())
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
            quiet_since: BTreeMap::new(),
            logged: (None, None),
        }
    }

    /// The pods left unprobed now, and why.
    fn find(&mut self) -> Vec<(Arc<CachedPod>, Unprobed)> {
        // What each namespace gives its pods, read once per namespace and sweep.
        type Given = (Option<BTreeMap<String, String>>, Arc<Vec<PodProbeMarker>>);
        let mut namespaces: BTreeMap<String, Given> = BTreeMap::new();
        let mut found = Vec::new();
        let now = Instant::now();
        let mut quiet = BTreeMap::new();
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
                found.push((pod, Unprobed::NoSidecar { markers }));
            } else if let Some((conditions, grace)) = missing_conditions(&pod, ppms, &self.config)
                && let Some(uid) = pod.metadata.uid.clone()
            {
                let since = self.quiet_since.get(&uid).copied().unwrap_or(now);
                quiet.insert(uid, since);
                if now.duration_since(since) >= grace {
                    found.push((pod, Unprobed::NoConditions { conditions }));
                }
            }
        }
        self.quiet_since = quiet;
        found
    }

    /// One sweep: count, log when a count changed, publish the Events not yet published.
    pub async fn run_once(&mut self) {
        let found = self.find();
        let without_conditions = found
            .iter()
            .filter(|(_, u)| matches!(u, Unprobed::NoConditions { .. }))
            .count();
        let without_sidecar = found.len() - without_conditions;
        self.metrics
            .pods_without_sidecar
            .set(without_sidecar as i64);
        self.metrics
            .pods_without_conditions
            .set(without_conditions as i64);
        let now: BTreeSet<(String, &'static str)> = found
            .iter()
            .filter_map(|(p, u)| p.metadata.uid.clone().map(|uid| (uid, u.reason())))
            .collect();
        self.reported.retain(|key| now.contains(key));
        self.log_counts(&found, without_sidecar, without_conditions);
        // A Recorder per sweep: one that remembers an Event patches it into a series when the
        // same pod is reported again within minutes (it left the result and came back), and
        // the manager may only create Events.
        let recorder = Recorder::new(self.client.clone(), crate::events::reporter());
        let (mut published, mut failed) = (0, 0);
        for (pod, unprobed) in &found {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            let key = (uid, unprobed.reason());
            if published == EVENTS_PER_SWEEP {
                break;
            }
            if self.reported.contains(&key) {
                continue;
            }
            let (note, action) = match unprobed {
                Unprobed::NoSidecar { markers } => {
                    (note(pod, &self.config, markers), "CheckSidecar")
                }
                Unprobed::NoConditions { conditions } => (
                    conditions_note(pod, &self.config, conditions),
                    "CheckProbes",
                ),
            };
            let event = Event {
                type_: EventType::Warning,
                reason: key.1.into(),
                note: Some(note),
                action: action.into(),
                secondary: None,
            };
            match recorder.publish(&event, &pod.object_ref(&())).await {
                Ok(()) => {
                    published += 1;
                    self.reported.insert(key);
                }
                Err(e) => {
                    // The pod is tried again next sweep; the others go on (one pod whose
                    // Event is refused must not silence the rest). One line per sweep.
                    if failed == 0 {
                        tracing::warn!(pod = %pod.key(), "cannot publish the {} Event: {e}", key.1);
                    }
                    failed += 1;
                }
            }
        }
        if failed > 1 {
            tracing::warn!("{failed} Events refused in this sweep; tried again next sweep");
        }
    }

    fn log_counts(
        &mut self,
        found: &[(Arc<CachedPod>, Unprobed)],
        without_sidecar: usize,
        without_conditions: usize,
    ) {
        let names = |conditions: bool| {
            let names: Vec<String> = found
                .iter()
                .filter(|(_, u)| matches!(u, Unprobed::NoConditions { .. }) == conditions)
                .take(5)
                .map(|(p, _)| p.key())
                .collect();
            names.join(", ")
        };
        if self.logged.0 != Some(without_sidecar) {
            if without_sidecar == 0 {
                tracing::info!("every pod that opted in to the sidecar runs it");
            } else {
                tracing::warn!(
                    count = without_sidecar,
                    pods = %names(false),
                    "pods opted in to the sidecar and selected by a PodProbeMarker run without it: nothing probes them (Events {REASON} on each; recreate them)"
                );
            }
            self.logged.0 = Some(without_sidecar);
        }
        if self.logged.1 != Some(without_conditions) {
            if without_conditions > 0 {
                tracing::warn!(
                    count = without_conditions,
                    pods = %names(true),
                    "pods run the sidecar and none of their probe conditions has been written: their sidecars cannot write, or every probe attempt errors (Events {CONDITIONS_REASON} on each; the sidecar's log says which)"
                );
            } else if self.logged.1.is_some() {
                tracing::info!("every pod that runs the sidecar has its probe conditions");
            }
            self.logged.1 = Some(without_conditions);
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
        self.metrics.pods_without_conditions.set(0);
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

    fn running_with_sidecar(conditions: serde_json::Value) -> CachedPod {
        serde_json::from_value(json!({
            "metadata": {"name": "gs-0", "namespace": "games", "uid": "u-1",
                         "labels": {"app": "game", "podprobe.io/sidecar-token": "projected"}},
            "spec": {"containers": [{"name": "main"}, {"name": "podprobe"}]},
            "status": {"phase": "Running", "conditions": conditions}
        }))
        .unwrap()
    }

    #[test]
    fn a_running_pod_with_the_sidecar_and_none_of_its_conditions_is_found_others_are_not() {
        let silent = running_with_sidecar(json!([{"type": "Ready", "status": "True"}]));
        let (conditions, grace) = missing_conditions(&silent, &[ppm()], &config()).unwrap();
        assert_eq!(conditions, ["game.io/idle"]);
        assert_eq!(grace, SILENCE);
        let note = conditions_note(&silent, &config(), &conditions);
        assert!(
            note.contains("game.io/idle") && note.contains("projected"),
            "{note}"
        );
        assert!(note.len() <= NOTE_MAX);

        let mut delayed = ppm();
        delayed.spec.probes[0].probe.initial_delay_seconds = Some(600);
        assert_eq!(
            missing_conditions(&silent, &[delayed], &config()).map(|(_, g)| g),
            Some(SILENCE + Duration::from_secs(600)),
            "past the probe's initial delay"
        );

        let written = running_with_sidecar(json!([{"type": "game.io/idle", "status": "False"}]));
        let mut pending = silent.clone();
        pending.phase = Some("Pending".into());
        let mut without = silent.clone();
        without.containers = Box::new(["main".to_owned()]);
        for (what, p) in [
            ("written", &written),
            ("not running yet", &pending),
            ("no sidecar (the other check's)", &without),
        ] {
            assert_eq!(missing_conditions(p, &[ppm()], &config()), None, "{what}");
        }
        assert_eq!(
            missing_conditions(&silent, &[], &config()),
            None,
            "no marker"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_pod_is_reported_once_it_has_been_silent_for_the_grace() {
        let (store, mut writer) = kube::runtime::reflector::store::<CachedPod>();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(running_with_sidecar(
            json!([]),
        )));
        let ppms = Arc::new(PpmCache::default());
        ppms.set_for_tests(vec![ppm()]);
        let (namespaces, _) = kube::runtime::reflector::store::<Namespace>();
        let client =
            Client::try_from(kube::Config::new("https://127.0.0.1:1".parse().unwrap())).unwrap();
        let mut sweep = Sweep::new(
            client,
            store,
            ppms,
            namespaces,
            config(),
            Arc::new(Metrics::default()),
        );
        assert!(sweep.find().is_empty(), "first seen silent");
        tokio::time::advance(SILENCE - Duration::from_secs(1)).await;
        assert!(sweep.find().is_empty(), "not yet");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            sweep.find()[0].1,
            Unprobed::NoConditions {
                conditions: vec!["game.io/idle".into()]
            }
        );
        // Its condition written: forgotten, and counted from scratch if it goes again.
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(running_with_sidecar(
            json!([{"type": "game.io/idle", "status": "True"}]),
        )));
        assert!(sweep.find().is_empty());
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(running_with_sidecar(
            json!([]),
        )));
        assert!(sweep.find().is_empty(), "silent again: counted afresh");
    }
}
