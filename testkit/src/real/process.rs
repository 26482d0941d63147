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
    /// How it was started, to start it again ([`Daemon::start_again`]).
    command: Vec<std::ffi::OsString>,
    env: Vec<(String, String)>,
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
        let mut command: Vec<std::ffi::OsString> =
            vec!["--pdeathsig".into(), "KILL".into(), "--".into()];
        if let Some(netns) = netns {
            command.extend([
                "nsenter".into(),
                format!("--net=/run/netns/{netns}").into(),
                "--".into(),
            ]);
        }
        command.push(program.into());
        command.extend(args.iter().map(Into::into));
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        let child = Self::launch(name, &command, &env, File::create(&log)?)?;
        Ok(Daemon {
            name,
            child,
            log,
            command,
            env,
        })
    }

    fn launch(
        name: &'static str,
        command: &[std::ffi::OsString],
        env: &[(String, String)],
        out: File,
    ) -> Result<Child, Error> {
        let err = out.try_clone()?;
        Command::new("setpriv")
            .args(command)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| Error::Start(name, format!("{command:?}: {e}")))
    }

    /// Kills the process as a crash or an OOM kill would (SIGKILL: no graceful shutdown, its
    /// clients' connections reset) and waits until it is gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again with the same command line and environment (after [`Daemon::kill`]);
    /// its output goes on in the same log.
    pub fn start_again(&mut self) -> Result<(), Error> {
        self.kill();
        let log = std::fs::OpenOptions::new().append(true).open(&self.log)?;
        self.child = Self::launch(self.name, &self.command, &self.env, log)?;
        Ok(())
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
