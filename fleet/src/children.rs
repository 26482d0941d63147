//! Processes the bench starts and owns (sidecar hosts, exec agents): each under `setpriv
//! --pdeathsig KILL`, so the kernel kills it if the bench dies; killed and waited for when
//! dropped; an early exit is an error, since each runs until the bench ends.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::FleetError;

#[derive(Debug)]
pub struct Children {
    /// What they are, for errors: "sidecar host", "exec agent".
    what: &'static str,
    list: Vec<Child>,
}

impl Children {
    pub fn new(what: &'static str) -> Children {
        Children {
            what,
            list: Vec::new(),
        }
    }

    /// Starts `binary args...` in `dir` (the bench's own when `None`), its stderr to `log`;
    /// returns its pid.
    pub fn spawn<S: AsRef<OsStr>>(
        &mut self,
        binary: &Path,
        args: impl IntoIterator<Item = S>,
        dir: Option<&Path>,
        log: std::fs::File,
    ) -> Result<u32, FleetError> {
        let mut command = Command::new("setpriv");
        command
            .args(["--pdeathsig", "KILL", "--"])
            .arg(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(dir) = dir {
            command.current_dir(dir);
        }
        let child = command
            .spawn()
            .map_err(|e| FleetError::Setup(format!("{}: {e}", binary.display())))?;
        let pid = child.id();
        self.list.push(child);
        Ok(pid)
    }

    pub fn pids(&self) -> Vec<u32> {
        self.list.iter().map(Child::id).collect()
    }

    /// Fails when one has exited.
    pub fn check_running(&mut self) -> Result<(), FleetError> {
        for child in &mut self.list {
            if let Some(status) = child.try_wait()? {
                return Err(FleetError::Setup(format!(
                    "{} {} exited: {status}",
                    self.what,
                    child.id()
                )));
            }
        }
        Ok(())
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.list {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
