//! `podprobe demo`: the example game-server pod's probes, run by the real engine against real
//! local targets that go down and come back, so a newcomer sees Succeeded and Failed without a
//! cluster.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::check::{self, OutputFormat, Printer};
use crate::condition::ConditionBook;
use crate::probe::Prober;
use crate::runner::{Runner, RunnerConfig, WorkerReport};

/// The example pod the demo runs (also usable with `podprobe check`).
pub const EXAMPLE_POD: &str = include_str!("../examples/game-server-pod.yaml");

/// Where the example's idle probe looks; the demo points it at a temporary directory.
const EXAMPLE_STATE_DIR: &str = "/var/run/game";

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("cannot start a local target server: {0}")]
    Bind(#[from] std::io::Error),
    #[error("the built-in example is invalid: {0}")]
    Example(#[from] check::CheckError),
}

/// A TCP listener that can be closed and reopened on the same port (a demo and test target).
#[derive(Debug)]
pub struct GamePort {
    pub addr: SocketAddr,
    task: Option<JoinHandle<()>>,
}

impl GamePort {
    /// Listens on 127.0.0.1:`port` (0 = any free port).
    pub async fn open(port: u16) -> std::io::Result<Self> {
        let socket = TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket.bind(SocketAddr::from(([127, 0, 0, 1], port)))?;
        let listener = socket.listen(64)?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                drop(stream);
            }
        });
        Ok(GamePort {
            addr,
            task: Some(task),
        })
    }

    pub fn close(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// An HTTP `/healthz` on 127.0.0.1 that answers 200 or 503 as `healthy` says (a demo and test
/// target).
pub async fn serve_health(healthy: Arc<AtomicBool>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let healthy = healthy.clone();
            let service =
                hyper::service::service_fn(move |_req: Request<hyper::body::Incoming>| {
                    let up = healthy.load(Ordering::Relaxed);
                    async move {
                        let (status, body) = if up {
                            (StatusCode::OK, "ok: 3 players, tick 16ms")
                        } else {
                            (StatusCode::SERVICE_UNAVAILABLE, "draining")
                        };
                        let mut response =
                            Response::new(Full::new(Bytes::from_static(body.as_bytes())));
                        *response.status_mut() = status;
                        Ok::<_, Infallible>(response)
                    }
                });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// The example pod, pointed at this demo's targets and state directory.
fn example_for(state_dir: &Path, game: u16, http: u16, grpc: u16) -> String {
    EXAMPLE_POD
        .replace(EXAMPLE_STATE_DIR, &state_dir.display().to_string())
        .replace("containerPort: 7777", &format!("containerPort: {game}"))
        .replace("containerPort: 8080", &format!("containerPort: {http}"))
        .replace("containerPort: 9090", &format!("containerPort: {grpc}"))
        .replace(r#""port":9090"#, &format!(r#""port":{grpc}"#))
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The local targets the example's probes aim at, and the script that takes them down.
struct Targets {
    idle_marker: PathBuf,
    game: GamePort,
    healthy: Arc<AtomicBool>,
    http: SocketAddr,
    grpc: SocketAddr,
    grpc_health: tonic_health::server::HealthReporter,
}

impl Targets {
    async fn start(state_dir: &Path) -> Result<Self, DemoError> {
        let idle_marker = state_dir.join("idle");
        std::fs::write(&idle_marker, "")?;
        let healthy = Arc::new(AtomicBool::new(true));
        let http = serve_health(healthy.clone()).await?;
        let (grpc_health, health_service) = tonic_health::server::health_reporter();
        grpc_health
            .set_service_status("game", tonic_health::ServingStatus::Serving)
            .await;
        let grpc_listener = TcpListener::bind("127.0.0.1:0").await?;
        let grpc = grpc_listener.local_addr()?;
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health_service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(grpc_listener)),
        );
        Ok(Targets {
            idle_marker,
            game: GamePort::open(0).await?,
            healthy,
            http,
            grpc,
            grpc_health,
        })
    }

    /// Plays scene `n` of the script; `None` once the script is over.
    async fn play(&mut self, n: u32) -> Result<Option<&'static str>, DemoError> {
        let note = match n {
            1 => {
                let _ = std::fs::remove_file(&self.idle_marker);
                "players joined: the idle marker is gone"
            }
            2 => {
                self.healthy.store(false, Ordering::Relaxed);
                "/healthz answers 503 (failureThreshold 2: two failures to flip)"
            }
            3 => {
                self.grpc_status(tonic_health::ServingStatus::NotServing)
                    .await;
                "gRPC health says NOT_SERVING"
            }
            4 => {
                self.game.close();
                "the game port stops listening"
            }
            5 => {
                std::fs::write(&self.idle_marker, "")?;
                self.healthy.store(true, Ordering::Relaxed);
                self.grpc_status(tonic_health::ServingStatus::Serving).await;
                self.game = GamePort::open(self.game.addr.port()).await?;
                "everything is back"
            }
            _ => return Ok(None),
        };
        Ok(Some(note))
    }

    async fn grpc_status(&self, status: tonic_health::ServingStatus) {
        self.grpc_health.set_service_status("game", status).await;
    }
}

/// Runs the demo; returns when the script is done (about 20 seconds).
pub async fn run(format: OutputFormat) -> Result<ExitCode, DemoError> {
    let state_dir =
        TempDir(std::env::temp_dir().join(format!("podprobe-demo-{}", std::process::id())));
    std::fs::create_dir_all(&state_dir.0)?;
    let mut targets = Targets::start(&state_dir.0).await?;
    let (game, http, grpc) = (targets.game.addr, targets.http, targets.grpc);

    let pod = example_for(&state_dir.0, game.port(), http.port(), grpc.port());
    let (set, containers) = check::load_str(&pod, "examples/game-server-pod.yaml")?;

    let (tx, mut rx) = mpsc::channel(256);
    let config = RunnerConfig {
        start_jitter: false,
        ..RunnerConfig::default()
    };
    let mut runner = Runner::new(Prober::default(), config, tx);
    runner.apply(&set.probes, &containers);

    let mut printer = Printer::new(std::io::stdout().lock(), format);
    let mut book = ConditionBook::default();
    let _ = printer.note(&format!(
        "podprobe demo: {} probes of examples/game-server-pod.yaml against local targets \
         (tcp {game}, http {http}, grpc {grpc})\n",
        set.probes.len(),
    ));

    let step = Duration::from_secs(3);
    let mut script = tokio::time::interval_at(tokio::time::Instant::now() + step, step);
    let mut scene = 0;
    loop {
        tokio::select! {
            Some(event) = rx.recv() => {
                if let WorkerReport::Transition(t) = event {
                    book.record(&t);
                    let _ = printer.transition(&t);
                }
            }
            _ = script.tick() => {
                scene += 1;
                let Some(note) = targets.play(scene).await? else { break };
                let _ = printer.note(&format!("\n── {note}"));
            }
        }
    }
    runner.stop_all();
    let _ = printer.conditions(&book);
    Ok(ExitCode::SUCCESS)
}
