//! The virtual-kubelet library's own node agent (`cmd/virtual-kubelet --provider mock`, built
//! from the module pinned in `hack/k8s-oldest`) registered as a node of a
//! [`ControlPlane`]: what serverless providers run instead of a kubelet. The mock provider runs
//! no containers; the library writes the pods' status (`UpdateStatus`, the whole `.status`).
//!
//! It authenticates as the user `virtual-kubelet` bound to the bootstrap ClusterRole
//! `system:node`, as providers deploy it (a service account with RBAC, not a node identity:
//! the library labels its node `kubernetes.io/role=agent`, which NodeRestriction refuses a
//! `system:node:` user), and serves its kubelet API with a certificate from the test CA. The
//! library labels the node `type=virtual-kubelet` and taints it `virtual-kubelet.io/provider`.
//!
//! [`Provider::Replacer`] is `vk-replacer` (`hack/k8s-oldest/replacer`): the smallest
//! provider built on the library that does not notify, so the library copies its status
//! (Ready, Initialized, PodScheduled only, as azure-aci's) over the pods every 5 s.
//! [`Provider::AciRules`] is the same provider refusing, in `CreatePod`, the pods azure-aci
//! v1.6.4 refuses (`replacer/aci_rules.go`, each rule citing the provider's file and line), with
//! its pods' address on this host's loopback, where a test's servers and sidecars run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as NodeObject;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use super::process::Daemon;
use super::{ControlPlane, Error, VIRTUAL_NODE_NAME, VIRTUAL_NODE_TOKEN, free_port, tools};

/// The user every node agent authenticates as (the audit log's `user.username`).
pub const VIRTUAL_KUBELET_USER: &str = "virtual-kubelet";

/// Which provider the library runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// `virtual-kubelet --provider mock` (library v1.11.0, as azure-aci v1.6.4 runs it):
    /// notifies the library of each pod's status.
    Mock,
    /// The same agent from the newest library the module proxy serves, v1.14.1 (`hack/k8s`).
    MockNewest,
    /// `vk-replacer`: answers GetPodStatus only; the library's 5 s copy.
    Replacer,
    /// `vk-replacer --aci-rules --pod-ip 127.0.0.1`: azure-aci's pod rules, then as `Replacer`.
    AciRules,
    /// `vk-replacer --ready-only --pod-ip 127.0.0.1`: the condition Ready alone, as interLink
    /// reports its pods (no Initialized, which kruise-manager's serverless path waits for).
    ReadyOnly,
}

/// A running virtual-kubelet node agent; stopped when dropped.
#[derive(Debug)]
pub struct VirtualKubelet {
    daemon: Daemon,
    log: PathBuf,
    node: String,
}

impl VirtualKubelet {
    /// Starts the mock provider as node [`VIRTUAL_NODE_NAME`] and waits until it is Ready.
    pub async fn start(cp: &ControlPlane) -> Result<VirtualKubelet, Error> {
        Self::start_node(cp, VIRTUAL_NODE_NAME, Provider::Mock).await
    }

    /// Starts `provider` as node `node` against `cp` and waits until the node is Ready.
    pub async fn start_node(
        cp: &ControlPlane,
        node: &str,
        provider: Provider,
    ) -> Result<VirtualKubelet, Error> {
        bind_agent_user(cp).await?;
        let dir = cp.dir().join(format!("virtual-kubelet-{node}"));
        std::fs::create_dir_all(&dir)?;
        let kubeconfig = dir.join("kubeconfig");
        cp.write_kubeconfig_for_token(&kubeconfig, VIRTUAL_NODE_TOKEN)?;
        let log = dir.join("virtual-kubelet.log");
        let daemon = match provider {
            Provider::Mock => {
                Self::spawn_mock(cp, "virtual-kubelet", node, &dir, &kubeconfig, &log)?
            }
            Provider::MockNewest => {
                Self::spawn_mock(cp, "virtual-kubelet-v1.14.1", node, &dir, &kubeconfig, &log)?
            }
            Provider::Replacer | Provider::AciRules | Provider::ReadyOnly => {
                let mut args = vec![format!("--nodename={node}")];
                match provider {
                    Provider::AciRules => args.push("--aci-rules".to_owned()),
                    Provider::ReadyOnly => args.push("--ready-only".to_owned()),
                    _ => {}
                }
                if provider != Provider::Replacer {
                    args.push("--pod-ip=127.0.0.1".to_owned());
                }
                Daemon::spawn_with_env(
                    "vk-replacer",
                    &tools::tool("vk-replacer")?,
                    &args,
                    &[("KUBECONFIG", kubeconfig.display().to_string())],
                    log.clone(),
                )?
            }
        };
        let mut vk = VirtualKubelet {
            daemon,
            log,
            node: node.to_owned(),
        };
        vk.wait_ready(cp).await?;
        Ok(vk)
    }

    fn spawn_mock(
        cp: &ControlPlane,
        binary: &'static str,
        node: &str,
        dir: &std::path::Path,
        kubeconfig: &std::path::Path,
        log: &std::path::Path,
    ) -> Result<Daemon, Error> {
        // The mock's capacity, keyed by node name (its provider config format).
        let config = dir.join("mock.json");
        std::fs::write(
            &config,
            json!({node: {"cpu": "16", "memory": "64Gi", "pods": "1000"}}).to_string(),
        )?;
        let serving = cp.pki().issue(&["127.0.0.1"])?;
        let (cert, key) = (dir.join("serving.crt"), dir.join("serving.key"));
        std::fs::write(&cert, &serving.cert_pem)?;
        std::fs::write(&key, &serving.key_pem)?;
        let args = vec![
            "--provider=mock".to_owned(),
            format!("--provider-config={}", config.display()),
            format!("--nodename={node}"),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--metrics-addr=127.0.0.1:{}", free_port()?),
        ];
        let env = [
            ("KUBELET_PORT", free_port()?.to_string()),
            ("APISERVER_CERT_LOCATION", cert.display().to_string()),
            ("APISERVER_KEY_LOCATION", key.display().to_string()),
            // The node's InternalIP: where the apiserver would dial its kubelet API.
            ("VKUBELET_POD_IP", "127.0.0.1".to_owned()),
        ];
        Daemon::spawn_with_env(
            binary,
            &tools::tool(binary)?,
            &args,
            &env,
            log.to_path_buf(),
        )
    }

    async fn wait_ready(&mut self, cp: &ControlPlane) -> Result<(), Error> {
        const LIMIT: Duration = Duration::from_secs(60);
        let nodes: Api<NodeObject> = Api::all(cp.client());
        let started = Instant::now();
        loop {
            if let Some(status) = self.daemon.exited() {
                return Err(Error::Other(format!(
                    "virtual-kubelet exited ({status}); its log ends:\n{}",
                    self.log_tail(30)
                )));
            }
            let node = nodes.get_opt(&self.node).await?;
            let ready = node
                .and_then(|n| n.status)
                .and_then(|s| s.conditions)
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if ready {
                return Ok(());
            }
            if started.elapsed() > LIMIT {
                return Err(Error::Other(format!(
                    "node {} was not Ready within {LIMIT:?}; its agent's log ends:\n{}",
                    self.node,
                    self.log_tail(30)
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The last lines of its log (for failure messages).
    pub fn log_tail(&self, lines: usize) -> String {
        self.daemon.log_tail(lines)
    }

    /// Its whole log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The node agents' user may act as a node (`system:node`) and check its API's callers
/// (`system:auth-delegator`), as providers' deployments bind them; one pair of bindings serves
/// every agent of the control plane.
pub(crate) async fn bind_agent_user(cp: &ControlPlane) -> Result<(), Error> {
    for (name, role) in [
        ("virtual-kubelet", "system:node"),
        ("virtual-kubelet:auth-delegator", "system:auth-delegator"),
    ] {
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": VIRTUAL_KUBELET_USER}]
        }))?;
        match Api::<ClusterRoleBinding>::all(cp.client())
            .create(&PostParams::default(), &binding)
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            other => {
                other?;
            }
        }
    }
    Ok(())
}
