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
