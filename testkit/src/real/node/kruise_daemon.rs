//! OpenKruise's kruise-daemon on a [`Node`], as its DaemonSet runs it: in the node's network
//! namespace (its tcp and http probes reach pod IPs from there), with the node's containerd
//! socket where the DaemonSet mounts the host's `/var/run` (`/hostvarrun`: the only place it
//! looks for a CRI socket), `NODE_NAME` set, and the token of its own ServiceAccount from
//! Kruise's manifests (`kruise-daemon` in `kruise-system`, bound to `kruise-daemon-role`),
//! which [`ControlPlane::start_kruise_manager`] installs.
//!
//! The bind mount is made in a mount namespace of the daemon's own (`unshare --mount`), so
//! parallel tests' daemons each see their own node's socket; the host keeps an empty
//! `/hostvarrun` as the mount point.

use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use super::super::kruise::http_ok_at;
use super::super::process::Daemon;
use super::super::{ControlPlane, Error, KRUISE_NAMESPACE, NODE_NAME, free_port, tools};
use super::Node;

/// Its ServiceAccount, from Kruise's manifests.
const SERVICE_ACCOUNT: &str = "kruise-daemon";
/// Where the DaemonSet mounts the host's `/var/run`.
const HOST_VAR_RUN: &str = "/hostvarrun";
const READY_LIMIT: Duration = Duration::from_secs(60);

/// The running kruise-daemon; stopped when dropped (drop it before stopping the node).
#[derive(Debug)]
pub struct KruiseDaemon {
    daemon: Daemon,
}

impl KruiseDaemon {
    /// The last lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.daemon.log_tail(lines)
    }

    /// Its process id (the `unshare` it was started as execs into it).
    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }
}

impl Node {
    /// Starts kruise-daemon for this node (Kruise's manifests must be installed: see the
    /// module's text) with only what its PodProbeMarker prober needs: `DaemonWatchingPod` off
    /// (it would annotate every pod with its containers' metadata), no pprof listener. Returns
    /// once its `/healthz` answers.
    pub async fn start_kruise_daemon(&self, cp: &ControlPlane) -> Result<KruiseDaemon, Error> {
        let token = cp
            .service_account_token(KRUISE_NAMESPACE, SERVICE_ACCOUNT)
            .await?;
        let dir = self.dir().join("kruise-daemon");
        std::fs::create_dir_all(&dir)?;
        let kubeconfig = dir.join("kubeconfig");
        cp.write_kubeconfig_for_token(&kubeconfig, &token)?;
        std::fs::create_dir_all(HOST_VAR_RUN)?;
        let addr = SocketAddrV4::new(self.network().node_ip(), free_port()?);
        let socket_dir = self
            .socket()
            .parent()
            .expect("in the node's dir")
            .to_owned();
        let args = vec![
            "--mount".to_owned(),
            "--propagation".to_owned(),
            "private".to_owned(),
            "--".to_owned(),
            "sh".to_owned(),
            "-c".to_owned(),
            format!("mount --bind \"$1\" {HOST_VAR_RUN} && shift && exec \"$@\""),
            "sh".to_owned(),
            socket_dir.display().to_string(),
            tools::tool("kruise-daemon")?.display().to_string(),
            format!("--addr={addr}"),
            "--enable-pprof=false".to_owned(),
            "--feature-gates=DaemonWatchingPod=false".to_owned(),
            "--v=2".to_owned(),
        ];
        let env = [
            ("NODE_NAME", NODE_NAME.to_owned()),
            ("KUBECONFIG", kubeconfig.display().to_string()),
        ];
        let mut daemon = Daemon::spawn_in(
            "kruise-daemon",
            Some(self.network().netns()),
            std::path::Path::new("unshare"),
            &args,
            &env,
            dir.join("kruise-daemon.log"),
        )?;
        let started = Instant::now();
        while !http_ok_at(addr, "/healthz").await {
            if let Some(status) = daemon.exited() {
                return Err(Error::Exited(
                    "kruise-daemon",
                    status.to_string(),
                    daemon.log_tail(40),
                ));
            }
            if started.elapsed() > READY_LIMIT {
                return Err(Error::Other(format!(
                    "kruise-daemon did not answer /healthz within {READY_LIMIT:?}; its log ends:\n{}",
                    daemon.log_tail(40)
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(KruiseDaemon { daemon })
    }
}
