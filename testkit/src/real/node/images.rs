//! The node's images, built here and imported into containerd: no registry is reachable.
//!
//! - `podprobe.test/pause:3.10`: Kubernetes' own `pause.c` from the pinned module, static.
//! - `podprobe.test/podprobe:dev`: the sidecar as `sidecar.Dockerfile` ships it (the static
//!   musl binary of the `sidecar` profile without default features, non-root 65532, entrypoint
//!   the binary, command `run`, no shell); a test holds the two to agreement.
//! - `podprobe.test/gameserver:dev`: busybox (for exec probes) and the test game server
//!   (TCP 7777, HTTP 8080, gRPC 9090), running as root like many game server images.
//!
//! Each is a root filesystem turned into an OCI archive by `hack/oci-image.sh` (umoci). The
//! binaries are built with cargo in a target directory of their own (the outer cargo may hold
//! the workspace's lock); a file lock serialises test processes building at the same time.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::super::Error;

pub const PAUSE_IMAGE: &str = "podprobe.test/pause:3.10";
pub const SIDECAR_IMAGE: &str = "podprobe.test/podprobe:dev";
pub const GAMESERVER_IMAGE: &str = "podprobe.test/gameserver:dev";

/// What the sidecar image says about how it runs; `sidecar.Dockerfile` must say the same.
pub const SIDECAR_USER: &str = "65532:65532";
pub const SIDECAR_ENTRYPOINT: &str = "/usr/local/bin/podprobe";
pub const SIDECAR_CMD: &str = "run";

const MUSL: &str = "x86_64-unknown-linux-musl";
/// busybox applets the game server image links (exec probes and tests use them).
const APPLETS: [&str; 14] = [
    "sh", "cat", "test", "[", "touch", "rm", "sleep", "kill", "ls", "echo", "ps", "pidof", "id",
    "env",
];

/// One image: its reference and its OCI archive.
#[derive(Debug, Clone)]
pub struct ImageArchive {
    pub reference: &'static str,
    pub archive: PathBuf,
}

/// The three images of a node, built (or found up to date) under the workspace's
/// `target/podprobe-node-images`.
pub fn build() -> Result<Vec<ImageArchive>, Error> {
    let root = workspace().join("target/podprobe-node-images");
    std::fs::create_dir_all(&root)?;
    let lock = std::fs::File::create(root.join("lock"))?;
    lock.lock()?;
    let sidecar = cargo_build(
        &root,
        &[
            "-p",
            "podprobe",
            "--bin",
            "podprobe",
            "--no-default-features",
        ],
        "sidecar",
        "podprobe",
    )?;
    let gameserver = cargo_build(
        &root,
        &["-p", "podprobe-test-gameserver"],
        "sidecar",
        "podprobe-test-gameserver",
    )?;
    let pause = compile_pause(&root)?;
    let images = vec![
        image(
            &root,
            PAUSE_IMAGE,
            &[("pause", Entry::Copy(&pause))],
            &["--config.user=65535:65535", "--config.entrypoint=/pause"],
        )?,
        sidecar_image(&root, &sidecar)?,
        gameserver_image(&root, &gameserver)?,
    ];
    Ok(images)
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `cargo build --target musl --profile PROFILE ARGS`, returning the binary `bin`.
fn cargo_build(root: &Path, args: &[&str], profile: &str, bin: &str) -> Result<PathBuf, Error> {
    let target_dir = root.join("cargo");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // The same build whichever test asks: none of the calling test's cargo environment
    // (package name, manifest dir, and the library path nextest sets per package, which
    // cargo counts as a change and rebuilds ring for) may reach the build.
    let inherited = std::env::vars_os().map(|(k, _)| k).filter(|k| {
        k.to_str().is_some_and(|k| {
            (k.starts_with("CARGO_") && k != "CARGO_HOME") || k.ends_with("LD_LIBRARY_PATH")
        })
    });
    let mut command = Command::new(cargo);
    for key in inherited {
        command.env_remove(key);
    }
    let status = command
        .current_dir(workspace())
        .args(["build", "--locked", "--target", MUSL, "--profile", profile])
        .args(args)
        .env("CARGO_TARGET_DIR", &target_dir)
        .status()?;
    if !status.success() {
        return Err(Error::Other(format!(
            "cargo build --target {MUSL} {} failed ({status}); hack/setup-tests.sh installs the target and musl-gcc",
            args.join(" ")
        )));
    }
    Ok(target_dir.join(MUSL).join(profile).join(bin))
}

/// Kubernetes' `build/pause/linux/pause.c` of the pinned module, linked statically with musl.
fn compile_pause(root: &Path) -> Result<PathBuf, Error> {
    let hack = workspace().join("hack/k8s");
    let out = Command::new("go")
        .current_dir(&hack)
        .args(["list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"])
        .env("GOFLAGS", "-mod=readonly")
        .output()?;
    if !out.status.success() {
        return Err(Error::Other(format!(
            "go list -m k8s.io/kubernetes (for pause.c): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let module = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let binary = root.join("pause");
    let status = Command::new("musl-gcc")
        .args(["-Os", "-static", "-DVERSION=3.10", "-o"])
        .arg(&binary)
        .arg(module.join("build/pause/linux/pause.c"))
        .status()?;
    if !status.success() {
        return Err(Error::Other(format!("musl-gcc pause.c failed ({status})")));
    }
    Ok(binary)
}

/// One entry of an image's root filesystem.
#[derive(Clone, Copy)]
enum Entry<'a> {
    /// A copy of a host file (keeps its mode).
    Copy(&'a Path),
    Text(&'a str),
    Symlink(&'a str),
    Dir {
        mode: u32,
        owner: u32,
    },
}

fn sidecar_image(root: &Path, binary: &Path) -> Result<ImageArchive, Error> {
    let user = format!("--config.user={SIDECAR_USER}");
    let entrypoint = format!("--config.entrypoint={SIDECAR_ENTRYPOINT}");
    let cmd = format!("--config.cmd={SIDECAR_CMD}");
    // distroless/static's identity files: the nonroot user, its home and a writable /tmp.
    let entries = [
        ("usr/local/bin/podprobe", Entry::Copy(binary)),
        (
            "etc/passwd",
            Entry::Text(
                "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
            ),
        ),
        ("etc/group", Entry::Text("root:x:0:\nnonroot:x:65532:\n")),
        (
            "home/nonroot",
            Entry::Dir {
                mode: 0o700,
                owner: 65532,
            },
        ),
        (
            "tmp",
            Entry::Dir {
                mode: 0o1777,
                owner: 0,
            },
        ),
    ];
    image(root, SIDECAR_IMAGE, &entries, &[&user, &entrypoint, &cmd])
}

fn gameserver_image(root: &Path, binary: &Path) -> Result<ImageArchive, Error> {
    let busybox = which("busybox")?;
    let links: Vec<(String, Entry)> = APPLETS
        .iter()
        .map(|applet| (format!("bin/{applet}"), Entry::Symlink("busybox")))
        .collect();
    let mut entries: Vec<(&str, Entry)> = vec![
        ("usr/local/bin/gameserver", Entry::Copy(binary)),
        ("bin/busybox", Entry::Copy(&busybox)),
        (
            "var/run/game",
            Entry::Dir {
                mode: 0o755,
                owner: 0,
            },
        ),
        (
            "tmp",
            Entry::Dir {
                mode: 0o1777,
                owner: 0,
            },
        ),
    ];
    entries.extend(links.iter().map(|(path, entry)| (path.as_str(), *entry)));
    image(
        root,
        GAMESERVER_IMAGE,
        &entries,
        &[
            "--config.entrypoint=/usr/local/bin/gameserver",
            "--config.env=PATH=/bin:/usr/local/bin",
        ],
    )
}

/// Lays out `entries` as a root filesystem and packs it with `hack/oci-image.sh`.
fn image(
    root: &Path,
    reference: &'static str,
    entries: &[(&str, Entry)],
    config: &[&str],
) -> Result<ImageArchive, Error> {
    let (name, tag) = reference.rsplit_once(':').expect("references carry a tag");
    let short = name.rsplit('/').next().unwrap_or(name);
    let rootfs = root.join(format!("{short}.rootfs"));
    let _ = std::fs::remove_dir_all(&rootfs);
    for (path, entry) in entries {
        let dest = rootfs.join(path);
        std::fs::create_dir_all(dest.parent().expect("paths are relative"))?;
        match entry {
            Entry::Copy(source) => {
                std::fs::copy(source, &dest)?;
            }
            Entry::Text(text) => std::fs::write(&dest, text)?,
            Entry::Symlink(target) => std::os::unix::fs::symlink(target, &dest)?,
            Entry::Dir { mode, owner } => {
                std::fs::create_dir_all(&dest)?;
                std::fs::set_permissions(
                    &dest,
                    std::os::unix::fs::PermissionsExt::from_mode(*mode),
                )?;
                std::os::unix::fs::chown(&dest, Some(*owner), Some(*owner))?;
            }
        }
    }
    let archive = root.join(format!("{short}.tar"));
    let script = workspace().join("hack/oci-image.sh");
    let out = Command::new(&script)
        .arg(&archive)
        .arg(tag)
        .arg(&rootfs)
        .args(config)
        .output()?;
    if !out.status.success() {
        return Err(Error::Other(format!(
            "{} {reference}: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(ImageArchive { reference, archive })
}

fn which(program: &str) -> Result<PathBuf, Error> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            Error::Tools(format!(
                "{program} is not installed (Debian: busybox-static)"
            ))
        })
}
