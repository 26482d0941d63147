//! `hack/release.sh` as a maintainer runs it, but writing OCI layouts instead of pushing (no
//! registry here): both images as manifest lists of linux/amd64 and linux/arm64, each image's
//! binary of its machine, a chart package whose default image references are the ones
//! released, and the kubectl plugin's krew archives (each binary of its machine) with a
//! manifest krew-index's validator accepts.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use testkit::real::node::images::{self, Platform};
use testkit::real::tools;

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(
        &std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap()
}

fn blob(layout: &Path, descriptor: &Value) -> PathBuf {
    let (algorithm, hex) = descriptor["digest"]
        .as_str()
        .unwrap()
        .split_once(':')
        .unwrap();
    layout.join("blobs").join(algorithm).join(hex)
}

/// The chart's `appVersion`, which release.sh tags with by default.
fn app_version() -> String {
    let chart =
        std::fs::read_to_string(images::workspace_path("charts/podprobe/Chart.yaml")).unwrap();
    chart
        .lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .expect("appVersion in Chart.yaml")
        .trim()
        .trim_matches('"')
        .to_owned()
}

/// One file of an image layer (a gzip'd tar), extracted.
fn layer_file(layer: &Path, path: &str, into: &Path) -> PathBuf {
    let status = Command::new("tar")
        .arg("-xf")
        .arg(layer)
        .arg("-C")
        .arg(into)
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "{path} in {}", layer.display());
    into.join(path)
}

fn elf_machine(path: &Path) -> u16 {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF", "{}", path.display());
    u16::from_le_bytes([bytes[0x12], bytes[0x13]])
}

#[test]
fn release_builds_both_images_for_both_architectures_and_the_chart() {
    let root = images::build_root().unwrap();
    // The cross-compiled architecture first, without the images' lock: it may still be
    // building in the background (hack/setup-tests.sh), and node tests need that lock.
    let native = Platform::native().unwrap();
    for platform in [Platform::Amd64, Platform::Arm64] {
        if platform != native {
            images::static_binaries(&root, platform)
                .unwrap_or_else(|e| panic!("{}: {e}", platform.arch()));
        }
    }
    let _lock = images::lock(&root).unwrap();
    let work = tempfile::tempdir().unwrap();
    let storage_conf = work.path().join("storage.conf");
    std::fs::write(
        &storage_conf,
        format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{0}/storage\"\nrunroot = \"{0}/run\"\n",
            work.path().display()
        ),
    )
    .unwrap();
    let layouts = work.path().join("layouts");
    let out = work.path().join("out");
    let helm = tools::tool("helm").unwrap();
    let release = images::in_workspace(&root, images::workspace_path("hack/release.sh"))
        .arg("--dest")
        .arg(format!("oci:{}", layouts.display()))
        .env("OUT", &out)
        .env("HELM", &helm)
        .env("CONTAINERS_STORAGE_CONF", &storage_conf)
        .output()
        .unwrap();
    assert!(
        release.status.success(),
        "hack/release.sh: {}\n{}",
        String::from_utf8_lossy(&release.stdout),
        String::from_utf8_lossy(&release.stderr)
    );

    let version = app_version();
    let head = String::from_utf8(
        Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(images::workspace_path("."))
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_owned();
    let mut released = Vec::new();
    let mut by_digest = Vec::new();
    for (name, binary) in [
        ("podprobe", "podprobe"),
        ("podprobe-manager", "podprobe-manager"),
    ] {
        let layout = layouts.join(name);
        let index = read_json(&layout.join("index.json"));
        let tagged = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == version.as_str())
            .unwrap_or_else(|| panic!("{name}: no manifest tagged {version} in {index}"));
        let list = read_json(&blob(&layout, tagged));
        let mut platforms = Vec::new();
        for manifest in list["manifests"].as_array().unwrap() {
            let arch = manifest["platform"]["architecture"]
                .as_str()
                .unwrap()
                .to_owned();
            let image = read_json(&blob(&layout, manifest));
            let config = read_json(&blob(&layout, &image["config"]));
            assert_eq!(config["architecture"], arch.as_str(), "{name}");
            assert_eq!(config["config"]["User"], "65532:65532", "{name} {arch}");
            // Which version and commit the image is, as the chart's default tag promises.
            let labels = &config["config"]["Labels"];
            assert_eq!(
                labels["org.opencontainers.image.version"],
                version.as_str(),
                "{name} {arch}: {labels}"
            );
            assert_eq!(
                labels["org.opencontainers.image.revision"],
                head.as_str(),
                "{name} {arch}: {labels}"
            );
            assert_eq!(
                config["config"]["Entrypoint"],
                json!([format!("/usr/local/bin/{binary}")]),
                "{name} {arch}"
            );
            let platform = [Platform::Amd64, Platform::Arm64]
                .into_iter()
                .find(|p| p.arch() == arch)
                .unwrap_or_else(|| panic!("{name}: unexpected architecture {arch}"));
            let layers = image["layers"].as_array().unwrap();
            let layer = blob(&layout, layers.last().unwrap());
            let extracted = tempfile::tempdir().unwrap();
            let file = layer_file(&layer, &format!("usr/local/bin/{binary}"), extracted.path());
            assert_eq!(elf_machine(&file), platform.elf_machine(), "{name} {arch}");
            platforms.push(arch);
        }
        platforms.sort();
        assert_eq!(platforms, ["amd64", "arm64"], "{name}'s manifest list");
        released.push(format!("ghcr.io/podprobe/{name}:{version}"));
        by_digest.push(format!(
            "ghcr.io/podprobe/{name}:{version}@{}",
            tagged["digest"].as_str().unwrap()
        ));
    }
    // What users pin: each list's reference by the digest written.
    let listed = std::fs::read_to_string(out.join("images.txt")).unwrap();
    assert_eq!(listed.lines().collect::<Vec<_>>(), by_digest, "images.txt");

    // The packaged chart deploys and injects exactly the released references by default.
    let package = out.join(format!("podprobe-{version}.tgz"));
    let rendered = Command::new(&helm)
        .args(["template", "podprobe"])
        .arg(&package)
        .args(["--kube-version", "1.37.0"])
        .args(["--set", "cert.certManager.enabled=true"])
        .env("HELM_CACHE_HOME", work.path().join("helm"))
        .env("HELM_CONFIG_HOME", work.path().join("helm"))
        .output()
        .unwrap();
    assert!(
        rendered.status.success(),
        "helm template {}: {}",
        package.display(),
        String::from_utf8_lossy(&rendered.stderr)
    );
    let rendered = String::from_utf8(rendered.stdout).unwrap();
    let mut referenced: Vec<String> = rendered
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image:"))
        .map(|r| r.trim().trim_matches('"').to_owned())
        .collect();
    referenced.sort();
    referenced.dedup();
    released.sort();
    assert_eq!(referenced, released, "the chart's default images");

    plugin_assets(&out, &version);
    sboms(&out);
    provenance(&out, &listed, &version);
}

/// The version Cargo.lock pins for `name` (its only version in the lock).
fn locked_version(name: &str) -> String {
    let lock = std::fs::read_to_string(images::workspace_path("Cargo.lock")).unwrap();
    let versions: Vec<&str> = lock
        .split("[[package]]")
        .filter(|p| p.contains(&format!("\nname = \"{name}\"\n")))
        .filter_map(|p| p.lines().find_map(|l| l.strip_prefix("version = \"")))
        .map(|v| v.trim_end_matches('"'))
        .collect();
    assert_eq!(versions.len(), 1, "{name} in Cargo.lock: {versions:?}");
    versions[0].to_owned()
}

/// Each shipped binary's CycloneDX SBOM, per architecture, read by syft from the crate list
/// cargo-auditable embedded: the crates built in at their locked versions, and no crate that
/// only the tests use.
fn sboms(out: &Path) {
    for platform in [Platform::Amd64, Platform::Arm64] {
        for (binary, built_in, test_only) in [
            (
                "podprobe",
                ["tokio", "kube-client", "hyper"],
                ["cel", "testkit"],
            ),
            // The exec agent, which the sidecar image carries for the install container.
            (
                "podprobe-agent",
                ["tokio", "clap", "nix"],
                ["cel", "testkit"],
            ),
            (
                "podprobe-manager",
                ["tokio", "kube-runtime", "rustls"],
                ["cel", "testkit"],
            ),
            (
                "kubectl-podprobe",
                ["tokio", "kube-client", "clap"],
                ["cel", "testkit"],
            ),
        ] {
            let path = out.join(format!("{binary}-linux-{}.cdx.json", platform.arch()));
            let sbom = read_json(&path);
            assert_eq!(sbom["bomFormat"], "CycloneDX", "{}", path.display());
            let components: Vec<(String, String)> = sbom["components"]
                .as_array()
                .unwrap_or_else(|| panic!("no components in {}", path.display()))
                .iter()
                .filter(|c| c["type"] == "library")
                .map(|c| {
                    let field = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
                    (field("name"), field("version"))
                })
                .collect();
            for name in built_in {
                let version = locked_version(name);
                assert!(
                    components.contains(&(name.to_owned(), version.clone())),
                    "{name} {version} in {}: {components:?}",
                    path.display()
                );
            }
            for name in test_only {
                assert!(
                    components.iter().all(|(n, _)| n != name),
                    "{name} in {}",
                    path.display()
                );
            }
        }
    }
}

/// The provenance statement: every released artifact by its digest, and the lock file it was
/// built from.
fn provenance(out: &Path, images: &str, version: &str) {
    let statement = read_json(&out.join("provenance.json"));
    assert_eq!(statement["_type"], "https://in-toto.io/Statement/v1");
    assert_eq!(statement["predicateType"], "https://slsa.dev/provenance/v1");
    let subjects: Vec<(String, String)> = statement["subject"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let (algorithm, digest) = s["digest"].as_object().unwrap().iter().next().unwrap();
            let name = s["name"].as_str().unwrap().to_owned();
            (name, format!("{algorithm}:{}", digest.as_str().unwrap()))
        })
        .collect();
    let sha256 = |path: &Path| {
        let sum = Command::new("sha256sum").arg(path).output().unwrap();
        let sum = String::from_utf8(sum.stdout).unwrap();
        format!("sha256:{}", sum.split_whitespace().next().unwrap())
    };
    let mut expected: Vec<(String, String)> = images
        .lines()
        .map(|l| {
            let (reference, digest) = l.split_once('@').unwrap();
            (reference.to_owned(), digest.to_owned())
        })
        .collect();
    let mut files = vec![
        format!("podprobe-{version}.tgz"),
        "podprobe.yaml".to_owned(),
    ];
    for platform in [Platform::Amd64, Platform::Arm64] {
        files.push(format!("kubectl-podprobe-linux-{}.tar.gz", platform.arch()));
        for binary in [
            "podprobe",
            "podprobe-agent",
            "podprobe-manager",
            "kubectl-podprobe",
        ] {
            files.push(format!("{binary}-linux-{}.cdx.json", platform.arch()));
        }
    }
    expected.extend(files.into_iter().map(|f| {
        let digest = sha256(&out.join(&f));
        (f, digest)
    }));
    let (mut subjects, mut expected) = (subjects, expected);
    subjects.sort();
    expected.sort();
    assert_eq!(subjects, expected, "provenance.json's subjects");
    let dependencies = &statement["predicate"]["buildDefinition"]["resolvedDependencies"];
    let lock = dependencies
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "Cargo.lock")
        .unwrap_or_else(|| panic!("no Cargo.lock in {dependencies}"));
    assert_eq!(
        format!("sha256:{}", lock["digest"]["sha256"].as_str().unwrap()),
        sha256(&images::workspace_path("Cargo.lock"))
    );
}

/// The plugin's release assets: one archive per architecture holding its machine's binary and
/// the LICENSE, and a manifest naming each archive's sha256, valid for krew-index.
fn plugin_assets(out: &Path, version: &str) {
    let manifest = out.join("podprobe.yaml");
    let text = std::fs::read_to_string(&manifest)
        .unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
    assert!(
        text.contains(&format!("version: v{version}")),
        "the manifest's version: {text}"
    );
    for platform in [Platform::Amd64, Platform::Arm64] {
        let name = format!("kubectl-podprobe-linux-{}.tar.gz", platform.arch());
        let archive = out.join(&name);
        let extracted = tempfile::tempdir().unwrap();
        let binary = layer_file(&archive, "kubectl-podprobe", extracted.path());
        assert_eq!(elf_machine(&binary), platform.elf_machine(), "{name}");
        layer_file(&archive, "LICENSE", extracted.path());
        let sha = Command::new("sha256sum").arg(&archive).output().unwrap();
        let sha = String::from_utf8(sha.stdout).unwrap();
        let sha = sha.split_whitespace().next().unwrap();
        assert!(
            text.contains(&format!("/v{version}/{name}\n    sha256: {sha}")),
            "{name} with its sha256 {sha} in the manifest: {text}"
        );
    }
    let checked = Command::new(tools::tool("validate-krew-manifest").unwrap())
        .arg("-manifest")
        .arg(&manifest)
        .arg("-skip-install")
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "krew-index's validation of {}: {}",
        manifest.display(),
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// A release's images carry the chart's appVersion, which the chart pulls: any other
/// `VERSION` is refused before anything is built.
#[test]
fn release_refuses_a_version_other_than_the_charts() {
    let out = Command::new("bash")
        .arg(images::workspace_path("hack/release.sh"))
        .arg("--no-push")
        .env("VERSION", "99.0.0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "VERSION 99.0.0 is not the chart's appVersion {}",
            app_version()
        )),
        "{stderr}"
    );
}
