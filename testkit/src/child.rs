//! A process under test that writes its log to a file (the real `podprobe run` of the root and
//! manager tests): killed when dropped, its log printed when the test failed, so a failure says
//! why.

use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

#[derive(Debug)]
pub struct LoggedChild {
    pub child: Child,
    pub log: PathBuf,
    /// What serves the child while it runs (a downward-API volume kept up to date, as a
    /// kubelet would), stopped with it.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl LoggedChild {
    pub fn new(child: Child, log: PathBuf) -> Self {
        LoggedChild {
            child,
            log,
            tasks: Vec::new(),
        }
    }

    /// `task` runs for as long as the child, and is aborted when it is dropped.
    pub fn serving(mut self, task: tokio::task::JoinHandle<()>) -> Self {
        self.tasks.push(task);
        self
    }

    /// The log as written so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Sends SIGTERM and waits (up to `limit`) for the exit status.
    pub fn terminate(&mut self, limit: Duration) -> Option<ExitStatus> {
        let _ = kill(self.pid(), Signal::SIGTERM);
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (up to `limit`) until the log contains `needle`; panics with the log otherwise.
    pub async fn wait_log(&self, needle: &str, limit: Duration) {
        let what = format!("{needle:?} logged");
        crate::wait::until(limit, &what, || self.log().contains(needle)).await;
    }
}

impl Drop for LoggedChild {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- log ({}) ----\n{}", self.log.display(), self.log());
        }
    }
}

/// The word that follows the last `needle` in `log`: a time or a count the process logged.
pub fn logged_after<'a>(log: &'a str, needle: &str) -> Option<&'a str> {
    let rest = &log[log.rfind(needle)? + needle.len()..];
    rest.split_whitespace().next()
}
