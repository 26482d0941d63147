//! Another workload's requests through an outage: a client of a service account of its own
//! (so the built-in `service-accounts` FlowSchema and priority level `workload-low`, as most
//! controllers and operators are) asking `GET /version` every 100 ms, to show what a
//! recovering fleet costs the apiserver's other clients.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testkit::real::ControlPlane;
use tokio::task::JoinHandle;

use crate::FleetError;
use crate::report::percentile;

const NAMESPACE: &str = "default";
const ACCOUNT: &str = "bystander";
const PERIOD: Duration = Duration::from_millis(100);
/// A request still unanswered after this long counts as failed.
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy)]
enum Outcome {
    Answered(Duration),
    Throttled,
    Failed,
}

/// The running client; stops when dropped.
#[derive(Debug)]
pub struct Bystander {
    asked: Arc<Mutex<Vec<(Instant, Outcome)>>>,
    task: JoinHandle<()>,
}

/// What its requests saw in one window.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BystanderFigures {
    pub requests: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    /// Answered 429.
    pub throttled: usize,
    /// Any other error, or no answer within 10 s.
    pub failed: usize,
}

impl Bystander {
    /// Creates its service account and starts asking.
    pub async fn start(cp: &ControlPlane) -> Result<Self, FleetError> {
        cp.create_service_account(NAMESPACE, ACCOUNT).await?;
        let token = cp.service_account_token(NAMESPACE, ACCOUNT).await?;
        let client = cp.client_for_token(&token);
        let asked = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let asked = asked.clone();
            async move {
                let mut tick = tokio::time::interval(PERIOD);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let sent = Instant::now();
                    let outcome =
                        match tokio::time::timeout(TIMEOUT, client.apiserver_version()).await {
                            Ok(Ok(_)) => Outcome::Answered(sent.elapsed()),
                            Ok(Err(kube::Error::Api(s))) if s.code == 429 => Outcome::Throttled,
                            Ok(Err(_)) | Err(_) => Outcome::Failed,
                        };
                    asked
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((sent, outcome));
                }
            }
        });
        Ok(Self { asked, task })
    }

    /// The requests sent from `from` up to `to`.
    pub fn figures(&self, from: Instant, to: Instant) -> BystanderFigures {
        let asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
        let window: Vec<Outcome> = asked
            .iter()
            .filter(|(at, _)| *at >= from && *at < to)
            .map(|(_, o)| *o)
            .collect();
        let mut answered: Vec<f64> = window
            .iter()
            .filter_map(|o| match o {
                Outcome::Answered(d) => Some(d.as_secs_f64() * 1000.0),
                _ => None,
            })
            .collect();
        BystanderFigures {
            requests: window.len(),
            p50_ms: percentile(&mut answered, 0.5),
            p99_ms: percentile(&mut answered, 0.99),
            max_ms: percentile(&mut answered, 1.0),
            throttled: window
                .iter()
                .filter(|o| matches!(o, Outcome::Throttled))
                .count(),
            failed: window
                .iter()
                .filter(|o| matches!(o, Outcome::Failed))
                .count(),
        }
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        self.task.abort();
    }
}
