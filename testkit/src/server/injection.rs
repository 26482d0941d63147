//! What the matching fault rules do to a request: delay it, reset its
//! connection, answer it with an error, or cut its watch or exec stream later.

use std::time::Duration;

use serde_json::json;

use crate::error::ApiError;
use crate::faults::Action;

/// Faults that act later in the request: on its watch or its exec stream.
#[derive(Default)]
pub(super) struct Later {
    pub end_watch_after: Option<usize>,
    pub drop_exec_after: Option<u64>,
}

/// What the matching fault rules do to a request.
pub(super) enum Injected {
    /// The connection is dropped.
    Reset,
    /// The request is answered with this error instead.
    Answer(ApiError),
    /// It is served, with these faults to come.
    Later(Later),
}

/// Applies delays in order; the first reset or status answers the request.
pub(super) async fn injected(actions: Vec<Action>) -> Injected {
    let mut later = Later::default();
    for action in actions {
        match action {
            Action::Delay { millis } => tokio::time::sleep(Duration::from_millis(millis)).await,
            Action::Reset => return Injected::Reset,
            Action::Status {
                code,
                retry_after,
                message,
            } => {
                let mut e = ApiError::from_code(code, message);
                e.retry_after = retry_after;
                if code == 429 && e.details.is_none() {
                    e.details = Some(json!({"retryAfterSeconds": retry_after.unwrap_or(1)}));
                }
                return Injected::Answer(e);
            }
            Action::EndWatchAfter { events } => later.end_watch_after = Some(events),
            Action::DropExecStreamAfter { bytes } => later.drop_exec_after = Some(bytes),
            Action::WithoutSubprotocol { .. } => {}
        }
    }
    Injected::Later(later)
}
