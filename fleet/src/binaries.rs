//! The binaries a run starts, built by cargo into the caller's own profile directory (a
//! release bench runs release binaries, a debug test debug ones).

use std::path::{Path, PathBuf};

/// Builds `bin` of `package` next to the running executable's profile and returns its path.
/// Panics when cargo fails: nothing can run without it.
pub fn build(package: &str, bin: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/examples/x or target/<profile>/deps/x.
    let profile_dir = exe.parent().and_then(Path::parent).expect("profile dir");
    let profile = profile_dir
        .file_name()
        .unwrap_or_default()
        .to_string_lossy();
    let target_dir = profile_dir.parent().expect("target dir");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let mut command = std::process::Command::new(cargo);
    command
        .args([
            "build",
            "-q",
            "-p",
            package,
            "--bin",
            bin,
            "--manifest-path",
        ])
        .arg(manifest)
        .env("CARGO_TARGET_DIR", target_dir);
    if profile != "debug" {
        command.args(["--profile", &profile]);
    }
    let status = command.status().expect("run cargo build");
    assert!(
        status.success(),
        "cargo build -p {package} --bin {bin} failed"
    );
    profile_dir.join(bin)
}
