//! exec probes (local mode: the command runs as a child of podprobe).
use std::time::Duration;

use super::{AttemptError, ExecAction, Observation};

pub async fn attempt(action: &ExecAction, _timeout: Duration) -> Result<Observation, AttemptError> {
    Err(AttemptError::Other(format!(
        "exec of {:?}: handler not built yet",
        action.command
    )))
}
