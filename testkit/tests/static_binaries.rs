//! What `hack/build-static.sh` builds for the images, for both architectures: static ELF
//! binaries of the right machine (sizes printed), the shipped sidecar without `demo`, and the
//! arm64 sidecar, run under Debian's qemu-user-static, reporting the same conditions for the
//! example pod as the native build.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;
use testkit::real::node::images::{self, Platform};

const EXAMPLE_POD: &str = include_str!("../../examples/game-server-pod.yaml");

/// Both architectures' binaries (`dist/` of each): this machine's under the images' lock, the
/// other's (cross-compiled, perhaps still building in the background) without it.
fn binaries() -> [(Platform, PathBuf); 2] {
    let root = images::build_root().unwrap();
    let native = Platform::native().unwrap();
    let build = |platform: Platform| {
        let _lock = (platform == native).then(|| images::lock(&root).unwrap());
        let context = images::static_binaries(&root, platform)
            .unwrap_or_else(|e| panic!("{}: {e}", platform.arch()));
        (platform, context.join("dist"))
    };
    [Platform::Amd64, Platform::Arm64].map(build)
}

struct Elf {
    machine: u16,
    /// `e_type`: 2 for an executable at a fixed address, 3 for a position-independent one.
    kind: u16,
    interpreter: bool,
}

/// ELF64 little-endian: the machine, and whether a PT_INTERP header names a dynamic loader.
fn elf(path: &Path) -> Elf {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        &bytes[..4],
        b"\x7fELF",
        "{} is not an ELF file",
        path.display()
    );
    assert_eq!(bytes[4], 2, "{} is not ELF64", path.display());
    let u16_at = |o: usize| u16::from_le_bytes(bytes[o..o + 2].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap()) as usize;
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36) as usize, u16_at(0x38) as usize);
    let interpreter = (0..phnum).any(|i| {
        let p = phoff + i * phentsize;
        u32::from_le_bytes(bytes[p..p + 4].try_into().unwrap()) == 3 // PT_INTERP
    });
    Elf {
        machine: u16_at(0x12),
        kind: u16_at(0x10),
        interpreter,
    }
}

#[test]
fn both_architectures_build_static_binaries_of_their_machine() {
    for (platform, dist) in binaries() {
        for binary in ["podprobe", "podprobe-agent", "podprobe-manager"] {
            let path = dist.join(binary);
            let elf = elf(&path);
            assert_eq!(
                elf.machine,
                platform.elf_machine(),
                "{} is built for machine {}",
                path.display(),
                elf.machine
            );
            assert!(!elf.interpreter, "{} is dynamically linked", path.display());
            // The agent runs in every game container that has it: linked at a fixed address,
            // its pointer tables are not relocated into anonymous memory at start
            // (hack/build-static.sh).
            if binary == "podprobe-agent" {
                assert_eq!(elf.kind, 2, "{}: ELF type {}", path.display(), elf.kind);
            }
            let size = std::fs::metadata(&path).unwrap().len();
            println!(
                "{binary} {}: {size} bytes ({:.1} MiB)",
                platform.arch(),
                size as f64 / 1048576.0
            );
        }
    }
}

#[test]
fn the_elf_check_tells_dynamic_from_static() {
    // The test binary itself is dynamically linked (glibc) for this machine: the check must say so.
    let me = elf(&std::env::current_exe().unwrap());
    assert!(me.interpreter);
    assert_eq!(me.machine, Platform::native().unwrap().elf_machine());
}

/// Runs `binary args` natively, or under qemu-user-static when built for another machine.
fn run_on(platform: Platform, binary: &Path) -> Command {
    if platform == Platform::native().unwrap() {
        return Command::new(binary);
    }
    let qemu = match platform {
        Platform::Arm64 => "qemu-aarch64-static",
        Platform::Amd64 => "qemu-x86_64-static",
    };
    assert!(
        Command::new(qemu).arg("--version").output().is_ok(),
        "{qemu} is not installed: run hack/setup-tests.sh (Debian: qemu-user-static)"
    );
    let mut command = Command::new(qemu);
    command.arg(binary);
    command
}

#[test]
fn the_shipped_binaries_run_and_the_sidecar_has_no_demo() {
    for (platform, dist) in binaries() {
        let run = |binary: &str, arg: &str| {
            run_on(platform, &dist.join(binary))
                .arg(arg)
                .output()
                .unwrap()
        };
        let version = run("podprobe", "version");
        assert!(version.status.success(), "{version:?}");
        assert!(String::from_utf8_lossy(&version.stdout).starts_with("podprobe "));
        let demo = run("podprobe", "demo");
        assert_eq!(
            demo.status.code(),
            Some(2),
            "`podprobe demo` must be unknown"
        );
        let agent_version = run("podprobe-agent", "version");
        assert!(agent_version.status.success(), "{agent_version:?}");
        assert!(String::from_utf8_lossy(&agent_version.stdout).starts_with("podprobe-agent "));
        let sidecar = run("podprobe-agent", "run");
        assert_eq!(
            sidecar.status.code(),
            Some(2),
            "the agent alone has no `run`: {sidecar:?}"
        );
        // The agent's real job: the command runs under it and its exit code is the agent's.
        let sockets = tempfile::tempdir().unwrap();
        let wrapped = run_on(platform, &dist.join("podprobe-agent"))
            .arg("agent")
            .arg("--socket")
            .arg(sockets.path().join("agent.sock"))
            .args(["--", "sh", "-c", "exit 7"])
            .output()
            .unwrap();
        assert_eq!(wrapped.status.code(), Some(7), "{wrapped:?}");
        let help = run("podprobe-manager", "--help");
        assert!(help.status.success(), "{help:?}");
        assert!(String::from_utf8_lossy(&help.stdout).contains("run"));
    }
}

/// The test game server on ports the kernel picks; its state directory says idle and
/// unhealthy, so the example's four probes end two True and two False.
struct GameServer {
    child: Child,
    ports: [u16; 3],
    state: tempfile::TempDir,
}

impl GameServer {
    fn start() -> GameServer {
        let root = images::build_root().unwrap();
        let binary = {
            let _lock = images::lock(&root).unwrap();
            images::test_gameserver(&root).unwrap()
        };
        let state = tempfile::tempdir().unwrap();
        std::fs::write(state.path().join("idle"), "").unwrap();
        std::fs::write(state.path().join("unhealthy"), "").unwrap();
        let mut child = Command::new(binary)
            .env("GAMESERVER_PORTS", "0,0,0")
            .env("GAME_STATE_DIR", state.path())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Its first line, written once all three listen: "gameserver: tcp G, http H/healthz, grpc R ..."
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        // The rest of its log goes on to the test's (a closed pipe would end the server).
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::stderr()));
        let numbers: Vec<u16> = line
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .take(3)
            .collect();
        let ports = numbers
            .try_into()
            .unwrap_or_else(|_| panic!("ports in {line:?}"));
        GameServer {
            child,
            ports,
            state,
        }
    }

    /// The example pod aimed at this server and its state directory.
    fn example_pod(&self) -> String {
        let [game, http, grpc] = self.ports;
        EXAMPLE_POD
            .replace("/var/run/game", &self.state.path().display().to_string())
            .replace("containerPort: 7777", &format!("containerPort: {game}"))
            .replace("containerPort: 8080", &format!("containerPort: {http}"))
            .replace("containerPort: 9090", &format!("containerPort: {grpc}"))
            .replace(r#""port":9090"#, &format!(r#""port":{grpc}"#))
    }
}

impl Drop for GameServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `podprobe check --once -o json`'s conditions: type, status and message of each.
fn conditions(platform: Platform, binary: &Path, pod: &Path) -> Vec<(String, String, String)> {
    let out = run_on(platform, binary)
        .args(["check", "--once", "-o", "json"])
        .arg(pod)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let parsed: Value = serde_json::from_str(last).unwrap_or_else(|e| {
        panic!(
            "{} check: last line {last:?}: {e}; stderr: {}",
            platform.arch(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let field = |c: &Value, k: &str| c[k].as_str().unwrap_or_default().to_owned();
    let mut conditions: Vec<_> = parsed["conditions"]
        .as_array()
        .unwrap_or_else(|| panic!("no conditions in {last}"))
        .iter()
        .map(|c| (field(c, "type"), field(c, "status"), field(c, "message")))
        .collect();
    conditions.sort();
    conditions
}

#[test]
fn the_arm64_sidecar_under_qemu_reports_what_the_amd64_one_does() {
    let [(amd64, amd64_dist), (arm64, arm64_dist)] = binaries();
    let server = GameServer::start();
    let pod = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(pod.path(), server.example_pod()).unwrap();

    let native = conditions(amd64, &amd64_dist.join("podprobe"), pod.path());
    let emulated = conditions(arm64, &arm64_dist.join("podprobe"), pod.path());
    let statuses: Vec<(&str, &str)> = native
        .iter()
        .map(|(t, s, _)| (t.as_str(), s.as_str()))
        .collect();
    assert_eq!(
        statuses,
        [
            ("game.kruise.io/accepting", "True"),
            ("game.kruise.io/healthy", "False"),
            ("game.kruise.io/idle", "True"),
            ("game.kruise.io/serving", "False"),
        ],
        "amd64: {native:?}"
    );
    assert_eq!(emulated, native, "arm64 (qemu) vs amd64");
}
