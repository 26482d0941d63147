//! The registry-less sidecar image the node tests run agrees with `sidecar.Dockerfile`, the
//! image users build: same user, entrypoint and command, no shell, only the binary and the
//! nonroot identity files of the distroless base.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use testkit::real::node::images::{self, SIDECAR_IMAGE};

fn dockerfile_instruction(dockerfile: &str, name: &str) -> String {
    dockerfile
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("sidecar.Dockerfile has no {name}"))
        .trim()
        .to_owned()
}

fn blob(layout: &Path, digest: &str) -> std::path::PathBuf {
    let (algorithm, hex) = digest.split_once(':').unwrap();
    layout.join("blobs").join(algorithm).join(hex)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn the_sidecar_image_agrees_with_sidecar_dockerfile() {
    let archives = images::build().unwrap_or_else(|e| panic!("images: {e}"));
    let sidecar = archives
        .iter()
        .find(|a| a.reference == SIDECAR_IMAGE)
        .unwrap();
    let layout = tempfile::tempdir().unwrap();
    let untar = Command::new("tar")
        .arg("-xf")
        .arg(&sidecar.archive)
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

    let dockerfile = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../sidecar.Dockerfile"),
    )
    .unwrap();
    let as_json_list = |v: &Value| serde_json::to_string(v).unwrap().replace(',', ", ");
    assert_eq!(
        config["config"]["User"],
        dockerfile_instruction(&dockerfile, "USER")
    );
    assert_eq!(
        as_json_list(&config["config"]["Entrypoint"]),
        dockerfile_instruction(&dockerfile, "ENTRYPOINT")
    );
    assert_eq!(
        as_json_list(&config["config"]["Cmd"]),
        dockerfile_instruction(&dockerfile, "CMD")
    );
    // The Dockerfile's default base is distroless/static: no shell there either.
    assert!(
        dockerfile.contains("ARG BASE=gcr.io/distroless/static"),
        "sidecar.Dockerfile's default base changed: check it still has no shell"
    );

    let mut files = Vec::new();
    for layer in manifest["layers"].as_array().unwrap() {
        let listing = Command::new("tar")
            .arg("-tzf")
            .arg(blob(layout.path(), layer["digest"].as_str().unwrap()))
            .output()
            .unwrap();
        assert!(
            listing.status.success(),
            "tar -tzf {layer}: {}",
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
    assert!(
        !files
            .iter()
            .any(|f| f.ends_with("bin/sh") || f.contains("busybox")),
        "no shell in the sidecar image: {files:?}"
    );
    for expected in ["usr/local/bin/podprobe", "etc/passwd", "etc/group"] {
        assert!(
            files.iter().any(|f| f == expected),
            "{expected} in {files:?}"
        );
    }
    let regular: Vec<&String> = files
        .iter()
        .filter(|f| {
            ![
                ".",
                "usr",
                "usr/local",
                "usr/local/bin",
                "etc",
                "home",
                "home/nonroot",
                "tmp",
            ]
            .contains(&f.as_str())
        })
        .collect();
    assert_eq!(
        regular.len(),
        3,
        "only the binary and the identity files: {files:?}"
    );
}
