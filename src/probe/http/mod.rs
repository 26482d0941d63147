//! httpGet probes, with kubelet's request, transport, redirect and response rules.
//!
//! hyper's client *connection* API is used directly (not a pooled client): one fresh
//! connection per attempt and per redirect hop, exactly the headers kubelet puts on the wire
//! (`Host`, `User-Agent`, `Accept`, `Connection: close`, no `Accept-Encoding`), names written
//! in canonical case. No proxy: sockets are dialled by [`super::tcp::dial`] and nothing here
//! reads `HTTP_PROXY`/`NO_PROXY`.
//!
//! One deadline (the probe timeout) covers resolution, connect, TLS, every hop, the response
//! headers and the body.
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use super::tcp::{dial, errno_text};
use super::url::ProbeUrl;
use super::{AttemptError, HttpAction, MAX_READ_BYTES, Observation, Scheme};

pub const DEFAULT_USER_AGENT: &str = "kube-probe/1.33";

/// Go's `http.Client` follows at most this many requests per call.
const MAX_REQUESTS: usize = 10;

/// Go's `Transport.TLSHandshakeTimeout` as configured by kubelet (always also bounded by the
/// probe deadline).
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct HttpProber {
    user_agent: String,
    tls: Arc<rustls::ClientConfig>,
}

impl HttpProber {
    pub fn new(user_agent: String) -> Self {
        HttpProber {
            user_agent,
            tls: Arc::new(insecure_tls_config()),
        }
    }

    /// The User-Agent sent by default (also used for grpc probes).
    pub fn user_agent(&self) -> &str {
        &self.user_agent
    }

    pub async fn attempt(
        &self,
        action: &HttpAction,
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> Result<Observation, AttemptError> {
        let deadline = Instant::now() + timeout;
        let scheme = match action.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        let url = ProbeUrl::for_probe(scheme, host, port, &action.path);
        let headers = RequestHeaders::new(&action.headers, &self.user_agent);
        let (status, mut hop) = match self.follow(url, &headers, deadline).await {
            Ok(final_response) => final_response,
            // Transport/client errors are failures with the client's error text.
            Err(message) => return Ok(Observation::failed(message)),
        };
        // Read (up to the limit) before looking at the status, as kubelet does: a body error
        // is an errored attempt whatever the status.
        let text = read_body(&mut hop.response, deadline).await?;
        drop(hop);
        Ok(match status.as_u16() {
            200..=299 => Observation::succeeded(text),
            // kubelet's "warning": counted as success.
            300..=399 => {
                Observation::succeeded(format!("Probe terminated redirects, Response body: {text}"))
            }
            code => Observation::failed(format!("HTTP probe failed with statuscode: {code}")),
        })
    }

    /// Runs the request and its redirect chain like Go's `http.Client` with kubelet's
    /// `CheckRedirect`: follow only to the original hostname, at most 10 requests.
    async fn follow(
        &self,
        first: ProbeUrl,
        headers: &RequestHeaders,
        deadline: Instant,
    ) -> Result<(StatusCode, Hop), String> {
        let original_hostname = first.hostname.clone();
        let mut url = first;
        let mut host_line = headers.host.clone();
        let mut referer: Option<String> = None;
        let mut requests = 0;
        loop {
            requests += 1;
            let hop = match tokio::time::timeout_at(
                deadline,
                self.round_trip(
                    &url,
                    headers,
                    host_line.as_deref(),
                    referer.as_deref(),
                    deadline,
                ),
            )
            .await
            {
                Err(_) => {
                    return Err(format!(
                        "Get {:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
                        url.to_string()
                    ));
                }
                Ok(Err(message)) => {
                    return Err(format!("Get {:?}: {message}", url.to_string()));
                }
                Ok(Ok(hop)) => hop,
            };
            let status = hop.response.status();
            let redirect = matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308);
            let location = hop
                .response
                .headers()
                .get(http::header::LOCATION)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
            let (true, Some(location)) = (redirect, location) else {
                // Not a redirect, or a 3xx without Location: this is the final response.
                return Ok((status, hop));
            };
            let (next, absolute) = url.resolve(&location).map_err(|e| {
                format!(
                    "Get {:?}: failed to parse Location header {location:?}: {e}",
                    url.to_string()
                )
            })?;
            if next.hostname != original_hostname {
                // kubelet: http.ErrUseLastResponse → the redirect itself is the result.
                return Ok((status, hop));
            }
            if requests >= MAX_REQUESTS {
                return Err(format!("Get {location:?}: stopped after 10 redirects"));
            }
            drop(hop);
            // Go keeps the original request's Host only for a relative Location.
            host_line = if absolute { None } else { headers.host.clone() };
            // Go's refererForURL: none when going from https to http.
            referer = if url.scheme == "https" && next.scheme == "http" {
                None
            } else {
                Some(url.to_string())
            };
            url = next;
        }
    }

    /// One request on a fresh connection, up to the response headers.
    async fn round_trip(
        &self,
        url: &ProbeUrl,
        headers: &RequestHeaders,
        host_line: Option<&str>,
        referer: Option<&str>,
        deadline: Instant,
    ) -> Result<Hop, String> {
        let request = headers.request(url, host_line, referer)?;
        let Some(port) = url.dial_port() else {
            return Err(format!("unsupported protocol scheme {:?}", url.scheme));
        };
        let stream = dial(&url.hostname, port, deadline)
            .await
            .map_err(|e| e.to_string())?;
        match url.scheme.as_str() {
            "http" => send(stream, request).await,
            "https" => {
                let server_name = ServerName::try_from(url.hostname.clone())
                    .map_err(|e| format!("tls: invalid server name {:?}: {e}", url.hostname))?;
                let connector = tokio_rustls::TlsConnector::from(self.tls.clone());
                let tls = tokio::time::timeout(
                    TLS_HANDSHAKE_TIMEOUT,
                    connector.connect(server_name, stream),
                )
                .await
                .map_err(|_| "net/http: TLS handshake timeout".to_string())?
                .map_err(|e| match e.get_ref() {
                    Some(inner) => format!("tls: {inner}"),
                    None => format!("tls: {}", errno_text(&e)),
                })?;
                send(tls, request).await
            }
            other => Err(format!("unsupported protocol scheme {other:?}")),
        }
    }
}

/// A response with headers read, and the task driving its connection (aborted on drop, so an
/// abandoned body never keeps a connection or task alive).
struct Hop {
    response: Response<Incoming>,
    connection: tokio::task::JoinHandle<()>,
}

impl Drop for Hop {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

async fn send<S>(io: S, request: Request<Empty<Bytes>>) -> Result<Hop, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| hyper_error_text(&e))?;
    let connection = tokio::spawn(async move {
        let _ = connection.await;
    });
    let hop_guard = AbortOnDrop(Some(connection));
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| hyper_error_text(&e))?;
    Ok(Hop {
        response,
        connection: hop_guard.disarm(),
    })
}

struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl AbortOnDrop {
    fn disarm(mut self) -> tokio::task::JoinHandle<()> {
        self.0.take().expect("armed")
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(handle) = &self.0 {
            handle.abort();
        }
    }
}

/// hyper's errors in the words Go's transport uses where they have an equivalent.
fn hyper_error_text(e: &hyper::Error) -> String {
    if e.is_incomplete_message() {
        return "EOF".into();
    }
    if e.is_parse() {
        return format!(
            "net/http: HTTP/1.x transport connection broken: malformed HTTP response: {e}"
        );
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return format!("read: {}", errno_text(io));
        }
        source = s.source();
    }
    e.to_string()
}

/// Reads at most [`MAX_READ_BYTES`] of the body; hitting the limit is not an error. A read
/// error or the deadline after the headers is an *errored* attempt (kubelet H30).
async fn read_body(
    response: &mut Response<Incoming>,
    deadline: Instant,
) -> Result<String, AttemptError> {
    let body = response.body_mut();
    let mut kept: Vec<u8> = Vec::new();
    while kept.len() < MAX_READ_BYTES {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                return Err(AttemptError::HttpBody(
                    "context deadline exceeded (Client.Timeout or context cancellation while reading body)"
                        .into(),
                ));
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(AttemptError::HttpBody(hyper_error_text(&e))),
            Ok(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let room = MAX_READ_BYTES - kept.len();
                    kept.extend_from_slice(&data[..data.len().min(room)]);
                }
            }
        }
    }
    Ok(String::from_utf8_lossy(&kept).into_owned())
}

/// Go's `textproto.CanonicalMIMEHeaderKey`: `FOO-bAR` → `Foo-Bar`; a name with a byte that is
/// not a token character is returned unchanged.
pub fn canonical_header_key(name: &str) -> String {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if !name.bytes().all(token) {
        return name.to_string();
    }
    let mut upper = true;
    name.chars()
        .map(|c| {
            let out = if upper {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            };
            upper = c == '-';
            out
        })
        .collect()
}

/// The request headers kubelet builds from `httpHeaders`, in Go's `http.Header` shape
/// (canonical name → values in order), with defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeaders {
    /// Canonical name and all its values, in first-seen order.
    pub fields: Vec<(String, Vec<String>)>,
    /// Host line override (first non-empty `Host` value).
    pub host: Option<String>,
}

impl RequestHeaders {
    pub fn new(user: &[(String, String)], user_agent: &str) -> RequestHeaders {
        let mut fields: Vec<(String, Vec<String>)> = Vec::new();
        for (name, value) in user {
            let name = canonical_header_key(name);
            match fields.iter_mut().find(|(n, _)| *n == name) {
                Some((_, values)) => values.push(value.clone()),
                None => fields.push((name, vec![value.clone()])),
            }
        }
        let get = |fields: &[(String, Vec<String>)], name: &str| {
            fields
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.first().cloned().unwrap_or_default())
        };
        if get(&fields, "User-Agent").is_none() {
            fields.push(("User-Agent".into(), vec![user_agent.to_string()]));
        }
        match get(&fields, "Accept") {
            None => fields.push(("Accept".into(), vec!["*/*".into()])),
            Some(v) if v.is_empty() => fields.retain(|(n, _)| n != "Accept"),
            Some(_) => {}
        }
        let host = get(&fields, "Host").filter(|h| !h.is_empty());
        RequestHeaders { fields, host }
    }

    /// The header lines as Go's `Request.Write` puts them on the wire (besides Host): the
    /// first User-Agent value unless empty, every other header except Host/Content-Length/
    /// Transfer-Encoding/Trailer, and `Connection: close` (keep-alives are disabled).
    pub fn wire(&self) -> Vec<(String, String)> {
        let mut lines = Vec::new();
        let mut has_close = false;
        for (name, values) in &self.fields {
            match name.as_str() {
                "Host" | "Content-Length" | "Transfer-Encoding" | "Trailer" => {}
                "User-Agent" => {
                    if let Some(ua) = values.first().filter(|v| !v.is_empty()) {
                        lines.push((name.clone(), ua.clone()));
                    }
                }
                _ => {
                    if name == "Connection" {
                        has_close |= values
                            .iter()
                            .any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")));
                    }
                    for v in values {
                        lines.push((name.clone(), v.clone()));
                    }
                }
            }
        }
        if !has_close {
            lines.push(("Connection".into(), "close".into()));
        }
        lines
    }

    fn request(
        &self,
        url: &ProbeUrl,
        host_line: Option<&str>,
        referer: Option<&str>,
    ) -> Result<Request<Empty<Bytes>>, String> {
        let mut request = Request::get(url.request_target())
            .body(Empty::new())
            .map_err(|e| format!("net/http: invalid request URI: {e}"))?;
        let map = request.headers_mut();
        let host = host_line.unwrap_or(&url.authority);
        map.append(
            http::header::HOST,
            HeaderValue::from_str(host)
                .map_err(|_| format!("http: invalid Host header {host:?}"))?,
        );
        let explicit_referer = self.fields.iter().any(|(n, _)| n == "Referer");
        for (name, value) in self.wire() {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("net/http: invalid header field name {name:?}"))?;
            let value = HeaderValue::from_str(&value)
                .map_err(|_| format!("net/http: invalid header field value for {name:?}"))?;
            map.append(header, value);
        }
        if let (Some(referer), false) = (referer, explicit_referer)
            && let Ok(value) = HeaderValue::from_str(referer)
        {
            map.append(http::header::REFERER, value);
        }
        Ok(request)
    }
}

/// TLS without certificate or hostname verification (kubelet's `InsecureSkipVerify`). The
/// handshake signature is still checked, as Go does. ALPN offers only `http/1.1`: kubelet also
/// offers `h2`, but this client speaks HTTP/1.1 only. No session resumption (each probe is a
/// fresh handshake, like a fresh Go transport).
fn insecure_tls_config() -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports TLS 1.2 and 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.resumption = rustls::client::Resumption::disabled();
    config
}

#[derive(Debug)]
struct AcceptAnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests;
