//! testkit: an in-process Kubernetes API server for podprobe's tests.
//!
//! It serves the resources podprobe uses (pods and `pods/status`, nodes,
//! namespaces, core/v1 and events.k8s.io/v1 events, leases, and the
//! OpenKruise `PodProbeMarker` custom resource) with the semantics that
//! matter: a global resourceVersion, optimistic concurrency, uid
//! preconditions, status subresources, strategic/merge/JSON patches,
//! finalizers and graceful pod deletion, watches with bookmarks and 410 Gone.
//! It also injects faults and keeps a journal of every request. See the
//! crate's README for what is faithful and what is not.
//!
//! ```no_run
//! # async fn demo() -> Result<(), testkit::Error> {
//! use testkit::{ApiServer, Fault};
//! let api = ApiServer::start().await?;
//! let client = api.client();
//! api.faults().add(Fault::status(500).method("PATCH").path_contains("/status").times(3));
//! // ... run the code under test with `client` ...
//! assert_eq!(api.journal().count("PATCH", "pods/status"), 4);
//! # Ok(()) }
//! ```

pub mod auth;
pub mod discovery;
pub mod error;
pub mod exec;
pub mod faults;
pub mod journal;
pub mod openapi;
pub mod patch;
pub mod real;
pub mod resources;
mod response;
pub mod selectors;
mod server;
pub mod store;
pub mod strategic;
mod table;
pub mod validation;
pub mod workspace;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod, PodStatus};
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use auth::{ADMIN_TOKEN, ADMIN_USER, Rule, User};
pub use error::{ApiError, Error};
pub use exec::{ExecExit, ExecIo, ExecRequest, ExecRunner, SpawnRunner, TokioRunner};
pub use faults::{Action, Fault, Faults};
pub use journal::{Entry, Journal};
use resources::ResourceDef;
use server::Shared;

/// Options for [`ApiServer::builder`].
#[derive(Debug, Clone)]
pub struct Builder {
    port: u16,
    history_limit: usize,
    bookmark_interval: Duration,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            port: 0,
            history_limit: 10_000,
            bookmark_interval: Duration::from_secs(1),
        }
    }
}

impl Builder {
    /// Listen on this port of 127.0.0.1 (0, the default: any free port).
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Keep at most this many writes in the watch history (default 10000);
    /// a watch from an older resourceVersion gets 410 Gone.
    pub fn history_limit(mut self, n: usize) -> Self {
        self.history_limit = n;
        self
    }

    /// How often a watch that asked for bookmarks gets one when the
    /// resourceVersion has moved (default 1 s; the real server: ~1 min).
    pub fn bookmark_interval(mut self, d: Duration) -> Self {
        self.bookmark_interval = d;
        self
    }

    /// Bind and serve.
    pub async fn start(self) -> Result<ApiServer, Error> {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).await?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            store: store::Store::new(self.history_limit),
            journal: Journal::default(),
            faults: Faults::default(),
            auth: auth::Auth::default(),
            bookmark_interval: self.bookmark_interval,
            address: format!("127.0.0.1:{port}"),
            exec: exec::ExecState::default(),
        });
        let api = ApiServer {
            shared,
            port,
            running: Mutex::new(None),
        };
        api.serve(listener);
        Ok(api)
    }
}

/// A running testkit API server. Dropping it stops the server.
#[derive(Debug)]
pub struct ApiServer {
    shared: Arc<Shared>,
    port: u16,
    running: Mutex<Option<(watch::Sender<bool>, JoinHandle<()>)>>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some((tx, _)) = self.running_lock().take() {
            let _ = tx.send(true);
        }
    }
}

impl ApiServer {
    /// Start on a free port of 127.0.0.1 with default options.
    pub async fn start() -> Result<Self, Error> {
        Builder::default().start().await
    }

    /// Options: port, history limit, bookmark interval.
    pub fn builder() -> Builder {
        Builder::default()
    }

    fn running_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, Option<(watch::Sender<bool>, JoinHandle<()>)>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn serve(&self, listener: TcpListener) {
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(server::serve(listener, self.shared.clone(), rx));
        *self.running_lock() = Some((tx, task));
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The port (stays the same across [`stop`](Self::stop)/[`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A `kube::Config` for the admin user.
    pub fn config(&self) -> kube::Config {
        self.config_for_token(ADMIN_TOKEN)
    }

    /// A `kube::Config` authenticating with `token`.
    pub fn config_for_token(&self, token: &str) -> kube::Config {
        let mut c = kube::Config::new(self.url().parse().expect("valid url"));
        c.auth_info.token = Some(secrecy::SecretString::from(token.to_string()));
        c.default_namespace = "default".into();
        c
    }

    /// A ready client, authenticated as the admin (always allowed).
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config()).expect("plain-http client")
    }

    /// A client authenticating with `token` (see [`add_token`](Self::add_token)).
    pub fn client_for_token(&self, token: &str) -> kube::Client {
        kube::Client::try_from(self.config_for_token(token)).expect("plain-http client")
    }

    /// Write a kubeconfig (JSON, which is YAML) for the admin user, so a
    /// subprocess can connect (`KUBECONFIG=<path>` or `--kubeconfig`).
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        self.write_kubeconfig_for_token(path, ADMIN_TOKEN)
    }

    /// Write a kubeconfig authenticating with `token`.
    pub fn write_kubeconfig_for_token(
        &self,
        path: impl AsRef<Path>,
        token: &str,
    ) -> Result<(), Error> {
        // Written aside and renamed into place: a process waiting for the file to appear
        // (the `testkit-apiserver` binary's users) never reads it half-written.
        let path = path.as_ref();
        let partial = path.with_extension("partial");
        std::fs::write(&partial, kubeconfig(&self.url(), token))?;
        std::fs::rename(&partial, path)?;
        Ok(())
    }

    /// The request journal.
    pub fn journal(&self) -> &Journal {
        &self.shared.journal
    }

    /// The fault rules.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Run `pods/exec` commands with `runner` from now on (default:
    /// [`TokioRunner`], which spawns them on this machine with tokio).
    pub fn set_exec_runner(&self, runner: Arc<dyn ExecRunner>) {
        self.shared.exec.set_runner(runner);
    }

    /// Turn the apiserver's v5 stream translator on (default, as Kubernetes
    /// 1.30+) or off (older servers, or the `TranslateStreamCloseWebsocketRequests`
    /// gate off): then `pods/exec` negotiates as the kubelet alone, so a client
    /// offering `v5, v4` gets `v4`.
    pub fn set_exec_v5(&self, on: bool) {
        self.shared.exec.set_v5(on);
    }

    /// Every `pods/exec` request that was upgraded, in order, with the
    /// negotiated subprotocol.
    pub fn exec_requests(&self) -> Vec<ExecRequest> {
        self.shared.exec.requests()
    }

    /// Map a bearer token to a user with `extra` attributes (e.g.
    /// `authentication.kubernetes.io/pod-name`).
    pub fn add_token(&self, token: &str, user: &str, extra: BTreeMap<String, Vec<String>>) {
        self.shared.auth.add_token(token, user, extra);
    }

    /// Allow what `rule` says, and turn authorization on: from now on
    /// requests not allowed by some rule are 403 (the admin is always
    /// allowed).
    pub fn allow(&self, rule: Rule) {
        self.shared.auth.allow(rule);
    }

    /// Turn authorization on without adding a rule.
    pub fn enable_authorization(&self) {
        self.shared.auth.enable();
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.resource_version()
    }

    /// Compact the watch history: watches (and continues) from any version
    /// before now get 410 Gone. Returns the compaction version.
    pub fn compact(&self) -> u64 {
        self.shared.store.compact()
    }

    /// Stop serving: close the listener and every open connection (watches
    /// end). The stored objects stay.
    pub async fn stop(&self) {
        let running = self.running_lock().take();
        if let Some((tx, task)) = running {
            let _ = tx.send(true);
            let _ = task.await;
        }
    }

    /// Serve again on the same port, with the same objects.
    pub async fn restart(&self) -> Result<(), Error> {
        self.stop().await;
        let listener = TcpListener::bind(("127.0.0.1", self.port)).await?;
        self.serve(listener);
        Ok(())
    }

    /// Is the server serving?
    pub fn is_running(&self) -> bool {
        self.running_lock().is_some()
    }

    // ---- objects, as a kubelet or an outside writer would set them ----

    fn def_of<K: Resource<DynamicType = ()>>() -> Result<&'static ResourceDef, Error> {
        let (v, k) = (K::api_version(&()), K::kind(&()));
        resources::find_kind(&v, &k).ok_or_else(|| Error::UnknownResource(format!("{v} {k}")))
    }

    /// Create through the API rules (as `POST` would), as the admin.
    pub fn create<K>(&self, obj: &K) -> Result<K, Error>
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let r = Self::def_of::<K>()?;
        let v = serde_json::to_value(obj)?;
        let ns = v
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        let out = self
            .shared
            .store
            .create(r, if r.namespaced { &ns } else { "" }, v)?;
        Ok(serde_json::from_value(out)?)
    }

    /// Create a namespace.
    pub fn create_namespace(&self, name: &str) -> Result<Namespace, Error> {
        self.create(&serde_json::from_value::<Namespace>(
            json!({"metadata": {"name": name}}),
        )?)
    }

    /// Store `obj` exactly as given (creating or replacing it), bypassing
    /// the API's endpoint rules: status, spec, labels, all as given. Bumps
    /// the resourceVersion and emits ADDED or MODIFIED.
    pub fn set_object<K>(&self, obj: &K) -> Result<K, Error>
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let r = Self::def_of::<K>()?;
        let out = self.shared.store.put_raw(r, serde_json::to_value(obj)?)?;
        Ok(serde_json::from_value(out)?)
    }

    /// The stored object, if any (`ns` is ignored for cluster-scoped kinds).
    pub fn get<K>(&self, ns: &str, name: &str) -> Option<K>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let r = Self::def_of::<K>().ok()?;
        let v = self.shared.store.get(r, ns, name).ok()?;
        serde_json::from_value(v).ok()
    }

    /// Read-modify-write the stored object with `f`, bypassing endpoint
    /// rules (like [`set_object`](Self::set_object)).
    pub fn modify<K>(&self, ns: &str, name: &str, f: impl FnOnce(&mut K)) -> Result<K, Error>
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let r = Self::def_of::<K>()?;
        let cur = self.shared.store.get(r, ns, name)?;
        let mut k: K = serde_json::from_value(cur)?;
        f(&mut k);
        self.set_object(&k)
    }

    /// Change a pod's status as the kubelet does (e.g. `containerStatuses`,
    /// `podIP`, `phase`); creates an empty status if there is none.
    pub fn update_pod_status(
        &self,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut PodStatus),
    ) -> Result<Pod, Error> {
        self.modify::<Pod>(ns, name, |p| {
            f(p.status.get_or_insert_with(Default::default))
        })
    }

    /// The kubelet's end of a graceful pod deletion: the pod goes (once its
    /// finalizers are gone). See the README on deletion.
    pub fn finish_pod_deletion(&self, ns: &str, name: &str) -> Result<(), Error> {
        self.shared.store.finish_pod_deletion(ns, name)?;
        Ok(())
    }
}

/// A kubeconfig document for `server` and `token`.
pub fn kubeconfig(server: &str, token: &str) -> String {
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testkit", "cluster": {"server": server}}],
        "users": [{"name": "testkit", "user": {"token": token}}],
        "contexts": [{"name": "testkit", "context": {"cluster": "testkit", "user": "testkit", "namespace": "default"}}],
        "current-context": "testkit",
        "preferences": {}
    });
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}
