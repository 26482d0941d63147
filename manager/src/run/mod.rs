//! `podprobe-manager run`: the webhooks on every replica, the controllers on the leader.
//!
//! [`Manager::start`] wires the pieces in-process (the binary and the tests use it):
//! caches → TLS identity (reloaded) → HTTPS webhook server → metrics server → the sidecar
//! token issuer (with injection, every replica) → leader election → controllers (standalone
//! mode only: markers and propagation, PodProbeMarker status, and with injection the sweep for
//! pods running without their sidecar) while leading.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::Client;
use kube::runtime::reflector;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cache::{PpmCache, spawn_node_store, spawn_store};
use crate::config::{ConfigError, InjectionConfig, supports_native_sidecars};
use crate::leader::{Elector, LeaseConfig};
use crate::metrics::{Metrics, Readiness};
use crate::pods::unprobed::Sweep;
use crate::pods::{MarkerScope, PodContext};
use crate::status::StatusContext;
use crate::tls::{ReloadingCert, TlsError};
use crate::webhook::{Mode, Webhooks};
use crate::{metrics, pods, status, webhook};

mod options;

pub use options::{LeaderOptions, ModeArg, Options, RunArgs};
pub use podprobe_ops::entry::LogFormat;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("no Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// A running manager.
#[derive(Debug)]
pub struct Manager {
    /// Where the webhooks listen (the bound address when the option asked for port 0).
    pub webhook_addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub metrics: Arc<Metrics>,
    pub ppms: Arc<PpmCache>,
    pub tls: Arc<ReloadingCert>,
    shutdown: CancellationToken,
    kill: CancellationToken,
    leading: watch::Receiver<bool>,
    _fixed_leadership: Option<watch::Sender<bool>>,
    tasks: Vec<JoinHandle<()>>,
}

/// Listens on `addr`; returns the listener and the bound address (port 0 picks one).
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), RunError> {
    let listen_error = |source| RunError::Listen { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(listen_error)?;
    let bound = listener.local_addr().map_err(listen_error)?;
    Ok((listener, bound))
}

/// Serves the webhooks on `addr`; returns the bound address (port 0 picks one).
async fn serve_webhooks(
    addr: SocketAddr,
    tls: &Arc<ReloadingCert>,
    hooks: Arc<Webhooks>,
    shutdown: &CancellationToken,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<SocketAddr, RunError> {
    let (listener, bound) = bind(addr).await?;
    tasks.push(tokio::spawn(webhook::serve(
        listener,
        tls.server_config(),
        hooks,
        shutdown.clone(),
    )));
    Ok(bound)
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr`; returns the bound address.
async fn serve_endpoints(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    shutdown: &CancellationToken,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<SocketAddr, RunError> {
    let (listener, bound) = bind(addr).await?;
    tasks.push(tokio::spawn(metrics::serve(
        listener,
        metrics,
        readiness,
        shutdown.clone(),
    )));
    Ok(bound)
}

impl Manager {
    /// Start everything; returns once the listeners are bound.
    pub async fn start(client: Client, options: Options) -> Result<Manager, RunError> {
        let shutdown = CancellationToken::new();
        let kill = CancellationToken::new();
        let metrics = Arc::new(Metrics::new(options.mode == Mode::Standalone));
        let readiness = Arc::new(Readiness::default());
        let mut tasks = Vec::new();

        let native = apiserver_supports_native_sidecars(&client).await;

        let ppms = Arc::new(PpmCache::default());
        ppms.spawn(client.clone(), shutdown.clone());
        let namespaces = options
            .injection
            .is_some()
            .then(|| spawn_store::<Namespace>(client.clone(), shutdown.clone()));
        let nodes = options
            .injection
            .is_some()
            .then(|| spawn_node_store(client.clone(), shutdown.clone()));
        tasks.push(tokio::spawn(ready_once_synced(
            ppms.clone(),
            namespaces.clone(),
            nodes.clone(),
            readiness.clone(),
            shutdown.clone(),
        )));

        let tls = ReloadingCert::load(&options.tls_cert, &options.tls_key)?;
        tasks.push(tokio::spawn(tls.clone().watch(
            options.tls_reload_interval,
            shutdown.clone(),
            metrics.cert_reloads.clone(),
            metrics.cert_reload_errors.clone(),
        )));

        // Names this replica on the virtual-node pods it admits, whose tokens it then issues.
        let identity = options
            .leader
            .as_ref()
            .map(|l| l.identity.clone())
            .unwrap_or_else(crate::leader::default_identity);
        let issuer = crate::sidecar_token::issuer_value(&identity);
        let hooks = Arc::new(Webhooks {
            mode: options.mode,
            injection: options.injection.clone(),
            native_sidecars_supported: native,
            ppms: ppms.clone(),
            namespaces: namespaces.clone(),
            nodes,
            issuer: issuer.clone(),
            metrics: metrics.clone(),
        });
        let webhook_addr =
            serve_webhooks(options.webhook_addr, &tls, hooks, &shutdown, &mut tasks).await?;
        tracing::info!(%webhook_addr, mode = ?options.mode, native_sidecars = native, "webhooks serving");
        let metrics_addr = match options.metrics_addr {
            Some(addr) => Some(
                serve_endpoints(
                    addr,
                    metrics.clone(),
                    readiness.clone(),
                    &shutdown,
                    &mut tasks,
                )
                .await?,
            ),
            None => None,
        };

        if let Some(injection) = &options.injection {
            // Every replica, in both modes: pods on virtual nodes wait for it, leader or not.
            tasks.push(tokio::spawn(crate::sidecar_token::issue::run(
                client.clone(),
                metrics.clone(),
                injection.sidecar_token_lifetime,
                issuer,
                shutdown.clone(),
            )));
        }
        let controllers = options.mode == Mode::Standalone;
        let (leading, fixed_leadership, elector) = leadership(
            &client,
            controllers,
            options.leader.as_ref(),
            &shutdown,
            &kill,
        );
        tasks.extend(elector);
        if controllers {
            let controllers = Controllers {
                client,
                ppms: ppms.clone(),
                scope: options.scope.clone(),
                workers: options.workers,
                metrics: metrics.clone(),
                injection: options.injection.clone().zip(namespaces),
                readiness: readiness.clone(),
            };
            tasks.push(tokio::spawn(lead(
                controllers,
                leading.clone(),
                shutdown.clone(),
            )));
        }
        Ok(Manager {
            webhook_addr,
            metrics_addr,
            metrics,
            ppms,
            tls,
            shutdown,
            kill,
            leading,
            _fixed_leadership: fixed_leadership,
            tasks,
        })
    }

    /// This replica runs the controllers now.
    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Wait until this replica leads.
    pub async fn wait_leader(&self) {
        let mut rx = self.leading.clone();
        let _ = rx.wait_for(|l| *l).await;
    }

    /// Graceful shutdown: stop accepting, finish in-flight requests and reconciles, release
    /// the lease.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// Simulate a crash: stop at once, without releasing the lease.
    pub fn kill(self) {
        self.kill.cancel();
        self.shutdown.cancel();
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What the leader's controllers run with.
struct Controllers {
    client: Client,
    ppms: Arc<PpmCache>,
    scope: MarkerScope,
    workers: u16,
    metrics: Arc<Metrics>,
    /// With injection: its settings and the namespace cache, for the sweep that reports pods
    /// running without their sidecar.
    injection: Option<(InjectionConfig, reflector::Store<Namespace>)>,
    /// The webhooks' caches are synced (the sweep reads them too).
    readiness: Arc<Readiness>,
}

/// Run the controllers whenever `leading` is true.
async fn lead(
    controllers: Controllers,
    mut leading: watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    let Controllers {
        client,
        ppms,
        scope,
        workers,
        metrics,
        injection,
        readiness,
    } = controllers;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = leading.wait_for(|l| *l) => if r.is_err() { return },
        }
        metrics.leader.set(1);
        let term = shutdown.child_token();
        let (nodes, node_writer) = reflector::store::<Node>();
        let pod_store = reflector::store::<crate::pods::CachedPod>();
        let (status_tx, status_rx) = mpsc::unbounded_channel();
        let pod_ctx = Arc::new(PodContext {
            client: client.clone(),
            ppms: ppms.clone(),
            nodes,
            scope: scope.clone(),
            metrics: metrics.clone(),
            status_triggers: status_tx,
            written: Default::default(),
            pods_listed: watch::Sender::new(false),
            retries: crate::retries::Retries::new(podprobe_ops::backoff::Policy::WATCH),
        });
        let status_ctx = Arc::new(StatusContext {
            client: client.clone(),
            pods: pod_store.0.clone(),
            metrics: metrics.clone(),
        });
        let sweep = injection.as_ref().map(|(config, namespaces)| {
            let sweep = Sweep::new(
                client.clone(),
                pod_store.0.clone(),
                ppms.clone(),
                namespaces.clone(),
                config.clone(),
                metrics.clone(),
            );
            let listed = pod_ctx.pods_listed.subscribe();
            tokio::spawn(sweep.run(listed, readiness.clone(), term.clone()))
        });
        let pods_task = tokio::spawn(pods::run(
            pod_ctx,
            pod_store,
            node_writer,
            workers,
            term.clone(),
        ));
        let status_task = tokio::spawn(status::run(status_ctx, status_rx, term.clone()));
        tracing::info!("controllers started");
        tokio::select! {
            _ = shutdown.cancelled() => {}
            r = leading.wait_for(|l| !*l) => if r.is_err() {
                // The elector is gone (killed): stop leading.
            }
        }
        term.cancel();
        let _ = tokio::join!(pods_task, status_task);
        if let Some(sweep) = sweep {
            let _ = sweep.await;
        }
        metrics.leader.set(0);
        tracing::info!("controllers stopped");
        if shutdown.is_cancelled() {
            return;
        }
    }
}

/// Who leads the controllers: the Lease elector when one is configured, else this replica
/// whenever it runs controllers. Returns the leadership signal, the sender kept when there is
/// no elector (a dropped sender would read as "leadership over"), and the elector's task.
fn leadership(
    client: &Client,
    controllers: bool,
    leader: Option<&LeaderOptions>,
    shutdown: &CancellationToken,
    kill: &CancellationToken,
) -> (
    watch::Receiver<bool>,
    Option<watch::Sender<bool>>,
    Option<JoinHandle<()>>,
) {
    let (leading_tx, leading) = watch::channel(controllers && leader.is_none());
    let Some(leader) = leader.filter(|_| controllers) else {
        return (leading, Some(leading_tx), None);
    };
    let config = LeaseConfig::new(
        &leader.namespace,
        &leader.name,
        &leader.identity,
        leader.lease_duration,
    );
    let elector = Elector::new(client.clone(), config);
    let (shutdown, kill) = (shutdown.clone(), kill.clone());
    let task = tokio::spawn(async move {
        tokio::select! {
            _ = kill.cancelled() => {}
            _ = elector.run(leading_tx, shutdown) => {}
        }
    });
    (leading, None, Some(task))
}

/// Whether the apiserver runs restartable init containers (native sidecars, ≥ 1.29).
async fn apiserver_supports_native_sidecars(client: &Client) -> bool {
    match client.apiserver_version().await {
        Ok(v) => supports_native_sidecars(&v.major, &v.minor),
        Err(e) => {
            tracing::warn!("cannot read the apiserver version ({e}); no native sidecars");
            false
        }
    }
}

/// `/readyz` turns ok once the caches the webhooks read have their first list.
/// How long readiness waits for the node list (see [`ready_once_synced`]).
const NODES_SYNC: Duration = Duration::from_secs(30);

async fn ready_once_synced(
    ppms: Arc<PpmCache>,
    namespaces: Option<kube::runtime::reflector::Store<Namespace>>,
    nodes: Option<kube::runtime::reflector::Store<Node>>,
    readiness: Arc<Readiness>,
    shutdown: CancellationToken,
) {
    let synced = async {
        if let Some(ns) = &namespaces {
            let _ = ns.wait_until_ready().await;
        }
        // The shape decision reads the virtual nodes: a webhook that admitted pods before
        // knowing them would give a pod bound for an untainted one the kubelet shape. Bounded:
        // without the grant (RBAC older than this build) the webhook still serves, deciding
        // from the pod alone, and the watch's warnings say why.
        if let Some(nodes) = &nodes
            && tokio::time::timeout(NODES_SYNC, nodes.wait_until_ready())
                .await
                .is_err()
        {
            tracing::warn!(
                "no node list after {NODES_SYNC:?}: injected pods get their shape from what they carry alone until it comes (is `list nodes` granted?)"
            );
        }
        ppms.wait_synced().await;
    };
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = synced => {
            readiness.set(true);
            tracing::info!("caches synced; ready");
        }
    }
}

/// The manager's client for `config`: without kube-rs's own retry of 429, 503 and 504 answers,
/// which resends a request up to 15 times, each after exactly the `Retry-After` (API Priority
/// and Fairness always says 1 s), so that a manager's watches and controllers wait as
/// `podprobe_ops::backoff` says: longer after each 429, apart from the other clients.
pub fn client(mut config: kube::Config) -> Result<Client, kube::Error> {
    config.default_retry = false;
    Client::try_from(config)
}

/// [`client`] from the in-cluster or kubeconfig settings.
pub async fn default_client() -> Result<Client, kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    client(config)
}

/// The binary's `run`: start, wait for SIGTERM, shut down gracefully (at most 25 s).
pub async fn main(args: &RunArgs) -> Result<(), RunError> {
    let options = Options::from_args(args)?;
    let client = default_client().await?;
    let manager = Manager::start(client, options).await?;
    let signal = podprobe_ops::entry::termination().await;
    tracing::info!("{signal}: shutting down");
    if tokio::time::timeout(Duration::from_secs(25), manager.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("shutdown did not finish within 25 s");
    }
    Ok(())
}
