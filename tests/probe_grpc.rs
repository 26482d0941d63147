//! grpc probe handler against real tonic servers on loopback (kubelet conformance G1–G7).
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use podprobe::probe::{GrpcAction, Handler, Observation, Outcome, Prober, Target, grpc};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

const SEC: Duration = Duration::from_secs(1);

async fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

async fn serve_routes(routes: Routes) -> u16 {
    let (l, port) = listener().await;
    tokio::spawn(
        Server::builder()
            .add_routes(routes)
            .serve_with_incoming(TcpIncoming::from(l)),
    );
    port
}

/// A standard tonic-health server with `services` set to the given statuses.
async fn health_server(services: &[(&str, ServingStatus)]) -> u16 {
    let (reporter, service) = tonic_health::server::health_reporter();
    for (name, status) in services {
        reporter.set_service_status(*name, *status).await;
    }
    serve_routes(Routes::new(service)).await
}

fn grpc_action(port: u16, service: &str) -> GrpcAction {
    GrpcAction {
        port,
        service: service.into(),
    }
}

async fn probe(port: u16, service: &str, timeout: Duration) -> Observation {
    grpc::attempt(&grpc_action(port, service), "127.0.0.1", timeout).await
}

/// A Health service whose Check never answers, recording the user agent it saw.
#[derive(Clone, Default)]
struct SlowHealth {
    user_agents: Arc<Mutex<Vec<String>>>,
    answer: Option<i32>,
}

#[tonic::async_trait]
impl Health for SlowHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let ua = request
            .metadata()
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        self.user_agents.lock().unwrap().push(ua);
        match self.answer {
            Some(status) => Ok(Response::new(HealthCheckResponse { status })),
            None => std::future::pending().await,
        }
    }

    type WatchStream = BoxStream<'static, Result<HealthCheckResponse, Status>>;

    async fn watch(
        &self,
        _request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("watch"))
    }
}

/// G1: nothing listens → the connection is retried until the deadline; connect-timeout text.
#[tokio::test]
async fn g1_refused_port_times_out_connecting() {
    let (l, port) = listener().await;
    drop(l);
    let started = Instant::now();
    let obs = probe(port, "", SEC).await;
    let elapsed = started.elapsed();
    assert_eq!(
        obs,
        Observation::failed(format!(
            "timeout: failed to connect service \"127.0.0.1:{port}\" within 1s: context deadline exceeded"
        ))
    );
    assert!(elapsed >= SEC && elapsed < 3 * SEC, "{elapsed:?}");
}

/// G2: a plain HTTP/1 server on the port → Failed (not errored, not a success).
#[tokio::test]
async fn g2_plain_http_server_fails() {
    let (l, port) = listener().await;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    let obs = probe(port, "", SEC).await;
    println!("G2 message: {}", obs.message);
    assert_eq!(obs.outcome, Outcome::Failed);
    assert!(
        obs.message.starts_with("error: health rpc probe failed: ")
            || obs
                .message
                .starts_with("timeout: failed to connect service"),
        "{}",
        obs.message
    );
}

/// G3: NOT_SERVING → Failed with the status name.
#[tokio::test]
async fn g3_not_serving_fails() {
    let port = health_server(&[("", ServingStatus::NotServing)]).await;
    assert_eq!(
        probe(port, "", SEC).await,
        Observation::failed("service unhealthy (responded with \"NOT_SERVING\")")
    );
}

/// G4: Check slower than the timeout → the RPC timeout text.
#[tokio::test]
async fn g4_slow_check_times_out() {
    let port = serve_routes(Routes::new(HealthServer::new(SlowHealth::default()))).await;
    let started = Instant::now();
    let obs = probe(port, "", 2 * SEC).await;
    assert_eq!(
        obs,
        Observation::failed("timeout: health rpc did not complete within 2s")
    );
    let elapsed = started.elapsed();
    assert!(elapsed >= 2 * SEC && elapsed < 4 * SEC, "{elapsed:?}");
}

/// G5: SERVING → Succeeded; a named service too.
#[tokio::test]
async fn g5_serving_succeeds() {
    let port = health_server(&[("", ServingStatus::Serving), ("db", ServingStatus::Serving)]).await;
    assert_eq!(
        probe(port, "", SEC).await,
        Observation::succeeded("service healthy")
    );
    assert_eq!(
        probe(port, "db", SEC).await,
        Observation::succeeded("service healthy")
    );
}

/// G6: a gRPC server without the Health service → "does not implement" text.
#[tokio::test]
async fn g6_server_without_health_service() {
    let port = serve_routes(Routes::default()).await;
    let obs = probe(port, "", SEC).await;
    assert_eq!(obs.outcome, Outcome::Failed);
    assert!(
        obs.message.starts_with(
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health)"
        ),
        "{}",
        obs.message
    );
}

/// G7: an unknown service name (NotFound) → generic RPC failure text, grpc-go style.
#[tokio::test]
async fn g7_unknown_service_fails() {
    let port = health_server(&[("", ServingStatus::Serving)]).await;
    assert_eq!(
        probe(port, "foo", SEC).await,
        Observation::failed(
            "error: health rpc probe failed: rpc error: code = NotFound desc = service not registered"
        )
    );
}

/// UNKNOWN / SERVICE_UNKNOWN are failures too, with their names.
#[tokio::test]
async fn other_statuses_fail_with_their_names() {
    for (status, name) in [(0, "UNKNOWN"), (3, "SERVICE_UNKNOWN")] {
        let health = SlowHealth {
            answer: Some(status),
            ..Default::default()
        };
        let port = serve_routes(Routes::new(HealthServer::new(health))).await;
        assert_eq!(
            probe(port, "", SEC).await,
            Observation::failed(format!("service unhealthy (responded with \"{name}\")"))
        );
    }
}

/// Through `Prober::attempt`: the configured kube-probe User-Agent is sent.
#[tokio::test]
async fn prober_sends_user_agent() {
    let health = SlowHealth {
        answer: Some(1),
        ..Default::default()
    };
    let seen = health.user_agents.clone();
    let port = serve_routes(Routes::new(HealthServer::new(health))).await;
    let obs = Prober::new("kube-probe/1.33")
        .attempt(
            &Handler::Grpc(grpc_action(port, "")),
            &Target::new("127.0.0.1"),
            SEC,
        )
        .await
        .unwrap();
    assert_eq!(obs, Observation::succeeded("service healthy"));
    let ua = seen.lock().unwrap().clone();
    assert_eq!(ua.len(), 1);
    assert!(ua[0].starts_with("kube-probe/1.33"), "{ua:?}");
}
