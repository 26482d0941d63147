//! `procfs` exec mode against a real process running chrooted in a prepared root directory,
//! as a non-root uid, so `/proc/<pid>/root` differs from ours.
//!
//! Needs root with CAP_SYS_CHROOT (chroot, setuid), a writable cgroup hierarchy and `capsh`, as
//! the project's machines have (`hack/setup-tests.sh` installs capsh); a missing prerequisite
//! fails the test with what is missing, it never passes unrun. Every child is spawned through
//! podprobe's reaper.
#[path = "support/rootfs.rs"]
mod rootfs;
#[path = "support/zombies.rs"]
mod zombies;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use podprobe::probe::exec::procfs;
use podprobe::probe::{
    AttemptError, ExecAction, ExecConfig, ExecMode, Handler, Observation, Outcome, Prober, Target,
    reaper,
};
use rootfs::{TARGET_UID, TargetProcess};

const SEC: Duration = Duration::from_secs(1);

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    target: TargetProcess,
}

/// Panics, naming what is missing, where the machine cannot run these tests.
fn require_chroot() {
    if let Some(why) = rootfs::cannot_chroot() {
        panic!("procfs exec mode needs root with CAP_SYS_CHROOT to be tested: {why}");
    }
}

async fn fixture() -> Fixture {
    require_chroot();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    rootfs::build(&root).await;
    let target = TargetProcess::start(&root).await;
    Fixture {
        _dir: dir,
        root,
        target,
    }
}

fn cmd(argv: &[&str]) -> ExecAction {
    ExecAction {
        command: argv.iter().map(|s| s.to_string()).collect(),
    }
}

async fn in_target(
    pid: i32,
    action: ExecAction,
    timeout: Duration,
) -> Result<Observation, AttemptError> {
    procfs::attempt_in(Path::new("/proc"), pid, &action, timeout).await
}

/// The probe sees the target's files, environment, working directory and runs as its uid/gid.
#[tokio::test]
async fn runs_with_the_targets_root_env_cwd_and_ids() {
    let f = fixture().await;
    let obs = in_target(
        f.target.pid,
        cmd(&[
            "sh",
            "-c",
            "echo \"$GAME_MODE\"; pwd; id -u; id -g; cat only-in-target; test -e /usr && echo sidecar-root-visible; true",
        ]),
        5 * SEC,
    )
    .await
    .unwrap();
    assert_eq!(obs.outcome, Outcome::Succeeded, "{obs:?}");
    assert_eq!(
        obs.message,
        format!("idle\n/data\n{TARGET_UID}\n{TARGET_UID}\ntarget-file")
    );
    // And the sidecar's own environment did not leak in.
    let obs = in_target(
        f.target.pid,
        cmd(&["sh", "-c", "printf '%s' \"$HOME$CARGO\""]),
        5 * SEC,
    )
    .await
    .unwrap();
    assert_eq!(obs.message, "");
}

/// A script that exists only in the target's root succeeds in procfs mode (by path and through
/// the target's PATH), and cannot even start in local mode.
#[tokio::test]
async fn a_script_only_in_the_target_root_succeeds() {
    let f = fixture().await;
    let by_path = in_target(f.target.pid, cmd(&["/data/probe.sh"]), 5 * SEC)
        .await
        .unwrap();
    assert_eq!(by_path, Observation::succeeded("in-target:idle"));
    let by_path_lookup = in_target(f.target.pid, cmd(&["probe.sh"]), 5 * SEC)
        .await
        .unwrap();
    assert_eq!(by_path_lookup, Observation::succeeded("in-target:idle"));
    let bash_style = in_target(f.target.pid, cmd(&["sh", "/data/probe.sh"]), 5 * SEC)
        .await
        .unwrap();
    assert_eq!(bash_style, Observation::succeeded("in-target:idle"));

    let local = podprobe::probe::exec::attempt(&cmd(&["/data/probe.sh"]), 5 * SEC).await;
    assert!(
        matches!(local, Err(AttemptError::Spawn { .. })),
        "{local:?}"
    );
}

/// Exit codes, stderr and missing commands behave as in local mode.
#[tokio::test]
async fn failures_and_missing_commands() {
    let f = fixture().await;
    let obs = in_target(
        f.target.pid,
        cmd(&["sh", "-c", "echo out; echo broken >&2; exit 3"]),
        5 * SEC,
    )
    .await
    .unwrap();
    assert_eq!(obs, Observation::failed("broken\n"));
    // Exists on this machine, not in the target: a normal errored attempt, not "mode unavailable".
    let err = in_target(f.target.pid, cmd(&["ls"]), 5 * SEC)
        .await
        .unwrap_err();
    assert!(matches!(err, AttemptError::Spawn { .. }), "{err:?}");
}

fn alive(pid: i32) -> bool {
    // A zombie still has a /proc entry; "gone" means reaped.
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Timeout: Failed with the local message, the whole group (a background grandchild included)
/// is killed and reaped; no zombies remain and the target itself lives on.
#[tokio::test]
async fn timeout_kills_the_whole_group_without_zombies() {
    let f = fixture().await;
    let orphans = reaper::orphans_reaped();
    let script = "sleep 30 & echo $! > /tmp/bg; sleep 30";
    let started = Instant::now();
    let obs = in_target(f.target.pid, cmd(&["sh", "-c", script]), SEC)
        .await
        .unwrap();
    assert!(started.elapsed() < 5 * SEC, "{:?}", started.elapsed());
    assert_eq!(obs.outcome, Outcome::Failed);
    assert_eq!(
        obs.message,
        format!("command timed out: \"sh -c {script}\" timed out after 1s")
    );
    let bg: i32 = std::fs::read_to_string(f.root.join("tmp/bg"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The group's other members (the background and the foreground `sleep`) are orphans once
    // `sh` is killed, reaped by the reaper thread in whatever order: wait for all of them.
    let mut orphans = orphans;
    let gone = async {
        while alive(bg) || !zombies::zombie_children().is_empty() {
            let seen = *orphans.borrow_and_update();
            let _ = tokio::time::timeout(SEC, orphans.wait_for(|n| *n > seen)).await;
        }
    };
    tokio::time::timeout(10 * SEC, gone)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "after the timeout kill: background child {bg} alive: {}, zombies: {:?}",
                alive(bg),
                zombies::zombie_children()
            )
        });
    assert!(
        alive(f.target.pid),
        "the target process must not be touched"
    );
}

/// The whole path through `Prober` in `procfs` mode: the target is found by its containerID in
/// `/proc/<pid>/cgroup` (we put it in a cgroup named like containerd's), and `auto` picks
/// procfs for it.
#[tokio::test]
async fn prober_finds_the_target_by_container_id() {
    let f = fixture().await;
    let hex = format!("{:064x}", u128::from(std::process::id()) << 64 | 0xfeed);
    let cgroup = Cgroup::create(&format!("cri-containerd-{hex}.scope"));
    cgroup.add(f.target.pid);
    let target = Target {
        container_name: "game".into(),
        container_id: Some(format!("containerd://{hex}")),
        ..Target::new("127.0.0.1")
    };
    let handler = Handler::Exec(cmd(&["/data/probe.sh"]));
    for mode in [ExecMode::Procfs, ExecMode::Auto] {
        let prober = Prober::default().with_exec(ExecConfig {
            mode,
            ..Default::default()
        });
        let obs = prober.attempt(&handler, &target, 5 * SEC).await.unwrap();
        assert_eq!(obs, Observation::succeeded("in-target:idle"), "{mode}");
        assert_eq!(prober.exec_mode_for(&target), ExecMode::Procfs);
    }
    f.target.stop().await;
    drop(cgroup);
}

/// A cgroup2 directory of our own, removed on drop.
struct Cgroup {
    parent: PathBuf,
    path: PathBuf,
}

impl Cgroup {
    /// In the cgroup2 hierarchy, or else the first cgroup v1 one (a host on cgroup v1 shows the
    /// container id in `/proc/<pid>/cgroup` just the same). Panics, naming why, where neither is
    /// mounted writable.
    fn create(name: &str) -> Cgroup {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mounts: Vec<(&str, PathBuf)> = mountinfo
            .lines()
            .filter_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                let fstype = right.split_whitespace().next()?;
                let point = left.split_whitespace().nth(4)?;
                Some((fstype, PathBuf::from(point)))
            })
            .filter(|(fstype, _)| *fstype == "cgroup2" || *fstype == "cgroup")
            .collect();
        let mount = mounts
            .iter()
            .find(|(fstype, _)| *fstype == "cgroup2")
            .or_else(|| mounts.first())
            .map(|(_, point)| point)
            .expect("no cgroup hierarchy is mounted: the container-id lookup cannot be tested");
        let parent = mount.join(format!("podprobe-test-{}", std::process::id()));
        let path = parent.join(name);
        if let Err(e) = std::fs::create_dir_all(&path) {
            panic!("cannot create a cgroup under {}: {e}", mount.display());
        }
        Cgroup { parent, path }
    }

    fn add(&self, pid: i32) {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.path);
        let _ = std::fs::remove_dir(&self.parent);
    }
}

/// The documented sequence without CAP_SYS_PTRACE (as in a default Kubernetes
/// container): opening `/proc/<pid>/root` of a non-root target needs the fsuid switch. Runs
/// this same test again in a child with CAP_SYS_PTRACE dropped from the bounding set (capsh).
#[tokio::test]
async fn works_without_cap_sys_ptrace() {
    const INNER: &str = "PODPROBE_TEST_NO_PTRACE";
    if std::env::var_os(INNER).is_some() {
        let caps = std::fs::read_to_string("/proc/self/status").unwrap();
        let eff = caps
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
            .unwrap();
        assert_eq!(eff & (1 << 19), 0, "CAP_SYS_PTRACE is still effective");
        let f = fixture().await;
        let obs = in_target(
            f.target.pid,
            cmd(&["sh", "-c", "id -u; cat only-in-target"]),
            5 * SEC,
        )
        .await
        .unwrap();
        assert_eq!(
            obs,
            Observation::succeeded(format!("{TARGET_UID}\ntarget-file"))
        );
        return;
    }
    require_chroot();
    let capsh = ["/usr/sbin/capsh", "/sbin/capsh", "/usr/bin/capsh"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("capsh is not installed (package libcap2-bin; hack/setup-tests.sh installs it)");
    let exe = std::env::current_exe().unwrap();
    let mut command = std::process::Command::new(capsh);
    command
        .args(["--drop=cap_sys_ptrace", "--", "-c", "exec \"$@\"", "capsh"])
        .arg(exe)
        .args(["--exact", "works_without_cap_sys_ptrace", "--nocapture"])
        .env(INNER, "1");
    let (_child, exit) = reaper::spawn(&mut command).unwrap();
    let status = exit.wait().await.unwrap();
    assert!(
        status.success(),
        "the test without CAP_SYS_PTRACE failed: {status:?}"
    );
}

/// `proc` mounted at `<root>/proc` while it lives, so a command chrooted there can read its
/// own `/proc/self/status`.
struct ProcMount(PathBuf);

impl ProcMount {
    async fn at(root: &Path) -> ProcMount {
        let at = root.join("proc");
        std::fs::create_dir_all(&at).unwrap();
        let mut mount = std::process::Command::new("mount");
        mount.args(["-t", "proc", "proc"]).arg(&at);
        let (_child, exit) = reaper::spawn(&mut mount).unwrap();
        let status = exit.wait().await.unwrap();
        assert!(
            status.success(),
            "mount proc at {}: {status:?}",
            at.display()
        );
        ProcMount(at)
    }
}

impl Drop for ProcMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// The `Cap*:` and `NoNewPrivs:` lines of a status file, in order.
fn limits(status: &str) -> Vec<String> {
    status
        .lines()
        .filter(|l| l.starts_with("Cap") || l.starts_with("NoNewPrivs:"))
        .map(str::to_owned)
        .collect()
}

/// A root target confined as a hardened container's process is (no_new_privs, a small
/// bounding set): the probe command, although podprobe here holds every capability, runs with
/// exactly the target's capability sets, bounding set and no_new_privs, not podprobe's.
#[tokio::test]
async fn the_command_holds_no_more_than_the_target() {
    require_chroot();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    rootfs::build(&root).await;
    let _proc = ProcMount::at(&root).await;
    let target = TargetProcess::start_confined_root(&root).await;
    let theirs = std::fs::read_to_string(format!("/proc/{}/status", target.pid)).unwrap();
    assert!(theirs.contains("NoNewPrivs:\t1"), "{theirs}");
    let ours = std::fs::read_to_string("/proc/self/status").unwrap();
    assert_ne!(
        limits(&ours),
        limits(&theirs),
        "the test needs a wider podprobe"
    );

    let obs = in_target(target.pid, cmd(&["cat", "/proc/self/status"]), 5 * SEC)
        .await
        .unwrap();
    assert_eq!(obs.outcome, Outcome::Succeeded, "{obs:?}");
    assert_eq!(limits(&obs.message), limits(&theirs), "{}", obs.message);
    target.stop().await;
}
