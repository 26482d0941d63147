//! This workspace's own binaries, built by cargo into the running executable's profile
//! directory: a test (`target/<profile>/deps/…`) or an example (`target/<profile>/examples/…`)
//! gets the binaries of the same profile, where `CARGO_BIN_EXE_<name>` exists only for the
//! binaries of a test's own package.

use std::path::{Path, PathBuf};

/// `target/<profile>/<bin>` of `package`, built if needed. Panics when cargo fails: nothing
/// that asks for a binary can go on without it.
pub fn binary(package: &str, bin: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
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
    let path = profile_dir.join(bin);
    assert!(
        path.exists(),
        "{} missing after cargo build",
        path.display()
    );
    path
}
