//! `podprobe run`'s command line: a bad flag value is refused before anything starts, naming the
//! flag and the value (exit 2, no panic), so a pod with a typo in its injected args fails at
//! once with a reason instead of running with a setting it did not ask for.

use std::process::{Command, Stdio};

#[test]
fn bad_event_budget_and_repair_values_are_refused_with_the_flag_named() {
    for (flag, value) in [
        ("--event-burst", "0"),
        ("--event-refill", "soon"),
        ("--overwrite-repair", "sometimes"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_podprobe"))
            .args(["run", flag, value])
            .env("POD_NAME", "p")
            .env("POD_NAMESPACE", "default")
            .stdin(Stdio::null())
            .output()
            .expect("run podprobe");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(
            err.contains(flag) && err.contains(value),
            "{flag} {value}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// The repair policy set through the environment (how an injection config without args sets
/// it) is checked the same way.
#[test]
fn a_bad_repair_policy_in_the_environment_is_refused_naming_the_choices() {
    let out = Command::new(env!("CARGO_BIN_EXE_podprobe"))
        .arg("run")
        .env("POD_NAME", "p")
        .env("POD_NAMESPACE", "default")
        .env("PODPROBE_OVERWRITE_REPAIR", "sometimes")
        .stdin(Stdio::null())
        .output()
        .expect("run podprobe");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("sometimes") && err.contains("after-change") && err.contains("immediate"),
        "{err}"
    );
}

/// `podprobe install-agent` (the injected init container) copies the exec agent alone when it
/// is beside the sidecar binary, as in the sidecar image, and the sidecar binary itself when
/// it stands alone; either copy answers `agent`, with the same flags.
#[test]
fn install_agent_copies_the_agent_alone_beside_it_or_else_itself() {
    let version = |binary: &std::path::Path| {
        let out = Command::new(binary).arg("version").output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let agent_help = |binary: &std::path::Path| {
        let out = Command::new(binary)
            .args(["agent", "--help"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let install = |binary: &std::path::Path, dest: &std::path::Path| {
        let out = Command::new(binary)
            .arg("install-agent")
            .arg(dest)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        out
    };
    let sidecar = std::path::Path::new(env!("CARGO_BIN_EXE_podprobe"));
    let alone = std::path::Path::new(env!("CARGO_BIN_EXE_podprobe-agent"));
    assert_eq!(
        sidecar.parent(),
        alone.parent(),
        "cargo puts both bins together"
    );

    let volume = tempfile::tempdir().unwrap();
    let dest = volume.path().join("podprobe");
    let out = install(sidecar, &dest);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("podprobe-agent"),
        "says what it copied: {out:?}"
    );
    assert!(version(&dest).starts_with("podprobe-agent "));
    assert_eq!(std::fs::read(&dest).unwrap(), std::fs::read(alone).unwrap());
    assert_eq!(agent_help(&dest), agent_help(sidecar));

    // A sidecar binary without the agent beside it copies itself.
    let lone_dir = tempfile::tempdir().unwrap();
    let lone = lone_dir.path().join("podprobe");
    std::fs::copy(sidecar, &lone).unwrap();
    let dest = volume.path().join("itself");
    install(&lone, &dest);
    assert!(
        version(&dest).starts_with("podprobe "),
        "{}",
        version(&dest)
    );
}
