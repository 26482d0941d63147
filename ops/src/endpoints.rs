//! `/metrics`, `/healthz` and `/readyz`, for the kubelet's probes and for Prometheus.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The content type of prometheus-client's text encoding.
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long an accept error (out of file descriptors, mostly) pauses the listener: long enough
/// not to spin, short enough that the next scrape or probe is served.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// What a binary answers on its operator endpoints.
pub trait Endpoints: Send + Sync + 'static {
    /// The metrics, as OpenMetrics text.
    fn metrics(&self) -> String;
    /// `Ok` when ready for traffic; otherwise why not (the body of the 503).
    fn readiness(&self) -> Result<(), String>;
}

/// The answer to one request. `/healthz` is ok whenever the process can answer at all.
pub fn respond(endpoints: &dyn Endpoints, method: &Method, path: &str) -> Response<Full<Bytes>> {
    if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
        return text(StatusCode::NOT_FOUND, "not found\n".into());
    }
    if method != Method::GET && method != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match path {
        "/metrics" => {
            let mut r = text(StatusCode::OK, endpoints.metrics());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(OPENMETRICS_TEXT),
            );
            r
        }
        "/readyz" => match endpoints.readiness() {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        _ => text(StatusCode::OK, "ok\n".into()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Serves the endpoints on `listener` until `shutdown`, then lets in-flight requests finish.
/// An accept error is logged and the listener goes on: a probe endpoint that stopped for good
/// would get the pod restarted for nothing.
pub async fn serve(
    listener: TcpListener,
    endpoints: Arc<dyn Endpoints>,
    shutdown: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("metrics/health listener cannot accept a connection: {e}");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        let endpoints = endpoints.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let response = respond(endpoints.as_ref(), req.method(), req.uri().path());
            async move { Ok::<_, Infallible>(response) }
        });
        tokio::spawn(crate::connection::serve(stream, service, shutdown.clone()));
    }
}

#[cfg(test)]
mod tests;
