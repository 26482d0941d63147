//! The privileged pre-exec steps of the `procfs` exec mode. **The only module in podprobe that
//! may use `unsafe`** (the workspace denies `unsafe_code`; CI checks that no other file allows
//! it).
//!
//! Why unsafe: the steps must run in the forked child between `fork` and `execve` (chroot
//! changes the root of the whole calling process, so the parent cannot do it), and std exposes
//! that hook only as the `unsafe` [`CommandExt::pre_exec`]. std's safe `uid/gid/groups/
//! current_dir` cannot be used: std applies them *before* `pre_exec` runs, and after dropping to
//! a non-root uid the child no longer has `CAP_SYS_CHROOT`, and a working directory set before
//! the chroot would point outside the new root. The capability calls (`capget`/`capset`) have
//! no safe wrapper in nix; they are raw system calls with the kernel's own structures.
//!
//! In the child, in this order: `fchdir(root_fd)`, `chroot(".")`, `fchdir(cwd_fd)` (or
//! `chdir("/")`); the bounding-set drops (they need `CAP_SETPCAP`, which `setuid` to a non-root
//! uid takes away); `setgroups`, `setgid`, `setuid`; the capability sets cut to the target's
//! (`capset`, only ever lowering them); the ambient set cleared; `no_new_privs`. The command so
//! never holds a capability, a bounding-set entry or the freedom to gain privileges by exec
//! that the target process does not have. The root and cwd are `O_PATH` descriptors the parent
//! opened (with the ptrace access check passed there), so the child never resolves
//! `/proc/<pid>/...` itself.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::libc;
use nix::unistd::{Gid, Uid, chdir, chroot, fchdir, setgid, setgroups, setuid};

/// The ids to switch to (all already computed by the parent).
#[derive(Debug)]
pub(super) struct Ids {
    pub uid: Uid,
    pub gid: Gid,
    pub groups: Vec<Gid>,
}

/// What the command may hold, from the target's `/proc/<pid>/status` (computed by the parent).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Confine {
    /// Capabilities to drop from the bounding set (ours that the target's lacks).
    pub drop_bounding: u64,
    /// The target's capability sets: the command's are cut to these (`permitted` and
    /// `effective` intersected with what the child still holds, `inheritable` likewise).
    pub inheritable: u64,
    pub permitted: u64,
    pub effective: u64,
    /// Set `no_new_privs`: the target has it, or the bounding set could not be matched.
    pub no_new_privs: bool,
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
    pub confine: Confine,
}

/// `struct __user_cap_header_struct` (linux/capability.h).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`; version 3 takes two of them (capabilities 0-31, 32-63).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

fn check(result: libc::c_long) -> io::Result<()> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Lowers this thread's capability sets to `confine`'s (never raises: each is intersected
/// with what the thread holds).
fn cut_caps(confine: &Confine) -> io::Result<()> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two `CapData` for version 3, which `data` holds.
    check(unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) })?;
    let held = |f: fn(&CapData) -> u32| u64::from(f(&data[0])) | (u64::from(f(&data[1])) << 32);
    let permitted = held(|d| d.permitted) & confine.permitted;
    let effective = held(|d| d.effective) & confine.effective & permitted;
    let inheritable = held(|d| d.inheritable) & confine.inheritable;
    for (i, half) in data.iter_mut().enumerate() {
        let shift = 32 * i;
        *half = CapData {
            effective: (effective >> shift) as u32,
            permitted: (permitted >> shift) as u32,
            inheritable: (inheritable >> shift) as u32,
        };
    }
    // SAFETY: capset reads the header and two `CapData`.
    check(unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) })
}

fn prctl(option: libc::c_int, arg: libc::c_ulong) -> io::Result<()> {
    // SAFETY: the options used here take integer arguments only.
    let result = unsafe { libc::prctl(option, arg, 0 as libc::c_ulong, 0 as libc::c_ulong, 0) };
    check(result.into())
}

/// Makes `command` enter `enter`'s root, working directory, ids and limits just before
/// `execve`.
pub(super) fn on_exec(command: &mut Command, enter: Enter) {
    let Enter {
        root,
        cwd,
        ids,
        confine,
    } = enter;
    let steps = move || -> io::Result<()> {
        fchdir(&root)?;
        chroot(c".")?;
        match &cwd {
            Some(cwd) => fchdir(cwd)?,
            None => chdir(c"/")?,
        }
        for cap in 0..64 {
            if confine.drop_bounding & (1 << cap) != 0 {
                prctl(libc::PR_CAPBSET_DROP, cap)?;
            }
        }
        if let Some(ids) = &ids {
            setgroups(&ids.groups)?;
            setgid(ids.gid)?;
            setuid(ids.uid)?;
        }
        cut_caps(&confine)?;
        // Kernels before 4.3 have no ambient set (EINVAL): nothing to clear there.
        match prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
        ) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            other => other?,
        }
        if confine.no_new_privs {
            prctl(libc::PR_SET_NO_NEW_PRIVS, 1)?;
        }
        Ok(())
    };
    // SAFETY: `pre_exec` requires the closure to be async-signal-safe, since it runs in the
    // child of a multi-threaded process right after `fork`. Every step is a direct system call
    // (nix's fchdir, chroot, chdir, setgroups, setgid, setuid; libc's prctl; capget and capset
    // through syscall(2)): no locks, no allocation (the paths are `&CStr` literals, so nix does
    // not allocate to NUL-terminate them; errors convert to `io::Error::from_raw_os_error` or
    // `last_os_error`, which do not allocate). All captured data (descriptors, ids, the group
    // list, the capability masks) was built by the parent before `fork` and is only read here.
    // glibc's `setgid/setuid` use the multi-thread set*id broadcast only when more than one
    // thread exists, and the forked child has exactly one. The descriptors are `O_CLOEXEC`, so
    // they are closed by the `execve` that follows and do not leak into the probe command.
    unsafe {
        command.pre_exec(steps);
    }
}
