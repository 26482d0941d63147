//! A minimal root filesystem for `procfs` tests and benchmarks: `/bin/{sh,sleep,cat,id}` copied
//! from this machine with the shared libraries `ldd` names, in a temp dir, plus a chrooted
//! "target container" process started in it as a non-root uid.
//!
//! Children are spawned through podprobe's reaper (it waits for every child of the process).
#![allow(dead_code)]

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use podprobe::probe::reaper;

/// The uid/gid the target process runs as.
pub const TARGET_UID: u32 = 4242;

/// The capabilities [`TargetProcess::start_confined_root`] keeps (setpriv's syntax).
pub const CONFINED_CAPS: &str = "+chown,+sys_chroot";

const TOOLS: [&str; 4] = ["sh", "sleep", "cat", "id"];

fn which(name: &str) -> PathBuf {
    for dir in ["/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return std::fs::canonicalize(p).unwrap();
        }
    }
    panic!("{name} not found on this machine");
}

/// Runs a command through the reaper and returns its stdout.
pub async fn output(program: &str, args: &[&str]) -> String {
    let mut command = Command::new(program);
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let (mut child, exit) = reaper::spawn(&mut command).unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let text = tokio::task::spawn_blocking(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).unwrap();
        s
    })
    .await
    .unwrap();
    exit.wait().await;
    text
}

fn copy_into(root: &Path, file: &Path, at: &Path) {
    let dest = root.join(at.strip_prefix("/").unwrap());
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::copy(file, &dest).unwrap();
}

/// A root directory (mode 0755) with the tools, `/tmp` (1777) and `/data` owned by
/// [`TARGET_UID`].
pub async fn build(dir: &Path) {
    let root = dir;
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
    for tool in TOOLS {
        let path = which(tool);
        copy_into(root, &path, &Path::new("/bin").join(tool));
        for line in output("ldd", &[path.to_str().unwrap()]).await.lines() {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux... (0x...)"
            let lib = line
                .split_whitespace()
                .find(|w| w.starts_with('/'))
                .map(PathBuf::from);
            if let Some(lib) = lib {
                copy_into(root, &std::fs::canonicalize(&lib).unwrap(), &lib);
            }
        }
    }
    let tmp = root.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("only-in-target"), "target-file").unwrap();
    std::fs::write(
        data.join("probe.sh"),
        "#!/bin/sh\nprintf 'in-target:%s' \"$GAME_MODE\"\n",
    )
    .unwrap();
    std::fs::set_permissions(
        data.join("probe.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::os::unix::fs::chown(&data, Some(TARGET_UID), Some(TARGET_UID)).unwrap();
}

/// The "target container": `sleep` chrooted into `root`, as [`TARGET_UID`], in `/data`, with
/// `GAME_MODE=idle` and `PATH=/bin:/data`. Killed when dropped.
#[derive(Debug)]
pub struct TargetProcess {
    pub pid: i32,
    exit: Option<reaper::ExitStatusFuture>,
}

impl TargetProcess {
    pub async fn start(root: &Path) -> TargetProcess {
        let mut command = Command::new(which("chroot"));
        command.arg(format!("--userspec={TARGET_UID}:{TARGET_UID}"));
        Self::spawn(command, root).await
    }

    /// The target as root, but confined as a hardened container's main process is:
    /// `no_new_privs`, and a bounding set (so permitted and effective sets) of
    /// [`CONFINED_CAPS`] only (util-linux's `setpriv`).
    pub async fn start_confined_root(root: &Path) -> TargetProcess {
        let mut command = Command::new(which("setpriv"));
        command
            .args(["--no-new-privs", "--inh-caps=-all"])
            .arg(format!("--bounding-set=-all,{CONFINED_CAPS}"))
            .arg("--")
            .arg(which("chroot"));
        Self::spawn(command, root).await
    }

    async fn spawn(mut command: Command, root: &Path) -> TargetProcess {
        command
            .arg(root)
            .args(["/bin/sh", "-c", "cd /data && exec sleep 600"])
            .env_clear()
            .env("GAME_MODE", "idle")
            .env("PATH", "/bin:/data")
            .stdin(Stdio::null());
        let (child, exit) = reaper::spawn(&mut command).unwrap();
        let pid = child.id() as i32;
        // Wait until the exec chain (chroot → sh → sleep) has settled in /data as the target uid.
        for _ in 0..500 {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmdline.starts_with(b"sleep\0") {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        TargetProcess {
            pid,
            exit: Some(exit),
        }
    }

    /// Kills the target and waits for it.
    pub async fn stop(mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        if let Some(exit) = self.exit.take() {
            exit.wait().await;
        }
    }
}

impl Drop for TargetProcess {
    fn drop(&mut self) {
        if self.exit.is_some() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Why procfs tests cannot run here, if they cannot (not root / no CAP_SYS_CHROOT).
pub fn cannot_chroot() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not running as root: chroot and setuid are not permitted".into());
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .unwrap_or(0);
    if caps & (1 << 18) == 0 {
        return Some("CAP_SYS_CHROOT is not in the effective set".into());
    }
    None
}
