//! A probe's handler as checked from the annotation: what one attempt runs (exec, httpGet,
//! tcpSocket or grpc), with its port still a name where the probe gave one.

use std::fmt;

/// A port as written in the annotation: a number, or a name to resolve against the target
/// container's `ports[].name` at attempt time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Port {
    Number(u16),
    Name(String),
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Port::Number(n) => write!(f, "{n}"),
            Port::Name(name) => write!(f, "{name:?}"),
        }
    }
}

/// `HTTP` or `HTTPS` (the API's spelling; the URL uses lower case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    Http,
    Https,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExecAction {
    /// argv, passed verbatim (OpenKruise does no `$(VAR)` expansion).
    pub command: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HttpAction {
    pub scheme: Scheme,
    /// Path (and optional query/fragment) as given; empty means `/`.
    pub path: String,
    pub port: Port,
    /// Headers in the order given; names as written (canonicalised when sent).
    pub headers: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TcpAction {
    pub port: Port,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GrpcAction {
    pub port: u16,
    /// Service name for `HealthCheckRequest`; empty means the whole server.
    pub service: String,
}

/// Exactly one handler per probe (validated in `annotation`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Handler {
    Exec(ExecAction),
    Http(HttpAction),
    Tcp(TcpAction),
    Grpc(GrpcAction),
}

impl Handler {
    /// Short name for logs and metrics: `exec`, `httpGet`, `tcpSocket`, `grpc`.
    pub fn kind(&self) -> &'static str {
        match self {
            Handler::Exec(_) => "exec",
            Handler::Http(_) => "httpGet",
            Handler::Tcp(_) => "tcpSocket",
            Handler::Grpc(_) => "grpc",
        }
    }
}
