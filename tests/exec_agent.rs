//! `agent` exec mode against the real `podprobe agent` process: the exec contract through its
//! socket (the vectors `local` mode passes in probe_exec.rs), and what the agent owes the
//! container as its main process (signals forwarded, orphans reaped, the exit code kept).
//!
//! Every child in this binary is spawned through podprobe's reaper (which waits for *all*
//! children of the process), so no test here may use `std::process::Command::output` & co.
#[path = "support/zombies.rs"]
mod zombies;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use podprobe::probe::exec::agent::{Request, Response, read_line, socket_path, write_line};
use podprobe::probe::reaper::{self, ExitStatusFuture};
use podprobe::probe::{
    AgentExec, AttemptError, ExecAction, ExecConfig, ExecMode, Handler, MAX_MESSAGE_BYTES,
    Observation, Outcome, Prober, Target,
};

const SEC: Duration = Duration::from_secs(1);
const CONTAINER: &str = "game";

fn cmd(argv: &[&str]) -> ExecAction {
    ExecAction {
        command: argv.iter().map(|s| s.to_string()).collect(),
    }
}

fn sh(script: &str) -> ExecAction {
    cmd(&["sh", "-c", script])
}

/// A running `podprobe agent` wrapping `command`, in its own process group (killed on drop).
struct Agent {
    dir: tempfile::TempDir,
    pid: Pid,
    exit: Option<ExitStatusFuture>,
}

impl Agent {
    async fn start(command: &[&str]) -> Agent {
        Agent::start_with(command, |_| {}).await
    }

    /// Starts the agent in a fresh directory (the shared volume, also its working directory's
    /// parent), with `FOO` in its environment, after `adjust` had its say.
    async fn start_with(command: &[&str], adjust: impl FnOnce(&mut Command)) -> Agent {
        Agent::start_in(None, command, adjust).await
    }

    /// [`Agent::start_with`], the agent moved into `cgroup` (a directory of a cgroup
    /// hierarchy) before it starts, as a runtime puts a container's first process.
    async fn start_in(
        cgroup: Option<&Path>,
        command: &[&str],
        adjust: impl FnOnce(&mut Command),
    ) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let socket = socket_path(dir.path(), CONTAINER);
        std::fs::create_dir(socket.parent().unwrap()).unwrap();
        // Writable by every user, as an emptyDir is.
        for path in [dir.path(), &work, socket.parent().unwrap()] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        // As the injected init container does: the agent runs from the shared volume (where
        // the container's user can execute it).
        let binary = dir.path().join("podprobe");
        let mut install = Command::new(env!("CARGO_BIN_EXE_podprobe"));
        install.arg("install-agent").arg(&binary);
        let (child, installed) = reaper::spawn(&mut install).unwrap();
        drop(child);
        assert!(
            installed.wait().await.is_some_and(|s| s.success()),
            "podprobe install-agent failed"
        );
        let mut agent = match cgroup {
            None => Command::new(&binary),
            Some(cgroup) => {
                let mut moved = Command::new("sh");
                moved
                    .args(["-c", "echo $$ > \"$0/cgroup.procs\" && exec \"$@\""])
                    .arg(cgroup)
                    .arg(&binary);
                moved
            }
        };
        agent
            .args(["agent", "--socket"])
            .arg(&socket)
            .arg("--")
            .args(command)
            .env("FOO", "from-the-container")
            .current_dir(&work)
            .process_group(0);
        adjust(&mut agent);
        let (child, exit) = reaper::spawn(&mut agent).unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        drop(child);
        let agent = Agent {
            dir,
            pid,
            exit: Some(exit),
        };
        until_exists(&socket, "the agent's socket").await;
        agent
    }

    fn volume(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    fn prober(&self, mode: ExecMode) -> Prober {
        Prober::default().with_exec(ExecConfig {
            mode,
            agent: AgentExec {
                dir: self.volume(),
                containers: vec![CONTAINER.into()],
            },
            ..Default::default()
        })
    }

    async fn probe(
        &self,
        action: ExecAction,
        timeout: Duration,
    ) -> Result<Observation, AttemptError> {
        let target = Target {
            container_name: CONTAINER.into(),
            ..Target::new("127.0.0.1")
        };
        self.prober(ExecMode::Agent)
            .attempt(&Handler::Exec(action), &target, timeout)
            .await
    }

    async fn exited(&mut self) -> ExitStatus {
        let exit = self.exit.take().expect("waited for once");
        tokio::time::timeout(10 * SEC, exit.wait())
            .await
            .expect("the agent did not exit within 10 s")
            .unwrap()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.exit.is_some() {
            // The command and the probe server are in process groups of their own.
            for child in children(self.pid) {
                let _ = killpg(Pid::from_raw(child), Signal::SIGKILL);
            }
            let _ = killpg(self.pid, Signal::SIGKILL);
        }
    }
}

const IDLE: &[&str] = &["sleep", "3600"];

#[tokio::test]
async fn the_exec_contract_holds_through_the_agent() {
    let agent = Agent::start(IDLE).await;
    let observed = |outcome, message: &str| Observation {
        outcome,
        message: message.to_owned(),
    };
    let cases = [
        (cmd(&["printf", "OK"]), observed(Outcome::Succeeded, "OK")),
        (
            sh("echo out; echo err >&2"),
            observed(Outcome::Succeeded, "out\n"),
        ),
        (
            sh("echo out; echo err >&2; exit 3"),
            observed(Outcome::Failed, "err\n"),
        ),
        (
            sh("kill -KILL $$"),
            observed(Outcome::Failed, "command terminated by signal SIGKILL"),
        ),
        // A real-time signal has no name in the kernel's list: numbered from SIGRTMIN.
        (
            sh(&format!("kill -{} $$", rt_min() + 3)),
            observed(Outcome::Failed, "command terminated by signal SIGRTMIN+3"),
        ),
        (
            cmd(&["printf", "%s|", "a b", "$HOME", "*"]),
            observed(Outcome::Succeeded, "a b|$HOME|*|"),
        ),
        (
            cmd(&["printenv", "FOO"]),
            observed(Outcome::Succeeded, "from-the-container\n"),
        ),
        (sh("cat; echo done"), observed(Outcome::Succeeded, "done\n")),
    ];
    for (action, want) in cases {
        let got = agent.probe(action.clone(), 5 * SEC).await;
        assert_eq!(got.unwrap(), want, "{action:?}");
    }
    let cwd = agent.probe(cmd(&["pwd"]), 5 * SEC).await.unwrap();
    let work = agent.volume().join("work").canonicalize().unwrap();
    assert_eq!(cwd.message.trim_end(), work.to_str().unwrap());

    // The agent keeps what `local` keeps; the prober then caps the message for both.
    let big = sh("head -c 100000 /dev/zero | tr '\\0' a");
    let local = Prober::default()
        .attempt(
            &Handler::Exec(big.clone()),
            &Target::new("127.0.0.1"),
            5 * SEC,
        )
        .await
        .unwrap();
    let through_agent = agent.probe(big, 5 * SEC).await.unwrap();
    assert_eq!(through_agent, local);
    assert_eq!(through_agent.message.len(), MAX_MESSAGE_BYTES);

    let missing = agent.probe(cmd(&["/no/such/probe"]), 5 * SEC).await;
    let err = missing.unwrap_err().to_string();
    assert!(
        err.contains("cannot start command") && err.contains("/no/such/probe"),
        "{err}"
    );
}

/// Waits until `path` exists: at most 10 s, then panics naming `what`.
async fn until_exists(path: &Path, what: &str) {
    let deadline = tokio::time::Instant::now() + 10 * SEC;
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {what} after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `pid` has no zombie child: every process the group kill or an exit left is
/// reaped (each on its own SIGCHLD, so not all at the same instant).
async fn until_no_zombies(pid: i32) {
    let deadline = tokio::time::Instant::now() + 10 * SEC;
    loop {
        let zombies = zombies::zombie_children_of(pid);
        if zombies.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "zombie children of {pid} after 10 s: {zombies:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Until `pid` is gone from /proc: reaped, not a zombie (a zombie keeps its /proc entry).
async fn until_reaped(pid: i32) {
    let deadline = tokio::time::Instant::now() + 10 * SEC;
    while alive(pid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pid {pid} still in /proc after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn read_pid(file: &Path) -> i32 {
    std::fs::read_to_string(file)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_timeout_kills_the_commands_group_and_says_what_the_kubelet_says() {
    let agent = Agent::start(IDLE).await;
    let pidfile = agent.volume().join("grandchild");
    let script = format!(
        "sleep 30 & echo $! > {0}.tmp; mv {0}.tmp {0}; sleep 30",
        pidfile.display()
    );
    let started = std::time::Instant::now();
    let obs = agent.probe(sh(&script), SEC).await.unwrap();
    assert!(started.elapsed() >= SEC);
    assert_eq!(obs.outcome, Outcome::Failed);
    assert_eq!(
        obs.message,
        format!("command timed out: \"sh -c {script}\" timed out after 1s")
    );
    until_reaped(read_pid(&pidfile)).await;
    until_no_zombies(agent.pid.as_raw()).await;
}

/// Needs root to start the agent as another user, as CI's machines have; fails otherwise.
#[tokio::test]
async fn probes_run_as_the_containers_user() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test starts the agent as uid 65534 and needs root"
    );
    let agent = Agent::start_with(IDLE, |c| {
        c.uid(65534).gid(65534);
    })
    .await;
    let ids = agent
        .probe(sh("echo $(id -u):$(id -g)"), 5 * SEC)
        .await
        .unwrap();
    assert_eq!(ids.message, "65534:65534\n");
}

#[tokio::test]
async fn auto_uses_the_agent_for_its_containers_only_and_never_falls_back_from_it() {
    let mut agent = Agent::start(IDLE).await;
    let auto = agent.prober(ExecMode::Auto);
    let game = Target {
        container_name: CONTAINER.into(),
        ..Target::new("127.0.0.1")
    };
    let other = Target {
        container_name: "other".into(),
        ..Target::new("127.0.0.1")
    };
    assert_eq!(auto.exec_mode_for(&game), ExecMode::Agent);
    assert_ne!(auto.exec_mode_for(&other), ExecMode::Agent);

    // The container stops: its processes are killed (the probe server is in a process group
    // of its own).
    let server = probe_server(agent.pid);
    for child in children(agent.pid) {
        let _ = killpg(Pid::from_raw(child), Signal::SIGKILL);
    }
    // The agent may be gone and reaped already: its command was in its group.
    match killpg(agent.pid, Signal::SIGKILL) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => panic!("cannot kill the agent's group: {e}"),
    }
    // (It may be gone already: it dies with the agent.)
    let _ = kill(Pid::from_raw(server), Signal::SIGKILL);
    agent.exited().await;
    until_reaped(server).await;
    let err = auto
        .attempt(&Handler::Exec(cmd(&["true"])), &game, SEC)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AttemptError::Other(m) if m.contains("not running")),
        "{err:?}"
    );
    assert_eq!(auto.exec_mode_for(&game), ExecMode::Agent);
}

#[tokio::test]
async fn sigterm_reaches_the_command_and_its_exit_code_is_the_containers() {
    let script = "trap 'exit 7' TERM; touch ready; while :; do sleep 0.05; done";
    let mut agent = Agent::start(&["sh", "-c", script]).await;
    let ready = agent.volume().join("work/ready");
    until_exists(&ready, "the command's trap").await;
    kill(agent.pid, Signal::SIGTERM).unwrap();
    assert_eq!(agent.exited().await.code(), Some(7));
}

/// `podprobe agent` as PID 1 of a new PID namespace with its own /proc, as in a container,
/// where it reads its command's signal dispositions as a container's init does. Needs root
/// for the namespace, as CI runs; fails without it.
struct InitAgent {
    dir: tempfile::TempDir,
    /// The namespace's PID 1 (the agent, or the container's own process where the agent runs
    /// beside it), as the test's namespace numbers it.
    pid: Pid,
    exit: ExitStatusFuture,
    _group: KillGroupOnDrop,
}

impl InitAgent {
    /// Starts the agent wrapping `command`, whose `{dir}` is replaced by a fresh directory,
    /// and returns once the command has created `{dir}/ready`.
    async fn start(command: &[&str]) -> InitAgent {
        let agent = [
            env!("CARGO_BIN_EXE_podprobe-agent"),
            "agent",
            "--socket",
            "{dir}/agent.sock",
            "--",
        ];
        let argv: Vec<&str> = agent.iter().chain(command).copied().collect();
        InitAgent::start_as_pid_1(&argv).await
    }

    /// Runs `argv` (its `{dir}` replaced, `{bin}` the agent's binary, as containers run it) as PID 1 of a new PID
    /// namespace, its stderr the namespace's log, and returns once it has created
    /// `{dir}/ready`.
    async fn start_as_pid_1(argv: &[&str]) -> InitAgent {
        let dir = tempfile::tempdir().unwrap();
        let argv: Vec<String> = argv
            .iter()
            .map(|arg| {
                arg.replace("{dir}", &dir.path().display().to_string())
                    .replace("{bin}", env!("CARGO_BIN_EXE_podprobe-agent"))
            })
            .collect();
        let mut unshare = Command::new("unshare");
        unshare
            .args(["--pid", "--fork", "--mount-proc", "--kill-child", "--"])
            .args(&argv)
            // Appended to, as a container's log pipe is: every writer's lines are kept.
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.path().join("agent.log"))
                    .unwrap(),
            )
            // The log line the tests read is at info, the agent's default level, whatever the
            // caller's.
            .env_remove("RUST_LOG")
            .process_group(0);
        let (child, exit) = reaper::spawn(&mut unshare).unwrap();
        let unshare_pid = Pid::from_raw(child.id() as i32);
        drop(child);
        let group = KillGroupOnDrop(unshare_pid);
        let ready = dir.path().join("ready");
        let deadline = tokio::time::Instant::now() + 10 * SEC;
        while !ready.exists() {
            let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
            assert!(
                tokio::time::Instant::now() < deadline,
                "no readiness after 10 s; the log:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let children =
            std::fs::read_to_string(format!("/proc/{unshare_pid}/task/{unshare_pid}/children"))
                .unwrap();
        let agent: i32 = children.trim().parse().expect("unshare's one child");
        assert_eq!(pid_in_its_namespace(agent), "1", "not PID 1");
        InitAgent {
            dir,
            pid: Pid::from_raw(agent),
            exit,
            _group: group,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap()
    }

    async fn until_logged(&self, text: &str) {
        self.until_logged_times(text, 1).await;
    }

    /// Waits until the log says `text` `times` times or more.
    async fn until_logged_times(&self, text: &str, times: usize) {
        let deadline = tokio::time::Instant::now() + 10 * SEC;
        while self.log().matches(text).count() < times {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the agent did not log {text:?}: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sends `sig` to the agent and returns how the namespace ended (the agent's exit code).
    async fn stopped_by(self, sig: i32) -> Option<i32> {
        use rustix_libc_wrappers::process::SignalExt;
        let pid = rustix::process::Pid::from_raw(self.pid.as_raw()).unwrap();
        let signal = rustix::process::Signal::from_raw(sig).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
        let log = self.log();
        let status = tokio::time::timeout(10 * SEC, self.exit.wait()).await;
        let status = status.unwrap_or_else(|_| {
            panic!("the agent did not exit within 10 s of signal {sig}: {log}")
        });
        status.and_then(|s| s.code())
    }
}

/// As PID 1 the agent forwards a signal only if the command would have received it as PID 1:
/// the kernel drops a signal sent to a namespace's init that neither handles nor blocks it, so
/// a command that was PID 1 never saw it, and must not now. Here the command catches USR1 and
/// not TERM (a non-interactive `sh` installs no handler for it and blocks nothing): TERM must
/// leave it running, and the USR1 after it end it with its own exit code. (Outside a
/// namespace's init every signal is forwarded:
/// `sigterm_reaches_the_command_and_its_exit_code_is_the_containers`.)
#[tokio::test]
async fn as_pid_1_the_agent_forwards_only_the_signals_the_command_would_receive() {
    let agent = InitAgent::start(&[
        "sh",
        "-c",
        "trap 'exit 7' USR1; touch {dir}/ready; while :; do sleep 0.05; done",
    ])
    .await;
    kill(agent.pid, Signal::SIGTERM).unwrap();
    agent.until_logged("SIGTERM not forwarded").await;
    // 7: the command's trap ran; 143 would be the command killed by the forwarded TERM.
    assert_eq!(
        agent.stopped_by(libc_signal(Signal::SIGUSR1)).await,
        Some(7)
    );
}

/// The inits users copy from their image's ENTRYPOINT into `command` install no handler: tini
/// and dumb-init wait for signals in `sigtimedwait`/`sigwait`, catatonit blocks them and reads
/// a `signalfd`. As PID 1 each would receive SIGTERM, so the agent must forward it, and the
/// server under them stops as it would without the agent, with its exit code.
#[tokio::test]
async fn as_pid_1_the_agent_forwards_sigterm_to_tini_dumb_init_and_catatonit() {
    let server = "trap 'exit 7' TERM; touch {dir}/ready; while :; do sleep 0.05; done";
    for init in [
        &["tini-static", "--"][..],
        &["dumb-init", "--"][..],
        &["catatonit", "--"][..],
    ] {
        let command: Vec<&str> = init.iter().copied().chain(["sh", "-c", server]).collect();
        let agent = InitAgent::start(&command).await;
        assert_eq!(
            agent.stopped_by(libc_signal(Signal::SIGTERM)).await,
            Some(7),
            "{} as the command",
            init[0]
        );
    }
}

/// A server that blocks its stop signal and waits for it with `sigwait`, as many C and C++
/// servers do, gets it; so does one whose stop signal is real-time (an image's `STOPSIGNAL
/// SIGRTMIN+3`, or a pod's `lifecycle.stopSignal`).
#[tokio::test]
async fn as_pid_1_the_agent_forwards_to_a_sigwait_server_and_real_time_signals() {
    let sigwait_server = |signal: &str, code: u8| {
        format!(
            "import pathlib, signal, sys\n\
             stop = {signal}\n\
             signal.pthread_sigmask(signal.SIG_BLOCK, {{stop}})\n\
             pathlib.Path('{{dir}}/ready').touch()\n\
             signal.sigwait({{stop}})\n\
             sys.exit({code})\n"
        )
    };
    for (signal, number, code) in [
        ("signal.SIGTERM", libc_signal(Signal::SIGTERM), 7),
        ("signal.SIGRTMIN + 3", rt_min() + 3, 9),
    ] {
        let script = sigwait_server(signal, code);
        let agent = InitAgent::start(&["python3", "-c", &script]).await;
        // Once the server sleeps in sigwait, /proc shows its stop signal neither caught nor
        // blocked.
        until_waiting_for_signals(agent.pid).await;
        assert_eq!(
            agent.stopped_by(number).await,
            Some(i32::from(code)),
            "{signal}"
        );
    }
}

/// A command that dies of a real-time signal (a game killed by an unhandled timer signal) ends
/// the container with 128 + the signal's number, as a shell and tini report it. A reaper that
/// decodes only the named signals consumed the zombie and lost its status: the agent then
/// waited for the kubelet's SIGKILL, its container Running with no server.
#[tokio::test]
async fn as_pid_1_a_death_by_a_real_time_signal_ends_the_container_with_its_code() {
    let agent = InitAgent::start(&[
        "python3",
        "-c",
        "import pathlib, time; pathlib.Path('{dir}/ready').touch(); time.sleep(3600)",
    ])
    .await;
    let command = child_with(agent.pid, "-c");
    let signal = rt_min() + 3;
    {
        use rustix_libc_wrappers::process::SignalExt;
        let pid = rustix::process::Pid::from_raw(command).unwrap();
        let rt = rustix::process::Signal::from_raw(signal).unwrap();
        rustix::process::kill_process(pid, rt).unwrap();
    }
    let ended = tokio::time::timeout(10 * SEC, agent.exit.wait()).await;
    let log = std::fs::read_to_string(agent.dir.path().join("agent.log")).unwrap_or_default();
    let status = ended.unwrap_or_else(|_| panic!("the agent did not end within 10 s: {log}"));
    assert_eq!(status.and_then(|s| s.code()), Some(128 + signal), "{log}");
}

fn libc_signal(sig: Signal) -> i32 {
    sig as i32
}

/// SIGRTMIN as the C library numbers it (`kill -l`'s, and the agent's).
fn rt_min() -> i32 {
    nix::libc::SIGRTMIN()
}

/// Until the agent's one child sleeps in `rt_sigtimedwait`.
async fn until_waiting_for_signals(agent: Pid) {
    let deadline = tokio::time::Instant::now() + 10 * SEC;
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{agent}/task/{agent}/children")).unwrap();
        let child = children.split_whitespace().next().unwrap_or_default();
        let wchan = std::fs::read_to_string(format!("/proc/{child}/wchan")).unwrap_or_default();
        if wchan.contains("sigtimedwait") {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server never waited in sigwait: {wchan:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Kills a process group when dropped (a failed test leaves nothing running).
struct KillGroupOnDrop(Pid);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        let _ = killpg(self.0, Signal::SIGKILL);
    }
}

/// Kills a process when dropped, unless it was seen to exit (its pid may be reused then).
struct KillOnDrop(Option<Pid>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = kill(pid, Signal::SIGKILL);
        }
    }
}

#[tokio::test]
async fn the_exit_code_is_the_commands() {
    for (script, code) in [("exit 0", 0), ("exit 3", 3), ("kill -KILL $$", 137)] {
        let mut agent = Agent::start(&["sh", "-c", &format!("sleep 0.2; {script}")]).await;
        assert_eq!(agent.exited().await.code(), Some(code), "{script}");
    }
}

/// The parent of `pid`, from `/proc/<pid>/stat` (after the last `)`: `comm` may hold any).
fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Process `pid`'s pid in its own (innermost) PID namespace (`NSpid`'s last field).
fn pid_in_its_namespace(pid: i32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let nspid = status.lines().find_map(|l| l.strip_prefix("NSpid:"));
    let innermost = nspid.and_then(|n| n.split_whitespace().last());
    innermost
        .unwrap_or_else(|| panic!("no NSpid for {pid}: {status}"))
        .to_owned()
}

/// The agent's children: its command and its probe server.
fn children(pid: Pid) -> Vec<i32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    let lists = tasks.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok());
    let pids = lists.flat_map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>());
    pids.filter_map(|p| p.parse().ok()).collect()
}

/// The agent's probe server, its child that serves the socket.
fn probe_server(agent: Pid) -> i32 {
    child_with(agent, "--serve-for")
}

/// `parent`'s one child whose command line has `flag`.
fn child_with(parent: Pid, flag: &str) -> i32 {
    let has_flag = |pid: &i32| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        cmdline.split(|b| *b == 0).any(|arg| arg == flag.as_bytes())
    };
    let found: Vec<i32> = children(parent).into_iter().filter(has_flag).collect();
    assert_eq!(found.len(), 1, "{parent}'s children with {flag}: {found:?}");
    found[0]
}

/// Waits until the pid written to `file` (atomically) is `adopter`'s child, then until it is
/// reaped.
async fn adopted_then_reaped(adopter: i32, file: &Path) {
    until_exists(file, "the orphan's pid file").await;
    let deadline = tokio::time::Instant::now() + 10 * SEC;
    let orphan = read_pid(file);
    // This process is a subreaper too: the orphan must land on the adopter, the nearer one.
    while parent(orphan) != Some(adopter) {
        let now = parent(orphan);
        assert!(
            tokio::time::Instant::now() < deadline,
            "orphan {orphan}'s parent is {now:?}, not {adopter}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    until_reaped(orphan).await;
}

#[tokio::test]
async fn orphans_in_the_container_are_adopted_and_reaped() {
    // The command leaves an orphan, and so does a probe.
    let script = "(sleep 1 & echo $! > ../orphan.tmp; mv ../orphan.tmp ../orphan); exec sleep 3600";
    let agent = Agent::start(&["sh", "-c", script]).await;
    adopted_then_reaped(agent.pid.as_raw(), &agent.volume().join("orphan")).await;
    let file = agent.volume().join("probe-orphan");
    let script = format!(
        "sleep 1 & echo $! > {0}.tmp; mv {0}.tmp {0}",
        file.display()
    );
    let obs = agent.probe(sh(&script), 5 * SEC).await.unwrap();
    assert_eq!(obs.outcome, Outcome::Succeeded);
    // A probe's orphan is its probe server's, which reaps it: the agent itself has nothing to
    // do with probes.
    let server = probe_server(agent.pid);
    adopted_then_reaped(server, &file).await;
    until_no_zombies(agent.pid.as_raw()).await;
    until_no_zombies(server).await;
}

/// A launcher may start the agent with SIGCHLD blocked (the mask survives exec). The agent's
/// reaper sleeps until a SIGCHLD, with no timer: it must take the signal anyway, or the
/// container would never see its command exit. Python's `pthread_sigmask` stands for such a
/// launcher.
#[tokio::test]
async fn started_with_sigchld_blocked_the_agent_still_sees_its_command_exit() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let go = dir.path().join("go");
    let launcher = "import os, signal, sys\n\
                    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})\n\
                    os.execv(sys.argv[1], sys.argv[1:])";
    // The command exits once told to, after the agent's mask has been read.
    let command = format!(
        "while [ ! -e {} ]; do sleep 0.02; done; exit 4",
        go.display()
    );
    let mut agent = Command::new("python3");
    agent
        .args([
            "-c",
            launcher,
            env!("CARGO_BIN_EXE_podprobe-agent"),
            "agent",
            "--socket",
        ])
        .arg(&socket)
        .args(["--", "sh", "-c", &command]);
    let (child, exit) = reaper::spawn(&mut agent).unwrap();
    let pid = Pid::from_raw(child.id() as i32);
    drop(child);
    let mut guard = KillOnDrop(Some(pid));
    until_exists(&socket, "the agent's socket").await;
    // The premise: the agent's main thread runs with SIGCHLD blocked, as the launcher left it.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let blocked = status
        .lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .unwrap();
    assert_ne!(
        blocked & (1 << (Signal::SIGCHLD as i32 - 1)),
        0,
        "SIGCHLD is not blocked in the agent: {blocked:x}"
    );
    std::fs::write(&go, "").unwrap();
    let status = tokio::time::timeout(10 * SEC, exit.wait())
        .await
        .expect("the agent did not see its command exit within 10 s");
    guard.0 = None;
    assert_eq!(status.and_then(|s| s.code()), Some(4));
}

/// An agent whose command runs and who serves no probe spends nothing: its reaper thread
/// sleeps until a child exits, with no timer waking it (one agent per pod waits days so).
/// Read from the thread's voluntary context switches over 3 s: a wake-up a second would be
/// three at least.
#[tokio::test]
async fn an_idle_agents_reaper_does_not_wake() {
    let agent = Agent::start(IDLE).await;
    let tasks = format!("/proc/{}/task", agent.pid);
    let reaper_status = std::fs::read_dir(&tasks)
        .unwrap()
        .map(|task| task.unwrap().path())
        .find(|task| {
            std::fs::read_to_string(task.join("comm")).is_ok_and(|c| c.trim() == "podprobe-reaper")
        })
        .expect("the agent's podprobe-reaper thread")
        .join("status");
    let switches = || {
        let status = std::fs::read_to_string(&reaper_status).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap()
    };
    let before = switches();
    tokio::time::sleep(3 * SEC).await;
    let woke = switches() - before;
    assert!(woke <= 1, "the idle reaper woke {woke} times in 3 s");
}

/// Runs `podprobe agent --socket SOCKET -- COMMAND` to its end: its exit code.
async fn run_to_exit(socket: &Path, termination_log: &Path, command: &[&str]) -> Option<i32> {
    let mut agent = Command::new(env!("CARGO_BIN_EXE_podprobe-agent"));
    agent
        .args(["agent", "--socket"])
        .arg(socket)
        .arg("--termination-log")
        .arg(termination_log)
        .arg("--")
        .args(command);
    let (child, exit) = reaper::spawn(&mut agent).unwrap();
    drop(child);
    let status = tokio::time::timeout(10 * SEC, exit.wait()).await.unwrap();
    status.and_then(|s| s.code())
}

/// A missing command exits 127 and one that cannot be executed 126, as a shell answers; why
/// is the container's termination message, which the kubelet shows.
#[tokio::test]
async fn a_command_that_cannot_start_exits_as_a_shell_would_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let not_executable = dir.path().join("server");
    std::fs::write(&not_executable, "data, not a program").unwrap();
    std::fs::set_permissions(&not_executable, std::fs::Permissions::from_mode(0o644)).unwrap();
    let not_executable = not_executable.display().to_string();
    for (command, code, reason) in [
        ("/no/such/server", 127, "No such file or directory"),
        (not_executable.as_str(), 126, "Permission denied"),
    ] {
        let message = dir.path().join("termination-log");
        let status = run_to_exit(&socket, &message, &[command]).await;
        assert_eq!(status, Some(code), "{command}");
        let said = std::fs::read_to_string(&message).unwrap();
        assert!(
            said.contains("podprobe agent: cannot start") && said.contains(reason),
            "{command}: {said:?}"
        );
    }
}

/// Serving probes is second to running the container's command: a socket that cannot be
/// bound (its volume missing) leaves the command running, with its exit code.
#[tokio::test]
async fn the_command_runs_when_the_socket_cannot_be_served() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("no-such-volume/agent.sock");
    let message = dir.path().join("termination-log");
    let status = run_to_exit(&socket, &message, &["sh", "-c", "exit 5"]).await;
    assert_eq!(status, Some(5));
    assert!(!message.exists(), "the command's own exit is not explained");
}

#[tokio::test]
async fn a_malformed_request_is_answered_and_the_agent_keeps_serving() {
    let agent = Agent::start(IDLE).await;
    let socket = socket_path(&agent.volume(), CONTAINER);
    let mut stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stream, b"{\"command\": 7}\n")
        .await
        .unwrap();
    let answer: Response = read_line(&mut stream).await.unwrap();
    assert!(
        matches!(&answer, Response::Error { message } if message.contains("could not read the request")),
        "{answer:?}"
    );
    let obs = agent.probe(cmd(&["printf", "still here"]), 5 * SEC).await;
    assert_eq!(obs.unwrap(), Observation::succeeded("still here"));
}

/// A hundred attempts asked at once (far past a pod's 32 probes): at most 32 commands run, the
/// others are refused at once, and the agent serves on.
#[tokio::test]
async fn a_hundred_concurrent_attempts_run_at_most_32_commands() {
    let agent = Agent::start(IDLE).await;
    let started = agent.volume().join("started");
    let script = format!("echo $$ >> {}; sleep 2", started.display());
    let asked = (0..100).map(|_| agent.probe(sh(&script), 10 * SEC));
    let answers = futures::future::join_all(asked).await;
    let ran = answers.iter().filter(|a| a.is_ok()).count();
    let refused: Vec<String> = answers
        .iter()
        .filter_map(|a| a.as_ref().err().map(|e| e.to_string()))
        .collect();
    let commands = std::fs::read_to_string(&started).unwrap().lines().count();
    assert!(
        (1..=32).contains(&ran) && commands == ran,
        "{ran} attempts answered, {commands} commands started"
    );
    // Past the 32 attempts, a request is answered with why; past 64 connections, one is
    // closed unread.
    assert!(
        refused
            .iter()
            .all(|e| e.contains("already runs 32 attempts")
                || e.contains("gave no answer")
                || e.contains("cannot ask the exec agent")),
        "{refused:?}"
    );
    let obs = agent.probe(cmd(&["printf", "still here"]), 5 * SEC).await;
    assert_eq!(obs.unwrap(), Observation::succeeded("still here"));
}

/// An attempt whose asker hangs up (the sidecar restarted) is stopped at once, its command's
/// group killed, not left running to its timeout in the game container.
#[tokio::test]
async fn an_attempt_whose_asker_hangs_up_is_stopped() {
    let agent = Agent::start(IDLE).await;
    let pid_file = agent.volume().join("pid");
    let socket = socket_path(&agent.volume(), CONTAINER);
    let mut stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
    let request = Request {
        command: sh(&format!("echo $$ > {}; exec sleep 60", pid_file.display())).command,
        timeout_millis: 120_000,
    };
    write_line(&mut stream, &request).await.unwrap();
    until_exists(&pid_file, "the command's pid").await;
    let pid = read_pid(&pid_file);
    drop(stream);
    until_reaped(pid).await;
}

/// As PID 1, the agent refuses a process of its own container (here: of its PID namespace and
/// cgroup), which would otherwise run commands with the agent's user and capabilities; the
/// asker from outside (the sidecar's place: another PID namespace) is answered.
#[tokio::test]
async fn as_pid_1_the_agent_refuses_a_process_of_its_own_container() {
    let asker = "import json, pathlib, signal, socket, time\n\
                 d = pathlib.Path('{dir}')\n\
                 while not (d / 'agent.sock').exists():\n    time.sleep(0.01)\n\
                 s = socket.socket(socket.AF_UNIX)\n\
                 s.connect(str(d / 'agent.sock'))\n\
                 s.sendall(json.dumps({'command': ['id', '-u'], 'timeoutMillis': 5000}).encode() + b'\\n')\n\
                 (d / 'answer').write_bytes(s.makefile('rb').readline())\n\
                 signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n\
                 (d / 'ready').touch()\n\
                 signal.sigwait({signal.SIGTERM})\n";
    let agent = InitAgent::start(&["python3", "-c", asker]).await;
    let answer = std::fs::read_to_string(agent.dir.path().join("answer")).unwrap();
    assert!(
        answer.contains("refused pid") && answer.contains("own container"),
        "{answer}"
    );
    let socket = agent.dir.path().join("agent.sock");
    assert_eq!(
        ask(&socket, &["printf", "from outside"]).await,
        succeeded("from outside")
    );
    assert_eq!(
        agent.stopped_by(libc_signal(Signal::SIGTERM)).await,
        Some(0)
    );
}

/// A process of the agent's own container cannot borrow another's connection: a child that
/// connects and exits before the agent looks, its parent then asking on the socket it
/// inherited, is refused every time, the asker's cgroup unreadable or not. (Read by the pid
/// the socket kept, a vanished asker's cgroup cannot be read, and such a read once let the
/// command run as the agent's user.)
#[tokio::test]
async fn as_pid_1_no_process_of_its_own_container_borrows_a_connection() {
    const TRIES: usize = 10_000;
    let racer = r#"
import json, os, pathlib, signal, socket, time
d = pathlib.Path('{dir}')
while not (d / 'agent.sock').exists():
    time.sleep(0.01)
(d / 'ready').touch()
request = json.dumps({'command': ['id', '-u'], 'timeoutMillis': 5000}).encode() + b'\n'
tally = {'ran': 0, 'refused': 0, 'other': []}
for _ in range(TRIES):
    s = socket.socket(socket.AF_UNIX)
    child = os.fork()
    if child == 0:
        s.connect(str(d / 'agent.sock'))
        os._exit(0)
    os.waitpid(child, 0)
    try:
        s.sendall(request)
        answer = s.makefile('rb').readline()
    except OSError as e:
        answer = str(e).encode()
    s.close()
    if b'"observed"' in answer:
        tally['ran'] += 1
    elif b'refused' in answer:
        tally['refused'] += 1
    else:
        tally['other'].append(answer.decode(errors='replace'))
(d / 'tally.tmp').write_text(json.dumps(tally))
(d / 'tally.tmp').rename(d / 'tally')
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
signal.sigwait({signal.SIGTERM})
"#
    .replace("TRIES", &TRIES.to_string());
    let agent = InitAgent::start(&["python3", "-c", &racer]).await;
    let tally = agent.dir.path().join("tally");
    let deadline = tokio::time::Instant::now() + 300 * SEC;
    while !tally.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{TRIES} tries not done in 300 s: {}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tally: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&tally).unwrap()).unwrap();
    assert_eq!(tally["ran"], 0, "commands run for the container: {tally}");
    assert_eq!(tally["refused"], TRIES, "{tally}");
    assert_eq!(
        agent.stopped_by(libc_signal(Signal::SIGTERM)).await,
        Some(0)
    );
}

/// A cgroup of its own for a test's agent, in the hierarchy that holds this process (the
/// unified one where it is the only one, else `pids`), removed when dropped.
struct OwnCgroup(PathBuf);

impl OwnCgroup {
    fn new(name: &str) -> OwnCgroup {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let unified_only = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let (root, line) = if unified_only {
            ("/sys/fs/cgroup", "0::")
        } else {
            ("/sys/fs/cgroup/pids", ":pids:")
        };
        let path = own
            .lines()
            .find_map(|l| l.split_once(line).map(|(_, path)| path))
            .unwrap_or_else(|| panic!("no {line} line in this process's cgroups: {own}"));
        let dir = Path::new(root)
            .join(path.trim_start_matches('/'))
            .join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create the cgroup {}: {e}", dir.display()));
        OwnCgroup(dir)
    }
}

impl Drop for OwnCgroup {
    /// Kills what is left in it and removes it once the reaper has collected them (a cgroup
    /// with a process in it, a zombie included, cannot be removed).
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.0.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|p| p.parse().ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let deadline = std::time::Instant::now() + 10 * SEC;
        while std::fs::remove_dir(&self.0).is_err() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Refused askers cannot starve the sidecar: a process of the container that opens connection
/// after connection and sends nothing holds none of the places the sidecar's attempts need.
/// (Refused askers used to hold one of the 64 connections each for 10 s.)
#[tokio::test]
async fn as_pid_1_refused_askers_leave_the_sidecar_its_connections() {
    let hog = "import os, pathlib, socket, time\n\
               d = pathlib.Path('{dir}')\n\
               while not (d / 'agent.sock').exists():\n    time.sleep(0.01)\n\
               held = []\n\
               for _ in range(200):\n    s = socket.socket(socket.AF_UNIX)\n    s.connect(str(d / 'agent.sock'))\n    held.append(s)\n\
               (d / 'ready').touch()\n\
               time.sleep(3600)\n";
    let agent = InitAgent::start(&["python3", "-c", hog]).await;
    let socket = agent.dir.path().join("agent.sock");
    assert_eq!(
        ask(&socket, &["printf", "still served"]).await,
        succeeded("still served"),
        "{}",
        agent.log()
    );
}

/// When the container runs out of memory the probes go first: the probe server and the
/// commands it runs have the highest OOM score, the container's command keeps its own.
#[tokio::test]
async fn the_probe_server_and_its_commands_go_first_when_memory_runs_out() {
    let agent = InitAgent::start(&[
        "python3",
        "-c",
        "import pathlib, time; pathlib.Path('{dir}/ready').touch(); time.sleep(3600)",
    ])
    .await;
    let score = |pid: i32| {
        let path = format!("/proc/{pid}/oom_score_adj");
        std::fs::read_to_string(path).unwrap().trim().to_owned()
    };
    let own = score(std::process::id() as i32);
    assert_eq!(score(probe_server(agent.pid)), "1000");
    let command = child_with(agent.pid, "-c");
    assert_eq!(
        score(command),
        own,
        "the container's command keeps its score"
    );
    let socket = agent.dir.path().join("agent.sock");
    assert_eq!(
        ask(&socket, &["cat", "/proc/self/oom_score_adj"]).await,
        succeeded("1000\n")
    );
}

/// In a pod on the host's PID namespace (`hostPID`) the agent is not PID 1, and its parent,
/// the runtime's shim, is a process it sees, of another cgroup than the container's: the
/// agent still knows it is its container's first process and refuses the container's
/// processes, while a process of another cgroup (the sidecar's place) is answered. Here the
/// agent runs in a cgroup of its own, started by this test from its own.
#[tokio::test]
async fn on_the_hosts_pid_namespace_the_agent_refuses_its_containers_processes() {
    let cgroup = OwnCgroup::new("podprobe-host-pid");
    let asker = "import json, os, pathlib, socket, sys, time\n\
                 path = sys.argv[1]\n\
                 while not os.path.exists(path):\n    time.sleep(0.01)\n\
                 s = socket.socket(socket.AF_UNIX)\n\
                 s.connect(path)\n\
                 s.sendall(json.dumps({'command': ['id', '-u'], 'timeoutMillis': 5000}).encode() + b'\\n')\n\
                 pathlib.Path('answer.tmp').write_bytes(s.makefile('rb').readline())\n\
                 os.rename('answer.tmp', 'answer')\n\
                 time.sleep(3600)\n";
    // The command's working directory is the volume's `work`; its socket is beside it.
    let relative = format!("../{CONTAINER}/agent.sock");
    let command = ["python3", "-c", asker, relative.as_str()];
    let agent = Agent::start_in(Some(&cgroup.0), &command, |_| {}).await;
    let answer = agent.volume().join("work/answer");
    until_exists(&answer, "the container's asker's answer").await;
    let answer = std::fs::read_to_string(&answer).unwrap();
    assert!(
        answer.contains("refused pid") && answer.contains("own container"),
        "{answer}"
    );
    let socket = socket_path(&agent.volume(), CONTAINER);
    assert_eq!(
        ask(&socket, &["printf", "from another cgroup"]).await,
        succeeded("from another cgroup")
    );
}

/// In a pod that shares its process namespace `pause` is PID 1, and the runtime starts the
/// wrapping agent from outside the namespace: not PID 1, but its container's first process, it
/// still refuses a process of its own container and answers the sidecar's place.
#[tokio::test]
async fn in_a_shared_process_namespace_the_agent_still_refuses_its_containers_processes() {
    let pause =
        InitAgent::start_as_pid_1(&["sh", "-c", "touch {dir}/ready; exec sleep 3600"]).await;
    let dir = pause.dir.path();
    let asker = format!(
        "import json, pathlib, signal, socket, time\n\
         d = pathlib.Path('{}')\n\
         while not (d / 'agent.sock').exists():\n    time.sleep(0.01)\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.connect(str(d / 'agent.sock'))\n\
         s.sendall(json.dumps({{'command': ['id', '-u'], 'timeoutMillis': 5000}}).encode() + b'\\n')\n\
         (d / 'answer.tmp').write_bytes(s.makefile('rb').readline())\n\
         (d / 'answer.tmp').rename(d / 'answer')\n\
         signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})\n\
         signal.sigwait({{signal.SIGTERM}})\n",
        dir.display()
    );
    // As a runtime starts a container in the pod's namespace: from outside it.
    let mut enter = Command::new("nsenter");
    enter
        .arg(format!("--target={}", pause.pid))
        .args(["--pid", "--mount", "--"])
        .arg(env!("CARGO_BIN_EXE_podprobe-agent"))
        .args(["agent", "--socket"])
        .arg(dir.join("agent.sock"))
        .args(["--", "python3", "-c", &asker])
        .stderr(std::fs::File::create(dir.join("entered.log")).unwrap())
        .env_remove("RUST_LOG")
        .process_group(0);
    let (child, _exit) = reaper::spawn(&mut enter).unwrap();
    let nsenter = Pid::from_raw(child.id() as i32);
    drop(child);
    let _group = KillGroupOnDrop(nsenter);
    until_exists(&dir.join("answer"), "the container process's answer").await;
    let [agent] = children(nsenter)[..] else {
        panic!("nsenter's children: {:?}", children(nsenter));
    };
    assert_ne!(pid_in_its_namespace(agent), "1", "PID 1");

    let answer = std::fs::read_to_string(dir.join("answer")).unwrap();
    let log = std::fs::read_to_string(dir.join("entered.log")).unwrap();
    assert!(
        answer.contains("refused pid") && answer.contains("own container"),
        "{answer}\n{log}"
    );
    assert_eq!(
        ask(&dir.join("agent.sock"), &["printf", "from outside"]).await,
        succeeded("from outside")
    );
}

/// A container that runs its image's entrypoint (here a python "game server", its PID 1) gets
/// the agent from its postStart hook, `podprobe agent --detach`: the hook returns 0 once the
/// agent serves (the game connects at once after it, without waiting for the socket); the
/// game stays PID 1, with its own signals and exit code; the agent logs to the container's
/// log; a process of the container is refused, the sidecar's place (another PID namespace)
/// is answered.
#[tokio::test]
async fn beside_the_containers_own_process_the_hook_returns_once_the_agent_serves() {
    let game = "import json, pathlib, signal, socket, subprocess\n\
                d = pathlib.Path('{dir}')\n\
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n\
                hook = subprocess.run(['{bin}', 'agent', '--socket', str(d / 'agent.sock'), '--detach'])\n\
                (d / 'hook').write_text(str(hook.returncode))\n\
                s = socket.socket(socket.AF_UNIX)\n\
                s.connect(str(d / 'agent.sock'))\n\
                s.sendall(json.dumps({'command': ['id', '-u'], 'timeoutMillis': 5000}).encode() + b'\\n')\n\
                (d / 'answer').write_bytes(s.makefile('rb').readline())\n\
                (d / 'ready').touch()\n\
                signal.sigwait({signal.SIGTERM})\n\
                raise SystemExit(3)\n";
    let game = InitAgent::start_as_pid_1(&["python3", "-c", game]).await;
    let read = |name: &str| std::fs::read_to_string(game.dir.path().join(name)).unwrap();
    assert_eq!(read("hook"), "0");
    let answer = read("answer");
    assert!(
        answer.contains("refused pid") && answer.contains("own container"),
        "{answer}"
    );
    game.until_logged("beside the container's own process")
        .await;

    // The sidecar's place: answered, and the command runs in the container, whose PID 1 is
    // the game's own process.
    let socket = game.dir.path().join("agent.sock");
    assert_eq!(
        ask(&socket, &["cat", "/proc/1/comm"]).await,
        succeeded("python3\n")
    );
    // SIGTERM to PID 1 is the game's alone: its exit code is the container's.
    assert_eq!(game.stopped_by(libc_signal(Signal::SIGTERM)).await, Some(3));
}

/// An agent that cannot serve (its socket's directory is missing) must not fail the hook: the
/// kubelet kills a container whose postStart hook fails. The hook returns 0, and why is in the
/// container's log.
#[tokio::test]
async fn a_hook_whose_agent_cannot_serve_still_returns_0_and_the_log_says_why() {
    let game = "import pathlib, signal, subprocess\n\
                d = pathlib.Path('{dir}')\n\
                hook = subprocess.run(['{bin}', 'agent', '--socket', str(d / 'missing' / 'agent.sock'), '--detach'])\n\
                (d / 'hook').write_text(str(hook.returncode))\n\
                (d / 'ready').touch()\n\
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n\
                signal.sigwait({signal.SIGTERM})\n";
    let game = InitAgent::start_as_pid_1(&["python3", "-c", game]).await;
    let hook = std::fs::read_to_string(game.dir.path().join("hook")).unwrap();
    assert_eq!(hook, "0");
    game.until_logged("cannot serve exec probes on").await;
    assert!(
        game.log().contains("No such file or directory"),
        "{}",
        game.log()
    );
}

/// Beside the image's entrypoint, as when wrapping a command, probes are served by a process
/// of their own under a supervisor (the one the hook leaves running): a server that dies is
/// started again and probes are answered again, and the game, PID 1, never notices.
#[tokio::test]
async fn beside_the_entrypoint_a_probe_server_that_dies_is_started_again() {
    let game = "import pathlib, signal, subprocess\n\
                d = pathlib.Path('{dir}')\n\
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n\
                subprocess.run(['{bin}', 'agent', '--socket', str(d / 'agent.sock'), '--detach'])\n\
                (d / 'ready').touch()\n\
                signal.sigwait({signal.SIGTERM})\n\
                raise SystemExit(3)\n";
    let game = InitAgent::start_as_pid_1(&["python3", "-c", game]).await;
    let socket = game.dir.path().join("agent.sock");
    let answered = succeeded("up");
    assert_eq!(ask(&socket, &["printf", "up"]).await, answered);

    // The hook is gone; its supervisor is the game's (PID 1's) adopted child.
    let supervisor = Pid::from_raw(child_with(game.pid, "--supervise"));
    let crashed = child_with(supervisor, "--serve-for");
    kill(Pid::from_raw(crashed), Signal::SIGABRT).unwrap();
    game.until_logged("the probe server").await;
    game.until_logged_times("serving exec probes on", 2).await;
    assert_eq!(ask(&socket, &["printf", "up"]).await, answered);
    assert_ne!(child_with(supervisor, "--serve-for"), crashed);

    assert_eq!(game.stopped_by(libc_signal(Signal::SIGTERM)).await, Some(3));
}

/// One request on `socket` from this process (the sidecar's place): the agent's answer.
/// The agent's answer for a command that succeeded with `message` on its stdout.
fn succeeded(message: &str) -> Response {
    Response::Observed {
        outcome: Outcome::Succeeded,
        message: message.into(),
    }
}

async fn ask(socket: &Path, argv: &[&str]) -> Response {
    let mut stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    let request = Request {
        command: cmd(argv).command,
        timeout_millis: 5_000,
    };
    write_line(&mut stream, &request).await.unwrap();
    read_line(&mut stream).await.unwrap()
}

/// Probe serving runs in a process of its own: when it dies (a crash, whatever its cause)
/// the agent starts another and probes are answered again; when it hangs, the agent still
/// forwards the kubelet's SIGTERM and the container's exit code is the command's.
#[tokio::test]
async fn a_probe_server_that_crashes_or_hangs_never_stops_the_command() {
    let agent = InitAgent::start(&[
        "sh",
        "-c",
        "trap 'exit 7' TERM; touch {dir}/ready; while :; do sleep 0.05; done",
    ])
    .await;
    let socket = agent.dir.path().join("agent.sock");
    agent.until_logged("serving exec probes on").await;
    let answered = succeeded("up");
    assert_eq!(ask(&socket, &["printf", "up"]).await, answered);

    let crashed = probe_server(agent.pid);
    // SIGABRT, as a panic in the shipped build (`panic = "abort"`) ends it.
    kill(Pid::from_raw(crashed), Signal::SIGABRT).unwrap();
    agent.until_logged("the probe server").await;
    agent.until_logged_times("serving exec probes on", 2).await;
    assert_eq!(ask(&socket, &["printf", "up"]).await, answered);
    let hung = probe_server(agent.pid);
    assert_ne!(hung, crashed);

    kill(Pid::from_raw(hung), Signal::SIGSTOP).unwrap();
    assert_eq!(
        agent.stopped_by(libc_signal(Signal::SIGTERM)).await,
        Some(7)
    );
}

/// In a container with a terminal the command is the terminal's foreground group, alone in
/// it, as under tini: Ctrl-C reaches it from the terminal once, not also forwarded by the
/// agent, and a shell script's `kill 0` does not reach the agent. A pty stands for the
/// container's terminal (python's `pty.fork`: the agent a session leader on it, as a runtime
/// starts a `tty: true` container's process).
#[tokio::test]
async fn with_a_terminal_the_command_is_its_foreground_group() {
    let dir = tempfile::tempdir().unwrap();
    let terminal = r#"
import os, pathlib, pty, sys, time
d, agent = pathlib.Path(sys.argv[1]), sys.argv[2]
script = f"echo $$ > {d}/cmd.tmp; mv {d}/cmd.tmp {d}/cmd; while :; do sleep 0.05; done"
pid, fd = pty.fork()
if pid == 0:
    os.execv(agent, [agent, 'agent', '--socket', str(d / 'agent.sock'), '--', 'sh', '-c', script])
while not (d / 'cmd').exists():
    time.sleep(0.01)
cmd = int((d / 'cmd').read_text())
fields = open(f'/proc/{cmd}/stat').read().rsplit(')', 1)[1].split()
(d / 'groups').write_text(f'{pid} {cmd} {fields[2]} {fields[5]}')
os.write(fd, b'\x03')
while True:
    try:
        if not os.read(fd, 1024):
            break
    except OSError:
        break
(d / 'status').write_text(str(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])))
"#;
    let mut python = Command::new("python3");
    python
        .args(["-c", terminal])
        .arg(dir.path())
        .arg(env!("CARGO_BIN_EXE_podprobe-agent"))
        .process_group(0);
    let (child, exit) = reaper::spawn(&mut python).unwrap();
    let _group = KillGroupOnDrop(Pid::from_raw(child.id() as i32));
    drop(child);
    let ended = tokio::time::timeout(10 * SEC, exit.wait()).await;
    assert!(
        ended.as_ref().is_ok_and(|s| s.is_some_and(|s| s.success())),
        "the terminal's script: {ended:?}"
    );
    let groups = std::fs::read_to_string(dir.path().join("groups")).unwrap();
    let [agent, command, group, foreground] = groups
        .split_whitespace()
        .map(|n| n.parse::<i32>().unwrap())
        .collect::<Vec<_>>()[..]
    else {
        panic!("{groups}")
    };
    assert_ne!(agent, command);
    assert_eq!(group, command, "the command's process group");
    assert_eq!(foreground, command, "the terminal's foreground group");
    // Ctrl-C ended the command (no handler), and the agent exited as it did.
    let status = std::fs::read_to_string(dir.path().join("status")).unwrap();
    assert_eq!(status, "130");
}
