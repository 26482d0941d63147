//! A real node for the tests: containerd (CRI) running pods with runc, a kubelet registered
//! against the test's [`ControlPlane`] (or, with [`NodeOptions::virtual_agent`], a
//! virtual-kubelet provider that runs the pods on the same containerd: [`virtual_agent`]), and
//! kube-proxy routing the `kubernetes` Service to the apiserver, all in a network namespace of
//! the node's own ([`NodeNetwork`]) with a CNI bridge for the pods. Images come from
//! [`images`]: built here, imported, never pulled.
//!
//! ```no_run
//! # async fn demo() -> Result<(), testkit::real::Error> {
//! use testkit::real::{ControlPlane, Node, NodeNetwork, NodeOptions};
//! let network = NodeNetwork::create()?;
//! let mut cp = ControlPlane::start_on(network.host_ip()).await?;
//! let node = Node::start(&mut cp, network, NodeOptions::default()).await?;
//! // pods with `spec.nodeName: node-1` run; `node.stop(&cp).await` tears it down.
//! # Ok(()) }
//! ```
//!
//! There is no scheduler: pods name the node. Stopping deletes the node's pods through the
//! apiserver first (so the kubelet stops them as in a drain), then stops the daemons, and makes
//! sure no task, shim, mount or cgroup of the node is left ([`Leftovers`]).

mod cleanup;
mod config;
pub mod images;
mod kruise_daemon;
mod network;
pub mod virtual_agent;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node as NodeObject, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

pub use cleanup::Leftovers;
pub use config::{CLUSTER_POD_CIDR, KUBELET_PORT};
pub use kruise_daemon::KruiseDaemon;
pub use network::NodeNetwork;
pub use network::ServiceRange;
pub use virtual_agent::{Library, VirtualAgent};

use super::process::Daemon;
use super::{ControlPlane, Error, KUBE_PROXY_TOKEN, NODE_NAME, NODE_TOKEN, tools};

/// How long the node may take to become Ready, and its pods to go away on stop.
const LIMIT: Duration = Duration::from_secs(120);

/// What kind of node to start.
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    /// Labels the kubelet registers the node with (e.g. `type=virtual-kubelet`).
    pub labels: BTreeMap<String, String>,
    /// kube-controller-manager controllers to run besides those a node's pods need
    /// (`serviceaccount`, `root-ca-cert-publisher`).
    pub controllers: Vec<&'static str>,
    /// A virtual-kubelet provider that runs the pods on the node's containerd instead of a
    /// kubelet ([`VirtualAgent`]); `None`: a kubelet.
    pub virtual_agent: Option<VirtualAgent>,
}

/// A running node; stop it with [`Node::stop`] (dropping it cleans up too, without waiting
/// for the apiserver).
#[derive(Debug)]
pub struct Node {
    // Field order is drop order: the node's daemons, its network, its directory.
    kube_proxy: Option<Daemon>,
    /// The kubelet, or the virtual node's provider.
    kubelet: Option<Daemon>,
    containerd: Option<Daemon>,
    name: &'static str,
    /// The agent is a virtual node's provider, not a kubelet.
    virtual_agent: bool,
    /// Set once [`Node::teardown`] ran (by `stop`), so dropping does not repeat it.
    torn_down: bool,
    network: NodeNetwork,
    dir: tempfile::TempDir,
}

/// Every kubelet on a host serves its device-plugin socket at one fixed path
/// (`/var/lib/kubelet/device-plugins/kubelet.sock`, whatever `--root-dir` says) and removes the
/// sockets there as it starts: two starting at once can take it from each other, and the one
/// left without it exits. Node tests run side by side, so kubelets start one at a time, each
/// holding this lock (released if the test dies) until its node is Ready.
async fn kubelet_start_lock() -> Result<std::fs::File, Error> {
    let path = std::env::temp_dir().join("podprobe-kubelet-start.lock");
    tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        file.lock()?;
        Ok(file)
    })
    .await
    .map_err(|e| Error::Other(e.to_string()))?
}

impl Node {
    /// Starts containerd (and imports the images), kube-proxy, the kubelet (or the virtual
    /// node's provider) and the controllers pods need (kube-controller-manager), and waits
    /// until the node is Ready and the `kubernetes` Service is routed.
    pub async fn start(
        cp: &mut ControlPlane,
        network: NodeNetwork,
        options: NodeOptions,
    ) -> Result<Node, Error> {
        let images = tokio::task::spawn_blocking(images::build)
            .await
            .map_err(|e| Error::Other(e.to_string()))??;
        let dir = tempfile::Builder::new()
            .prefix("podprobe-node-")
            .tempdir()?;
        let name = options
            .virtual_agent
            .as_ref()
            .map_or(NODE_NAME, VirtualAgent::node_name);
        let mut node = Node {
            kube_proxy: None,
            kubelet: None,
            containerd: None,
            name,
            virtual_agent: options.virtual_agent.is_some(),
            torn_down: false,
            network,
            dir,
        };
        node.start_containerd()?;
        node.wait_containerd().await?;
        for image in &images {
            node.import(image)?;
        }
        allow_delegated_auth(cp).await?;
        let mut controllers = vec!["serviceaccount", "root-ca-cert-publisher"];
        controllers.extend(&options.controllers);
        cp.start_controller_manager(&controllers)?;
        node.start_kube_proxy(cp)?;
        if let Some(agent) = &options.virtual_agent {
            super::virtual_kubelet::bind_agent_user(cp).await?;
            node.start_virtual_agent(cp, agent)?;
            node.wait_ready(cp).await?;
            return Ok(node);
        }
        let one_kubelet_starting = kubelet_start_lock().await?;
        node.start_kubelet(cp, &options)?;
        node.wait_ready(cp).await?;
        drop(one_kubelet_starting);
        Ok(node)
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn network(&self) -> &NodeNetwork {
        &self.network
    }

    /// The node's cgroup root (in every v1 hierarchy), under which the kubelet puts pods.
    pub fn cgroup_root(&self) -> String {
        format!("/{}", self.network.netns())
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    /// `ctr` against this node's containerd, in the CRI namespace (`k8s.io`).
    pub fn ctr(&self) -> Command {
        let mut command = Command::new("ctr");
        command
            .arg("--address")
            .arg(self.socket())
            .args(["--namespace", "k8s.io"]);
        command
    }

    fn start_containerd(&mut self) -> Result<(), Error> {
        let dir = self.dir.path();
        std::fs::create_dir_all(dir.join("cni"))?;
        std::fs::write(
            dir.join("cni/10-podprobe.conflist"),
            config::cni(dir, &self.network.pod_subnet()),
        )?;
        std::fs::write(
            dir.join("containerd.toml"),
            config::containerd(dir, &self.socket()),
        )?;
        let args = vec![format!(
            "--config={}",
            dir.join("containerd.toml").display()
        )];
        self.containerd = Some(self.spawn("containerd", Path::new("containerd"), &args)?);
        Ok(())
    }

    async fn wait_containerd(&mut self) -> Result<(), Error> {
        let started = Instant::now();
        loop {
            if self.ctr().arg("version").output()?.status.success() {
                return Ok(());
            }
            self.check_alive()?;
            if started.elapsed() > LIMIT {
                return Err(Error::Other(
                    "containerd did not answer within 2 minutes".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn import(&self, image: &images::ImageArchive) -> Result<(), Error> {
        let (name, _) = image.reference.rsplit_once(':').expect("a tag");
        let out = self
            .ctr()
            .args([
                "images",
                "import",
                "--snapshotter",
                "native",
                "--base-name",
                name,
            ])
            .arg(&image.archive)
            .output()?;
        if !out.status.success() {
            return Err(Error::Other(format!(
                "ctr images import {}: {}",
                image.archive.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// Gives the imported image `reference` a second name, `name`, as if a registry served it
    /// there: a manifest naming a released image (the chart's defaults) then runs what was
    /// built here, with no value changed (the kubelet pulls nothing with `IfNotPresent`).
    pub fn tag_image(&self, reference: &str, name: &str) -> Result<(), Error> {
        let out = self
            .ctr()
            .args(["images", "tag", "--force", reference, name])
            .output()?;
        if !out.status.success() {
            return Err(Error::Other(format!(
                "ctr images tag {reference} {name}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    fn start_kube_proxy(&mut self, cp: &ControlPlane) -> Result<(), Error> {
        let kubeconfig = self.dir.path().join("kube-proxy.kubeconfig");
        cp.write_kubeconfig_for_token(&kubeconfig, KUBE_PROXY_TOKEN)?;
        let args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--hostname-override={}", self.name),
            "--proxy-mode=iptables".to_owned(),
            format!("--cluster-cidr={CLUSTER_POD_CIDR}"),
            // The conntrack table size is a host-wide sysctl: leave it alone.
            "--conntrack-max-per-core=0".to_owned(),
            "--v=1".to_owned(),
        ];
        self.kube_proxy = Some(self.spawn("kube-proxy", &tools::tool("kube-proxy")?, &args)?);
        Ok(())
    }

    fn start_kubelet(&mut self, cp: &ControlPlane, options: &NodeOptions) -> Result<(), Error> {
        let dir = self.dir.path();
        cleanup::create_cgroup_root(&self.cgroup_root())?;
        let kubeconfig = dir.join("kubelet.kubeconfig");
        cp.write_kubeconfig_for_token(&kubeconfig, NODE_TOKEN)?;
        let ca = dir.join("ca.crt");
        std::fs::write(&ca, cp.pki().ca_pem())?;
        let config = config::kubelet(
            dir,
            &self.socket(),
            self.network.node_ip(),
            &self.cgroup_root(),
            &ca,
        );
        std::fs::write(dir.join("kubelet.yaml"), config)?;
        let labels: Vec<String> = options
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let mut args = vec![
            format!("--config={}", dir.join("kubelet.yaml").display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", dir.join("kubelet").display()),
            format!("--cert-dir={}", dir.join("kubelet-pki").display()),
            format!("--hostname-override={NODE_NAME}"),
            format!("--node-ip={}", self.network.node_ip()),
            "--v=2".to_owned(),
        ];
        if !labels.is_empty() {
            args.push(format!("--node-labels={}", labels.join(",")));
        }
        self.kubelet = Some(self.spawn("kubelet", &tools::tool("kubelet")?, &args)?);
        Ok(())
    }

    fn start_virtual_agent(
        &mut self,
        cp: &ControlPlane,
        agent: &VirtualAgent,
    ) -> Result<(), Error> {
        cleanup::create_cgroup_root(&self.cgroup_root())?;
        let command = agent.command(
            cp,
            self.dir.path(),
            &self.socket(),
            self.network.node_ip(),
            &self.cgroup_root(),
        )?;
        let log = self.dir.path().join("vk-cri.log");
        let daemon = Daemon::spawn_in(
            "vk-cri",
            Some(self.network.netns()),
            &command.program,
            &command.args,
            &command.env,
            log,
        )?;
        self.kubelet = Some(daemon);
        Ok(())
    }

    /// One of the node's daemons, in its network namespace, logging to `<dir>/<name>.log`.
    fn spawn(&self, name: &'static str, program: &Path, args: &[String]) -> Result<Daemon, Error> {
        let log = self.dir.path().join(format!("{name}.log"));
        Daemon::spawn_in(name, Some(self.network.netns()), program, args, &[], log)
    }

    fn check_alive(&mut self) -> Result<(), Error> {
        for daemon in [
            &mut self.containerd,
            &mut self.kubelet,
            &mut self.kube_proxy,
        ]
        .into_iter()
        .flatten()
        {
            if let Some(status) = daemon.exited() {
                return Err(Error::Exited(
                    daemon.name(),
                    status.to_string(),
                    daemon.log_tail(30),
                ));
            }
        }
        Ok(())
    }

    async fn wait_ready(&mut self, cp: &ControlPlane) -> Result<(), Error> {
        let nodes: Api<NodeObject> = Api::all(cp.client());
        let started = Instant::now();
        loop {
            self.check_alive()?;
            let ready = nodes
                .get_opt(self.name)
                .await?
                .is_some_and(|n| is_ready(&n));
            if ready && self.service_routed()? {
                return Ok(());
            }
            if started.elapsed() > LIMIT {
                let kubelet = self
                    .kubelet
                    .as_ref()
                    .map(|k| k.log_tail(30))
                    .unwrap_or_default();
                return Err(Error::Other(format!(
                    "node {} was not Ready with the kubernetes Service routed within {LIMIT:?}; \
                     its agent's log ends:\n{kubelet}",
                    self.name
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// kube-proxy has written the `kubernetes` Service's rule into the node's iptables.
    fn service_routed(&self) -> Result<bool, Error> {
        let rules = self.network.exec(&["iptables-save", "-t", "nat"])?;
        Ok(rules.contains("default/kubernetes:https") && rules.contains("KUBE-SEP-"))
    }

    /// The last lines of the kubelet's log, or the virtual node's provider's (for failure
    /// messages).
    pub fn kubelet_log_tail(&self, lines: usize) -> String {
        self.kubelet
            .as_ref()
            .map(|k| k.log_tail(lines))
            .unwrap_or_default()
    }

    /// Drains the node: cordons it (a scheduler places no replacement there), deletes its pods
    /// through the apiserver and waits until the kubelet has stopped them; then stops the
    /// daemons and removes what they left. Returns what had to be removed by force after the
    /// daemons stopped (all empty on a clean stop).
    pub async fn stop(mut self, cp: &ControlPlane) -> Result<Leftovers, Error> {
        let cordon = json!({"spec": {"unschedulable": true}});
        Api::<NodeObject>::all(cp.client())
            .patch(self.name, &PatchParams::default(), &Patch::Merge(&cordon))
            .await?;
        let pods: Api<Pod> = Api::all(cp.client());
        let on_node = ListParams::default().fields(&format!("spec.nodeName={}", self.name));
        for pod in pods.list(&on_node).await? {
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let name = pod.metadata.name.clone().unwrap_or_default();
            let _ = Api::<Pod>::namespaced(cp.client(), &namespace)
                .delete(&name, &DeleteParams::default().grace_period(0))
                .await;
        }
        let started = Instant::now();
        while !pods.list(&on_node).await?.items.is_empty() {
            if started.elapsed() > LIMIT {
                return Err(Error::Other(format!(
                    "the node agent did not finish deleting node {}'s pods within {LIMIT:?}",
                    self.name
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // A pod deleted with no grace period is gone from the API at once, before a virtual
        // node's provider has stopped it: wait until the runtime runs none of the node's tasks.
        let started = Instant::now();
        while self.virtual_agent && !self.tasks()?.is_empty() && started.elapsed() < LIMIT {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The API object goes when the containers have stopped; the volume manager unmounts
        // the pods' volumes a moment later.
        let pods_dir = self.dir.path().join("kubelet/pods");
        let started = Instant::now();
        while !cleanup::mounts_under(&pods_dir).is_empty() && started.elapsed() < LIMIT {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(self.teardown())
    }

    /// The ids of the tasks the node's containerd runs.
    fn tasks(&self) -> Result<Vec<String>, Error> {
        let out = self.ctr().args(["tasks", "list", "--quiet"]).output()?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect())
    }

    /// Stops the daemons and removes tasks, shims, mounts and cgroups left behind.
    fn teardown(&mut self) -> Leftovers {
        self.torn_down = true;
        self.kube_proxy.take();
        self.kubelet.take();
        let mut leftovers = Leftovers::default();
        if self.containerd.is_some() {
            leftovers.tasks = cleanup::remove_tasks(|| self.ctr());
        }
        self.containerd.take();
        leftovers.shims = cleanup::kill_shims(&self.socket());
        let kubelet_root = self.dir.path().join("kubelet");
        leftovers.mounts = cleanup::unmount_under(self.dir.path(), &[&kubelet_root]);
        leftovers.cgroups = cleanup::remove_cgroups(&self.cgroup_root());
        leftovers
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if !self.torn_down {
            self.teardown();
        }
    }
}

fn is_ready(node: &NodeObject) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The kubelet checks callers of its API (the apiserver's exec, logs) with TokenReview and
/// SubjectAccessReview; the `system:auth-delegator` role allows those to group `system:nodes`
/// (kubeadm grants the same).
async fn allow_delegated_auth(cp: &ControlPlane) -> Result<(), Error> {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "podprobe-test:nodes-auth-delegator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "system:auth-delegator"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": "system:nodes"}]
    }))?;
    match Api::<ClusterRoleBinding>::all(cp.client())
        .create(&PostParams::default(), &binding)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
