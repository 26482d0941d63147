//! tcpSocket probes.
use std::time::Duration;

use super::Observation;

pub async fn attempt(host: &str, port: u16, _timeout: Duration) -> Observation {
    Observation::failed(format!("tcp {host}:{port}: handler not built yet"))
}
