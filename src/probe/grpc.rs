//! grpc probes (grpc.health.v1.Health/Check), with kubelet's messages.
//!
//! Plaintext HTTP/2 to `host:port`, a fresh channel per attempt (dropped afterwards), one
//! deadline for connecting and the RPC. Like grpc-go's blocking dial, a failed connection is
//! retried with grpc's default backoff (1 s base, ×1.6, ±20 % jitter) until the deadline, so a
//! refused port takes the full timeout and reports the connect-timeout text.
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::http::DEFAULT_USER_AGENT;
use super::tcp::join_host_port;
use super::{GrpcAction, Observation, go_duration};

const BACKOFF_BASE: Duration = Duration::from_secs(1);
const BACKOFF_MULTIPLIER: f64 = 1.6;
const BACKOFF_JITTER: f64 = 0.2;
const BACKOFF_MAX: Duration = Duration::from_secs(120);

pub async fn attempt(action: &GrpcAction, host: &str, timeout: Duration) -> Observation {
    attempt_with_user_agent(action, host, timeout, DEFAULT_USER_AGENT).await
}

/// As [`attempt`], sending `user_agent` (tonic appends its own token, as grpc-go does).
pub async fn attempt_with_user_agent(
    action: &GrpcAction,
    host: &str,
    timeout: Duration,
    user_agent: &str,
) -> Observation {
    let deadline = Instant::now() + timeout;
    let hostname = host.trim_start_matches('[').trim_end_matches(']');
    let addr = join_host_port(hostname, action.port);
    let endpoint = Endpoint::from_shared(format!("http://{addr}")).and_then(|e| {
        if user_agent.is_empty() {
            Ok(e)
        } else {
            e.user_agent(user_agent.to_string())
        }
    });
    let endpoint = match endpoint {
        Ok(e) => e.tcp_nodelay(true),
        Err(e) => {
            return Observation::failed(format!(
                "error: failed to connect service at {addr:?}: {e}"
            ));
        }
    };

    let channel = match tokio::time::timeout_at(deadline, connect(&endpoint)).await {
        Ok(channel) => channel,
        Err(_) => {
            return Observation::failed(format!(
                "timeout: failed to connect service {addr:?} within {}: context deadline exceeded",
                go_duration(timeout)
            ));
        }
    };

    let mut client = HealthClient::new(channel);
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: action.service.clone(),
    });
    // Tell the server the deadline (grpc-timeout), as grpc-go does from its context.
    request.set_timeout(deadline.saturating_duration_since(Instant::now()));
    let rpc_timeout = || {
        Observation::failed(format!(
            "timeout: health rpc did not complete within {}",
            go_duration(timeout)
        ))
    };
    match tokio::time::timeout_at(deadline, client.check(request)).await {
        Err(_) => rpc_timeout(),
        Ok(Ok(response)) => serving_status(response.into_inner().status),
        Ok(Err(status)) => rpc_error(&status, deadline, rpc_timeout),
    }
}

/// The kubelet's reading of a health response: only SERVING succeeds.
fn serving_status(raw: i32) -> Observation {
    match ServingStatus::try_from(raw) {
        Ok(ServingStatus::Serving) => Observation::succeeded("service healthy"),
        Ok(other) => Observation::failed(format!(
            "service unhealthy (responded with {:?})",
            other.as_str_name()
        )),
        Err(_) => Observation::failed(format!("service unhealthy (responded with \"{raw}\")")),
    }
}

/// A failed health rpc, in the kubelet's words.
fn rpc_error(
    status: &tonic::Status,
    deadline: Instant,
    rpc_timeout: impl Fn() -> Observation,
) -> Observation {
    match status.code() {
        Code::Unimplemented => Observation::failed(format!(
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
            status.message()
        )),
        Code::DeadlineExceeded => rpc_timeout(),
        // tonic enforces the grpc-timeout it sends on the client side too and reports its
        // expiry as Cancelled("Timeout expired"): that is our deadline.
        Code::Cancelled if Instant::now() + Duration::from_millis(10) >= deadline => rpc_timeout(),
        code => Observation::failed(format!(
            "error: health rpc probe failed: rpc error: code = {} desc = {}",
            go_code_name(code),
            status.message()
        )),
    }
}

/// Connects, retrying with grpc's default backoff; the caller bounds it with the deadline.
/// Hand-written, not `backon`: grpc-go's jitter is symmetric (±20 %), which backon's additive
/// jitter cannot express, and the kubelet's probe timing follows grpc-go.
async fn connect(endpoint: &Endpoint) -> Channel {
    let mut backoff = BACKOFF_BASE;
    loop {
        if let Ok(channel) = endpoint.connect().await {
            return channel;
        }
        let jitter = rand::rng().random_range(-BACKOFF_JITTER..=BACKOFF_JITTER);
        tokio::time::sleep(backoff.mul_f64(1.0 + jitter)).await;
        backoff = backoff.mul_f64(BACKOFF_MULTIPLIER).min(BACKOFF_MAX);
    }
}

/// grpc-go's `codes.Code.String()`.
fn go_code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}
