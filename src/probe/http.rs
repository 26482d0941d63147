//! httpGet probes.
use std::time::Duration;

use super::{AttemptError, HttpAction, Observation};

pub const DEFAULT_USER_AGENT: &str = "kube-probe/1.33";

#[derive(Debug, Clone)]
pub struct HttpProber {
    user_agent: String,
}

impl HttpProber {
    pub fn new(user_agent: String) -> Self {
        HttpProber { user_agent }
    }

    pub async fn attempt(
        &self,
        action: &HttpAction,
        host: &str,
        port: u16,
        _timeout: Duration,
    ) -> Result<Observation, AttemptError> {
        Err(AttemptError::Other(format!(
            "GET {host}:{port}{} ({}): handler not built yet",
            action.path, self.user_agent
        )))
    }
}
