//! buildah, with a storage of its own (vfs: no overlay mounts to leave behind), builds
//! Dockerfile stages and writes them as OCI archives for containerd.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::super::super::Error;

/// An image platform (Docker's `TARGETARCH` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    Amd64,
    Arm64,
}

impl Platform {
    /// This machine's.
    pub fn native() -> Result<Platform, Error> {
        match std::env::consts::ARCH {
            "x86_64" => Ok(Platform::Amd64),
            "aarch64" => Ok(Platform::Arm64),
            other => Err(Error::Other(format!(
                "images are built for amd64 and arm64 hosts, not {other}"
            ))),
        }
    }

    /// `amd64` / `arm64`: Docker's and `hack/build-static.sh`'s name.
    pub fn arch(self) -> &'static str {
        match self {
            Platform::Amd64 => "amd64",
            Platform::Arm64 => "arm64",
        }
    }

    pub fn rust_target(self) -> &'static str {
        match self {
            Platform::Amd64 => "x86_64-unknown-linux-musl",
            Platform::Arm64 => "aarch64-unknown-linux-musl",
        }
    }

    /// The ELF header's `e_machine` of its binaries.
    pub fn elf_machine(self) -> u16 {
        match self {
            Platform::Amd64 => 62,
            Platform::Arm64 => 183,
        }
    }
}

/// buildah with its storage under one directory.
#[derive(Debug)]
pub struct Buildah {
    dir: PathBuf,
}

impl Buildah {
    pub fn new(dir: &Path) -> Buildah {
        Buildah {
            dir: dir.to_owned(),
        }
    }

    /// `buildah` with this storage.
    pub fn command(&self) -> Command {
        let mut command = Command::new("buildah");
        command
            .arg("--root")
            .arg(self.dir.join("storage"))
            .arg("--runroot")
            .arg(self.dir.join("run"))
            .args(["--storage-driver", "vfs"]);
        command
    }

    /// Builds stage `target` of `dockerfile` for `platform` as `reference`, the Dockerfile's
    /// directory the build context and `contexts` the named ones (a stage of that name is
    /// replaced by the directory).
    pub fn build(
        &self,
        dockerfile: &Path,
        target: &str,
        platform: Platform,
        contexts: &[(&str, &PathBuf)],
        reference: &str,
    ) -> Result<(), Error> {
        let mut command = self.command();
        command
            .args(["build", "--quiet", "--target", target, "--platform"])
            .arg(format!("linux/{}", platform.arch()))
            .arg("--file")
            .arg(dockerfile)
            .args(["--tag", reference]);
        for (name, dir) in contexts {
            command
                .arg("--build-context")
                .arg(format!("{name}={}", dir.display()));
        }
        command.arg(dockerfile.parent().expect("a file in a directory"));
        run(
            command,
            &format!("buildah build --target {target} ({reference})"),
        )
    }

    /// Moves `reference` out of the storage into an OCI archive whose image is named by its
    /// tag alone, for `ctr images import --base-name REPOSITORY`.
    pub fn move_to_archive(&self, reference: &str, archive: &Path) -> Result<(), Error> {
        let (_, tag) = reference.rsplit_once(':').expect("references carry a tag");
        let partial = archive.with_extension("partial");
        let _ = std::fs::remove_file(&partial);
        let mut command = self.command();
        command
            .args(["push", "--quiet", reference])
            .arg(format!("oci-archive:{}:{tag}", partial.display()));
        run(command, &format!("buildah push {reference}"))?;
        std::fs::rename(&partial, archive)?;
        // The archive is what the node imports: without this every build (a new image, new
        // timestamps) would stay in the vfs storage for good.
        let mut rmi = self.command();
        rmi.args(["rmi", reference]);
        run(rmi, &format!("buildah rmi {reference}"))
    }
}

fn run(mut command: Command, what: &str) -> Result<(), Error> {
    let out = command.output().map_err(|e| {
        Error::Tools(format!(
            "{what}: {e} (hack/setup-tests.sh installs buildah)"
        ))
    })?;
    if !out.status.success() {
        return Err(Error::Other(format!(
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}
