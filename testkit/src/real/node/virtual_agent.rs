//! A node whose agent is a virtual-kubelet provider that runs its pods (`vk-cri`, built from
//! `hack/k8s-oldest/vkcri` on the library v1.11.0 and v1.14.1): instead of a kubelet, the
//! provider drives the node's containerd through CRI, so each pod is a sandbox with its own
//! network namespace on the node's CNI bridge, its containers real runc containers. It
//! registers the node as virtual nodes register (`type=virtual-kubelet`, the taint
//! `virtual-kubelet.io/provider`), authenticates as the user `virtual-kubelet` bound to
//! `system:node` (as providers are deployed), and serves the kubelet API (exec, logs) on the
//! node's address with a certificate from the test CA, checking callers with TokenReview and
//! SubjectAccessReview.

use std::path::Path;

use super::super::{ControlPlane, Error, VIRTUAL_NODE_TOKEN, tools};
use super::config::KUBELET_PORT;

/// The library version the provider is built on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Library {
    /// v1.14.1, the newest the module proxy serves (`hack/k8s`).
    #[default]
    V1_14,
    /// v1.11.0, the version azure-aci v1.6.4 runs on (`hack/k8s-oldest`).
    V1_11,
}

/// The providers' behaviours, chosen per node (`vk-cri --help`). Every behaviour builds the
/// pods' status from its own state and the library writes it whole, as every provider on the
/// library does; `status_interval` is how often it is sent again (azure-aci: 5 s).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VirtualAgent {
    pub library: Library,
    /// azure-aci v1.6.4: its pod rules, volumes and exec (one command string, no exit status).
    pub aci: bool,
    /// The condition Ready alone, as interLink reports it.
    pub ready_only: bool,
    /// Exec calls allowed a minute (Alibaba ECI: 500).
    pub exec_quota: Option<u32>,
    /// Where the provider reaches the apiserver, over TLS with a certificate from the control
    /// plane's CA: a [`FaultProxy`](super::super::FaultProxy) on the node network's host side
    /// ([`FaultProxy::start_on`](super::super::FaultProxy::start_on)) that changes what it
    /// sees. `None`: the apiserver itself.
    pub apiserver: Option<String>,
}

impl VirtualAgent {
    /// The node's name: the provider's kind and library.
    pub fn node_name(&self) -> &'static str {
        match (self.aci, self.ready_only, self.library) {
            (true, _, Library::V1_11) => "aci-cri-v1-11",
            (true, _, Library::V1_14) => "aci-cri-v1-14",
            (false, true, Library::V1_11) => "interlink-cri-v1-11",
            (false, true, Library::V1_14) => "interlink-cri-v1-14",
            (false, false, Library::V1_11) => "vk-cri-v1-11",
            (false, false, Library::V1_14) => "vk-cri-v1-14",
        }
    }

    fn binary(&self) -> &'static str {
        match self.library {
            Library::V1_11 => "vk-cri",
            Library::V1_14 => "vk-cri-v1.14.1",
        }
    }

    /// Writes the agent's kubeconfig and serving certificate into `dir`; the program and its
    /// arguments.
    pub(super) fn command(
        &self,
        cp: &ControlPlane,
        dir: &Path,
        socket: &Path,
        node_ip: std::net::Ipv4Addr,
        cgroup_root: &str,
    ) -> Result<AgentCommand, Error> {
        let kubeconfig = dir.join("vk-cri.kubeconfig");
        let ca = dir.join("ca.crt");
        std::fs::write(&ca, cp.pki().ca_pem())?;
        match &self.apiserver {
            None => cp.write_kubeconfig_for_token(&kubeconfig, VIRTUAL_NODE_TOKEN)?,
            Some(url) => std::fs::write(
                &kubeconfig,
                serde_json::json!({
                    "apiVersion": "v1", "kind": "Config",
                    "clusters": [{"name": "proxy", "cluster": {
                        "server": url, "certificate-authority": ca.display().to_string()}}],
                    "users": [{"name": "virtual-kubelet", "user": {"token": VIRTUAL_NODE_TOKEN}}],
                    "contexts": [{"name": "proxy",
                                  "context": {"cluster": "proxy", "user": "virtual-kubelet"}}],
                    "current-context": "proxy",
                })
                .to_string(),
            )?,
        }
        let serving = cp.pki().issue(&[&node_ip.to_string()])?;
        let (cert, key) = (dir.join("vk-cri.crt"), dir.join("vk-cri.key"));
        std::fs::write(&cert, &serving.cert_pem)?;
        std::fs::write(&key, &serving.key_pem)?;
        let mut args = vec![
            format!("--nodename={}", self.node_name()),
            format!("--cri={}", socket.display()),
            format!("--node-ip={node_ip}"),
            format!("--port={KUBELET_PORT}"),
            format!("--root={}", dir.join("vk-cri").display()),
            format!("--cgroup-parent={cgroup_root}"),
            format!("--cert={}", cert.display()),
            format!("--key={}", key.display()),
            format!("--client-ca={}", ca.display()),
        ];
        if self.aci {
            args.push("--aci".to_owned());
        }
        if self.ready_only {
            args.push("--ready-only".to_owned());
        }
        if let Some(quota) = self.exec_quota {
            args.push(format!("--exec-quota={quota}"));
        }
        Ok(AgentCommand {
            program: tools::tool(self.binary())?,
            args,
            env: vec![("KUBECONFIG", kubeconfig.display().to_string())],
        })
    }
}

/// How to start the provider.
pub(super) struct AgentCommand {
    pub program: std::path::PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(&'static str, String)>,
}
