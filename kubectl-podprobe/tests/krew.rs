//! The plugin as krew ships it: `hack/krew-package.sh` packages the built binary, krew-index's
//! own `validate-krew-manifest` checks the manifest, the real krew installs it from the
//! archive (checking its sha256), and the kubectl built from the pinned module runs it as
//! `kubectl podprobe`. A tampered archive is refused.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use testkit::real::tools;

fn run(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"))
}

fn ok(command: &mut Command) -> String {
    let out = run(command);
    assert!(
        out.status.success(),
        "{command:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn package(out: &Path) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/krew-package.sh");
    let binary = env!("CARGO_BIN_EXE_kubectl-podprobe");
    let printed = ok(Command::new("bash")
        .arg(script)
        .args(["0.1.0", out.to_str().unwrap()])
        .arg(format!("linux/amd64={binary}")));
    PathBuf::from(printed.trim())
}

fn krew_install(root: &Path, manifest: &Path, archive: &Path) -> Output {
    run(Command::new(tools::tool("kubectl-krew").unwrap())
        .args(["install", "--manifest"])
        .arg(manifest)
        .arg("--archive")
        .arg(archive)
        .env("KREW_ROOT", root)
        .env("KREW_OS", "linux")
        .env("KREW_ARCH", "amd64")
        .stdin(std::process::Stdio::null()))
}

#[test]
fn krew_installs_the_packaged_plugin_and_kubectl_runs_it() {
    let dir = tempfile::tempdir().unwrap();
    let dist = dir.path().join("dist");
    let manifest = package(&dist);
    let archive = dist.join("kubectl-podprobe-linux-amd64.tar.gz");

    let checked = run(Command::new(tools::tool("validate-krew-manifest").unwrap())
        .arg("-manifest")
        .arg(&manifest)
        .arg("-skip-install"));
    assert!(
        checked.status.success(),
        "krew-index's validation: {}",
        String::from_utf8_lossy(&checked.stderr)
    );

    let root = dir.path().join("krew");
    let installed = krew_install(&root, &manifest, &archive);
    assert!(
        installed.status.success(),
        "krew install: {}",
        String::from_utf8_lossy(&installed.stderr)
    );
    let path = format!(
        "{}:{}",
        root.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let help = ok(Command::new(tools::tool("kubectl").unwrap())
        .args(["podprobe", "--help"])
        .env("PATH", path));
    assert!(help.contains("Usage: kubectl podprobe"), "{help}");

    // Another archive than the manifest names: krew checks the sha256 and refuses it.
    let tampered = dir.path().join("tampered.tar.gz");
    let mut bytes = std::fs::read(&archive).unwrap();
    bytes.extend_from_slice(b"\0");
    std::fs::write(&tampered, bytes).unwrap();
    let refused = krew_install(&dir.path().join("krew-2"), &manifest, &tampered);
    assert!(
        !refused.status.success(),
        "a tampered archive was installed"
    );
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("checksum does not match"), "{why}");
}
