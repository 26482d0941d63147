//! The privileged pre-exec steps of the `procfs` exec mode. **The only module in podprobe that
//! may use `unsafe`** (the workspace denies `unsafe_code`; CI checks that no other file allows
//! it).
//!
//! Why unsafe: the steps must run in the forked child between `fork` and `execve` (chroot
//! changes the root of the whole calling process, so the parent cannot do it), and std exposes
//! that hook only as the `unsafe` [`CommandExt::pre_exec`]. std's safe `uid/gid/groups/
//! current_dir` cannot be used: std applies them *before* `pre_exec` runs, and after dropping to
//! a non-root uid the child no longer has `CAP_SYS_CHROOT`, and a working directory set before
//! the chroot would point outside the new root.
//!
//! In the child, in this order: `fchdir(root_fd)`, `chroot(".")`, `fchdir(cwd_fd)` (or
//! `chdir("/")`), `setgroups`, `setgid`, `setuid`. The root and cwd are `O_PATH` descriptors the
//! parent opened (with the ptrace access check passed there), so the child never resolves
//! `/proc/<pid>/...` itself.

#![allow(unsafe_code)]

use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::unistd::{Gid, Uid, chdir, chroot, fchdir, setgid, setgroups, setuid};

/// The ids to switch to (all already computed by the parent).
#[derive(Debug)]
pub(super) struct Ids {
    pub uid: Uid,
    pub gid: Gid,
    pub groups: Vec<Gid>,
}

/// Where and as whom the command runs.
#[derive(Debug)]
pub(super) struct Enter {
    /// `/proc/<pid>/root`, opened `O_PATH | O_DIRECTORY | O_CLOEXEC`.
    pub root: OwnedFd,
    /// `/proc/<pid>/cwd`, likewise; `None` → `/`.
    pub cwd: Option<OwnedFd>,
    /// `None` when the target's ids are the sidecar's own.
    pub ids: Option<Ids>,
}

/// Makes `command` enter `enter`'s root, working directory and ids just before `execve`.
pub(super) fn on_exec(command: &mut Command, enter: Enter) {
    let Enter { root, cwd, ids } = enter;
    let steps = move || -> std::io::Result<()> {
        fchdir(&root)?;
        chroot(c".")?;
        match &cwd {
            Some(cwd) => fchdir(cwd)?,
            None => chdir(c"/")?,
        }
        if let Some(ids) = &ids {
            setgroups(&ids.groups)?;
            setgid(ids.gid)?;
            setuid(ids.uid)?;
        }
        Ok(())
    };
    // SAFETY: `pre_exec` requires the closure to be async-signal-safe, since it runs in the
    // child of a multi-threaded process right after `fork`. Every step is a direct system call
    // wrapper (nix's fchdir, chroot, chdir, setgroups, setgid, setuid: no locks, no allocation;
    // the paths are `&CStr` literals, so nix does not allocate to NUL-terminate them; errors
    // convert to `io::Error::from_raw_os_error`, which does not allocate). All captured data
    // (descriptors, ids, the group list) was built by the parent before `fork` and is only
    // read here. glibc's `setgid/setuid` use the multi-thread set*id broadcast only when more
    // than one thread exists, and the forked child has exactly one. The descriptors are
    // `O_CLOEXEC`, so they are closed by the `execve` that follows and do not leak into the
    // probe command.
    unsafe {
        command.pre_exec(steps);
    }
}
