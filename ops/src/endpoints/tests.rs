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
