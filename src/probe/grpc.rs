//! grpc probes (grpc.health.v1.Health/Check).
use std::time::Duration;

use super::{GrpcAction, Observation};

pub async fn attempt(action: &GrpcAction, host: &str, _timeout: Duration) -> Observation {
    Observation::failed(format!(
        "grpc {host}:{}: handler not built yet",
        action.port
    ))
}
