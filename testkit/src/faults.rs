//! Fault injection: rules that match requests and change how they are
//! answered.
//!
//! Rules are checked in the order they were added; the first rule that
//! matches and still has uses left applies (and uses one up). A
//! [`Action::Delay`] waits and then lets the request go on to later rules
//! and normal handling.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What a matching rule does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum Action {
    /// Answer with this status code and a `metav1.Status` body.
    Status {
        /// HTTP status code.
        code: u16,
        /// Optional `Retry-After` header, in seconds.
        #[serde(default)]
        retry_after: Option<u64>,
        /// Optional `Status.message`.
        #[serde(default)]
        message: Option<String>,
    },
    /// Wait, then handle the request normally.
    Delay {
        /// Milliseconds to wait.
        millis: u64,
    },
    /// Close the connection without an answer.
    Reset,
    /// For a watch: end the stream after this many events (bookmarks not
    /// counted). Other requests are handled normally.
    EndWatchAfter {
        /// Events sent before the server closes the stream.
        events: usize,
    },
    /// For a watch: pass each event (line) on this long after the apiserver sent it, as a
    /// client whose watch lags would see it (an informer behind a slow link or a busy
    /// apiserver). Other requests are handled normally.
    DelayWatchEvents {
        /// Milliseconds each event is held.
        millis: u64,
    },
    /// For a watch: answer with one `ERROR` event, code 410 (`Expired`), and end the stream,
    /// as kube-apiserver's watch cache answers a watch from a resourceVersion it no longer
    /// holds. The client must list again. Other requests are handled normally.
    WatchExpired,
    /// For a `pods/exec` stream: after this many bytes of command output
    /// (stdout and stderr together; 0: right after the upgrade), the
    /// connection is dropped without a status or a close frame. Other
    /// requests are handled normally.
    DropExecStreamAfter {
        /// Output bytes forwarded before the drop.
        bytes: u64,
    },
    /// For an upgrade (`pods/exec`): the WebSocket subprotocol `protocol` is taken out of the
    /// client's offer before the apiserver sees it, as an apiserver that does not know it
    /// would ignore it (the fault proxy only). Other requests are handled normally.
    WithoutSubprotocol {
        /// E.g. `v5.channel.k8s.io`.
        protocol: String,
    },
}

/// A fault rule. Build one with [`Fault::status`], [`Fault::too_many_requests`],
/// [`Fault::delay`], [`Fault::reset`], [`Fault::end_watch_after`] or
/// [`Fault::drop_exec_stream_after`], then
/// narrow it with [`method`](Fault::method), [`path_contains`](Fault::path_contains),
/// [`content_type`](Fault::content_type), [`watch`](Fault::watch) and
/// [`times`](Fault::times). JSON form (for `POST /testkit/faults`):
/// `{"action":{"type":"status","code":500},"method":"PATCH","pathContains":"/status","times":3}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fault {
    /// What to do.
    pub action: Action,
    /// HTTP method to match (any when `None`).
    #[serde(default)]
    pub method: Option<String>,
    /// Substring of the path to match.
    #[serde(default)]
    pub path_contains: Option<String>,
    /// Substring of the query to match (e.g. `watch=true`).
    #[serde(default)]
    pub query_contains: Option<String>,
    /// Substring of the `Content-Type` to match.
    #[serde(default)]
    pub content_type: Option<String>,
    /// Uses left; `None` is unlimited.
    #[serde(default)]
    pub times: Option<u32>,
}

impl Fault {
    fn new(action: Action) -> Self {
        Self {
            action,
            method: None,
            path_contains: None,
            query_contains: None,
            content_type: None,
            times: None,
        }
    }

    /// Answer with `code`.
    pub fn status(code: u16) -> Self {
        Self::new(Action::Status {
            code,
            retry_after: None,
            message: None,
        })
    }

    /// Answer 429 with `Retry-After: <secs>`.
    pub fn too_many_requests(retry_after_secs: u64) -> Self {
        Self::new(Action::Status {
            code: 429,
            retry_after: Some(retry_after_secs),
            message: None,
        })
    }

    /// Delay the answer.
    pub fn delay(d: Duration) -> Self {
        Self::new(Action::Delay {
            millis: d.as_millis() as u64,
        })
    }

    /// Reset the connection.
    pub fn reset() -> Self {
        Self::new(Action::Reset)
    }

    /// End matching watches after `events` events.
    pub fn end_watch_after(events: usize) -> Self {
        Self::new(Action::EndWatchAfter { events }).watch()
    }

    /// Hold each event of matching watches for `d` ([`Action::DelayWatchEvents`]).
    pub fn delay_watch_events(d: Duration) -> Self {
        Self::new(Action::DelayWatchEvents {
            millis: d.as_millis() as u64,
        })
        .watch()
    }

    /// Answer matching watches with an expired resourceVersion ([`Action::WatchExpired`]).
    pub fn watch_expired() -> Self {
        Self::new(Action::WatchExpired).watch()
    }

    /// Drop matching `pods/exec` streams after `bytes` bytes of output.
    pub fn drop_exec_stream_after(bytes: u64) -> Self {
        Self::new(Action::DropExecStreamAfter { bytes }).path_contains("/exec")
    }

    /// Take `protocol` out of matching upgrades' WebSocket subprotocol offers.
    pub fn without_subprotocol(protocol: impl Into<String>) -> Self {
        Self::new(Action::WithoutSubprotocol {
            protocol: protocol.into(),
        })
        .path_contains("/exec")
    }

    /// Only requests with this method.
    pub fn method(mut self, m: impl Into<String>) -> Self {
        self.method = Some(m.into());
        self
    }

    /// Only paths containing `s`.
    pub fn path_contains(mut self, s: impl Into<String>) -> Self {
        self.path_contains = Some(s.into());
        self
    }

    /// Only queries containing `s`.
    pub fn query_contains(mut self, s: impl Into<String>) -> Self {
        self.query_contains = Some(s.into());
        self
    }

    /// Only watch requests.
    pub fn watch(self) -> Self {
        self.query_contains("watch=")
    }

    /// Only requests whose `Content-Type` contains `s`.
    pub fn content_type(mut self, s: impl Into<String>) -> Self {
        self.content_type = Some(s.into());
        self
    }

    /// Apply at most `n` times.
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }

    fn matches(&self, method: &str, path: &str, query: &str, content_type: &str) -> bool {
        self.times != Some(0)
            && self
                .method
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case(method))
            && self
                .path_contains
                .as_deref()
                .is_none_or(|p| path.contains(p))
            && self
                .query_contains
                .as_deref()
                .is_none_or(|q| query.contains(q))
            && self
                .content_type
                .as_deref()
                .is_none_or(|c| content_type.contains(c))
    }
}

/// The installed rules, cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct Faults {
    rules: Arc<Mutex<Vec<Fault>>>,
}

impl Faults {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Fault>> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Install a rule (checked after the ones already installed).
    pub fn add(&self, f: Fault) {
        self.lock().push(f);
    }

    /// Remove all rules.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// The rules with their uses left.
    pub fn rules(&self) -> Vec<Fault> {
        self.lock().clone()
    }

    /// The actions for one request, in order, using up one use of each
    /// rule taken. Stops after the first action that answers the request.
    pub(crate) fn take(
        &self,
        method: &str,
        path: &str,
        query: &str,
        content_type: &str,
        is_watch: bool,
    ) -> Vec<Action> {
        let mut out = Vec::new();
        let mut g = self.lock();
        for rule in g.iter_mut() {
            if !rule.matches(method, path, query, content_type) {
                continue;
            }
            if matches!(
                rule.action,
                Action::EndWatchAfter { .. } | Action::DelayWatchEvents { .. }
            ) && !is_watch
            {
                continue;
            }
            if matches!(rule.action, Action::DropExecStreamAfter { .. }) && !path.ends_with("/exec")
            {
                continue;
            }
            if let Some(n) = rule.times.as_mut() {
                *n -= 1;
            }
            out.push(rule.action.clone());
            if !matches!(
                rule.action,
                Action::Delay { .. } | Action::WithoutSubprotocol { .. }
            ) {
                break;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_used_up_in_order() {
        let f = Faults::default();
        f.add(
            Fault::status(500)
                .method("PATCH")
                .path_contains("/status")
                .times(2),
        );
        let take = || f.take("PATCH", "/api/v1/namespaces/a/pods/p/status", "", "", false);
        assert_eq!(take().len(), 1);
        assert_eq!(take().len(), 1);
        assert!(take().is_empty());
        assert!(f.take("GET", "/x/status", "", "", false).is_empty());
    }

    #[test]
    fn delay_then_status() {
        let f = Faults::default();
        f.add(Fault::delay(Duration::from_millis(5)).times(1));
        f.add(Fault::too_many_requests(1));
        let a = f.take("GET", "/api", "", "", false);
        assert_eq!(a.len(), 2);
        assert!(matches!(
            a[1],
            Action::Status {
                code: 429,
                retry_after: Some(1),
                ..
            }
        ));
    }

    #[test]
    fn json_form() {
        let f: Fault = serde_json::from_str(
            r#"{"action":{"type":"status","code":500},"method":"PATCH","pathContains":"/status","times":3}"#,
        )
        .unwrap();
        assert_eq!(
            f,
            Fault::status(500)
                .method("PATCH")
                .path_contains("/status")
                .times(3)
        );
    }
}
