//! The node's images, built here and imported into containerd: no registry is reachable.
//!
//! - `podprobe.test/podprobe:dev` and `podprobe.test/podprobe-manager:dev`: the `sidecar` and
//!   `manager` stages of the workspace's `Dockerfile`, built by buildah with the `binaries`
//!   stage replaced by `hack/build-static.sh`'s output (`--build-context`), exactly as
//!   `hack/release.sh` builds what users pull: the image the tests run is the image shipped.
//! - `podprobe.test/pause:3.10`: Kubernetes' own `pause.c` from the pinned module, static.
//! - `podprobe.test/gameserver:dev`: busybox (for exec probes), the idle recipe's `/idle.sh`
//!   and the test game server (TCP 7777, HTTP 8080, gRPC 9090), running as root like many
//!   game server images; for OpenKruise's ported e2e also `/probe.sh` (minecraft-demo's) and
//!   `/www/index.html` with busybox `httpd` (nginx's stand-in).
//!
//! The last two come from `testkit/node-images.Dockerfile`, built the same way. Everything
//! lives under `podprobe-node-images` in the target directory (a cargo target directory of its
//! own, since the outer cargo may hold the workspace's lock, and buildah's storage); a file
//! lock serialises test processes building at the same time.

mod buildah;
mod cargo;

use std::path::{Path, PathBuf};
use std::process::Command;

pub use buildah::{Buildah, Platform};
pub use cargo::{in_workspace, static_binaries, test_gameserver};

use super::super::Error;

pub const PAUSE_IMAGE: &str = "podprobe.test/pause:3.10";
pub const SIDECAR_IMAGE: &str = "podprobe.test/podprobe:dev";
pub const MANAGER_IMAGE: &str = "podprobe.test/podprobe-manager:dev";
pub const GAMESERVER_IMAGE: &str = "podprobe.test/gameserver:dev";

/// busybox applets the game server image links (exec probes and tests use them).
const APPLETS: [&str; 15] = [
    "sh", "cat", "test", "[", "touch", "rm", "sleep", "kill", "ls", "echo", "ps", "pidof", "id",
    "env", "httpd",
];

/// One image: its reference and its OCI archive.
#[derive(Debug, Clone)]
pub struct ImageArchive {
    pub reference: &'static str,
    pub archive: PathBuf,
}

/// Where the images and their inputs are built: `podprobe-node-images` in the target directory
/// (`CARGO_TARGET_DIR` when set, as CI sets it to keep builds across clones; else the
/// workspace's `target/`).
pub fn build_root() -> Result<PathBuf, Error> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute())
        .unwrap_or_else(|| workspace().join("target"));
    let root = target.join("podprobe-node-images");
    std::fs::create_dir_all(&root)?;
    Ok(root)
}

/// Holds the build root's file lock while alive.
#[derive(Debug)]
pub struct BuildLock(#[allow(dead_code)] std::fs::File);

/// Waits for the build root's lock: one process at a time builds there.
pub fn lock(root: &Path) -> Result<BuildLock, Error> {
    let file = std::fs::File::create(root.join("lock"))?;
    file.lock()?;
    Ok(BuildLock(file))
}

/// The shipped static binaries for this machine (`hack/build-static.sh`, what the images
/// hold): the directory with `podprobe`, `podprobe-agent` and `podprobe-manager`. For
/// benchmarks that measure what users run (its allocator is musl's, not the host's).
pub fn shipped_binaries() -> Result<PathBuf, Error> {
    let root = build_root()?;
    let _lock = lock(&root)?;
    Ok(static_binaries(&root, Platform::native()?)?.join("dist"))
}

/// The node's four images for this machine's architecture. cargo recompiles only what
/// changed; the images themselves (static files on an empty base) are rebuilt each call, about
/// 3 s, so an archive is never older than its binaries.
pub fn build() -> Result<Vec<ImageArchive>, Error> {
    let root = build_root()?;
    let _lock = lock(&root)?;
    let platform = Platform::native()?;
    let binaries = static_binaries(&root, platform)?;
    let gameserver = cargo::test_gameserver(&root)?;
    let pause = compile_pause(&root)?;
    let buildah = Buildah::new(&root.join("buildah"));
    let dockerfile = workspace().join("Dockerfile");
    let test_dockerfile = workspace().join("testkit/node-images.Dockerfile");
    let pause_dir = root.join("pause.context");
    lay_out(&pause_dir, &[("pause", Entry::Copy(&pause))])?;
    let gameserver_dir = root.join("gameserver.context");
    let busybox = which("busybox")?;
    let tini = which("tini-static")?;
    lay_out(
        &gameserver_dir,
        &gameserver_entries(&gameserver, &busybox, &tini),
    )?;

    let images = [
        (
            SIDECAR_IMAGE,
            &dockerfile,
            "sidecar",
            ("binaries", &binaries),
        ),
        (
            MANAGER_IMAGE,
            &dockerfile,
            "manager",
            ("binaries", &binaries),
        ),
        (
            PAUSE_IMAGE,
            &test_dockerfile,
            "pause",
            ("pause-binary", &pause_dir),
        ),
        (
            GAMESERVER_IMAGE,
            &test_dockerfile,
            "gameserver",
            ("gameserver-rootfs", &gameserver_dir),
        ),
    ];
    images
        .into_iter()
        .map(|(reference, dockerfile, target, context)| {
            buildah.build(dockerfile, target, platform, &[context], reference)?;
            let archive = root.join(format!("{target}.tar"));
            buildah.move_to_archive(reference, &archive)?;
            Ok(ImageArchive { reference, archive })
        })
        .collect()
}

pub(crate) fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A path of the workspace (`hack/release.sh`, `charts/podprobe`, ...).
pub fn workspace_path(relative: &str) -> PathBuf {
    workspace().join(relative)
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

/// The idle recipe's command (examples/recipes/idle-deletion-cost.yaml) as the game server
/// image has it: prints `idle` and succeeds unless a player is on, which a test says by
/// creating `/var/run/game/players`.
const IDLE_SCRIPT: &str =
    "#!/bin/sh\nif [ -e /var/run/game/players ]; then echo busy; exit 1; fi\necho idle\n";

/// What OpenKruise's PodProbeMarker e2e expects of `openkruise/minecraft-demo:probe-v0`'s
/// `./probe.sh` (its source is not published; its outputs are the spec's): it fails while the
/// server is young, then succeeds printing `data`, then `gate`. The age is the container's
/// first process's, from `/proc` (clock ticks of 1/100 s, as on every Linux this runs on).
/// 12 s and 26 s fit the spec's windows (`False` within 10 s of the pods running, then each
/// answer within 20 s of the last) with room for a slow first probe on a loaded machine.
const MINECRAFT_PROBE_SCRIPT: &str = "#!/bin/sh
read up _ < /proc/uptime
set -- $(cat /proc/1/stat)
age=$(( ${up%.*} - ${22} / 100 ))
if [ \"$age\" -lt 12 ]; then echo false; exit 1; fi
if [ \"$age\" -lt 26 ]; then echo data; else echo gate; fi
";

/// One entry of a build context directory.
#[derive(Clone, Copy)]
enum Entry<'a> {
    /// A copy of a host file (keeps its mode).
    Copy(&'a Path),
    /// An executable file with this text.
    Script(&'a str),
    /// A plain file with this text.
    File(&'a str),
    Symlink(&'a str),
    Dir(u32),
}

/// The game server image's root filesystem.
fn gameserver_entries<'a>(
    binary: &'a Path,
    busybox: &'a Path,
    tini: &'a Path,
) -> Vec<(String, Entry<'a>)> {
    let mut entries = vec![
        ("usr/local/bin/gameserver".to_owned(), Entry::Copy(binary)),
        ("bin/busybox".to_owned(), Entry::Copy(busybox)),
        // The init many game images start from (`ENTRYPOINT ["tini", "--", ...]`).
        ("bin/tini".to_owned(), Entry::Copy(tini)),
        ("idle.sh".to_owned(), Entry::Script(IDLE_SCRIPT)),
        ("probe.sh".to_owned(), Entry::Script(MINECRAFT_PROBE_SCRIPT)),
        // nginx's stand-in (`httpd -f -p 80 -h /www`) serves this as `/`.
        (
            "www/index.html".to_owned(),
            Entry::File("podprobe test page\n"),
        ),
        ("var/run/game".to_owned(), Entry::Dir(0o755)),
        ("tmp".to_owned(), Entry::Dir(0o1777)),
    ];
    entries.extend(
        APPLETS
            .iter()
            .map(|applet| (format!("bin/{applet}"), Entry::Symlink("busybox"))),
    );
    entries
}

/// Lays out `entries` in a fresh directory `dir` (a build context).
fn lay_out<P: AsRef<str>>(dir: &Path, entries: &[(P, Entry)]) -> Result<(), Error> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    for (path, entry) in entries {
        let dest = dir.join(path.as_ref());
        std::fs::create_dir_all(dest.parent().expect("paths are relative"))?;
        match entry {
            Entry::Copy(source) => {
                std::fs::copy(source, &dest)?;
            }
            Entry::Script(text) => {
                std::fs::write(&dest, text)?;
                std::fs::set_permissions(
                    &dest,
                    std::os::unix::fs::PermissionsExt::from_mode(0o755),
                )?;
            }
            Entry::File(text) => std::fs::write(&dest, text)?,
            Entry::Symlink(target) => std::os::unix::fs::symlink(target, &dest)?,
            Entry::Dir(mode) => {
                std::fs::create_dir_all(&dest)?;
                std::fs::set_permissions(
                    &dest,
                    std::os::unix::fs::PermissionsExt::from_mode(*mode),
                )?;
            }
        }
    }
    Ok(())
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
