//! OpenKruise Game's manager (kruise-game, built from `hack/kruise-game`) on a [`ControlPlane`]
//! on a node network, installed as its own manifests describe (`config/default`: the
//! GameServer and GameServerSet CRDs, its ClusterRole and ServiceAccount, its webhook
//! configurations and Services) and run as a process with that ServiceAccount's token, beside
//! kruise-manager (whose Advanced StatefulSet and PodProbeMarker it builds on).
//!
//! Its webhooks are reached as in a cluster: kruise-game generates its serving certificate
//! for its Service's name and points its webhook configurations at that Service; the
//! Service here has no selector and one EndpointSlice with the host's node-network address
//! (the apiserver's host routes Service addresses to the node, where kube-proxy forwards
//! them back to this process). Unlike kruise-manager it has no local-development URL mode.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

use super::kruise::{http_ok, rendered_manifests};
use super::process::Daemon;
use super::{ControlPlane, Error, free_port, tools};

/// kruise-game's namespace (its manifests' `namespace:`).
pub const KRUISE_GAME_NAMESPACE: &str = "kruise-game-system";
/// Its ServiceAccount there, bound to `kruise-game-manager-role` by the manifests.
const SERVICE_ACCOUNT: &str = "kruise-game-controller-manager";
/// The Service its webhook configurations name.
const WEBHOOK_SERVICE: &str = "kruise-game-webhook-service";
/// The mutating webhook configuration it writes at start.
const MUTATING_WEBHOOKS: &str = "kruise-game-mutating-webhook";
/// How the manifests deploy it (the Deployment; cert-manager's Issuer and Certificate, which
/// its own certificate generation replaces): here the process is started by the test.
const NOT_INSTALLED: [&str; 3] = ["Deployment", "Issuer", "Certificate"];
const READY_LIMIT: Duration = Duration::from_secs(180);

/// The running kruise-game manager; stopped when dropped.
#[derive(Debug)]
pub struct KruiseGame {
    daemon: Daemon,
}

impl KruiseGame {
    /// Installs kruise-game's manifests on `cp` (whose apiserver listens on `host`, the host
    /// side of a node network) and starts its manager; returns once its webhooks are
    /// configured and it reports ready.
    pub async fn start(cp: &ControlPlane, host: Ipv4Addr) -> Result<KruiseGame, Error> {
        let webhook_port = free_port()?;
        install(cp)?;
        route_webhook_service(cp, host, webhook_port).await?;
        let token = cp
            .service_account_token(KRUISE_GAME_NAMESPACE, SERVICE_ACCOUNT)
            .await?;
        let dir = cp.dir().join("kruise-game");
        std::fs::create_dir_all(dir.join("certs"))?;
        let kubeconfig = dir.join("kubeconfig");
        cp.write_kubeconfig_for_token(&kubeconfig, &token)?;
        // No cloud provider's network plugins: an empty configuration registers none.
        let provider_config = dir.join("config.toml");
        std::fs::write(&provider_config, "")?;
        let health_port = free_port()?;
        let args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-elect=false".to_owned(),
            format!("--metrics-bind-address=127.0.0.1:{}", free_port()?),
            format!("--health-probe-bind-address=127.0.0.1:{health_port}"),
            format!("--scale-server-bind-address=127.0.0.1:{}", free_port()?),
            format!("--webhook-port={webhook_port}"),
            format!("--webhook-server-certs-dir={}", dir.join("certs").display()),
            format!("--provider-config={}", provider_config.display()),
        ];
        let env = [("KUBECONFIG", kubeconfig.display().to_string())];
        let daemon = Daemon::spawn_with_env(
            "kruise-game-manager",
            &tools::tool("kruise-game-manager")?,
            &args,
            &env,
            dir.join("kruise-game-manager.log"),
        )?;
        let mut game = KruiseGame { daemon };
        game.wait_ready(cp, health_port).await?;
        Ok(game)
    }

    /// The last lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.daemon.log_tail(lines)
    }

    /// Ready = its mutating webhook configuration names its Service with a CA bundle, its
    /// `/readyz` answers 200, and its Service is routed: a connection to the Service's address
    /// reaches it (kube-proxy programs a new Service within seconds, more on a loaded machine;
    /// until then the apiserver's calls time out).
    async fn wait_ready(&mut self, cp: &ControlPlane, health_port: u16) -> Result<(), Error> {
        let started = Instant::now();
        let configs: Api<MutatingWebhookConfiguration> = Api::all(cp.client());
        loop {
            if let Some(status) = self.daemon.exited() {
                return Err(Error::Exited(
                    "kruise-game-manager",
                    status.to_string(),
                    self.log_tail(40),
                ));
            }
            let configured = configs
                .get_opt(MUTATING_WEBHOOKS)
                .await?
                .and_then(|c| c.webhooks)
                .is_some_and(|hooks| {
                    !hooks.is_empty()
                        && hooks.iter().all(|w| {
                            w.client_config
                                .service
                                .as_ref()
                                .is_some_and(|s| s.name == WEBHOOK_SERVICE)
                                && w.client_config.ca_bundle.is_some()
                        })
                });
            if configured && http_ok(health_port, "/readyz").await && service_routed(cp).await {
                return Ok(());
            }
            if started.elapsed() > READY_LIMIT {
                return Err(Error::Other(format!(
                    "kruise-game-manager was not ready within {READY_LIMIT:?}; its log ends:\n{}",
                    self.log_tail(40)
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A TCP connection to the webhook Service's cluster address and port opens.
async fn service_routed(cp: &ControlPlane) -> bool {
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(cp.client(), KRUISE_GAME_NAMESPACE);
    let Ok(service) = services.get(WEBHOOK_SERVICE).await else {
        return false;
    };
    let spec = service.spec.unwrap_or_default();
    let (Some(ip), Some(port)) = (
        spec.cluster_ip,
        spec.ports.and_then(|p| p.first().map(|p| p.port)),
    ) else {
        return false;
    };
    let connect = tokio::net::TcpStream::connect(format!("{ip}:{port}"));
    matches!(
        tokio::time::timeout(Duration::from_secs(1), connect).await,
        Ok(Ok(_))
    )
}

/// Everything of `config/default` but how kruise-game itself is deployed; the webhook
/// Service without its selector (no pod backs it here).
fn install(cp: &ControlPlane) -> Result<(), Error> {
    let path = rendered_manifests("kruise-game", "kruise-game.yaml")?;
    cp.install_manifests(&path, &NOT_INSTALLED, |mut d| {
        if d["kind"] == "Service" && d["metadata"]["name"] == WEBHOOK_SERVICE {
            d["spec"]
                .as_object_mut()
                .map(|spec| spec.remove("selector"));
        }
        d
    })
}

/// The webhook Service's one endpoint: this host's node-network address and the port the
/// process serves on, for each of the Service's ports.
async fn route_webhook_service(cp: &ControlPlane, host: Ipv4Addr, port: u16) -> Result<(), Error> {
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(cp.client(), KRUISE_GAME_NAMESPACE);
    let service = services.get(WEBHOOK_SERVICE).await?;
    let ports: Vec<Value> = service
        .spec
        .and_then(|s| s.ports)
        .unwrap_or_default()
        .into_iter()
        .map(|p| json!({"name": p.name.unwrap_or_default(), "port": port, "protocol": "TCP"}))
        .collect();
    let slice: EndpointSlice = serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{WEBHOOK_SERVICE}-host"),
            "namespace": KRUISE_GAME_NAMESPACE,
            "labels": {
                "kubernetes.io/service-name": WEBHOOK_SERVICE,
                "endpointslice.kubernetes.io/managed-by": "podprobe-testkit",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host.to_string()], "conditions": {"ready": true}}],
        "ports": ports,
    }))?;
    Api::<EndpointSlice>::namespaced(cp.client(), KRUISE_GAME_NAMESPACE)
        .create(&PostParams::default(), &slice)
        .await?;
    Ok(())
}
