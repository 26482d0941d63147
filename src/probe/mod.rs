//! One probe attempt: exec, tcpSocket, httpGet or grpc against the pod.
//!
//! This module owns the *validated* handler model (what `annotation` produces from a core/v1
//! Probe) and the per-attempt contract shared by all handlers:
//! - `Ok(Observation)` is a real result (Succeeded or Failed, with its message);
//! - `Err(AttemptError)` is an *errored* attempt (cannot start the command, unresolvable named
//!   port, ...): the runner changes no state and no counter for it.
//!
//! Timing, thresholds and state live in `runner`; this module only does one attempt.
//!
//! Child processes: podprobe spawns children **only** through [`reaper::spawn`]. The reaper
//! waits for every child of the process (`waitpid(-1)`, as PID 1 must), so `tokio::process` or
//! `std::process::Child::wait`/`output`/`status` anywhere else in podprobe would race with it.

pub mod exec;
pub mod grpc;
pub mod http;
pub mod reaper;
pub mod tcp;
pub mod url;

use std::time::Duration;

use k8s_openapi::api::core::v1::ContainerPort;

pub use exec::{AgentExec, ApiExec, ExecConfig, ExecMode};

/// Longest condition message podprobe writes, in bytes (OpenKruise's limit, cut on a char
/// boundary instead of mid-character).
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// At most this many bytes of each output stream / response body are read into memory.
pub const MAX_READ_BYTES: usize = 10 * 1024;

pub use podprobe_protocol::handler::{
    ExecAction, GrpcAction, Handler, HttpAction, Port, Scheme, TcpAction,
};

/// What an attempt is aimed at: the pod's address and the target container (its name, declared
/// ports and, when the pod status is known, its current `containerID`).
#[derive(Debug, Clone, Default)]
pub struct Target {
    /// Pod IP (or `127.0.0.1`, or what `--host` says). An IP literal or a DNS name.
    pub host: String,
    /// `spec.containers[].ports` of the target container, for named-port resolution.
    pub container_ports: Vec<ContainerPort>,
    /// The probe's `containerName` (where `procfs` and `api` exec modes run the command).
    pub container_name: String,
    /// `containerStatuses[].containerID` of the target container (`containerd://<hex>`), when
    /// the pod status is known. Changes when the container restarts.
    pub container_id: Option<String>,
}

impl Target {
    pub fn new(host: impl Into<String>) -> Self {
        Target {
            host: host.into(),
            ..Target::default()
        }
    }

    /// Resolves a port: numbers as is; names against the container's ports (first match wins).
    /// A name is never digits: the probe check made a string of digits its number, as
    /// OpenKruise's resolver does (`podprobe_protocol::check`).
    pub fn resolve_port(&self, port: &Port) -> Result<u16, AttemptError> {
        match port {
            Port::Number(n) => Ok(*n),
            Port::Name(name) => {
                if let Some(p) = self
                    .container_ports
                    .iter()
                    .find(|p| p.name.as_deref() == Some(name.as_str()))
                {
                    return u16::try_from(p.container_port)
                        .ok()
                        .filter(|n| *n != 0)
                        .ok_or_else(|| AttemptError::UnresolvedPort {
                            name: name.clone(),
                            reason: format!("containerPort {} is out of range", p.container_port),
                        });
                }
                // No declared ports at all is also what the sidecar sees when it reads only
                // the downward-API file (seen on a real node): say how to fix that.
                let reason = if self.container_ports.is_empty() {
                    "no ports known for the target container (with `--source file` the \
                     sidecar does not see the pod spec: use a port number in the probe, or \
                     `--source api`)"
                } else {
                    "no port with that name in the target container"
                };
                Err(AttemptError::UnresolvedPort {
                    name: name.clone(),
                    reason: reason.into(),
                })
            }
        }
    }
}

/// The result of an attempt that ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Outcome {
    Succeeded,
    Failed,
}

/// A real result with its message (already capped at [`MAX_MESSAGE_BYTES`] by [`Prober`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub outcome: Outcome,
    pub message: String,
}

impl Observation {
    pub fn succeeded(message: impl Into<String>) -> Self {
        Observation {
            outcome: Outcome::Succeeded,
            message: message.into(),
        }
    }

    pub fn failed(message: impl Into<String>) -> Self {
        Observation {
            outcome: Outcome::Failed,
            message: message.into(),
        }
    }
}

/// An attempt that produced no result: the runner keeps state and counters as they are.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    #[error("port {name:?} cannot be resolved: {reason}")]
    UnresolvedPort { name: String, reason: String },
    #[error("cannot start command {command:?}: {source}")]
    Spawn {
        command: Vec<String>,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the HTTP response body failed: {0}")]
    HttpBody(String),
    /// The exec mode cannot work in this pod (no shared PID namespace, missing capability,
    /// RBAC, ...). `auto` falls back to the next mode on this error; with an explicit mode it
    /// is an errored attempt.
    #[error("exec mode {mode} cannot run here: {reason}")]
    ModeUnavailable { mode: ExecMode, reason: String },
    #[error("{0}")]
    Other(String),
}

/// Cuts `message` to at most [`MAX_MESSAGE_BYTES`] bytes on a UTF-8 character boundary.
pub fn truncate_message(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        let mut cut = MAX_MESSAGE_BYTES;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    message
}

/// Formats a duration like Go's `time.Duration.String` ("1s", "1.5s", "2m0s", "500ms"), as the
/// kubelet's messages do.
pub fn go_duration(d: Duration) -> String {
    fn fixed(value: u128, unit: u128, digits: usize) -> String {
        let (int, frac) = (value / unit, value % unit);
        if frac == 0 {
            return int.to_string();
        }
        let frac = format!("{frac:0digits$}");
        format!("{int}.{}", frac.trim_end_matches('0'))
    }
    let ns = d.as_nanos();
    match ns {
        0 => "0s".into(),
        1..1_000 => format!("{ns}ns"),
        1_000..1_000_000 => format!("{}\u{b5}s", fixed(ns, 1_000, 3)),
        1_000_000..1_000_000_000 => format!("{}ms", fixed(ns, 1_000_000, 6)),
        _ => {
            let secs = ns / 1_000_000_000;
            let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
            let mut out = String::new();
            if h > 0 {
                out.push_str(&format!("{h}h"));
            }
            if h > 0 || m > 0 {
                out.push_str(&format!("{m}m"));
            }
            out.push_str(&fixed(
                s * 1_000_000_000 + ns % 1_000_000_000,
                1_000_000_000,
                9,
            ));
            out.push('s');
            out
        }
    }
}

/// Runs single attempts. Cheap to clone; one per sidecar.
#[derive(Debug, Clone)]
pub struct Prober {
    http: http::HttpProber,
    exec: exec::Executor,
}

impl Default for Prober {
    fn default() -> Self {
        Prober::new(http::DEFAULT_USER_AGENT)
    }
}

impl Prober {
    pub fn new(user_agent: impl Into<String>) -> Self {
        Prober {
            http: http::HttpProber::new(user_agent.into()),
            exec: exec::Executor::new(ExecConfig::default()),
        }
    }

    /// Where exec probes run (default: `local`).
    pub fn with_exec(mut self, config: ExecConfig) -> Self {
        self.exec = exec::Executor::new(config);
        self
    }

    /// The mode exec probes against `target` run in now (`auto` decides on first use, and
    /// again after the container restarts or a mode turned out not to work).
    pub fn exec_mode_for(&self, target: &Target) -> ExecMode {
        self.exec.mode_for(target)
    }

    /// One attempt of `handler` against `target`, bounded by `timeout`.
    pub async fn attempt(
        &self,
        handler: &Handler,
        target: &Target,
        timeout: Duration,
    ) -> Result<Observation, AttemptError> {
        let observation = match handler {
            Handler::Exec(action) => self.exec.attempt(action, target, timeout).await?,
            Handler::Tcp(action) => {
                let port = target.resolve_port(&action.port)?;
                tcp::attempt(&target.host, port, timeout).await
            }
            Handler::Http(action) => {
                let port = target.resolve_port(&action.port)?;
                self.http
                    .attempt(action, &target.host, port, timeout)
                    .await?
            }
            Handler::Grpc(action) => {
                grpc::attempt_with_user_agent(action, &target.host, timeout, self.http.user_agent())
                    .await
            }
        };
        Ok(Observation {
            outcome: observation.outcome,
            message: truncate_message(observation.message),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_short_messages() {
        assert_eq!(truncate_message("ok".into()), "ok");
        let exact = "a".repeat(MAX_MESSAGE_BYTES);
        assert_eq!(truncate_message(exact.clone()), exact);
    }

    #[test]
    fn truncation_cuts_on_a_char_boundary() {
        // 1023 ASCII bytes then a 3-byte character: byte 1024 falls inside it.
        let msg = format!("{}€tail", "a".repeat(MAX_MESSAGE_BYTES - 1));
        let cut = truncate_message(msg);
        assert_eq!(cut.len(), MAX_MESSAGE_BYTES - 1);
        assert!(cut.chars().all(|c| c == 'a'));
    }

    #[test]
    fn go_duration_matches_go() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(5), "5ns"),
            (Duration::from_nanos(1_500), "1.5\u{b5}s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_micros(1_250), "1.25ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1_500), "1.5s"),
            (Duration::from_secs(2), "2s"),
            (Duration::from_secs(60), "1m0s"),
            (Duration::from_secs(125), "2m5s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_millis(3_723_500), "1h2m3.5s"),
        ];
        for (d, want) in cases {
            assert_eq!(go_duration(d), want, "{d:?}");
        }
    }

    fn named(name: &str, port: i32) -> ContainerPort {
        ContainerPort {
            name: Some(name.into()),
            container_port: port,
            ..Default::default()
        }
    }

    #[test]
    fn named_ports_resolve_against_the_container() {
        let target = Target {
            host: "127.0.0.1".into(),
            container_ports: vec![named("main-port", 80), named("main-port", 81)],
            ..Target::default()
        };
        assert_eq!(
            target
                .resolve_port(&Port::Name("main-port".into()))
                .unwrap(),
            80
        );
        assert_eq!(target.resolve_port(&Port::Number(8080)).unwrap(), 8080);
        let err = target.resolve_port(&Port::Name("web".into())).unwrap_err();
        assert!(err.to_string().contains("\"web\""), "{err}");
        assert!(err.to_string().contains("no port with that name"), "{err}");
    }

    /// Reading only the downward-API file, the sidecar knows no container ports: the error
    /// says so and how to fix it, not that the container lacks the port (seen on a real node).
    #[test]
    fn a_named_port_without_a_pod_spec_says_how_to_fix_it() {
        let target = Target::new("10.0.0.7");
        let err = target.resolve_port(&Port::Name("http".into())).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, AttemptError::UnresolvedPort { .. }),
            "{err:?}"
        );
        assert!(
            text.contains("--source file") && text.contains("port number"),
            "{text}"
        );
    }
}
