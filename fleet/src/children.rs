//! Processes the bench starts and owns (sidecar hosts, exec agents), as testkit's
//! [`Daemon`]s: each under `setpriv --pdeathsig KILL`, so the kernel kills it if the bench
//! dies, and killed when dropped; an early exit is an error, since each runs until the bench
//! ends.

use std::path::{Path, PathBuf};

use testkit::real::process::Daemon;

use crate::FleetError;

#[derive(Debug)]
pub struct Children {
    /// What they are, for errors: "sidecar host", "exec agent".
    what: &'static str,
    list: Vec<Daemon>,
}

impl Children {
    pub fn new(what: &'static str) -> Children {
        Children {
            what,
            list: Vec::new(),
        }
    }

    /// Starts `binary args...`, its output to `log`; returns its pid.
    pub fn spawn(
        &mut self,
        binary: &Path,
        args: &[String],
        log: PathBuf,
    ) -> Result<u32, FleetError> {
        let daemon = Daemon::spawn(self.what, binary, args, log)?;
        let pid = daemon.pid();
        self.list.push(daemon);
        Ok(pid)
    }

    pub fn pids(&self) -> Vec<u32> {
        self.list.iter().map(Daemon::pid).collect()
    }

    /// The last `lines` lines of the log of the one with `pid`, for error messages.
    pub fn log_tail(&self, pid: u32, lines: usize) -> String {
        self.list
            .iter()
            .find(|d| d.pid() == pid)
            .map_or_else(String::new, |d| d.log_tail(lines))
    }

    /// Fails when one has exited.
    pub fn check_running(&mut self) -> Result<(), FleetError> {
        for daemon in &mut self.list {
            if let Some(status) = daemon.exited() {
                return Err(FleetError::Setup(format!(
                    "{} {} exited: {status}; its log ends:\n{}",
                    self.what,
                    daemon.pid(),
                    daemon.log_tail(10)
                )));
            }
        }
        Ok(())
    }
}
