//! Prometheus metrics and the plain-HTTP `/metrics`, `/healthz`, `/readyz` endpoints.

use std::sync::Arc;

use podprobe_ops::endpoints::Endpoints;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    /// `/mutate-pods` or `/validate-podprobemarkers`.
    pub path: String,
    /// `allowed`, `patched`, `denied`, `error` (allowed unchanged after an internal error) or
    /// `bad_request`.
    pub result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabel {
    pub path: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `ok`, `gone` (pod deleted or replaced) or `error`.
    pub outcome: String,
}

/// Every `result` of [`WebhookLabels`] a known path answers with.
const WEBHOOK_RESULTS: [&str; 5] = ["allowed", "patched", "denied", "error", "bad_request"];
/// Every `outcome` of [`OutcomeLabel`].
const OUTCOMES: [&str; 3] = ["ok", "gone", "error"];
/// Every `outcome` of `sidecar_tokens` (manager/src/sidecar_token/issue.rs).
pub const TOKEN_OUTCOMES: [&str; 2] = ["issued", "refused"];

/// Every metric the manager exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub webhook_requests: Family<WebhookLabels, Counter>,
    pub webhook_duration: Family<PathLabel, Histogram>,
    pub pod_patches: Family<OutcomeLabel, Counter>,
    pub pod_reconciles: Counter,
    pub status_updates: Family<OutcomeLabel, Counter>,
    pub leader: Gauge,
    pub cert_reloads: Counter,
    pub cert_reload_errors: Counter,
    /// Pods held by the sidecar-token gate that this replica sees.
    pub sidecar_tokens_pending: Gauge,
    pub sidecar_tokens: Family<OutcomeLabel, Counter>,
    /// Pods opted in to the sidecar, selected by a PodProbeMarker, and running without it
    /// (manager/src/pods/unprobed.rs); set by the leader's sweep.
    pub pods_without_sidecar: Gauge,
    /// Pods running the sidecar none of whose probe conditions was written minutes after
    /// they ran (manager/src/pods/unprobed.rs); set by the leader's sweep.
    pub pods_without_conditions: Gauge,
}

impl Default for Metrics {
    /// The metrics of a replica that may lead (standalone mode).
    fn default() -> Self {
        Self::new(true)
    }
}

impl Metrics {
    /// `may_lead`: the replica runs the controllers when it holds the Lease (standalone mode).
    /// Otherwise `podprobe_manager_leader` is not exported: a series stuck at 0 would read as
    /// "no replica leads" where none is meant to.
    pub fn new(may_lead: bool) -> Self {
        let mut registry = Registry::default();
        podprobe_ops::process::register_process_metrics(&mut registry);
        let own = registry.sub_registry_with_prefix("podprobe_manager");
        podprobe_ops::process::register_build_info(own, env!("CARGO_PKG_VERSION"));
        let webhook_requests = Family::<WebhookLabels, Counter>::default();
        let webhook_duration = Family::<PathLabel, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
            ])
        });
        let pod_patches = Family::<OutcomeLabel, Counter>::default();
        let pod_reconciles = Counter::default();
        let status_updates = Family::<OutcomeLabel, Counter>::default();
        let leader = Gauge::default();
        let cert_reloads = Counter::default();
        let cert_reload_errors = Counter::default();
        let sidecar_tokens_pending = Gauge::default();
        let sidecar_tokens = Family::<OutcomeLabel, Counter>::default();
        let pods_without_sidecar = Gauge::default();
        let pods_without_conditions = Gauge::default();
        own.register(
            "webhook_requests",
            "AdmissionReview requests by path and result",
            webhook_requests.clone(),
        );
        own.register(
            "webhook_duration_seconds",
            "Time to answer an AdmissionReview, from request head to response",
            webhook_duration.clone(),
        );
        own.register(
            "pod_patches",
            "Pod metadata patches sent (markers and annotation propagation) by outcome",
            pod_patches.clone(),
        );
        own.register(
            "pod_reconciles",
            "Pod reconciles run (each sends at most one patch)",
            pod_reconciles.clone(),
        );
        own.register(
            "status_updates",
            "PodProbeMarker status patches by outcome",
            status_updates.clone(),
        );
        if may_lead {
            own.register(
                "leader",
                "1 while this replica holds the leader Lease",
                leader.clone(),
            );
        }
        own.register(
            "cert_reloads",
            "Webhook certificate reloads",
            cert_reloads.clone(),
        );
        own.register(
            "cert_reload_errors",
            "Webhook certificate reloads that failed (the previous certificate stays in use)",
            cert_reload_errors.clone(),
        );
        own.register(
            "sidecar_tokens_pending",
            "Virtual-node pods held by the podprobe.io/sidecar-token scheduling gate, waiting for their sidecar's token",
            sidecar_tokens_pending.clone(),
        );
        own.register(
            "sidecar_tokens",
            "Virtual-node pods released by outcome: issued (token bound to the pod) or refused (released without one)",
            sidecar_tokens.clone(),
        );
        own.register(
            "pods_without_sidecar",
            "Pods opted in to the sidecar and selected by a PodProbeMarker that run without it: nothing probes them (each gets a SidecarMissing Event; recreate them). Counted by the leader every 30 s in standalone mode with injection",
            pods_without_sidecar.clone(),
        );
        own.register(
            "pods_without_conditions",
            "Pods running the sidecar none of whose probe conditions has been written 5 minutes (plus the probes' initial delay) after the leader saw them running: the sidecar cannot write (no token, RBAC) or every attempt errors (each gets a ProbeConditionsMissing Event). Counted by the leader every 30 s in standalone mode with injection",
            pods_without_conditions.clone(),
        );
        // Every known label value starts at 0, so a series exists before its first event:
        // `rate()` and `increase()` then see that first error instead of a series appearing at 1.
        for path in [
            crate::routes::MUTATE_PODS_PATH,
            crate::routes::VALIDATE_PPM_PATH,
        ] {
            for result in WEBHOOK_RESULTS {
                let _ = webhook_requests.get_or_create(&WebhookLabels {
                    path: path.into(),
                    result: result.into(),
                });
            }
        }
        for outcome in OUTCOMES {
            let label = OutcomeLabel {
                outcome: outcome.into(),
            };
            let _ = pod_patches.get_or_create(&label);
            let _ = status_updates.get_or_create(&label);
        }
        for outcome in TOKEN_OUTCOMES {
            let _ = sidecar_tokens.get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            });
        }
        Self {
            registry,
            webhook_requests,
            webhook_duration,
            pod_patches,
            pod_reconciles,
            status_updates,
            leader,
            cert_reloads,
            cert_reload_errors,
            sidecar_tokens_pending,
            sidecar_tokens,
            pods_without_sidecar,
            pods_without_conditions,
        }
    }
}

impl Metrics {
    pub fn webhook(&self, path: &str, result: &str, seconds: f64) {
        self.webhook_requests
            .get_or_create(&WebhookLabels {
                path: path.into(),
                result: result.into(),
            })
            .inc();
        self.webhook_duration
            .get_or_create(&PathLabel { path: path.into() })
            .observe(seconds);
    }

    pub fn pod_patch(&self, outcome: &str) {
        self.pod_patches
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .inc();
    }

    pub fn sidecar_token(&self, outcome: &str) {
        self.sidecar_tokens
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .inc();
    }

    pub fn status_update(&self, outcome: &str) {
        self.status_updates
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// What `/readyz` reports: whether the caches the webhooks read have their first list. Also
/// awaited by the leader's sweep for pods without their sidecar, which reads the same caches
/// (a `Store`'s own `wait_until_ready` wakes only one of several waiters in kube-runtime 5.0,
/// so a second waiter could leave this one waiting for ever).
#[derive(Debug)]
pub struct Readiness {
    ready: watch::Sender<bool>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self {
            ready: watch::Sender::new(false),
        }
    }
}

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.ready.send_replace(ready);
    }
    pub fn get(&self) -> bool {
        *self.ready.borrow()
    }
    /// Resolves once ready.
    pub async fn wait(&self) {
        // The sender lives as long as `self`: the wait ends only by readiness.
        let _ = self.ready.subscribe().wait_for(|r| *r).await;
    }
}

/// What the manager answers on `/metrics`, `/healthz` and `/readyz` (ready once the caches the
/// webhooks read have synced).
#[derive(Debug)]
pub struct ManagerEndpoints {
    pub metrics: Arc<Metrics>,
    pub readiness: Arc<Readiness>,
}

impl Endpoints for ManagerEndpoints {
    fn metrics(&self) -> String {
        self.metrics.encode()
    }

    fn readiness(&self) -> Result<(), String> {
        if self.readiness.get() {
            Ok(())
        } else {
            Err("caches not synced".into())
        }
    }
}

/// Serves the manager's endpoints on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    shutdown: CancellationToken,
) {
    let endpoints = Arc::new(ManagerEndpoints { metrics, readiness });
    podprobe_ops::endpoints::serve(listener, endpoints, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_series_alerts_watch_exist_at_zero_from_the_start() {
        let text = Metrics::default().encode();
        for series in [
            r#"podprobe_manager_webhook_requests_total{path="/mutate-pods",result="error"} 0"#,
            r#"podprobe_manager_webhook_requests_total{path="/validate-podprobemarkers",result="denied"} 0"#,
            r#"podprobe_manager_pod_patches_total{outcome="error"} 0"#,
            r#"podprobe_manager_status_updates_total{outcome="error"} 0"#,
            "podprobe_manager_cert_reload_errors_total 0",
        ] {
            assert!(text.contains(series), "{series} in {text}");
        }
    }

    #[test]
    fn only_a_replica_that_may_lead_exports_the_leader_gauge() {
        assert!(
            Metrics::new(true)
                .encode()
                .contains("podprobe_manager_leader 0")
        );
        let companion = Metrics::new(false).encode();
        assert!(
            !companion.contains("podprobe_manager_leader"),
            "{companion}"
        );
    }
}
