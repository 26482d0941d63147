//! What a sidecar's reconnect costs against a request on its held connection, on a real
//! kube-apiserver and etcd (`testkit::real`), with the sidecar's own client
//! (`podprobe::apiserver`):
//!
//!     cargo run --release -p podprobe-fleet --example bench_reconnect -- 300
//!
//! N reads of a small object each way, as a sidecar's writes come:
//! - **held**: on one HTTP/2 connection kept open (the api source, whose watch holds it);
//! - **resumed**: each on a new connection of the same client, after the last one closed on its
//!   idle timeout (the file source between writes; TLS 1.3 session resumption applies);
//! - **new client**: each with a new client (a restarted sidecar: a full handshake).
//!
//! Prints the apiserver's CPU per request (its CPU over the loop, less its idle rate over the
//! same time) and this process' CPU per request (the client side: TLS, HTTP/2, the request),
//! and the ratios to `held`. A program that prints figures, not a test.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use podprobe::apiserver::{Clients, Idle};
use testkit::real::ControlPlane;
use testkit::real::usage::{TICKS_PER_SECOND, connections, cpu_ticks};

/// This process' user + system CPU time.
fn own_cpu() -> Duration {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .expect("getrusage");
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    tv(usage.user_time()) + tv(usage.system_time())
}

/// Waits until this process holds no connection to the apiserver at `apiserver`.
async fn until_closed(apiserver: std::net::SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while connections(std::process::id())
        .iter()
        .any(|c| c.remote == apiserver)
    {
        assert!(Instant::now() < deadline, "the connection did not close");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

struct Cost {
    apiserver_ms: f64,
    client_ms: f64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .map_or(300, |a| a.parse().expect("N, a number of requests"));
    let cp = ControlPlane::start().await.expect("a real control plane");
    let config = cp.config();
    let apiserver = cp.address();
    let pid = cp.pids().apiserver;

    // The apiserver's own rate with nothing asked of it (its controllers, leases).
    let idle_ticks = cpu_ticks(pid);
    let idle_from = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle_rate = (cpu_ticks(pid) - idle_ticks) as f64 / idle_from.elapsed().as_secs_f64();

    let read = |clients: &Clients| {
        let namespaces: Api<Namespace> = Api::all(clients.requests.clone());
        async move { namespaces.get("default").await.expect("GET namespace") }
    };
    let measure = |name: &'static str, cost: Cost, held: Option<&Cost>| {
        let ratio =
            |a: f64, b: Option<f64>| b.map_or(String::new(), |b| format!(" ({:.1}×)", a / b));
        println!(
            "{name:<10} apiserver {:.2} ms{}, client {:.2} ms{} per request",
            cost.apiserver_ms,
            ratio(cost.apiserver_ms, held.map(|h| h.apiserver_ms)),
            cost.client_ms,
            ratio(cost.client_ms, held.map(|h| h.client_ms)),
        );
        cost
    };

    // Each loop: the apiserver's CPU over it less its idle rate, and the client's CPU spent
    // in the requests themselves (not in waiting for the close).
    async fn run<F: std::future::Future<Output = ()>>(
        n: u32,
        pid: u32,
        idle_rate: f64,
        mut one: impl FnMut() -> F,
        apiserver: std::net::SocketAddr,
        wait_close: bool,
    ) -> Cost {
        let ticks = cpu_ticks(pid);
        let from = Instant::now();
        let mut client = Duration::ZERO;
        for _ in 0..n {
            let cpu = own_cpu();
            one().await;
            client += own_cpu() - cpu;
            if wait_close {
                until_closed(apiserver).await;
            }
        }
        let busy = (cpu_ticks(pid) - ticks) as f64 - idle_rate * from.elapsed().as_secs_f64();
        Cost {
            apiserver_ms: busy.max(0.0) / TICKS_PER_SECOND * 1000.0 / f64::from(n),
            client_ms: client.as_secs_f64() * 1000.0 / f64::from(n),
        }
    }

    let kept = Clients::new(&config, Idle::Keep).expect("clients");
    read(&kept).await;
    let held = run(
        n,
        pid,
        idle_rate,
        || async { drop(read(&kept).await) },
        apiserver,
        false,
    )
    .await;
    let held = measure("held", held, None);
    drop(kept);
    until_closed(apiserver).await;

    let closing =
        Clients::new(&config, Idle::CloseAfter(Duration::from_millis(20))).expect("clients");
    let resumed = run(
        n,
        pid,
        idle_rate,
        || async { drop(read(&closing).await) },
        apiserver,
        true,
    )
    .await;
    measure("resumed", resumed, Some(&held));

    let fresh = run(
        n,
        pid,
        idle_rate,
        || {
            let config = config.clone();
            async move {
                let clients = Clients::new(&config, Idle::Keep).expect("clients");
                drop(read(&clients).await);
            }
        },
        apiserver,
        true,
    )
    .await;
    measure("new client", fresh, Some(&held));
    println!(
        "({n} GET /api/v1/namespaces/default each; kube-apiserver idle {:.3} cores)",
        idle_rate / TICKS_PER_SECOND
    );
}
