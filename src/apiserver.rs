//! The sidecar's connection to the apiserver: every request a sidecar makes (its pod's read or
//! watch, status patches, Events) shares one HTTP/2 connection, and a sidecar with nothing to
//! say holds none.
//!
//! kube-rs' default client speaks HTTP/1.1 only, which carries one request at a time: a watch
//! holds one connection for its life and each write in flight beside it opens another, kept
//! idle in the pool afterwards. Across a fleet that is two to three connections per pod on the
//! apiserver, each with a goroutine, TLS state and buffers there (docs/scale.md). This client
//! offers `h2` by ALPN, as client-go does, so the apiserver multiplexes them on one connection;
//! HTTP/1.1 stays as the fallback when a proxy in between cannot speak HTTP/2.
//!
//! Exec through `pods/exec` needs an HTTP/1.1 upgrade, which an HTTP/2 connection cannot carry:
//! [`Clients::upgrades`] is a separate HTTP/1.1 client, used only by `--exec-mode api` and
//! releasing its connection a few seconds after the last exec.

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{ClientBuilder, ConfigExt};
use kube::{Client, Config};
use tower::ServiceBuilder;

/// How long the file source's connection stays open with no request in flight: long enough to
/// carry a burst of writes (a transition's status patch and its Event), short enough that an
/// idle fleet holds no connections.
pub const IDLE_CLOSE: Duration = Duration::from_secs(5);

/// With a request open (a watch) but no frame for this long, the connection is checked with an
/// HTTP/2 PING, and dropped if unanswered within [`PING_TIMEOUT`]: a silently dead apiserver
/// (a node gone, a load balancer that dropped the flow) is noticed in under a minute. The
/// same figures as client-go's `ReadIdleTimeout` and `PingTimeout`.
pub const PING_IDLE: Duration = Duration::from_secs(30);
pub const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// Whether the sidecar's connection may close when no request is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// Keep it (the api source: the pod's watch always has a request in flight, and a pooled
    /// connection expired under a running watch would make the next write open a second one).
    Keep,
    /// Close it this long after its last request ([`IDLE_CLOSE`] for the file source, which
    /// only writes).
    CloseAfter(Duration),
}

/// The sidecar's clients, built from one configuration (the same token and CA).
#[derive(Clone)]
pub struct Clients {
    /// Reads, watches and writes, on one HTTP/2 connection.
    pub requests: Client,
    /// HTTP/1.1 upgrades (`pods/exec`), on a connection of their own while in use.
    pub upgrades: Client,
}

impl std::fmt::Debug for Clients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clients").finish_non_exhaustive()
    }
}

/// Why a client could not be built from the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot set up TLS or authentication for the apiserver: {0}")]
    Config(#[from] kube::Error),
    #[error("the kubeconfig's tls-server-name {0:?} is not a valid server name")]
    ServerName(String),
}

impl Clients {
    /// Builds both clients; no connection is made until the first request.
    pub fn new(config: &Config, idle: Idle) -> Result<Clients, ClientError> {
        Ok(Clients {
            requests: client(config, Protocols::Http2OrHttp1, idle)?,
            upgrades: client(config, Protocols::Http1, Idle::CloseAfter(IDLE_CLOSE))?,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocols {
    Http2OrHttp1,
    Http1,
}

/// kube-rs' own middleware (base URI, authentication with token-file refresh, extra headers)
/// over a hyper client with this module's protocols and pool.
fn client(config: &Config, protocols: Protocols, idle: Idle) -> Result<Client, ClientError> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    http.set_nodelay(true);
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    let builder = match &config.tls_server_name {
        Some(name) => {
            let name = rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|_| ClientError::ServerName(name.clone()))?;
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => builder,
    };
    let builder = builder.enable_http1();
    let https = match protocols {
        Protocols::Http2OrHttp1 => builder.enable_http2().wrap_connector(http),
        Protocols::Http1 => builder.wrap_connector(http),
    };

    let mut hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
    hyper
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        // One connection is all a sidecar needs: never keep a second one idle.
        .pool_max_idle_per_host(1)
        .pool_idle_timeout(match idle {
            Idle::Keep => None,
            Idle::CloseAfter(idle) => Some(idle),
        })
        .http2_keep_alive_interval(PING_IDLE)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(false);
    let hyper = hyper.build(https);

    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(hyper);
    Ok(ClientBuilder::new(service, config.default_namespace.clone()).build())
}
