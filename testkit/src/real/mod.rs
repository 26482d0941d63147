//! A real Kubernetes control plane for the tests (the envtest convention): `etcd` and
//! `kube-apiserver`, built from the Go modules pinned under `hack/`, started on free loopback
//! ports with their own CA, service-account keys, static admin token, RBAC authorization, the
//! admission plugins podprobe relies on (MutatingAdmissionWebhook, ValidatingAdmissionWebhook,
//! ValidatingAdmissionPolicy, ServiceAccount) and an audit log that serves as the journal of
//! what clients sent.
//!
//! There is no kubelet, controller-manager, scheduler or kruise-manager unless a test starts
//! one ([`Node`], [`ControlPlane::start_controller_manager`], [`ControlPlane::start_scheduler`],
//! [`ControlPlane::start_kruise_manager`]): without a node the test plays the kubelet (it
//! writes pod status as admin), creates the ServiceAccounts a namespace needs, and finishes
//! graceful deletions itself. Each [`ControlPlane`] is private to its test; dropping it (also
//! while a failing test unwinds) kills its processes, and the kernel kills them if the test
//! process dies first.
//!
//! ```no_run
//! # async fn demo() -> Result<(), testkit::real::Error> {
//! let cp = testkit::real::ControlPlane::start().await?;
//! cp.create_namespace("games").await?;
//! let admin = cp.client();
//! # Ok(()) }
//! ```

pub mod audit;
pub mod cpu_group;
pub mod fault_proxy;
mod kruise;
pub mod kruise_game;
mod launch;
pub mod metrics;
pub mod node;
mod pki;
pub mod process;
mod requests;
pub mod sidecar_rbac;
pub mod tools;
pub mod usage;
pub mod virtual_kubelet;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

pub use audit::AuditEvent;
pub use fault_proxy::{ClientSide, FaultProxy, ProxyError};
pub use kruise::{
    KRUISE_FEATURE_GATES, KRUISE_MUTATING_WEBHOOKS, KRUISE_NAMESPACE, KRUISE_SERVICE_ACCOUNT,
    KruiseAddrs, KruiseRelease,
};
pub use kruise_game::KruiseGame;
pub use node::{
    KruiseDaemon, Leftovers, Library, Node, NodeNetwork, NodeOptions, ServiceRange, VirtualAgent,
};
pub use pki::{CertPair, Pki};
use process::Daemon;

/// The static token of the admin user (group `system:masters`).
pub const ADMIN_TOKEN: &str = "podprobe-test-admin";
/// The name of the one node a control plane can have ([`Node`]).
pub const NODE_NAME: &str = "node-1";
/// The static token of that node's kubelet (`system:node:node-1`, group `system:nodes`).
pub const NODE_TOKEN: &str = "podprobe-test-node";
/// The static token of kube-proxy (`system:kube-proxy`, bound to `system:node-proxier` by
/// the apiserver's bootstrap policy).
pub const KUBE_PROXY_TOKEN: &str = "podprobe-test-kube-proxy";
/// The node the virtual-kubelet library registers ([`virtual_kubelet::VirtualKubelet`]).
pub const VIRTUAL_NODE_NAME: &str = "vk-0";
/// Its static token: the user `virtual-kubelet`, not a `system:node:` identity (the
/// library labels its node with `kubernetes.io/role`, which NodeRestriction refuses a node).
pub const VIRTUAL_NODE_TOKEN: &str = "podprobe-test-virtual-kubelet";
/// The `kubernetes` Service's DNS names, which in-cluster clients check the certificate
/// against beside its ClusterIP ([`ServiceRange::kubernetes_ip`]).
const KUBERNETES_SERVICE_NAMES: [&str; 4] = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];
/// How long the apiserver may take to become ready on a loaded 2-core machine.
const READY_LIMIT: Duration = Duration::from_secs(180);

/// What can go wrong starting or talking to the control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the Kubernetes tools are not available: {0}")]
    Tools(String),
    #[error("cannot start {0}: {1}")]
    Start(&'static str, String),
    #[error("{0} exited before the apiserver was ready ({1}); its log ends:\n{2}")]
    Exited(&'static str, String, String),
    #[error("kube-apiserver was not ready within {0:?}; last answer: {1}; its log ends:\n{2}")]
    NotReady(Duration, String, String),
    #[error("certificate generation failed: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("apiserver request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Other(String),
}

/// The oldest Kubernetes the chart declares (`kubeVersion` in charts/podprobe/Chart.yaml), whose
/// kube-apiserver `hack/build-tools.sh` builds beside the current one.
pub const OLDEST_KUBERNETES: &str = "v1.30.14";

/// etcd + kube-apiserver, running until dropped.
#[derive(Debug)]
pub struct ControlPlane {
    // Field order is drop order: clients of the apiserver first, then the apiserver, etcd,
    // and the directory last.
    kruise_manager: Option<Daemon>,
    controller_manager: Option<Daemon>,
    /// The controllers `controller_manager` runs.
    controllers: std::collections::BTreeSet<String>,
    scheduler: Option<Daemon>,
    apiserver: Daemon,
    etcd: Daemon,
    url: String,
    etcd_url: String,
    services: ServiceRange,
    pki: Pki,
    dir: tempfile::TempDir,
}

/// See [`ControlPlane::pids`].
#[derive(Debug, Clone, Copy)]
pub struct ControlPlanePids {
    pub apiserver: u32,
    pub etcd: u32,
    pub kruise_manager: Option<u32>,
}

impl ControlPlane {
    /// Builds the tools if needed, starts etcd and kube-apiserver, and waits for `/readyz`.
    /// A port taken between choosing and binding it makes a daemon exit; that is retried.
    pub async fn start() -> Result<ControlPlane, Error> {
        Self::start_on(Ipv4Addr::LOCALHOST).await
    }

    /// [`ControlPlane::start`] with the apiserver on `address` instead of loopback: the host
    /// side of a [`NodeNetwork`], which a kubelet in the node's network namespace reaches. The
    /// apiserver then advertises that address as the `kubernetes` Service's endpoint (kube-proxy
    /// routes the Service to it) and its certificate also names the Service (its ClusterIP,
    /// `kubernetes.default.svc`), as in-cluster clients check. The Services' addresses are the
    /// node network's own ([`ServiceRange::of_apiserver`]).
    pub async fn start_on(address: Ipv4Addr) -> Result<ControlPlane, Error> {
        Self::start_with(address, "kube-apiserver", &[]).await
    }

    /// [`ControlPlane::start_on`] with kube-apiserver given `flags` besides the test control
    /// plane's own: a setting a user's cluster may have (a token lifetime cap, say) that the
    /// tests must meet as that cluster would.
    pub async fn start_on_with_flags(
        address: Ipv4Addr,
        flags: &[&str],
    ) -> Result<ControlPlane, Error> {
        Self::start_with(address, "kube-apiserver", flags).await
    }

    /// [`ControlPlane::start`] with the oldest kube-apiserver the chart supports
    /// ([`OLDEST_KUBERNETES`], built from `hack/k8s-oldest`): what the compatibility tests run
    /// the install, the webhooks, the admission policies and the sidecar against.
    pub async fn start_oldest() -> Result<ControlPlane, Error> {
        let tool = format!("kube-apiserver-{OLDEST_KUBERNETES}");
        Self::start_with(Ipv4Addr::LOCALHOST, &tool, &[]).await
    }

    async fn start_with(
        address: Ipv4Addr,
        apiserver: &str,
        flags: &[&str],
    ) -> Result<ControlPlane, Error> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::start_once(address, apiserver, flags).await {
                Err(Error::Exited(name, status, log))
                    if attempt < 3 && log.contains("address already in use") =>
                {
                    tracing::warn!(daemon = name, %status, "port race, starting again");
                }
                other => return other,
            }
        }
    }

    async fn wait_ready(&mut self) -> Result<(), Error> {
        let client = self.client();
        let started = Instant::now();
        loop {
            for daemon in [&mut self.etcd, &mut self.apiserver] {
                if let Some(status) = daemon.exited() {
                    return Err(Error::Exited(
                        daemon.name(),
                        status.to_string(),
                        daemon.log_tail(30),
                    ));
                }
            }
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| Error::Other(e.to_string()))?;
            let last = match client.request_text(request).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => body,
                Err(e) => e.to_string(),
            };
            if started.elapsed() > READY_LIMIT {
                return Err(Error::NotReady(
                    READY_LIMIT,
                    last,
                    self.apiserver.log_tail(30),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills kube-apiserver (SIGKILL, as a crash would); [`ControlPlane::start_apiserver_again`]
    /// brings it back on the same port, etcd and certificates.
    pub fn kill_apiserver(&mut self) {
        self.apiserver.kill();
    }

    /// Starts kube-apiserver again after [`ControlPlane::kill_apiserver`] and waits for `/readyz`.
    pub async fn start_apiserver_again(&mut self) -> Result<(), Error> {
        self.apiserver.start_again()?;
        self.wait_ready().await
    }

    /// Kills etcd under a running apiserver, which then answers with errors and timeouts;
    /// [`ControlPlane::start_etcd_again`] brings it back on its data directory.
    pub fn kill_etcd(&mut self) {
        self.etcd.kill();
    }

    /// Starts etcd again after [`ControlPlane::kill_etcd`] and waits until the apiserver is
    /// ready again (its `/readyz` checks etcd).
    pub async fn start_etcd_again(&mut self) -> Result<(), Error> {
        self.etcd.start_again()?;
        self.wait_ready().await
    }

    /// Starts kube-controller-manager with only `controllers` (e.g.
    /// `validatingadmissionpolicy-status-controller`, which type-checks policies and writes
    /// their status: kube-apiserver does not). It runs as the admin until the control plane
    /// is dropped. Called again (a second node), it runs those it runs already too: restarted
    /// with both sets, or left alone when it runs them all.
    pub fn start_controller_manager(&mut self, controllers: &[&str]) -> Result<(), Error> {
        let running = self.controller_manager.is_some();
        let before = self.controllers.len();
        self.controllers
            .extend(controllers.iter().map(|c| (*c).to_owned()));
        if running && self.controllers.len() == before {
            return Ok(());
        }
        // Stopped before its successor starts: two would both run every controller.
        self.controller_manager = None;
        let binary = tools::tool("kube-controller-manager")?;
        let all: Vec<&str> = self.controllers.iter().map(String::as_str).collect();
        let args = vec![
            format!("--kubeconfig={}", self.admin_kubeconfig().display()),
            format!("--controllers={}", all.join(",")),
            // For `root-ca-cert-publisher` (the `kube-root-ca.crt` ConfigMap every projected
            // service-account volume needs).
            format!(
                "--root-ca-file={}",
                self.dir.path().join("ca.crt").display()
            ),
            "--leader-elect=false".to_owned(),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={}", free_port()?),
            "--v=1".to_owned(),
        ];
        let log = self.dir.path().join("controller-manager.log");
        self.controller_manager = Some(Daemon::spawn(
            "kube-controller-manager",
            &binary,
            &args,
            log,
        )?);
        Ok(())
    }

    /// Starts kube-scheduler (as the admin, until the control plane is dropped), for tests of
    /// workloads whose pods a controller creates without a node: a Deployment as users install it.
    pub fn start_scheduler(&mut self) -> Result<(), Error> {
        let binary = tools::tool("kube-scheduler")?;
        let args = vec![
            format!("--kubeconfig={}", self.admin_kubeconfig().display()),
            "--leader-elect=false".to_owned(),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={}", free_port()?),
            "--v=1".to_owned(),
        ];
        let log = self.dir.path().join("scheduler.log");
        self.scheduler = Some(Daemon::spawn("kube-scheduler", &binary, &args, log)?);
        Ok(())
    }

    /// `https://127.0.0.1:<port>` (or the address given to [`ControlPlane::start_on`]).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The Services' virtual addresses (`--service-cluster-ip-range`): the node network's own
    /// when the apiserver listens on one.
    pub fn service_range(&self) -> ServiceRange {
        self.services
    }

    /// The apiserver's address: [`ControlPlane::url`]'s host and port, as a connection to it
    /// shows them.
    pub fn address(&self) -> std::net::SocketAddr {
        self.url
            .trim_start_matches("https://")
            .parse()
            .expect("the apiserver's URL is https://<ip>:<port>")
    }

    /// The CA that signed the apiserver's certificate; also use it for webhook servers.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// A private directory that lives as long as the control plane.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The admin's kubeconfig (for kubectl, helm and binaries under test).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    /// A `kube::Config` authenticating with `token`, trusting exactly the test CA.
    pub fn config_for_token(&self, token: &str) -> kube::Config {
        let mut config = kube::Config::new(self.url.parse().expect("a valid url"));
        config.root_cert = Some(vec![self.pki.ca_der()]);
        config.auth_info.token = Some(token.to_owned().into());
        config.default_namespace = "default".into();
        config
    }

    pub fn config(&self) -> kube::Config {
        self.config_for_token(ADMIN_TOKEN)
    }

    /// An admin client (group `system:masters`).
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config()).expect("a TLS client")
    }

    pub fn client_for_token(&self, token: &str) -> kube::Client {
        kube::Client::try_from(self.config_for_token(token)).expect("a TLS client")
    }

    /// Writes a kubeconfig that authenticates with `token`.
    pub fn write_kubeconfig_for_token(
        &self,
        path: impl AsRef<Path>,
        token: &str,
    ) -> Result<(), Error> {
        let doc = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": self.url,
                "certificate-authority": self.dir.path().join("ca.crt"),
            }}],
            "users": [{"name": "test", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": "default"}}],
            "current-context": "test",
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
        Ok(())
    }

    /// The process ids of kube-apiserver, etcd and (when started) kruise-manager, for
    /// benchmarks that read their CPU and memory from /proc.
    pub fn pids(&self) -> ControlPlanePids {
        ControlPlanePids {
            apiserver: self.apiserver.pid(),
            etcd: self.etcd.pid(),
            kruise_manager: self.kruise_manager.as_ref().map(Daemon::pid),
        }
    }

    /// etcd's client URL (plain HTTP on loopback): its `/metrics` has the database's size.
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The audit log's path, for readers that stream it instead of loading it whole.
    pub fn audit_path(&self) -> PathBuf {
        self.dir.path().join("audit.log")
    }

    /// Every audit event written so far (stage `ResponseComplete`; request bodies of writes
    /// to pods and their status, events and leases are included).
    pub fn audit(&self) -> Result<Vec<AuditEvent>, Error> {
        audit::read(&self.audit_path())
    }

    /// `kubectl` built from the pinned module, as the admin.
    pub fn kubectl(&self) -> Result<Command, Error> {
        let mut command = Command::new(tools::tool("kubectl")?);
        command.env("KUBECONFIG", self.admin_kubeconfig());
        Ok(command)
    }

    /// `helm` built from the pinned module, as the admin, with its state in this control
    /// plane's directory.
    pub fn helm(&self) -> Result<Command, Error> {
        let mut command = Command::new(tools::tool("helm")?);
        let home = self.dir.path().join("helm");
        command
            .env("KUBECONFIG", self.admin_kubeconfig())
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"));
        Ok(command)
    }

    /// The last lines of the apiserver's log.
    pub fn apiserver_log_tail(&self, lines: usize) -> String {
        self.apiserver.log_tail(lines)
    }

    /// The last lines of kube-scheduler's log, if it was started.
    pub fn scheduler_log_tail(&self, lines: usize) -> String {
        self.scheduler
            .as_ref()
            .map(|s| s.log_tail(lines))
            .unwrap_or_default()
    }
}

fn free_port() -> Result<u16, Error> {
    Ok(crate::port::free_port()?)
}
