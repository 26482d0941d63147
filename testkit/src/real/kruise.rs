//! OpenKruise's kruise-manager on a [`ControlPlane`], installed as its own manifests describe
//! (`config/default` of the pinned module: CRDs, the manager's ClusterRole and ServiceAccount,
//! the webhook configurations) and run as a process with that ServiceAccount's token.
//!
//! The webhooks are reached as Kruise's local-development mode does it: with `WEBHOOK_HOST`
//! set, kruise-manager issues its own serving certificate for that address (file writer),
//! and rewrites its webhook configurations from `service:` references to
//! `url: https://<host>:<port>/<path>` with its CA bundle. Nothing routes a Service here.
//!
//! The feature gates are the serverless protocol's (`EnablePodProbeMarkerOnServerless` on;
//! `KruiseDaemon`, `PodWebhook` and `PodProbeMarkerGate` must stay on for it) and the
//! workload features this flow does not use are off, so their webhooks and controllers do
//! not take part.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Api;
use serde_json::{Value, json};

use super::process::Daemon;
use super::{ControlPlane, Error, free_port, tools};

/// kruise-manager's namespace (its manifests' `namespace:`).
pub const KRUISE_NAMESPACE: &str = "kruise-system";
/// Its ServiceAccount there, bound to `kruise-manager-role` by the manifests.
pub const KRUISE_SERVICE_ACCOUNT: &str = "kruise-manager";
/// The mutating webhook configuration kruise-manager fills in at start.
pub const KRUISE_MUTATING_WEBHOOKS: &str = "kruise-mutating-webhook-configuration";
/// The feature gates of the serverless PodProbeMarker flow.
pub const KRUISE_FEATURE_GATES: &str = "EnablePodProbeMarkerOnServerless=true,\
KruiseDaemon=true,PodWebhook=true,PodProbeMarkerGate=true,WorkloadSpread=false,\
PodUnavailableBudgetDeleteGate=false,InPlaceUpdateEnvFromMetadata=false,\
StatefulSetAutoDeletePVC=false,PodIndexLabel=false";
/// Kinds of the manifests that describe how Kruise runs in a cluster (its Deployment, the
/// kruise-daemon DaemonSet, the webhook Service): here the process is started by the test.
const NOT_INSTALLED: [&str; 3] = ["Deployment", "DaemonSet", "Service"];
/// kruise-manager waits up to 60 s for its webhook and caches; a loaded 2-core machine may
/// need more than that to start it.
const READY_LIMIT: Duration = Duration::from_secs(180);

/// The running kruise-manager's addresses.
#[derive(Debug, Clone, Copy)]
pub struct KruiseAddrs {
    /// Its webhook server (https, the CA is its own).
    pub webhook_port: u16,
    /// Its controller-runtime `/readyz` and `/healthz` (plain http).
    pub health_port: u16,
    /// Its Prometheus metrics (plain http).
    pub metrics_port: u16,
}

/// The kruise-manager releases the tests run, each built from its own pinned module with its
/// own install manifests (v1.9.1 from `hack/kruise`, v1.8.0 from `hack/k8s-oldest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KruiseRelease {
    /// v1.9.1, the newest the module proxy serves here: what the tests run by default.
    V1_9_1,
    /// v1.8.0, the first with the serverless PodProbeMarker protocol (v1.8.1 is refused here).
    V1_8_0,
}

impl KruiseRelease {
    /// Its kruise-manager binary in the tools' bin directory.
    pub fn binary(self) -> &'static str {
        match self {
            Self::V1_9_1 => "kruise-manager",
            Self::V1_8_0 => "kruise-manager-v1.8.0",
        }
    }

    /// Its directory under the tools' `share/`.
    fn share(self) -> &'static str {
        match self {
            Self::V1_9_1 => "kruise",
            Self::V1_8_0 => "kruise-v1.8.0",
        }
    }
}

/// A module's rendered install manifests, `share/<dir>/<file>` beside the tools' binaries
/// (`hack/build-tools.sh` writes them).
pub(super) fn rendered_manifests(dir: &str, file: &str) -> Result<PathBuf, Error> {
    let path = tools::bin_dir()?.join(format!("../share/{dir}/{file}"));
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Tools(format!(
            "{} is missing: run hack/build-tools.sh",
            path.display()
        )))
    }
}

impl ControlPlane {
    /// Installs OpenKruise's CRDs, RBAC and webhook configurations and starts kruise-manager;
    /// returns once its webhooks are configured and it reports ready. It runs until the
    /// control plane is dropped.
    pub async fn start_kruise_manager(&mut self) -> Result<KruiseAddrs, Error> {
        self.start_kruise_release(KruiseRelease::V1_9_1).await
    }

    /// [`Self::start_kruise_manager`] with one release's manifests and binary.
    pub async fn start_kruise_release(
        &mut self,
        release: KruiseRelease,
    ) -> Result<KruiseAddrs, Error> {
        self.install_kruise_manifests(release)?;
        let token = self
            .service_account_token(KRUISE_NAMESPACE, KRUISE_SERVICE_ACCOUNT)
            .await?;
        let dir = self.dir().join("kruise");
        std::fs::create_dir_all(dir.join("certs"))?;
        let kubeconfig = dir.join("kubeconfig");
        self.write_kubeconfig_for_token(&kubeconfig, &token)?;
        let addrs = KruiseAddrs {
            webhook_port: free_port()?,
            health_port: free_port()?,
            metrics_port: free_port()?,
        };
        let args = vec![
            "--enable-leader-election=false".to_owned(),
            "--enable-pprof=false".to_owned(),
            format!("--metrics-addr=127.0.0.1:{}", addrs.metrics_port),
            format!("--health-probe-addr=127.0.0.1:{}", addrs.health_port),
            format!("--protection-log-path={}", dir.display()),
            format!("--feature-gates={KRUISE_FEATURE_GATES}"),
            "--v=2".to_owned(),
        ];
        let env = [
            ("KUBECONFIG", kubeconfig.display().to_string()),
            ("POD_NAMESPACE", KRUISE_NAMESPACE.to_owned()),
            ("WEBHOOK_HOST", "127.0.0.1".to_owned()),
            ("WEBHOOK_PORT", addrs.webhook_port.to_string()),
            ("WEBHOOK_CERT_DIR", dir.join("certs").display().to_string()),
        ];
        let daemon = Daemon::spawn_with_env(
            "kruise-manager",
            &tools::tool(release.binary())?,
            &args,
            &env,
            dir.join("kruise-manager.log"),
        )?;
        self.kruise_manager = Some(daemon);
        self.wait_kruise_ready(addrs).await?;
        Ok(addrs)
    }

    /// The last lines of kruise-manager's log.
    pub fn kruise_log_tail(&self, lines: usize) -> String {
        self.kruise_manager
            .as_ref()
            .map(|d| d.log_tail(lines))
            .unwrap_or_default()
    }

    /// Everything of `config/default` but how Kruise itself is deployed.
    fn install_kruise_manifests(&self, release: KruiseRelease) -> Result<(), Error> {
        let path = rendered_manifests(release.share(), "kruise.yaml")?;
        self.install_manifests(&path, &NOT_INSTALLED, |d| d)
    }

    /// Creates the documents of the manifests file `path` as the admin (`create`, not `apply`:
    /// CRDs are larger than apply's annotation may be), but those of the kinds in `skip` (how a
    /// project deploys itself: here the test starts the process), each passed through
    /// `adjust`; returns once every CRD is established.
    pub(super) fn install_manifests(
        &self,
        path: &std::path::Path,
        skip: &[&str],
        adjust: impl FnMut(Value) -> Value,
    ) -> Result<(), Error> {
        let text = std::fs::read_to_string(path)?;
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .map_err(|e| Error::Other(format!("{}: {e}", path.display())))?;
        let items: Vec<Value> = docs
            .into_iter()
            .filter(|d| !skip.contains(&d["kind"].as_str().unwrap_or_default()))
            .map(adjust)
            .collect();
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
        self.kubectl_stdin(&["create", "-f", "-"], &serde_json::to_vec(&list)?)?;
        self.kubectl_stdin(
            &["wait", "--for=condition=Established", "crd", "--all"],
            b"",
        )?;
        Ok(())
    }

    pub(super) fn kubectl_stdin(&self, args: &[&str], input: &[u8]) -> Result<(), Error> {
        use std::io::Write;
        let mut child = self
            .kubectl()?
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        child.stdin.take().expect("piped").write_all(input)?;
        let out = child.wait_with_output()?;
        if out.status.success() {
            Ok(())
        } else {
            Err(Error::Other(format!(
                "kubectl {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    /// Ready = the mutating webhooks point at this process with a CA bundle, and its
    /// `/readyz` (which includes the webhook server's own check) answers 200.
    async fn wait_kruise_ready(&mut self, addrs: KruiseAddrs) -> Result<(), Error> {
        let started = Instant::now();
        let url = format!("https://127.0.0.1:{}/", addrs.webhook_port);
        let configs: Api<MutatingWebhookConfiguration> = Api::all(self.client());
        loop {
            if let Some(status) = self.kruise_manager.as_mut().and_then(Daemon::exited) {
                return Err(Error::Exited(
                    "kruise-manager",
                    status.to_string(),
                    self.kruise_log_tail(40),
                ));
            }
            let configured = configs
                .get_opt(KRUISE_MUTATING_WEBHOOKS)
                .await?
                .is_some_and(|c| {
                    c.webhooks.unwrap_or_default().iter().all(|w| {
                        w.client_config
                            .url
                            .as_deref()
                            .is_some_and(|u| u.starts_with(&url))
                            && w.client_config.ca_bundle.is_some()
                    })
                });
            if configured && http_ok(addrs.health_port, "/readyz").await {
                return Ok(());
            }
            if started.elapsed() > READY_LIMIT {
                return Err(Error::Other(format!(
                    "kruise-manager was not ready within {READY_LIMIT:?}; its log ends:\n{}",
                    self.kruise_log_tail(40)
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// `GET http://127.0.0.1:<port><path>` answered 200.
pub(super) async fn http_ok(port: u16, path: &str) -> bool {
    http_ok_at(
        std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port),
        path,
    )
    .await
}

/// `GET http://<addr><path>` answered 200.
pub(super) async fn http_ok_at(addr: std::net::SocketAddrV4, path: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    response.starts_with(b"HTTP/1.1 200")
}
