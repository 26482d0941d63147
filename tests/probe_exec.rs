//! exec probe handler against real child processes.
//!
//! Every child in this binary is spawned through podprobe's reaper (which waits for *all*
//! children of the process), so no test here may use `std::process::Command::output` & co.
use std::time::Duration;

#[path = "support/zombies.rs"]
mod zombies;

use podprobe::probe::{
    AttemptError, ExecAction, Handler, MAX_MESSAGE_BYTES, MAX_READ_BYTES, Outcome, Prober, Target,
    exec, reaper,
};

fn cmd(argv: &[&str]) -> ExecAction {
    ExecAction {
        command: argv.iter().map(|s| s.to_string()).collect(),
    }
}

fn sh(script: &str) -> ExecAction {
    cmd(&["sh", "-c", script])
}

const SEC: Duration = Duration::from_secs(1);

async fn probe(
    action: ExecAction,
    timeout: Duration,
) -> Result<podprobe::probe::Observation, AttemptError> {
    Prober::default()
        .attempt(&Handler::Exec(action), &Target::new("127.0.0.1"), timeout)
        .await
}

/// E1: exit 0 with output "OK" → Succeeded, "OK".
#[tokio::test]
async fn e1_exit_zero_succeeds_with_output() {
    let obs = probe(cmd(&["printf", "OK"]), SEC).await.unwrap();
    assert_eq!(obs.outcome, Outcome::Succeeded);
    assert_eq!(obs.message, "OK");
}

/// OpenKruise: on success the message is stdout only (stderr is dropped).
#[tokio::test]
async fn success_message_is_stdout_only() {
    let obs = probe(sh("printf gate; printf noise >&2"), SEC)
        .await
        .unwrap();
    assert_eq!(obs.outcome, Outcome::Succeeded);
    assert_eq!(obs.message, "gate");
}

/// E3: 11264 bytes of stdout → the first 10240 bytes (handler level; the runner-facing
/// `Prober::attempt` further caps the message at 1024 bytes).
#[tokio::test]
async fn e3_output_is_capped_at_10_kib() {
    let script =
        "i=0; while [ $i -lt 11 ]; do head -c 1024 /dev/zero | tr '\\0' $i; i=$((i+1)); done";
    let obs = exec::attempt(&sh(script), 5 * SEC).await.unwrap();
    assert_eq!(obs.outcome, Outcome::Succeeded);
    assert_eq!(obs.message.len(), MAX_READ_BYTES);
    let mut want = String::new();
    for i in 0..10 {
        want.push_str(&i.to_string().repeat(1024));
    }
    assert_eq!(obs.message, want);
}

/// E5: exit 1 → Failed with message = stderr. This deliberately follows OpenKruise (stderr
/// only), not kubelet (stdout followed by stderr).
#[tokio::test]
async fn e5_nonzero_exit_fails_with_stderr() {
    let obs = probe(sh("printf stdout-text; printf Fail >&2; exit 1"), SEC)
        .await
        .unwrap();
    assert_eq!(obs.outcome, Outcome::Failed);
    assert_eq!(obs.message, "Fail");
}

#[tokio::test]
async fn killed_by_signal_fails_naming_the_signal() {
    let obs = probe(sh("kill -TERM $$"), SEC).await.unwrap();
    assert_eq!(obs.outcome, Outcome::Failed);
    assert!(obs.message.contains("SIGTERM"), "{}", obs.message);
}

fn proc_exists(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// E6: timeout → Failed with kubelet's CRI text, and the whole process group is killed
/// (a background grandchild included).
#[tokio::test]
async fn e6_timeout_kills_the_whole_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = format!(
        "sleep 30 & echo $! > {}.tmp; mv {0}.tmp {0}; sleep 30",
        pidfile.display()
    );
    let orphans = reaper::orphans_reaped();
    let before = *orphans.borrow();
    let action = sh(&script);
    let started = std::time::Instant::now();
    let obs = probe(action.clone(), SEC).await.unwrap();
    assert!(started.elapsed() >= SEC);
    assert!(started.elapsed() < 5 * SEC, "{:?}", started.elapsed());
    assert_eq!(obs.outcome, Outcome::Failed);
    assert_eq!(
        obs.message,
        format!("command timed out: \"sh -c {script}\" timed out after 1s")
    );
    let grandchild: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The killed grandchild is re-parented to us (child subreaper) and reaped as an orphan.
    // Wait on the reaper's orphan counter (not a sleep) until the grandchild is gone.
    let mut orphans = orphans;
    let gone = async {
        let mut seen = before;
        while proc_exists(grandchild) {
            orphans.wait_for(|n| *n > seen).await.unwrap();
            seen = *orphans.borrow();
        }
    };
    tokio::time::timeout(10 * SEC, gone)
        .await
        .unwrap_or_else(|_| panic!("grandchild {grandchild} survived the timeout kill"));
}

/// E9: a missing executable is an errored attempt, not a failure.
#[tokio::test]
async fn e9_missing_executable_is_an_error() {
    let err = probe(cmd(&["/nonexistent/podprobe-no-such-cmd"]), SEC)
        .await
        .unwrap_err();
    assert!(matches!(err, AttemptError::Spawn { .. }), "{err:?}");
    let err = probe(cmd(&["podprobe-no-such-cmd-in-path"]), SEC)
        .await
        .unwrap_err();
    assert!(matches!(err, AttemptError::Spawn { .. }), "{err:?}");
}

#[tokio::test]
async fn non_executable_file_is_an_error() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let err = probe(cmd(&[file.path().to_str().unwrap()]), SEC)
        .await
        .unwrap_err();
    assert!(matches!(err, AttemptError::Spawn { .. }), "{err:?}");
}

#[tokio::test]
async fn empty_command_is_an_error() {
    assert!(probe(cmd(&[]), SEC).await.is_err());
}

/// No shell and no `$(VAR)` expansion: argv reaches the program verbatim.
#[tokio::test]
async fn argv_is_passed_verbatim() {
    let obs = probe(cmd(&["printf", "%s|", "$(HOME)", "a b", "$HOME"]), SEC)
        .await
        .unwrap();
    assert_eq!(obs.message, "$(HOME)|a b|$HOME|");
}

/// The command's stdin is /dev/null (a command reading stdin sees EOF at once).
#[tokio::test]
async fn stdin_is_null() {
    let obs = probe(cmd(&["cat"]), SEC).await.unwrap();
    assert_eq!(obs.outcome, Outcome::Succeeded);
    assert_eq!(obs.message, "");
}

/// A background grandchild that keeps the pipes open does not hold the attempt until the
/// timeout: once the main process has exited, buffered output is taken and the attempt ends.
#[tokio::test]
async fn background_child_holding_the_pipe_does_not_block() {
    let started = std::time::Instant::now();
    let obs = probe(sh("printf ready; sleep 3 &"), 10 * SEC)
        .await
        .unwrap();
    assert_eq!(obs.outcome, Outcome::Succeeded);
    assert_eq!(obs.message, "ready");
    assert!(started.elapsed() < 2 * SEC, "{:?}", started.elapsed());
}

/// Many probes that leave a background child behind: every orphan is reaped, no zombie remains.
#[tokio::test]
async fn orphaned_grandchildren_are_reaped() {
    const N: u64 = 200;
    let mut orphans = reaper::orphans_reaped();
    let before = *orphans.borrow();
    for _ in 0..N {
        let obs = probe(sh("sleep 0.2 &"), 5 * SEC).await.unwrap();
        assert_eq!(obs.outcome, Outcome::Succeeded);
    }
    tokio::time::timeout(30 * SEC, orphans.wait_for(|n| *n >= before + N))
        .await
        .expect("not every orphan was reaped")
        .unwrap();
    assert_eq!(zombies::zombie_children(), Vec::<i32>::new());
}

/// Fast-exiting children started concurrently: each status reaches its own attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_fast_children_get_their_own_status() {
    let attempts = (0..64).map(|i| async move {
        let code = i % 3;
        let obs = probe(
            sh(&format!("printf {i}; printf e{i} >&2; exit {code}")),
            5 * SEC,
        )
        .await
        .unwrap();
        (i, code, obs)
    });
    for (i, code, obs) in futures::future::join_all(attempts).await {
        if code == 0 {
            assert_eq!(obs.outcome, Outcome::Succeeded);
            assert_eq!(obs.message, i.to_string());
        } else {
            assert_eq!(obs.outcome, Outcome::Failed);
            assert_eq!(obs.message, format!("e{i}"));
        }
    }
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} missing from /proc/self/status"))
}

/// A command printing 50 MiB: Succeeded, message capped, memory does not grow with the output.
#[tokio::test]
async fn fifty_mib_of_output_keeps_memory_bounded() {
    let hwm_before = status_kib("VmHWM:");
    let obs = probe(sh("yes podprobe | head -c 52428800"), 30 * SEC)
        .await
        .unwrap();
    assert_eq!(obs.outcome, Outcome::Succeeded);
    assert!(obs.message.len() <= MAX_MESSAGE_BYTES);
    assert!(obs.message.starts_with("podprobe\npodprobe\n"));
    let hwm_after = status_kib("VmHWM:");
    let rss_after = status_kib("VmRSS:");
    assert!(
        hwm_after - hwm_before < 8 * 1024,
        "peak RSS grew by {} KiB (now {rss_after} KiB)",
        hwm_after - hwm_before
    );
}

/// An abandoned attempt (its future dropped, e.g. on shutdown) kills the command's group
/// instead of leaving it running unobserved.
#[tokio::test]
async fn abandoned_attempt_kills_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pid.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    // Read-write open (Linux): the reader never sees EOF while the script has not opened it.
    let mut reader = tokio::net::unix::pipe::OpenOptions::new()
        .read_write(true)
        .open_receiver(&fifo)
        .unwrap();
    let mut orphans = reaper::orphans_reaped();
    let script = format!("echo $$ > {}; sleep 30", fifo.display());
    let attempt = tokio::spawn(async move { probe(sh(&script), 60 * SEC).await });
    let mut line = String::new();
    let mut buf = [0u8; 64];
    while !line.ends_with('\n') {
        let n = tokio::io::AsyncReadExt::read(&mut reader, &mut buf)
            .await
            .unwrap();
        line.push_str(std::str::from_utf8(&buf[..n]).unwrap());
    }
    let pid: i32 = line.trim().parse().unwrap();
    assert!(proc_exists(pid));
    attempt.abort();
    assert!(attempt.await.unwrap_err().is_cancelled());
    let gone = async {
        let mut seen = *orphans.borrow();
        while proc_exists(pid) {
            orphans.wait_for(|n| *n > seen).await.unwrap();
            seen = *orphans.borrow();
        }
    };
    tokio::time::timeout(10 * SEC, gone)
        .await
        .unwrap_or_else(|_| panic!("command {pid} survived its abandoned attempt"));
}
