//! procfs exec: locating the target's main process (by container id, by the only other
//! container, never by a guess), reading a `/proc` tree and a process' environment.

use super::*;

fn p(pid: i32, ppid: i32, comm: &str, cgroup: &str) -> ProcInfo {
    ProcInfo {
        pid,
        ppid,
        comm: comm.into(),
        cgroup: cgroup.into(),
        kernel_thread: false,
    }
}

const GAME: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A pod with a shared PID namespace: pause (1), the game server (7, with a child 30) and
/// the sidecar (12, podprobe itself 12).
fn pod(game_cgroup: &str) -> Vec<ProcInfo> {
    vec![
        p(1, 0, "pause", "0::/../cri-containerd-aaaa.scope\n"),
        p(7, 0, "bash", game_cgroup),
        p(30, 7, "game", game_cgroup),
        p(12, 0, "podprobe", "0::/\n"),
    ]
}

#[test]
fn finds_the_main_process_by_container_id() {
    let cg = format!("0::/../cri-containerd-{GAME}.scope\n");
    let got = locate_in(&pod(&cg), 12, Some(&format!("containerd://{GAME}"))).unwrap();
    assert_eq!(
        got,
        Located {
            pid: 7,
            found_by: FoundBy::ContainerId
        }
    );
}

#[test]
fn falls_back_to_the_only_other_container_when_cgroups_hide_the_id() {
    let got = locate_in(&pod("0::/\n"), 12, Some(&format!("containerd://{GAME}"))).unwrap();
    assert_eq!(
        got,
        Located {
            pid: 7,
            found_by: FoundBy::Heuristic
        }
    );
    // No containerID at all (downward-API file source): same heuristic.
    assert_eq!(locate_in(&pod("0::/\n"), 12, None).unwrap().pid, 7);
}

#[test]
fn heuristic_refuses_to_guess_between_containers() {
    let mut procs = pod("0::/\n");
    procs.push(p(40, 0, "redis", "0::/\n"));
    let err = locate_in(&procs, 12, None).unwrap_err();
    assert!(err.contains("7 bash, 40 redis"), "{err}");
}

#[test]
fn without_a_shared_pid_namespace_nothing_is_found() {
    // Only our own container is visible: podprobe as PID 1 of its namespace.
    let procs = vec![p(1, 0, "podprobe", "0::/\n"), p(9, 1, "sh", "0::/\n")];
    let err = locate_in(&procs, 1, Some("containerd://0123456789abcdef")).unwrap_err();
    assert!(err.contains("shareProcessNamespace"), "{err}");
    // A child of ours is never mistaken for the target.
    assert!(locate_in(&procs, 9, None).is_err());
}

#[test]
fn kernel_threads_are_not_candidates() {
    let mut procs = pod("0::/\n");
    procs.push(ProcInfo {
        kernel_thread: true,
        ..p(2, 0, "kthreadd", "0::/\n")
    });
    assert_eq!(locate_in(&procs, 12, None).unwrap().pid, 7);
}

#[test]
fn scan_reads_a_proc_tree() {
    let dir = tempfile::tempdir().unwrap();
    let write = |pid: i32, ppid: i32, name: &str, cgroup: &str, cmdline: &str| {
        let d = dir.path().join(pid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("status"),
            format!("Name:\t{name}\nPPid:\t{ppid}\nUid:\t0\t1000\t0\t1000\nGid:\t0\t2000\t0\t2000\nGroups:\t3 4 \n"),
        )
        .unwrap();
        std::fs::write(d.join("cgroup"), cgroup).unwrap();
        std::fs::write(d.join("cmdline"), cmdline).unwrap();
    };
    write(1, 0, "pause", "0::/pause\n", "/pause\0");
    write(
        5,
        0,
        "game",
        &format!("0::/kubepods/docker-{GAME}.scope\n"),
        "game\0",
    );
    std::fs::create_dir_all(dir.path().join("self")).unwrap();
    let procs = scan(dir.path()).unwrap();
    assert_eq!(procs.len(), 2);
    let procfs = Procfs::new(dir.path());
    let got = procfs
        .locate("game", Some(&format!("docker://{GAME}")))
        .unwrap();
    assert_eq!(got.pid, 5);
    assert_eq!(
        read_ids(dir.path(), 5).unwrap(),
        ProcIds {
            uid: 1000,
            gid: 2000,
            groups: vec![3, 4]
        }
    );
}

#[test]
fn environ_parses_nul_separated_pairs() {
    let env = parse_environ(b"A=1\0PATH=/bin:/usr/bin\0EMPTY=\0=bad\0noeq\0");
    let env: Vec<(String, String)> = env
        .into_iter()
        .map(|(k, v)| (k.into_string().unwrap(), v.into_string().unwrap()))
        .collect();
    assert_eq!(
        env,
        [
            ("A".to_owned(), "1".to_owned()),
            ("PATH".to_owned(), "/bin:/usr/bin".to_owned()),
            ("EMPTY".to_owned(), String::new()),
        ]
    );
}
