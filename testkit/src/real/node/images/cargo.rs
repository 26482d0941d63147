//! The binaries the images hold, built with cargo under the images' build root.
//!
//! `hack/setup-tests.sh` (`image_binaries`) runs the same builds beforehand, with the same
//! commands, target directory and outputs, so that no test waits for them: change both
//! together, or the tests build everything again (correct, but minutes slower).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::super::super::Error;
use super::{Platform, workspace};

/// `hack/build-static.sh ARCH`: the shipped binaries, as the Dockerfile's `binaries` stage
/// builds them. Returns the directory to pass as that stage (`dist/` inside holds them).
/// For this machine's architecture the caller holds the build root's lock. Another
/// architecture's build has its own target directory and lock (the script's), and may take
/// long (`hack/setup-tests.sh` builds it in the background at the lowest priority): ask for it
/// without the build root's lock, so that no node test waits on it.
pub fn static_binaries(root: &Path, platform: Platform) -> Result<PathBuf, Error> {
    let context = root.join(format!("binaries-{}", platform.arch()));
    let mut command = in_workspace(root, workspace().join("hack/build-static.sh"));
    // --plugin, as hack/setup-tests.sh and hack/release.sh build: one build serves all three.
    let status = command
        .arg(platform.arch())
        .arg(context.join("dist"))
        .arg("--plugin")
        .status()?;
    if !status.success() {
        return Err(Error::Other(format!(
            "hack/build-static.sh {arch} failed ({status}); `hack/build-static.sh --toolchain {arch}` \
             installs what it needs; a build hack/setup-tests.sh ran in the background logged to {}",
            root.join("other-arch.log").display(),
            arch = platform.arch(),
        )));
    }
    Ok(context)
}

/// The test game server, static for this machine (`--profile sidecar`).
pub fn test_gameserver(root: &Path) -> Result<PathBuf, Error> {
    let target = Platform::native()?.rust_target();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = in_workspace(root, cargo)
        .args([
            "build",
            "--locked",
            "--target",
            target,
            "--profile",
            "sidecar",
        ])
        .args(["-p", "podprobe-test-gameserver"])
        .status()?;
    if !status.success() {
        return Err(Error::Other(format!(
            "cargo build --target {target} -p podprobe-test-gameserver failed ({status})"
        )));
    }
    Ok(root
        .join("cargo")
        .join(target)
        .join("sidecar/podprobe-test-gameserver"))
}

/// `program` in the workspace, with the build root's target directory and none of the calling
/// test's cargo environment: the same build whichever test asks (package name, manifest dir,
/// and the library path nextest sets per package, which cargo counts as a change and rebuilds
/// ring for).
pub fn in_workspace(root: &Path, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new(program);
    let inherited = std::env::vars_os().map(|(k, _)| k).filter(|k| {
        k.to_str().is_some_and(|k| {
            (k.starts_with("CARGO_") && k != "CARGO_HOME") || k.ends_with("LD_LIBRARY_PATH")
        })
    });
    for key in inherited {
        command.env_remove(key);
    }
    command
        .current_dir(workspace())
        .env("CARGO_TARGET_DIR", root.join("cargo"));
    command
}
