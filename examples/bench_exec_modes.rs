//! CPU and wall time per exec attempt in each exec mode, side by side.
//!
//! `cargo run --release --example bench_exec_modes [-- N]` (default N = 200 attempts per mode)
//!
//! - `local`: `sleep 0` as a child of podprobe;
//! - `procfs`: the same command chrooted into a real target
//!   process running as uid 4242 in a minimal root built in a temp dir (needs root; skipped
//!   otherwise);
//!
//! `api` (pods/exec) needs an apiserver, a kubelet and a runtime: its cost is measured on a
//! real node by `cargo run --release -p podprobe-manager --example bench_node_exec`.
//!
//! CPU = user+sys of this process (getrusage SELF) plus that of its reaped children
//! (RUSAGE_CHILDREN: the probe commands).
#[path = "../tests/support/rootfs.rs"]
mod rootfs;

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::resource::{UsageWho, getrusage};
use podprobe::probe::exec::procfs;
use podprobe::probe::{ExecAction, Outcome};

fn cpu(who: UsageWho) -> Duration {
    let usage = getrusage(who).expect("getrusage");
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    tv(usage.user_time()) + tv(usage.system_time())
}

struct Row {
    mode: &'static str,
    wall: Duration,
    own: Duration,
    children: Duration,
    n: u32,
}

async fn measure<F, Fut>(mode: &'static str, n: u32, mut attempt: F) -> Row
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    // Warm-up (connection, page cache).
    for _ in 0..5 {
        assert_eq!(attempt().await, Outcome::Succeeded, "{mode}");
    }
    let (own0, ch0, t0) = (
        cpu(UsageWho::RUSAGE_SELF),
        cpu(UsageWho::RUSAGE_CHILDREN),
        Instant::now(),
    );
    for _ in 0..n {
        assert_eq!(attempt().await, Outcome::Succeeded, "{mode}");
    }
    Row {
        mode,
        wall: t0.elapsed(),
        own: cpu(UsageWho::RUSAGE_SELF) - own0,
        children: cpu(UsageWho::RUSAGE_CHILDREN) - ch0,
        n,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let timeout = Duration::from_secs(10);
    let action = ExecAction {
        command: vec!["sleep".into(), "0".into()],
    };
    let mut rows = Vec::new();

    rows.push(
        measure("local", n, || async {
            podprobe::probe::exec::attempt(&action, timeout)
                .await
                .unwrap()
                .outcome
        })
        .await,
    );

    let dir = tempfile::tempdir().unwrap();
    let _target = match rootfs::cannot_chroot() {
        Some(why) => {
            eprintln!("procfs skipped: {why}");
            None
        }
        None => {
            rootfs::build(dir.path()).await;
            let target = rootfs::TargetProcess::start(dir.path()).await;
            let pid = target.pid;
            rows.push(
                measure("procfs", n, || async {
                    procfs::attempt_in(Path::new("/proc"), pid, &action, timeout)
                        .await
                        .unwrap()
                        .outcome
                })
                .await,
            );
            Some(target)
        }
    };

    println!("exec attempt cost, {n} sequential attempts of `sleep 0` per mode");
    println!(
        "{:<8} {:>12} {:>14} {:>16} {:>16} {:>14}",
        "mode", "attempts/s", "wall/attempt", "own CPU/attempt", "child CPU/att.", "total CPU/att."
    );
    for r in rows {
        let per = |d: Duration| d / r.n;
        println!(
            "{:<8} {:>12.0} {:>14.2?} {:>16.2?} {:>16.2?} {:>14.2?}",
            r.mode,
            f64::from(r.n) / r.wall.as_secs_f64(),
            per(r.wall),
            per(r.own),
            per(r.children),
            per(r.own + r.children)
        );
    }
    println!(
        "(api: own CPU includes testkit's in-process pods/exec endpoint, i.e. the apiserver+kubelet stand-in)"
    );
}
