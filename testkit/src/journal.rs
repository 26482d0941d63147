//! The request journal: every request the server answered (or dropped).

use std::sync::{Arc, Mutex};

use serde::Serialize;

/// One request as the server saw it.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Sequence number, from 1.
    pub seq: u64,
    /// RFC 3339 time the request arrived.
    pub time: String,
    /// HTTP method, e.g. `PATCH`.
    pub method: String,
    /// Path, e.g. `/api/v1/namespaces/ns/pods/p/status`.
    pub path: String,
    /// Raw query string (may be empty).
    pub query: String,
    /// `Content-Type` header (may be empty).
    pub content_type: String,
    /// Request body as text (lossy UTF-8).
    pub body: String,
    /// Response status; `0` when the connection was reset by a fault.
    pub status: u16,
    /// Whether an injected fault answered this request.
    pub fault: bool,
}

impl Entry {
    /// `path` with the query, as in an access log.
    pub fn uri(&self) -> String {
        if self.query.is_empty() {
            self.path.clone()
        } else {
            format!("{}?{}", self.path, self.query)
        }
    }

    /// The request body parsed as JSON (`Null` if it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// When the request arrived.
    pub fn arrived(&self) -> std::time::SystemTime {
        chrono::DateTime::parse_from_rfc3339(&self.time)
            .map(std::time::SystemTime::from)
            .unwrap_or_else(|e| panic!("journal time {:?}: {e}", self.time))
    }

    /// Is this a watch request?
    pub fn is_watch(&self) -> bool {
        self.query
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1")
    }
}

/// The journal, cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct Journal {
    entries: Arc<Mutex<Vec<Entry>>>,
}

impl Journal {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn record(&self, mut e: Entry) {
        let mut g = self.lock();
        e.seq = g.len() as u64 + 1;
        g.push(e);
    }

    /// All entries so far, oldest first.
    pub fn entries(&self) -> Vec<Entry> {
        self.lock().clone()
    }

    /// Entries whose method is `method` (any when empty) and whose path
    /// ends with `path_suffix`, or whose resource (`pods`, `pods/status`,
    /// names and namespaces left out) is `path_suffix`: `("PATCH",
    /// "pods/status")` counts patches of any pod's status.
    pub fn matching(&self, method: &str, path_suffix: &str) -> Vec<Entry> {
        self.lock()
            .iter()
            .filter(|e| method.is_empty() || e.method.eq_ignore_ascii_case(method))
            .filter(|e| path_matches(&e.path, path_suffix))
            .cloned()
            .collect()
    }

    /// How many requests match, as [`matching`](Self::matching).
    pub fn count(&self, method: impl AsRef<str>, path_suffix: &str) -> usize {
        self.matching(method.as_ref(), path_suffix).len()
    }

    /// Wait until at least `n` requests match (as [`count`](Self::count)),
    /// polling every 10 ms; `false` if `within` passes first.
    pub async fn wait_for_count(
        &self,
        method: impl AsRef<str>,
        path_suffix: &str,
        n: usize,
        within: std::time::Duration,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.count(method.as_ref(), path_suffix) >= n {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Forget all entries.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// The entries as JSON lines.
    pub fn to_json_lines(&self) -> String {
        let mut out = String::new();
        for e in self.lock().iter() {
            out.push_str(&serde_json::to_string(e).unwrap_or_default());
            out.push('\n');
        }
        out
    }
}

/// The resource form of an API path: `pods`, `pods/status`, `events`.
fn resource_form(path: &str) -> Option<String> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segs.as_slice() {
        ["api", _, rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _, r, more @ ..] => {
            let mut v = vec![*r];
            v.extend_from_slice(more);
            v
        }
        r => r.to_vec(),
    };
    match rest.as_slice() {
        [plural] | [plural, _] => Some(plural.to_string()),
        [plural, _, sub] => Some(format!("{plural}/{sub}")),
        _ => None,
    }
}

/// A path matches when it ends with `suffix`, or when its resource form
/// (`pods/status` for `/api/v1/namespaces/ns/pods/p/status`) equals the
/// suffix without a leading `/`.
fn path_matches(path: &str, suffix: &str) -> bool {
    path.ends_with(suffix)
        || resource_form(path).is_some_and(|f| f == suffix.trim_start_matches('/'))
}

/// The time from each of `requests` to the next.
pub fn gaps(requests: &[Entry]) -> Vec<std::time::Duration> {
    requests
        .windows(2)
        .map(|w| {
            w[1].arrived()
                .duration_since(w[0].arrived())
                .unwrap_or_default()
        })
        .collect()
}

/// Panics unless `requests` (each one the retry of the one before, after a 429 whose
/// `Retry-After` was `hint`) back off as a fleet must: no retry sooner than the hint, each wait
/// at least the one before (50 ms of slack for the round trip), and the waits grown to at
/// least `grown_to`.
pub fn assert_backs_off(
    requests: &[Entry],
    hint: std::time::Duration,
    grown_to: std::time::Duration,
) {
    let gaps = gaps(requests);
    let slack = std::time::Duration::from_millis(50);
    let uris: Vec<String> = requests
        .iter()
        .map(|e| format!("{} {}", e.status, e.uri()))
        .collect();
    assert!(
        gaps.iter().all(|g| *g >= hint),
        "a retry sooner than the {hint:?} hint: {gaps:?}\n{uris:#?}"
    );
    assert!(
        gaps.windows(2).all(|w| w[1] + slack >= w[0]),
        "the waits do not grow: {gaps:?}\n{uris:#?}"
    );
    assert!(
        gaps.last().is_some_and(|g| *g >= grown_to),
        "the waits never reach {grown_to:?}: {gaps:?}\n{uris:#?}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(method: &str, path: &str) -> Entry {
        Entry {
            seq: 0,
            time: String::new(),
            method: method.into(),
            path: path.into(),
            query: String::new(),
            content_type: String::new(),
            body: String::new(),
            status: 200,
            fault: false,
        }
    }

    #[test]
    fn counts_by_method_and_path() {
        let j = Journal::default();
        j.record(entry("PATCH", "/api/v1/namespaces/ns/pods/p/status"));
        j.record(entry("PATCH", "/api/v1/namespaces/ns/pods/p"));
        j.record(entry("GET", "/api/v1/namespaces/ns/pods/p/status"));
        assert_eq!(j.count("PATCH", "pods/status"), 1);
        assert_eq!(j.count("patch", "/status"), 1);
        assert_eq!(j.count("", "p/status"), 2);
        assert_eq!(j.count("", "pods"), 1);
        assert_eq!(j.count("PATCH", "pods/p"), 1);
        assert_eq!(j.entries()[2].seq, 3);
    }
}
