//! What podprobe reads from a process' `/proc` files, parsed from their contents alone (the
//! reads are `mod.rs`'s), so the `proc_files` fuzz target can feed them any bytes: a process
//! in a shared PID namespace controls its own `Name:` and environment.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

/// The ids a process runs with (effective uid/gid, supplementary groups).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcIds {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// The fields of `/proc/<pid>/status` podprobe uses; each `None` (or empty) when its line is
/// missing or does not parse.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcStatus {
    /// `Name:`, trimmed.
    pub name: String,
    /// `PPid:`.
    pub ppid: Option<i32>,
    /// The effective ids: the second field of `Uid:` and `Gid:`, with `Groups:`.
    pub ids: Option<ProcIds>,
    /// The capability sets (`CapInh`, `CapPrm`, `CapEff`, `CapBnd`): what a probe command may
    /// not exceed, or what this process holds; `None` unless all four parse.
    pub caps: Option<CapSets>,
    /// `NoNewPrivs: 1`.
    pub no_new_privs: bool,
}

/// A process' capability sets, one bit per capability.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapSets {
    pub inheritable: u64,
    pub permitted: u64,
    pub effective: u64,
    pub bounding: u64,
}

impl ProcStatus {
    /// Reads the first line of each field; unknown lines are ignored.
    pub fn parse(text: &str) -> ProcStatus {
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
        };
        let numbers = |name: &str| -> Vec<u32> {
            let numbers = field(name).unwrap_or_default().split_whitespace();
            numbers.filter_map(|n| n.parse().ok()).collect()
        };
        let (uid, gid) = (numbers("Uid:"), numbers("Gid:"));
        let ids = match (uid.get(1), gid.get(1)) {
            (Some(&uid), Some(&gid)) => Some(ProcIds {
                uid,
                gid,
                groups: numbers("Groups:"),
            }),
            _ => None,
        };
        let hex = |name: &str| field(name).and_then(|v| u64::from_str_radix(v, 16).ok());
        let caps = match (
            hex("CapInh:"),
            hex("CapPrm:"),
            hex("CapEff:"),
            hex("CapBnd:"),
        ) {
            (Some(inheritable), Some(permitted), Some(effective), Some(bounding)) => {
                Some(CapSets {
                    inheritable,
                    permitted,
                    effective,
                    bounding,
                })
            }
            _ => None,
        };
        ProcStatus {
            name: field("Name:").unwrap_or_default().to_owned(),
            ppid: field("PPid:").and_then(|v| v.parse().ok()),
            ids,
            caps,
            no_new_privs: field("NoNewPrivs:") == Some("1"),
        }
    }
}

/// `/proc/<pid>/environ`: NUL-separated `KEY=value` pairs; entries without `=` or with an
/// empty key are skipped, as execve would never have set them.
pub fn parse_environ(raw: &[u8]) -> Vec<(OsString, OsString)> {
    raw.split(|b| *b == 0)
        .filter(|kv| !kv.is_empty())
        .filter_map(|kv| {
            let eq = kv.iter().position(|b| *b == b'=')?;
            (eq > 0).then(|| {
                (
                    OsString::from_vec(kv[..eq].to_vec()),
                    OsString::from_vec(kv[eq + 1..].to_vec()),
                )
            })
        })
        .collect()
}
