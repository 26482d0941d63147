//! One HTTP/1 connection served until it ends or the process shuts down (then gracefully:
//! in-flight requests finish, keep-alive connections close).
//!
//! A client that connects and sends nothing, or trickles its headers, is dropped after
//! [`HEADER_READ_TIMEOUT`]: the listeners are reachable by every pod, and an open connection
//! that never finishes a request must not be held forever.

use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::service::HttpService;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a request's headers may take to arrive, counted from when the server waits for
/// them (also the longest a keep-alive connection stays open between requests).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `io` with `service` until the connection ends, or `shutdown` (then gracefully).
pub async fn serve<I, S>(io: I, service: S, shutdown: CancellationToken)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: HttpService<Incoming>,
    S::Error: Into<BoxError>,
    S::ResBody: 'static,
    <S::ResBody as Body>::Error: Into<BoxError>,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}
