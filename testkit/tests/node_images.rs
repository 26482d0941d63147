//! The shipped images the node tests run, as the workspace's `Dockerfile` builds them (its
//! `sidecar` and `manager` stages on `hack/build-static.sh`'s binaries): non-root, the binary
//! as entrypoint, `run` as command, this machine's architecture, no shell, and nothing but the
//! binary and the nonroot identity files.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use testkit::real::node::images::{self, MANAGER_IMAGE, Platform, SIDECAR_IMAGE};

fn blob(layout: &Path, digest: &str) -> PathBuf {
    let (algorithm, hex) = digest.split_once(':').unwrap();
    layout.join("blobs").join(algorithm).join(hex)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// An image archive's config, the paths its layers hold, and the layers' size in bytes (as
/// stored, what a node pulls).
fn unpack(archive: &Path) -> (Value, Vec<String>, u64) {
    let layout = tempfile::tempdir().unwrap();
    let untar = Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(layout.path())
        .status()
        .unwrap();
    assert!(untar.success());
    let index = read_json(&layout.path().join("index.json"));
    let manifest = read_json(&blob(
        layout.path(),
        index["manifests"][0]["digest"].as_str().unwrap(),
    ));
    let config = read_json(&blob(
        layout.path(),
        manifest["config"]["digest"].as_str().unwrap(),
    ));
    let mut files = Vec::new();
    let mut bytes = 0;
    for layer in manifest["layers"].as_array().unwrap() {
        bytes += layer["size"].as_u64().unwrap();
        let listing = Command::new("tar")
            .arg("-tf")
            .arg(blob(layout.path(), layer["digest"].as_str().unwrap()))
            .output()
            .unwrap();
        assert!(
            listing.status.success(),
            "tar -tf {layer}: {}",
            String::from_utf8_lossy(&listing.stderr)
        );
        files.extend(
            String::from_utf8(listing.stdout)
                .unwrap()
                .lines()
                .map(|l| l.trim_start_matches("./").trim_end_matches('/').to_owned())
                .filter(|l| !l.is_empty()),
        );
    }
    (config, files, bytes)
}

#[test]
fn the_shipped_images_are_static_nonroot_and_shell_free() {
    let archives = images::build().unwrap_or_else(|e| panic!("images: {e}"));
    for (reference, binary) in [
        (SIDECAR_IMAGE, "podprobe"),
        (MANAGER_IMAGE, "podprobe-manager"),
    ] {
        let archive = &archives
            .iter()
            .find(|a| a.reference == reference)
            .unwrap()
            .archive;
        let (config, files, bytes) = unpack(archive);
        println!(
            "{reference}: layers {bytes} bytes ({:.1} MiB)",
            bytes as f64 / 1048576.0
        );
        let entrypoint = format!("/usr/local/bin/{binary}");
        assert_eq!(config["os"], "linux", "{reference}");
        assert_eq!(
            config["architecture"],
            Platform::native().unwrap().arch(),
            "{reference}"
        );
        assert_eq!(config["config"]["User"], "65532:65532", "{reference}");
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!([entrypoint]),
            "{reference}"
        );
        assert_eq!(
            config["config"]["Cmd"],
            serde_json::json!(["run"]),
            "{reference}"
        );

        let mut regular: Vec<&str> = files
            .iter()
            .map(String::as_str)
            .filter(|f| !["usr", "usr/local", "usr/local/bin", "etc"].contains(f))
            .collect();
        regular.sort();
        let mut expected = vec!["etc/group", "etc/passwd", &entrypoint[1..]];
        if reference == SIDECAR_IMAGE {
            // The exec agent alone, which `podprobe install-agent` copies into app containers.
            expected.push("usr/local/bin/podprobe-agent");
        }
        expected.sort();
        assert_eq!(
            regular, expected,
            "{reference}: only the binaries and the identity files (no shell)"
        );
    }
}
