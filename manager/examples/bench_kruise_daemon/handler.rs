//! The three handlers the benchmark runs one at a time, and where each one's attempts are
//! counted.

use serde_json::{Value, json};

use super::installed::NS;
use super::on_node::usage;
use super::support;

/// Where the exec probe counts its attempts, one byte each, in the game container.
pub const EXEC_ATTEMPTS: &str = "/var/run/game/attempts";

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Handler {
    Exec,
    Tcp,
    Http,
}

impl Handler {
    pub const ALL: [Handler; 3] = [Handler::Exec, Handler::Tcp, Handler::Http];

    pub fn name(self) -> &'static str {
        match self {
            Handler::Exec => "exec",
            Handler::Tcp => "tcp",
            Handler::Http => "http",
        }
    }

    pub fn condition_type(self) -> String {
        format!("game.kruise.io/bench-{}", self.name())
    }

    fn probe(self) -> Value {
        let command = format!("echo >> {EXEC_ATTEMPTS}; test -f /var/run/game/players");
        match self {
            Handler::Exec => {
                json!({"exec": {"command": ["sh", "-c", command]}, "periodSeconds": 1})
            }
            Handler::Tcp => json!({"tcpSocket": {"port": 7777}, "periodSeconds": 1}),
            Handler::Http => {
                json!({"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
                                    "periodSeconds": 1})
            }
        }
    }

    pub fn ppm(self) -> podprobe_manager::crd::PodProbeMarker {
        support::ppm(&json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
            "metadata": {"name": "bench", "namespace": NS},
            "spec": {"selector": {"matchLabels": {"app": "game"}}, "probes": [
                {"name": self.name(), "containerName": "game",
                 "podConditionType": self.condition_type(), "probe": self.probe()}]}
        }))
    }

    /// The attempts that have reached the game container whose process is `pid`, so far.
    pub fn attempts_in(self, pid: u32) -> u64 {
        match self {
            Handler::Exec => usage::file_len_in(pid, EXEC_ATTEMPTS),
            Handler::Tcp | Handler::Http => usage::passive_opens(pid),
        }
    }
}
