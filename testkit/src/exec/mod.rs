//! `pods/exec`: the WebSocket remotecommand endpoint, with the command run
//! locally by a pluggable [`ExecRunner`].
//!
//! `GET`/`POST /api/v1/namespaces/{ns}/pods/{name}/exec?command=…&command=…
//! &container=…&stdin=…&stdout=…&stderr=…&tty=…` with a WebSocket upgrade.
//! Before the upgrade, as the real apiserver: authorization (`create` on
//! `pods/exec`, the rule since Kubernetes 1.35 for WebSocket upgrades; older
//! servers wanted `get` for a WebSocket `GET`), 404 for a missing pod, 400 for
//! an unknown container, a missing container name in a multi-container pod,
//! no command, or a request without a WebSocket upgrade.
//!
//! Subprotocols, negotiated as the real server does: if the client offers
//! `v5.channel.k8s.io` anywhere in its list, the apiserver's stream translator
//! takes the request (v5); otherwise the kubelet's handler picks the first
//! protocol *in the client's order* it supports (`v4.channel.k8s.io`,
//! `channel.k8s.io`, or none offered → `channel.k8s.io` semantics without a
//! `Sec-WebSocket-Protocol` answer). A list with nothing supported → 403 with
//! an empty body (what golang.org/x/net/websocket answers to a failed
//! handshake).
//!
//! Framing: every binary message starts with the channel byte (0 stdin, 1
//! stdout, 2 stderr, 3 error/status, 4 resize, 255 close in v5). After the
//! upgrade an empty message goes to the lowest writable channel (stdout if
//! asked, else stderr, else 3), as the kubelet does. When the command ends
//! and its output has been forwarded, the status goes on channel 3 — v4/v5:
//! a `metav1.Status` JSON (`Success`; `Failure`/`NonZeroExitCode` with
//! `details.causes[{reason: ExitCode, message: "<n>"}]`; `InternalError` when
//! the command could not be started); v1: nothing on success, the status
//! message as plain text otherwise — then the server closes the WebSocket.

use std::sync::Arc;

mod runner;
mod session;
mod upgrade;

pub use runner::{ExecExit, ExecIo, ExecRequest, ExecRunner, SpawnRunner, Spawned, TokioRunner};
pub(crate) use upgrade::{Incoming, handle, parse_path};

/// `v5.channel.k8s.io`: v4 plus the CLOSE signal (channel 255).
pub const V5: &str = "v5.channel.k8s.io";
/// `v4.channel.k8s.io`: the status channel carries a `metav1.Status` JSON.
pub const V4: &str = "v4.channel.k8s.io";
/// `channel.k8s.io` (v1): the status channel carries plain error text.
pub const V1: &str = "channel.k8s.io";

/// The endpoint's shared state: the runner and the requests seen.
#[derive(Debug)]
pub(crate) struct ExecState {
    runner: std::sync::Mutex<Arc<dyn ExecRunner>>,
    seen: std::sync::Mutex<Vec<ExecRequest>>,
    no_v5: std::sync::atomic::AtomicBool,
}

impl Default for ExecState {
    fn default() -> Self {
        Self {
            runner: std::sync::Mutex::new(Arc::new(TokioRunner)),
            seen: std::sync::Mutex::default(),
            no_v5: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl ExecState {
    pub(crate) fn runner(&self) -> Arc<dyn ExecRunner> {
        self.runner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_runner(&self, r: Arc<dyn ExecRunner>) {
        *self.runner.lock().unwrap_or_else(|e| e.into_inner()) = r;
    }

    pub(crate) fn v5(&self) -> bool {
        !self.no_v5.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn set_v5(&self, on: bool) {
        self.no_v5.store(!on, std::sync::atomic::Ordering::SeqCst);
    }

    fn record(&self, r: ExecRequest) {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).push(r);
    }

    pub(crate) fn requests(&self) -> Vec<ExecRequest> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
