//! The game server of the node tests' target image (with busybox beside it for exec probes).
//!
//! It listens where the example game-server pod's probes look, on all addresses of the pod:
//! TCP 7777 (`game`, accepts and closes), HTTP 8080 `/healthz` and gRPC 9090 (health service
//! `game`). Health follows the file `/var/run/game/unhealthy` (or `$GAME_STATE_DIR/unhealthy`):
//! absent = 200 / SERVING, present = 503 / NOT_SERVING, so a test flips it with one `touch`
//! through `pods/exec` or the procfs view of the container. Exits on SIGTERM like a game server
//! that has drained.
//!
//! `GAMESERVER_PORTS=GAME,HTTP,GRPC` listens elsewhere (`0,0,0`: ports the kernel picks); the
//! first line on stderr names the ports bound, for a test on a shared network to read.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tonic_health::ServingStatus;

const DEFAULT_PORTS: [u16; 3] = [7777, 8080, 9090];
/// How often the gRPC health status follows the file (HTTP reads it per request).
const GRPC_FOLLOW: Duration = Duration::from_millis(100);

fn healthy(state_dir: &Path) -> bool {
    !state_dir.join("unhealthy").exists()
}

async fn serve_game(listener: TcpListener) {
    // Accepting is the whole protocol a tcpSocket probe checks; the stream drops at once.
    while listener.accept().await.is_ok() {}
}

async fn serve_http(listener: TcpListener, state_dir: PathBuf) {
    while let Ok((stream, _)) = listener.accept().await {
        let state_dir = state_dir.clone();
        let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
            let (status, body) = match (request.uri().path(), healthy(&state_dir)) {
                ("/healthz", true) => (StatusCode::OK, "ok"),
                ("/healthz", false) => (StatusCode::SERVICE_UNAVAILABLE, "draining"),
                _ => (StatusCode::NOT_FOUND, "not found"),
            };
            let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
            *response.status_mut() = status;
            async move { Ok::<_, Infallible>(response) }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn follow_grpc_health(reporter: tonic_health::server::HealthReporter, state_dir: PathBuf) {
    let mut last = None;
    let mut tick = tokio::time::interval(GRPC_FOLLOW);
    loop {
        tick.tick().await;
        let status = if healthy(&state_dir) {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        if last != Some(status) {
            reporter.set_service_status("game", status).await;
            eprintln!("gameserver: grpc health of \"game\" is now {status:?}");
            last = Some(status);
        }
    }
}

/// `GAMESERVER_PORTS` or the example pod's ports.
fn ports() -> std::io::Result<[u16; 3]> {
    let Some(spec) = std::env::var_os("GAMESERVER_PORTS") else {
        return Ok(DEFAULT_PORTS);
    };
    let invalid = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("GAMESERVER_PORTS={spec:?}: want GAME,HTTP,GRPC port numbers"),
        )
    };
    let ports: Vec<u16> = spec
        .to_str()
        .ok_or_else(invalid)?
        .split(',')
        .map(|p| p.trim().parse().map_err(|_| invalid()))
        .collect::<Result<_, _>>()?;
    ports.try_into().map_err(|_| invalid())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let state_dir =
        PathBuf::from(std::env::var_os("GAME_STATE_DIR").unwrap_or_else(|| "/var/run/game".into()));
    let [game, http, grpc] = ports()?;
    let game = TcpListener::bind(("0.0.0.0", game)).await?;
    let http = TcpListener::bind(("0.0.0.0", http)).await?;
    let grpc = TcpListener::bind(("0.0.0.0", grpc)).await?;
    let [game_port, http_port, grpc_port] =
        [&game, &http, &grpc].map(|l| l.local_addr().map_or(0, |a| a.port()));
    let (reporter, health_service) = tonic_health::server::health_reporter();
    tokio::spawn(serve_game(game));
    tokio::spawn(serve_http(http, state_dir.clone()));
    tokio::spawn(follow_grpc_health(reporter, state_dir.clone()));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health_service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(grpc)),
    );
    eprintln!(
        "gameserver: tcp {game_port}, http {http_port}/healthz, grpc {grpc_port} (\"game\"); \
         health follows {}",
        state_dir.join("unhealthy").display()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => eprintln!("gameserver: SIGTERM, exiting"),
        _ = tokio::signal::ctrl_c() => eprintln!("gameserver: SIGINT, exiting"),
    }
    Ok(())
}
