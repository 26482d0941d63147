//! Dispatch of exec attempts to a mode, and `auto`'s choice per target container.
//!
//! `auto` keeps one decision per target container (by name), made when the container is first
//! probed and again whenever its `containerID` changes (a restart): the first of agent →
//! procfs → api → local whose pre-check passes (agent: the manager wrapped the container's
//! command; procfs: the target process is found and the capabilities are there; api: a client
//! is configured). A container with an agent always uses it: an agent that is not answering
//! (its container restarting) is an errored attempt, never a fallback. The choice and the
//! reasons the earlier modes were passed over are logged once, at info. When an attempt in the
//! chosen mode ends with [`AttemptError::ModeUnavailable`] (ptrace access refused, RBAC
//! forbids `pods/exec`, ...), that mode is ruled out for this container instance, the fallback
//! is logged (warn) and the same attempt is retried in the next mode with what is left of its
//! timeout. `local` is always possible, so probes never stay errored because of the mode.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::procfs::Procfs;
use super::{AgentExec, ApiExec, ExecConfig, ExecMode};
use crate::probe::{AttemptError, ExecAction, Observation, Target};

const ORDER: [ExecMode; 4] = [
    ExecMode::Agent,
    ExecMode::Procfs,
    ExecMode::Api,
    ExecMode::Local,
];

#[derive(Debug)]
struct Decision {
    container_id: Option<String>,
    mode: ExecMode,
    /// Modes that cannot work for this container instance, with why.
    ruled_out: Vec<(ExecMode, String)>,
}

#[derive(Debug)]
struct Inner {
    mode: ExecMode,
    api: Option<ApiExec>,
    agent: AgentExec,
    procfs: Procfs,
    decisions: Mutex<HashMap<String, Decision>>,
}

/// Runs exec attempts in the configured mode. Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub(crate) struct Executor {
    inner: Arc<Inner>,
}

impl Executor {
    pub(crate) fn new(config: ExecConfig) -> Self {
        Executor {
            inner: Arc::new(Inner {
                mode: config.mode,
                api: config.api,
                agent: config.agent,
                procfs: Procfs::default(),
                decisions: Mutex::new(HashMap::new()),
            }),
        }
    }

    pub(crate) async fn attempt(
        &self,
        action: &ExecAction,
        target: &Target,
        timeout: Duration,
    ) -> Result<Observation, AttemptError> {
        if self.inner.mode != ExecMode::Auto {
            return self.run(self.inner.mode, action, target, timeout).await;
        }
        let deadline = Instant::now() + timeout;
        loop {
            let mode = self.choose(target);
            let left = deadline.saturating_duration_since(Instant::now());
            match self.run(mode, action, target, left).await {
                Err(AttemptError::ModeUnavailable { mode, reason }) if mode != ExecMode::Local => {
                    self.rule_out(target, mode, reason);
                }
                other => return other,
            }
        }
    }

    /// The mode `auto` currently uses for `target`'s container (choosing it if needed).
    /// For tests and diagnostics.
    pub(crate) fn mode_for(&self, target: &Target) -> ExecMode {
        match self.inner.mode {
            ExecMode::Auto => self.choose(target),
            mode => mode,
        }
    }

    async fn run(
        &self,
        mode: ExecMode,
        action: &ExecAction,
        target: &Target,
        timeout: Duration,
    ) -> Result<Observation, AttemptError> {
        match mode {
            ExecMode::Local | ExecMode::Auto => super::attempt(action, timeout).await,
            ExecMode::Agent => {
                self.inner
                    .agent
                    .attempt(action, &target.container_name, timeout)
                    .await
            }
            ExecMode::Procfs => {
                self.inner
                    .procfs
                    .attempt(
                        action,
                        &target.container_name,
                        target.container_id.as_deref(),
                        timeout,
                    )
                    .await
            }
            ExecMode::Api => match &self.inner.api {
                Some(api) => api.attempt(action, &target.container_name, timeout).await,
                None => Err(AttemptError::ModeUnavailable {
                    mode: ExecMode::Api,
                    reason: no_api_reason(),
                }),
            },
        }
    }

    /// The mode for `target`'s container, deciding (and logging) when the container is new or
    /// has restarted.
    fn choose(&self, target: &Target) -> ExecMode {
        let mut decisions = self.lock();
        if let Some(d) = decisions.get(&target.container_name)
            && d.container_id == target.container_id
        {
            return d.mode;
        }
        let mut ruled_out = Vec::new();
        let mut chosen = ExecMode::Local;
        let mut why = "always possible".to_owned();
        for mode in ORDER {
            match self.pre_check(mode, target) {
                Ok(reason) => {
                    chosen = mode;
                    why = reason;
                    break;
                }
                Err(reason) => ruled_out.push((mode, reason)),
            }
        }
        tracing::info!(
            container = %target.container_name,
            container_id = target.container_id.as_deref().unwrap_or("unknown"),
            exec_mode = %chosen,
            "exec probes in container {:?} run in {chosen} mode: {why}{}",
            target.container_name,
            passed_over(&ruled_out)
        );
        decisions.insert(
            target.container_name.clone(),
            Decision {
                container_id: target.container_id.clone(),
                mode: chosen,
                ruled_out,
            },
        );
        chosen
    }

    fn pre_check(&self, mode: ExecMode, target: &Target) -> Result<String, String> {
        match mode {
            ExecMode::Agent => self.inner.agent.check(&target.container_name),
            ExecMode::Procfs => self
                .inner
                .procfs
                .check(&target.container_name, target.container_id.as_deref()),
            ExecMode::Api if self.inner.api.is_some() => {
                Ok("pods/exec through the apiserver is configured".into())
            }
            ExecMode::Api => Err(no_api_reason()),
            ExecMode::Local | ExecMode::Auto => Ok("always possible".into()),
        }
    }

    fn rule_out(&self, target: &Target, failed: ExecMode, reason: String) {
        let mut decisions = self.lock();
        let Some(decision) = decisions.get_mut(&target.container_name) else {
            return;
        };
        if decision.container_id != target.container_id || decision.mode != failed {
            // Another attempt already moved on (or the container restarted meanwhile).
            return;
        }
        decision.ruled_out.push((failed, reason.clone()));
        let next = ORDER
            .into_iter()
            .skip_while(|m| *m != failed)
            .skip(1)
            .find(|m| match self.pre_check(*m, target) {
                Ok(_) => true,
                Err(why) => {
                    decision.ruled_out.push((*m, why));
                    false
                }
            })
            .unwrap_or(ExecMode::Local);
        decision.mode = next;
        tracing::warn!(
            container = %target.container_name,
            exec_mode = %next,
            "exec mode {failed} cannot run probes in container {:?}: {reason}; falling back to {next} until the container restarts",
            target.container_name
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Decision>> {
        self.inner
            .decisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

fn no_api_reason() -> String {
    "no pod to exec into (pods/exec needs the sidecar's Kubernetes client; podprobe check has none)"
        .into()
}

fn passed_over(ruled_out: &[(ExecMode, String)]) -> String {
    ruled_out
        .iter()
        .map(|(m, why)| format!("; not {m}: {why}"))
        .collect()
}
