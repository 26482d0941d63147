//! The webhook's TLS identity: a PEM certificate chain and key, reloaded when the files change.
//!
//! The files are re-read on a fixed interval and swapped in when their bytes differ. Polling,
//! not inotify, because Kubernetes updates a mounted Secret by an atomic `..data` symlink swap
//! that file watches on the individual paths miss; cert-manager rotations are rare, so one small
//! read every few seconds costs nothing. A file pair that fails to parse (a rotation caught
//! half-written) keeps the previous identity and is retried on the next tick. New handshakes
//! use the new certificate; open connections keep theirs.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate found")]
    NoCertificate { path: String },
    #[error("{path}: {detail}")]
    Pem { path: String, detail: String },
    #[error("{path}: unsupported private key: {detail}")]
    Key { path: String, detail: String },
}

/// A certificate/key pair on disk, and the identity last loaded from it.
#[derive(Debug)]
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    state: RwLock<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    bytes: (Vec<u8>, Vec<u8>),
    key: Arc<CertifiedKey>,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// Parse a PEM chain and key into a rustls identity (ring provider).
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem {
            path: cert_path.display().to_string(),
            detail: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_path.display().to_string(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Pem {
        path: key_path.display().to_string(),
        detail: e.to_string(),
    })?;
    let signing = any_supported_type(&key).map_err(|e| TlsError::Key {
        path: key_path.display().to_string(),
        detail: e.to_string(),
    })?;
    Ok(CertifiedKey::new(chain, signing))
}

impl ReloadingCert {
    /// Load the pair now; a failure here is a start-up error.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<Self>, TlsError> {
        let bytes = (read(cert_path)?, read(key_path)?);
        let key = Arc::new(certified_key(&bytes.0, &bytes.1, cert_path, key_path)?);
        Ok(Arc::new(Self {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            state: RwLock::new(Loaded { bytes, key }),
        }))
    }

    /// Re-read the files; `Ok(true)` when a new identity was swapped in.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let bytes = (read(&self.cert_path)?, read(&self.key_path)?);
        if self.state.read().unwrap_or_else(|e| e.into_inner()).bytes == bytes {
            return Ok(false);
        }
        let key = Arc::new(certified_key(
            &bytes.0,
            &bytes.1,
            &self.cert_path,
            &self.key_path,
        )?);
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = Loaded { bytes, key };
        Ok(true)
    }

    /// The identity new handshakes get.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .key
            .clone()
    }

    /// Reload every `interval` until `shutdown`, counting swaps in `reloads` and failed
    /// attempts in `errors` (one per interval while the files stay unusable).
    pub async fn watch(
        self: Arc<Self>,
        interval: Duration,
        shutdown: CancellationToken,
        reloads: prometheus_client::metrics::counter::Counter,
        errors: prometheus_client::metrics::counter::Counter,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            match self.reload() {
                Ok(true) => {
                    reloads.inc();
                    tracing::info!(cert = %self.cert_path.display(), "reloaded the webhook certificate")
                }
                Ok(false) => {}
                Err(e) => {
                    errors.inc();
                    tracing::warn!("keeping the previous webhook certificate: {e}")
                }
            }
        }
    }

    /// A rustls server configuration (ring provider, TLS 1.2/1.3, HTTP/1.1) serving this
    /// identity.
    pub fn server_config(self: &Arc<Self>) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}
