//! A long-running child (etcd, kube-apiserver, kruise-manager, a node's daemons) that cannot outlive the test: killed on drop
//! (also while a panicking test unwinds), and killed by the kernel if the test process dies
//! first (`setpriv --pdeathsig KILL`, util-linux, so no `unsafe` pre-exec hook is needed).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::Error;

#[derive(Debug)]
pub struct Daemon {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// Starts `program args...` with its stdout and stderr in `log`.
    pub fn spawn(
        name: &'static str,
        program: &Path,
        args: &[String],
        log: PathBuf,
    ) -> Result<Daemon, Error> {
        Self::spawn_with_env(name, program, args, &[], log)
    }

    /// [`Daemon::spawn`] with `env` added to the test's environment.
    pub fn spawn_with_env(
        name: &'static str,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
        log: PathBuf,
    ) -> Result<Daemon, Error> {
        Self::spawn_in(name, None, program, args, env, log)
    }

    /// [`Daemon::spawn_with_env`] in the network namespace `netns` (a name under
    /// `/run/netns`) when given: `nsenter --net` switches only that namespace, so the daemon
    /// shares the test's mounts and cgroups (a kubelet's volumes must be visible to runc).
    pub fn spawn_in(
        name: &'static str,
        netns: Option<&str>,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
        log: PathBuf,
    ) -> Result<Daemon, Error> {
        let out = File::create(&log)?;
        let err = out.try_clone()?;
        let mut command = Command::new("setpriv");
        command.args(["--pdeathsig", "KILL", "--"]);
        if let Some(netns) = netns {
            command
                .arg("nsenter")
                .arg(format!("--net=/run/netns/{netns}"))
                .arg("--");
        }
        let child = command
            .arg(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| Error::Start(name, format!("{}: {e}", program.display())))?;
        Ok(Daemon { name, child, log })
    }

    /// `Some(status)` when the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last `lines` lines of its log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        // kube-apiserver prints every flag at start; they would push the reason out of view.
        let all: Vec<&str> = text.lines().filter(|l| !l.contains("] FLAG: --")).collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The daemon's process id (`setpriv` and `nsenter` exec it in place), for reading its
    /// CPU and memory from /proc.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
