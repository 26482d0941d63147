use std::sync::atomic::{AtomicBool, Ordering};

use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::*;

#[derive(Default)]
struct Fake {
    ready: AtomicBool,
}

impl Endpoints for Fake {
    fn metrics(&self) -> String {
        "# EOF\n".into()
    }
    fn readiness(&self) -> Result<(), String> {
        if self.ready.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err("no probe set yet".into())
        }
    }
}

/// One request over a real connection: status, content type, body.
async fn get(addr: std::net::SocketAddr, method: Method, path: &str) -> (u16, String, String) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, "localhost")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        content_type,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

#[tokio::test]
async fn each_endpoint_answers_with_its_status_and_content_type() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = Arc::new(Fake::default());
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve(listener, fake.clone(), shutdown.clone()));

    let plain = "text/plain; charset=utf-8";
    assert_eq!(
        get(addr, Method::GET, "/metrics").await,
        (200, OPENMETRICS_TEXT.into(), "# EOF\n".into())
    );
    assert_eq!(
        get(addr, Method::GET, "/healthz").await,
        (200, plain.into(), "ok\n".into())
    );
    assert_eq!(
        get(addr, Method::GET, "/readyz").await,
        (503, plain.into(), "no probe set yet\n".into())
    );
    fake.ready.store(true, Ordering::Relaxed);
    assert_eq!(
        get(addr, Method::GET, "/readyz").await,
        (200, plain.into(), "ok\n".into())
    );
    assert_eq!(get(addr, Method::POST, "/metrics").await.0, 405);
    assert_eq!(get(addr, Method::GET, "/").await.0, 404);

    shutdown.cancel();
    server.await.unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}

/// How long the server kept a connection that sent `prefix` and then nothing: the time (on
/// the paused clock) until it closed it, and what it answered meanwhile.
async fn held_for(addr: std::net::SocketAddr, prefix: &[u8]) -> (std::time::Duration, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(prefix).await.unwrap();
    let start = tokio::time::Instant::now();
    let mut answered = Vec::new();
    stream.read_to_end(&mut answered).await.unwrap();
    (
        start.elapsed(),
        String::from_utf8_lossy(&answered).into_owned(),
    )
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_never_finishes_a_request_is_dropped() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve(listener, Arc::new(Fake::default()), shutdown.clone()));
    let timeout = crate::connection::HEADER_READ_TIMEOUT;
    let keep_alive = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    for (what, prefix) in [
        ("nothing sent", &b""[..]),
        ("half the headers", b"GET /metrics HTTP/1.1\r\nHost: x\r\n"),
        ("a request, then idle on keep-alive", keep_alive),
    ] {
        let (held, answered) = tokio::time::timeout(timeout * 3, held_for(addr, prefix))
            .await
            .unwrap_or_else(|_| panic!("{what}: still open after {:?}", timeout * 3));
        assert!(
            held >= timeout && held < timeout * 2,
            "{what}: closed after {held:?}"
        );
        let served = answered.starts_with("HTTP/1.1 200");
        assert_eq!(served, prefix == keep_alive, "{what}: {answered:?}");
    }
    shutdown.cancel();
    server.await.unwrap();
}
