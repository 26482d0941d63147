//! Prometheus metrics and the small HTTP endpoint serving `/metrics`, `/healthz` and `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use podprobe_ops::endpoints::Endpoints;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::runner::{ProbeId, ProbeState};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    probe: String,
    condition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttemptLabels {
    probe: String,
    condition: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabels {
    condition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    service_account: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteErrorLabels {
    code: String,
}

/// Everything the sidecar counts. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Metrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
    attempts: Family<AttemptLabels, Counter>,
    durations: Family<ProbeLabels, Histogram>,
    state: Family<ProbeLabels, Gauge>,
    erroring: Family<ProbeLabels, Gauge>,
    writes: Counter,
    write_errors: Family<WriteErrorLabels, Counter>,
    overwrites: Family<ConditionLabels, Counter>,
    absent: Family<ConditionLabels, Counter<f64, AtomicU64>>,
    annotation_file_reads: Counter,
    pod_status_reads: Counter,
    token_expiry: Family<TokenLabels, Gauge>,
    token_renewal: Family<TokenLabels, Gauge>,
    ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        podprobe_ops::process::register_process_metrics(&mut registry);
        let own = registry.sub_registry_with_prefix("podprobe");
        podprobe_ops::process::register_build_info(own, env!("CARGO_PKG_VERSION"));
        let attempts = Family::<AttemptLabels, Counter>::default();
        own.register(
            "probe_attempts",
            "Probe attempts by result (succeeded, failed, errored)",
            attempts.clone(),
        );
        let durations = Family::<ProbeLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 4.0, 9))
        });
        own.register(
            "probe_duration_seconds",
            "Duration of probe attempts that produced a result",
            durations.clone(),
        );
        let state = Family::<ProbeLabels, Gauge>::default();
        own.register(
            "probe_state",
            "Published state per probe: 1 Succeeded, 0 Failed, -1 Unknown",
            state.clone(),
        );
        let erroring = Family::<ProbeLabels, Gauge>::default();
        own.register(
            "probe_erroring",
            "1 while a probe's latest attempt errored (no result: its state keeps the last one), else 0",
            erroring.clone(),
        );
        let writes = Counter::default();
        own.register(
            "status_writes",
            "Pod status patches that succeeded",
            writes.clone(),
        );
        let write_errors = Family::<WriteErrorLabels, Counter>::default();
        own.register(
            "status_write_errors",
            "Pod status patches that failed, by HTTP code (or 'transport')",
            write_errors.clone(),
        );
        let overwrites = Family::<ConditionLabels, Counter>::default();
        own.register(
            "condition_overwrites",
            "Times another writer removed or changed a condition podprobe published",
            overwrites.clone(),
        );
        let absent = Family::<ConditionLabels, Counter<f64, AtomicU64>>::default();
        own.register(
            "condition_absent_seconds",
            "Time a condition podprobe published was missing or changed by another writer, from the pod view that showed the overwrite to the one that showed it back",
            absent.clone(),
        );
        let annotation_file_reads = Counter::default();
        own.register(
            "annotation_file_reads",
            "Reads of the downward-API annotations file (--source file): one at start, then one per change",
            annotation_file_reads.clone(),
        );
        let pod_status_reads = Counter::default();
        own.register(
            "pod_status_reads",
            "Reads of the pod through the apiserver by --source file: before probing, while a probed container has not started, and when a probe's attempts say its container may have changed",
            pod_status_reads.clone(),
        );
        // Only where the sidecar renews its own token (an issued one, on a virtual node).
        let token_expiry = Family::<TokenLabels, Gauge>::default();
        own.register(
            "token_expiry_timestamp_seconds",
            "When the sidecar's service-account token expires (Unix time), where the sidecar renews it itself",
            token_expiry.clone(),
        );
        let token_renewal = Family::<TokenLabels, Gauge>::default();
        own.register(
            "token_renewal_timestamp_seconds",
            "When the sidecar renews its token (Unix time: 80 % of its lifetime or a day after it was issued, whichever comes first, up to 10 s earlier); in the past while the apiserver refuses the renewal",
            token_renewal.clone(),
        );
        Metrics {
            inner: Arc::new(Inner {
                registry,
                attempts,
                durations,
                state,
                erroring,
                writes,
                write_errors,
                overwrites,
                absent,
                annotation_file_reads,
                pod_status_reads,
                token_expiry,
                token_renewal,
                ready: AtomicBool::new(false),
            }),
        }
    }

    fn labels(probe: &ProbeId) -> ProbeLabels {
        ProbeLabels {
            probe: probe.name.clone(),
            condition: probe.condition_type.clone(),
        }
    }

    pub fn attempt(
        &self,
        probe: &ProbeId,
        result: &'static str,
        duration: Option<std::time::Duration>,
    ) {
        self.inner
            .attempts
            .get_or_create(&AttemptLabels {
                probe: probe.name.clone(),
                condition: probe.condition_type.clone(),
                result,
            })
            .inc();
        self.inner
            .erroring
            .get_or_create(&Self::labels(probe))
            .set(i64::from(result == "errored"));
        if let Some(d) = duration {
            self.inner
                .durations
                .get_or_create(&Self::labels(probe))
                .observe(d.as_secs_f64());
        }
    }

    /// A probe's series, at 0 from its start: its attempts by result, whether it is erroring,
    /// and its condition's overwrites, so alerts on them see the first event (a series
    /// appearing at 1 shows no increase).
    pub fn track(&self, probe: &ProbeId) {
        let _ = self.inner.erroring.get_or_create(&Self::labels(probe));
        for result in ["succeeded", "failed", "errored"] {
            let _ = self.inner.attempts.get_or_create(&AttemptLabels {
                probe: probe.name.clone(),
                condition: probe.condition_type.clone(),
                result,
            });
        }
        let condition = ConditionLabels {
            condition: probe.condition_type.clone(),
        };
        let _ = self.inner.overwrites.get_or_create(&condition);
        let _ = self.inner.absent.get_or_create(&condition);
    }

    pub fn state(&self, probe: &ProbeId, state: ProbeState) {
        let value = match state {
            ProbeState::Succeeded => 1,
            ProbeState::Failed => 0,
            ProbeState::Unknown => -1,
        };
        self.inner
            .state
            .get_or_create(&Self::labels(probe))
            .set(value);
    }

    pub fn forget(&self, probe: &ProbeId) {
        self.inner.state.remove(&Self::labels(probe));
        self.inner.erroring.remove(&Self::labels(probe));
    }

    pub fn write_ok(&self) {
        self.inner.writes.inc();
    }

    pub fn write_error(&self, code: Option<u16>) {
        let code = code.map_or_else(|| "transport".to_owned(), |c| c.to_string());
        self.inner
            .write_errors
            .get_or_create(&WriteErrorLabels { code })
            .inc();
    }

    /// Another writer removed or changed a condition podprobe published.
    pub fn overwritten(&self, condition_type: &str) {
        self.inner
            .overwrites
            .get_or_create(&ConditionLabels {
                condition: condition_type.to_owned(),
            })
            .inc();
    }

    /// `condition_type` was absent (or changed by another writer) for `how_long`.
    pub fn absent(&self, condition_type: &str, how_long: std::time::Duration) {
        self.inner
            .absent
            .get_or_create(&ConditionLabels {
                condition: condition_type.to_owned(),
            })
            .inc_by(how_long.as_secs_f64());
    }

    /// The counter the file source increments on each read of the annotations file.
    pub fn annotation_file_reads(&self) -> Counter {
        self.inner.annotation_file_reads.clone()
    }

    pub fn pod_status_reads(&self) -> Counter {
        self.inner.pod_status_reads.clone()
    }

    /// The token the sidecar holds now: its service account, when it expires, when it is due
    /// for renewal.
    pub fn token(
        &self,
        service_account: &str,
        expires: jiff::Timestamp,
        renew_at: jiff::Timestamp,
    ) {
        self.set_token(service_account, expires.as_second(), renew_at.as_second());
    }

    /// The sidecar should renew its own token and holds none it can renew (none mounted: its
    /// provider started it before the token's Secret existed; or one not bound to the pod):
    /// shown as a token that expired and was due at the epoch, so the renewal's alert fires.
    pub fn token_missing(&self) {
        self.set_token("", 0, 0);
    }

    fn set_token(&self, service_account: &str, expires: i64, renewal: i64) {
        let labels = TokenLabels {
            service_account: service_account.to_owned(),
        };
        for (family, value) in [
            (&self.inner.token_expiry, expires),
            (&self.inner.token_renewal, renewal),
        ] {
            family.clear();
            family.get_or_create(&labels).set(value);
        }
    }

    pub fn writes(&self) -> u64 {
        self.inner.writes.get()
    }

    /// Ready while probing runs in line with the pod (from the first view until probing stops).
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Relaxed);
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.inner.registry);
        out
    }

    /// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until `shutdown`.
    pub async fn serve(
        self,
        addr: SocketAddr,
        shutdown: CancellationToken,
    ) -> std::io::Result<SocketAddr> {
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        tokio::spawn(podprobe_ops::endpoints::serve(
            listener,
            Arc::new(self),
            shutdown,
        ));
        Ok(local)
    }
}

/// Ready once the first probe set is running.
impl Endpoints for Metrics {
    fn metrics(&self) -> String {
        self.encode()
    }

    fn readiness(&self) -> Result<(), String> {
        if self.inner.ready.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err("no probe set yet".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> ProbeId {
        ProbeId {
            name: "idle".into(),
            condition_type: "game.kruise.io/idle".into(),
        }
    }

    #[test]
    fn a_tracked_probe_has_its_series_at_zero_before_any_event() {
        let m = Metrics::new();
        m.track(&id());
        let text = m.encode();
        for result in ["succeeded", "failed", "errored"] {
            let series = format!(
                r#"podprobe_probe_attempts_total{{probe="idle",condition="game.kruise.io/idle",result="{result}"}} 0"#
            );
            assert!(text.contains(&series), "{series} in {text}");
        }
        assert!(
            text.contains(
                r#"podprobe_condition_overwrites_total{condition="game.kruise.io/idle"} 0"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"podprobe_probe_erroring{probe="idle",condition="game.kruise.io/idle"} 0"#
            ),
            "{text}"
        );
    }

    #[test]
    fn erroring_follows_the_latest_attempt_and_goes_with_the_probe() {
        let m = Metrics::new();
        let erroring = |m: &Metrics| {
            let text = m.encode();
            text.lines()
                .find(|l| l.starts_with("podprobe_probe_erroring{"))
                .map(|l| l.rsplit_once(' ').unwrap().1.to_owned())
        };
        m.track(&id());
        m.attempt(&id(), "succeeded", Some(std::time::Duration::ZERO));
        m.attempt(&id(), "errored", None);
        assert_eq!(erroring(&m).as_deref(), Some("1"));
        // Tracking again (a new probe set) keeps what the attempts said.
        m.track(&id());
        assert_eq!(erroring(&m).as_deref(), Some("1"));
        m.attempt(&id(), "failed", Some(std::time::Duration::ZERO));
        assert_eq!(erroring(&m).as_deref(), Some("0"));
        m.forget(&id());
        assert_eq!(erroring(&m), None);
    }

    #[test]
    fn counts_show_up_in_the_exposition() {
        let m = Metrics::new();
        m.attempt(
            &id(),
            "succeeded",
            Some(std::time::Duration::from_millis(2)),
        );
        m.attempt(&id(), "errored", None);
        m.state(&id(), ProbeState::Failed);
        m.write_ok();
        m.write_error(Some(429));
        let text = m.encode();
        assert!(text.contains(r#"podprobe_probe_attempts_total{probe="idle",condition="game.kruise.io/idle",result="succeeded"} 1"#), "{text}");
        assert!(text.contains(r#"result="errored"} 1"#), "{text}");
        assert!(
            text.contains(
                r#"podprobe_probe_state{probe="idle",condition="game.kruise.io/idle"} 0"#
            ),
            "{text}"
        );
        assert!(text.contains("podprobe_status_writes_total 1"), "{text}");
        assert!(
            text.contains(r#"podprobe_status_write_errors_total{code="429"} 1"#),
            "{text}"
        );
        assert_eq!(m.writes(), 1);
    }

    #[test]
    fn the_renewed_token_shows_when_it_expires_and_is_due_and_a_missing_one_as_expired() {
        let m = Metrics::new();
        assert!(
            !m.encode()
                .contains("podprobe_token_expiry_timestamp_seconds{")
        );
        m.token_missing();
        let text = m.encode();
        for line in [
            r#"podprobe_token_expiry_timestamp_seconds{service_account=""} 0"#,
            r#"podprobe_token_renewal_timestamp_seconds{service_account=""} 0"#,
        ] {
            assert!(text.contains(line), "{text}");
        }
        let at = |s| jiff::Timestamp::from_second(s).unwrap();
        m.token("podprobe-sidecar", at(11_000), at(9_000));
        let text = m.encode();
        assert!(
            !text.contains(r#"service_account="""#),
            "the missing token's series go: {text}"
        );
        for line in [
            r#"podprobe_token_expiry_timestamp_seconds{service_account="podprobe-sidecar"} 11000"#,
            r#"podprobe_token_renewal_timestamp_seconds{service_account="podprobe-sidecar"} 9000"#,
        ] {
            assert!(text.contains(line), "{text}");
        }
    }

    #[tokio::test]
    async fn endpoints() {
        let m = Metrics::new();
        let addr = m
            .clone()
            .serve("127.0.0.1:0".parse().unwrap(), CancellationToken::new())
            .await
            .unwrap();
        let get = |path: &'static str| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/readyz").await.starts_with("HTTP/1.1 503"));
        m.set_ready(true);
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        assert!(
            get("/metrics")
                .await
                .contains("podprobe_status_writes_total 0")
        );
        assert!(get("/nope").await.starts_with("HTTP/1.1 404"));
        // What Prometheus needs to parse the exposition as OpenMetrics.
        assert!(
            get("/metrics")
                .await
                .contains("content-type: application/openmetrics-text; version=1.0.0"),
        );
    }
}
