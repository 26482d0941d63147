//! Rough cost of one probe attempt of each kind, through `Prober::attempt`.
//!
//! `cargo run --release --example bench_probes [-- SCALE]`
//!
//! Starts in-process a TCP listener, an HTTP/1 server and a gRPC health server on 127.0.0.1,
//! uses `true` for exec, runs N sequential attempts of each kind and prints attempts/s and CPU
//! time per attempt: podprobe's process (user+sys from getrusage, *including the in-process
//! servers' side*) and, for exec, the children's CPU separately. SCALE multiplies N (default 1).
//! The figures also go to `docs/perf/probe_cpu.csv` (plotted by `cargo run --example plot_perf`).
use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use nix::sys::resource::{UsageWho, getrusage};
use podprobe::probe::{
    ExecAction, GrpcAction, Handler, HttpAction, Outcome, Port, Prober, Scheme, Target, TcpAction,
};
use tokio::net::TcpListener;

fn cpu(who: UsageWho) -> Duration {
    let usage = getrusage(who).expect("getrusage");
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    tv(usage.user_time()) + tv(usage.system_time())
}

async fn http_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    port
}

async fn tcp_listener() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accept and drop, so the backlog never fills.
    tokio::spawn(async move { while listener.accept().await.is_ok() {} });
    port
}

async fn grpc_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    port
}

struct Row {
    kind: &'static str,
    n: u32,
    wall: Duration,
    cpu_self: Duration,
    cpu_children: Duration,
}

async fn run(prober: &Prober, kind: &'static str, handler: Handler, n: u32) -> Row {
    let target = Target::new("127.0.0.1");
    let timeout = Duration::from_secs(5);
    for _ in 0..(n / 20).max(5) {
        let _ = prober.attempt(&handler, &target, timeout).await;
    }
    let (self0, children0, t0) = (
        cpu(UsageWho::RUSAGE_SELF),
        cpu(UsageWho::RUSAGE_CHILDREN),
        Instant::now(),
    );
    for _ in 0..n {
        let obs = prober
            .attempt(&handler, &target, timeout)
            .await
            .expect("attempt errored");
        assert_eq!(obs.outcome, Outcome::Succeeded, "{kind}: {}", obs.message);
    }
    Row {
        kind,
        n,
        wall: t0.elapsed(),
        cpu_self: cpu(UsageWho::RUSAGE_SELF) - self0,
        cpu_children: cpu(UsageWho::RUSAGE_CHILDREN) - children0,
    }
}

fn main() {
    let scale: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    // One thread: the figures are then the cost on a single core.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let rows = runtime.block_on(async {
        let prober = Prober::default();
        let tcp_port = tcp_listener().await;
        let http_port = http_server().await;
        let grpc_port = grpc_server().await;
        vec![
            run(
                &prober,
                "tcpSocket",
                Handler::Tcp(TcpAction {
                    port: Port::Number(tcp_port),
                }),
                5000 * scale,
            )
            .await,
            run(
                &prober,
                "httpGet",
                Handler::Http(HttpAction {
                    scheme: Scheme::Http,
                    path: "/healthz".into(),
                    port: Port::Number(http_port),
                    headers: Vec::new(),
                }),
                3000 * scale,
            )
            .await,
            run(
                &prober,
                "grpc",
                Handler::Grpc(GrpcAction {
                    port: grpc_port,
                    service: String::new(),
                }),
                1000 * scale,
            )
            .await,
            run(
                &prober,
                "exec",
                Handler::Exec(ExecAction {
                    command: vec!["true".into()],
                }),
                500 * scale,
            )
            .await,
        ]
    });
    println!(
        "{:<10} {:>7} {:>12} {:>18} {:>22}",
        "kind", "N", "attempts/s", "CPU ms/attempt", "children CPU ms/att."
    );
    for r in &rows {
        let per = |d: Duration| d.as_secs_f64() * 1000.0 / f64::from(r.n);
        println!(
            "{:<10} {:>7} {:>12.0} {:>18.4} {:>22.4}",
            r.kind,
            r.n,
            f64::from(r.n) / r.wall.as_secs_f64(),
            per(r.cpu_self),
            per(r.cpu_children)
        );
    }
    println!(
        "(CPU = podprobe process user+sys incl. the in-process test servers; exec children separately)"
    );
    let mut csv = String::from(
        "kind,attempts,attempts_per_s,cpu_ms_per_attempt,children_cpu_ms_per_attempt\n",
    );
    for r in &rows {
        let per = |d: Duration| d.as_secs_f64() * 1000.0 / f64::from(r.n);
        csv.push_str(&format!(
            "{},{},{:.0},{:.4},{:.4}\n",
            r.kind,
            r.n,
            f64::from(r.n) / r.wall.as_secs_f64(),
            per(r.cpu_self),
            per(r.cpu_children)
        ));
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/perf/probe_cpu.csv");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::write(&out, csv).unwrap();
    println!("figures written to {}", out.display());
}
