//! A fault-injecting proxy in front of a real kube-apiserver: what a test needs from the
//! apiserver that it cannot ask of it (a 500 on the third status write, a 429 with
//! `Retry-After`, a reset connection, a watch that ends, an outage, a dropped exec stream),
//! while every request it lets through is answered by kube-apiserver itself, with its own
//! authentication, RBAC, admission and validation.
//!
//! The client under test talks plain HTTP or TLS (a certificate from the control plane's CA)
//! to the proxy; the proxy keeps one TLS connection to the apiserver per client connection
//! and passes each request on unchanged, bearer token included, so the apiserver
//! authenticates the client itself. Upgraded connections (`pods/exec`) are passed through byte for byte.
//! [`Faults`] decide what happens to each request; the [`Journal`] records every request that
//! reached the proxy and how it was answered.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use testkit::real::{ControlPlane, FaultProxy};
//! use testkit::Fault;
//! let cp = ControlPlane::start().await?;
//! let proxy = FaultProxy::start(&cp).await?;
//! proxy.faults().add(Fault::status(500).method("PATCH").path_contains("/status").times(3));
//! // ... run the code under test against `proxy.url()` with an apiserver token ...
//! proxy.stop().await; // an outage: the listener closes and open connections drop
//! proxy.restart().await?; // back on the same port
//! # Ok(()) }
//! ```

mod forward;
mod upgrade;
mod watch;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{ADMIN_TOKEN, ControlPlane};
use crate::{Faults, Journal};

/// What can go wrong starting the proxy.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("the fault proxy cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
    #[error("the fault proxy's TLS set-up failed: {0}")]
    Tls(String),
    #[error("the apiserver's URL {0:?} has no host and port")]
    Upstream(String),
    #[error("cannot write the proxy's kubeconfig: {0}")]
    Kubeconfig(std::io::Error),
}

/// How the client under test reaches the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientSide {
    /// Plain HTTP: the token travels in the clear, on loopback.
    Plain,
    /// TLS with a certificate for `127.0.0.1` signed by the control plane's CA: the same CA
    /// file as for the apiserver itself.
    Tls,
}

/// The proxy; it runs until dropped.
pub struct FaultProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    client_side: ClientSide,
    tls_acceptor: Option<tokio_rustls::TlsAcceptor>,
    ca_path: std::path::PathBuf,
    ca_der: Vec<u8>,
    running: Mutex<Option<Serving>>,
}

/// One listening period, between start (or restart) and stop: the tasks of its listener and
/// connections (upgraded streams included), which an outage ends together.
#[derive(Clone)]
pub(crate) struct Serving {
    pub(crate) outage: CancellationToken,
    pub(crate) tasks: TaskTracker,
}

/// What each connection's tasks share.
pub(crate) struct Shared {
    pub(crate) faults: Faults,
    pub(crate) journal: Journal,
    pub(crate) upstream: Upstream,
}

/// Where requests go: the apiserver, over TLS trusting only the control plane's CA.
pub(crate) struct Upstream {
    pub(crate) addr: String,
    pub(crate) authority: String,
    pub(crate) server_name: ServerName<'static>,
    pub(crate) tls: tokio_rustls::TlsConnector,
}

impl FaultProxy {
    /// A plain-HTTP proxy on a free loopback port in front of `cp`'s apiserver.
    pub async fn start(cp: &ControlPlane) -> Result<FaultProxy, ProxyError> {
        Self::start_with(cp, ClientSide::Plain).await
    }

    /// A proxy on a free loopback port in front of `cp`'s apiserver, serving the client under
    /// test as `client_side` says.
    pub async fn start_with(
        cp: &ControlPlane,
        client_side: ClientSide,
    ) -> Result<FaultProxy, ProxyError> {
        Self::start_at(cp, client_side, std::net::Ipv4Addr::LOCALHOST).await
    }

    /// A TLS proxy (its certificate names `address`, from the control plane's CA) on a free
    /// port of `address` in front of `cp`'s apiserver: the host side of a
    /// [`NodeNetwork`](super::NodeNetwork), which an agent in the node's network namespace
    /// reaches. TLS, since client-go sends no bearer token over plain HTTP.
    pub async fn start_on(
        cp: &ControlPlane,
        address: std::net::Ipv4Addr,
    ) -> Result<FaultProxy, ProxyError> {
        Self::start_at(cp, ClientSide::Tls, address).await
    }

    async fn start_at(
        cp: &ControlPlane,
        client_side: ClientSide,
        address: std::net::Ipv4Addr,
    ) -> Result<FaultProxy, ProxyError> {
        let upstream = Upstream::new(cp.url(), cp.pki().ca_der())?;
        let tls_acceptor = match client_side {
            ClientSide::Plain => None,
            ClientSide::Tls => Some(acceptor(cp, address)?),
        };
        let any = SocketAddr::from((address, 0));
        let listener = TcpListener::bind(any)
            .await
            .map_err(|e| ProxyError::Listen(any, e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| ProxyError::Listen(any, e))?;
        let proxy = FaultProxy {
            shared: Arc::new(Shared {
                faults: Faults::default(),
                journal: Journal::default(),
                upstream,
            }),
            addr,
            client_side,
            tls_acceptor,
            ca_path: cp.dir().join("ca.crt"),
            ca_der: cp.pki().ca_der(),
            running: Mutex::new(None),
        };
        proxy.serve(listener);
        Ok(proxy)
    }

    /// `http://<address>:<port>` or `https://…`.
    pub fn url(&self) -> String {
        let scheme = match self.client_side {
            ClientSide::Plain => "http",
            ClientSide::Tls => "https",
        };
        format!("{scheme}://{}", self.addr)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The fault rules, applied to every request from now on.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Every request that reached the proxy, with the status it was answered with.
    pub fn journal(&self) -> &Journal {
        &self.shared.journal
    }

    /// A `kube::Config` for the proxy, authenticating to the apiserver with `token`.
    pub fn config_for_token(&self, token: &str) -> kube::Config {
        let mut config = kube::Config::new(self.url().parse().expect("a valid url"));
        if self.client_side == ClientSide::Tls {
            config.root_cert = Some(vec![self.ca_der.clone()]);
        }
        config.auth_info.token = Some(token.to_owned().into());
        config.default_namespace = "default".into();
        config
    }

    /// An admin client through the proxy.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config_for_token(ADMIN_TOKEN)).expect("a client")
    }

    /// Writes a kubeconfig for the proxy that authenticates with `token`.
    pub fn write_kubeconfig_for_token(
        &self,
        path: impl AsRef<Path>,
        token: &str,
    ) -> Result<(), ProxyError> {
        let mut cluster = serde_json::json!({"server": self.url()});
        if self.client_side == ClientSide::Tls {
            cluster["certificate-authority"] = self.ca_path.display().to_string().into();
        }
        let doc = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": cluster}],
            "users": [{"name": "test", "user": {"token": token}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "test"}}],
            "current-context": "proxy",
        });
        std::fs::write(path, doc.to_string()).map_err(ProxyError::Kubeconfig)
    }

    /// An outage: the listener closes and every open connection (watches and exec streams
    /// included) drops without an answer; all of it has happened when this returns.
    /// Idempotent.
    pub async fn stop(&self) {
        let serving = self.lock_running().take();
        if let Some(serving) = serving {
            serving.outage.cancel();
            serving.tasks.close();
            serving.tasks.wait().await;
        }
    }

    /// Ends an outage: listens again on the same port. Idempotent.
    pub async fn restart(&self) -> Result<(), ProxyError> {
        if self.is_running() {
            return Ok(());
        }
        let listener = TcpListener::bind(self.addr)
            .await
            .map_err(|e| ProxyError::Listen(self.addr, e))?;
        self.serve(listener);
        Ok(())
    }

    pub fn is_running(&self) -> bool {
        self.lock_running().is_some()
    }

    fn lock_running(&self) -> std::sync::MutexGuard<'_, Option<Serving>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn serve(&self, listener: TcpListener) {
        let serving = Serving {
            outage: CancellationToken::new(),
            tasks: TaskTracker::new(),
        };
        *self.lock_running() = Some(serving.clone());
        let shared = self.shared.clone();
        let tls = self.tls_acceptor.clone();
        let run = serving.clone();
        serving.tasks.spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = run.outage.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((stream, _)) = accepted else { continue };
                let (shared, tls, conn) = (shared.clone(), tls.clone(), run.clone());
                run.tasks.spawn(async move {
                    tokio::select! {
                        () = conn.outage.cancelled() => {}
                        () = serve_connection(stream, shared, tls, conn.clone()) => {}
                    }
                });
            }
        });
    }
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("url", &self.url())
            .field("upstream", &self.shared.upstream.authority)
            .field("running", &self.is_running())
            .finish_non_exhaustive()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(serving) = self.lock_running().take() {
            serving.outage.cancel();
        }
    }
}

async fn serve_connection(
    stream: TcpStream,
    shared: Arc<Shared>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    serving: Serving,
) {
    let link = forward::Link::default();
    let service =
        service_fn(move |req| forward::handle(shared.clone(), serving.clone(), link.clone(), req));
    let http = http1::Builder::new();
    // A failed connection (a reset fault, a client that went away) ends only itself.
    let _ = match tls {
        None => {
            http.serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await
        }
        Some(tls) => match tls.accept(stream).await {
            Ok(stream) => {
                http.serve_connection(TokioIo::new(stream), service)
                    .with_upgrades()
                    .await
            }
            Err(_) => return,
        },
    };
}

impl Upstream {
    fn new(url: &str, ca_der: Vec<u8>) -> Result<Upstream, ProxyError> {
        let authority = url
            .strip_prefix("https://")
            .map(|rest| rest.trim_end_matches('/'))
            .filter(|a| a.contains(':'))
            .ok_or_else(|| ProxyError::Upstream(url.to_owned()))?
            .to_owned();
        let host = authority.rsplit_once(':').map(|(h, _)| h).unwrap_or("");
        let server_name = ServerName::try_from(host.to_owned())
            .map_err(|_| ProxyError::Upstream(url.to_owned()))?;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(ca_der))
            .map_err(|e| ProxyError::Tls(e.to_string()))?;
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| ProxyError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Upstream {
            addr: authority.clone(),
            authority,
            server_name,
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
        })
    }
}

fn acceptor(
    cp: &ControlPlane,
    address: std::net::Ipv4Addr,
) -> Result<tokio_rustls::TlsAcceptor, ProxyError> {
    let tls_err = |e: &dyn std::fmt::Display| ProxyError::Tls(e.to_string());
    let address = address.to_string();
    let pair = cp
        .pki()
        .issue(&["127.0.0.1", "localhost", &address])
        .map_err(|e| tls_err(&e))?;
    let certs = CertificateDer::pem_slice_iter(pair.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_err(&e))?;
    let key = PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes()).map_err(|e| tls_err(&e))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(&e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| tls_err(&e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
