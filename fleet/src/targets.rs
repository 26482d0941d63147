//! The probes' targets. Every pod of the fleet has an address of its own in 127.0.0.0/8 (all
//! of it is loopback on Linux), so one HTTP server and one TCP listener on the wildcard
//! address serve every pod and tell them apart by the address a connection came in on, as the
//! pods' own servers would be told apart by their pod IPs. The HTTP answer is what the bench
//! flips: 200 while the pod's target is healthy, 503 when not.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Pods a fleet can have: 127.1.0.0 … 127.254.255.255.
pub const MAX_PODS: usize = 254 << 16;

/// Pod `i`'s address (its `status.podIP`; where its probes aim).
pub fn pod_ip(i: usize) -> Ipv4Addr {
    assert!(i < MAX_PODS, "at most {MAX_PODS} pods");
    Ipv4Addr::new(127, 1 + (i >> 16) as u8, (i >> 8) as u8, i as u8)
}

/// The pod whose address `ip` is.
pub fn pod_index(ip: Ipv4Addr) -> Option<usize> {
    let [a, b, c, d] = ip.octets();
    (a == 127 && (1..255).contains(&b))
        .then(|| (usize::from(b - 1) << 16) | (usize::from(c) << 8) | usize::from(d))
}

/// The running servers; they stop when this is dropped.
#[derive(Debug)]
pub struct Targets {
    pub http_port: u16,
    pub tcp_port: u16,
    healthy: Arc<Vec<AtomicBool>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Targets {
    /// Starts both servers for `pods` pods, every target healthy.
    pub async fn start(pods: usize) -> std::io::Result<Targets> {
        let healthy: Arc<Vec<AtomicBool>> =
            Arc::new((0..pods).map(|_| AtomicBool::new(true)).collect());
        let http = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).await?;
        let tcp = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).await?;
        let (http_port, tcp_port) = (http.local_addr()?.port(), tcp.local_addr()?.port());
        let tasks = vec![
            tokio::spawn(serve_http(http, healthy.clone())),
            // A tcpSocket probe only needs the connection accepted.
            tokio::spawn(async move {
                while let Ok((stream, _)) = tcp.accept().await {
                    drop(stream);
                }
            }),
        ];
        Ok(Targets {
            http_port,
            tcp_port,
            healthy,
            tasks,
        })
    }

    pub fn is_healthy(&self, pod: usize) -> bool {
        self.healthy[pod].load(Ordering::Relaxed)
    }

    pub fn set_healthy(&self, pod: usize, healthy: bool) {
        self.healthy[pod].store(healthy, Ordering::Relaxed);
    }
}

impl Drop for Targets {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn serve_http(listener: TcpListener, healthy: Arc<Vec<AtomicBool>>) {
    while let Ok((stream, _)) = listener.accept().await {
        let pod = match stream.local_addr() {
            Ok(SocketAddr::V4(addr)) => pod_index(*addr.ip()),
            _ => None,
        };
        let healthy = healthy.clone();
        let service = service_fn(move |_: Request<hyper::body::Incoming>| {
            let up = pod
                .and_then(|i| healthy.get(i))
                .is_some_and(|h| h.load(Ordering::Relaxed));
            let status = if up {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            let mut response = Response::new(Full::new(Bytes::from_static(b"fleet\n")));
            *response.status_mut() = status;
            async move { Ok::<_, Infallible>(response) }
        });
        tokio::spawn(async move {
            // The kubelet's prober closes after each probe; so does this server.
            let _ = http1::Builder::new()
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_stay_off_127_0() {
        for i in [0, 1, 255, 256, 65_535, 65_536, 10_000, MAX_PODS - 1] {
            let ip = pod_ip(i);
            assert_ne!(ip.octets()[1], 0, "127.0.x.x is the control plane's");
            assert_eq!(pod_index(ip), Some(i), "{ip}");
        }
        assert_eq!(pod_index(Ipv4Addr::LOCALHOST), None);
    }

    #[tokio::test]
    async fn each_pod_address_gets_its_own_answer() {
        let targets = Targets::start(3).await.unwrap();
        targets.set_healthy(1, false);
        for (pod, code) in [(0, 200), (1, 503), (2, 200)] {
            let url = format!("http://{}:{}/", pod_ip(pod), targets.http_port);
            let mut stream = tokio::net::TcpStream::connect((pod_ip(pod), targets.http_port))
                .await
                .unwrap();
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            stream
                .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.unwrap();
            assert!(
                answer.starts_with(&format!("HTTP/1.1 {code}")),
                "{url}: {answer}"
            );
        }
        tokio::net::TcpStream::connect((pod_ip(2), targets.tcp_port))
            .await
            .expect("the tcp target accepts on every pod address");
    }
}
