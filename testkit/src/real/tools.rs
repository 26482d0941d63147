//! The real Kubernetes binaries the tests run: built from the Go modules pinned under `hack/`
//! by `hack/build-tools.sh`, into a cache outside the clone. The script is idempotent and takes
//! a lock, so every test process may call it; only the first build of a version costs minutes.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::Error;

/// Overrides the build: a directory that already holds the binaries.
pub const TOOLS_BIN_ENV: &str = "PODPROBE_TOOLS_BIN";

/// The repository's `hack/build-tools.sh`.
pub fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/build-tools.sh")
}

/// The directory holding `kube-apiserver`, `etcd`, `kubectl` and `helm`, building them first
/// when this version is not in the cache yet. A failed build is an error, never a skip.
pub fn bin_dir() -> Result<&'static Path, Error> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(locate)
        .as_deref()
        .map_err(|e| Error::Tools(e.clone()))
}

/// The path of one tool (`kube-apiserver`, `etcd`, `kubectl`, `helm`, ...).
pub fn tool(name: &str) -> Result<PathBuf, Error> {
    let path = bin_dir()?.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Tools(format!(
            "{} is missing from the tools directory",
            path.display()
        )))
    }
}

fn locate() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(TOOLS_BIN_ENV) {
        return Ok(PathBuf::from(dir));
    }
    let script = build_script();
    // The build's progress goes to our stderr (shown when a test fails or with --nocapture);
    // the last line of stdout is the bin directory.
    let out = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}); its output above says why",
            script.display(),
            out.status
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| PathBuf::from(l.trim()))
        .ok_or_else(|| format!("{} printed no bin directory", script.display()))?;
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err(format!(
            "{} printed {}, which is not a directory",
            script.display(),
            dir.display()
        ))
    }
}
