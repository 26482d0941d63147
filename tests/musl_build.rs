//! The sidecar image needs a static binary: build podprobe for x86_64-unknown-linux-musl and
//! check that the result has no dynamic loader and runs.

use std::path::PathBuf;
use std::process::Command;

const TARGET: &str = "x86_64-unknown-linux-musl";

fn musl_target_installed() -> bool {
    Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.trim() == TARGET)
        })
}

/// ELF64 little-endian: is there a PT_INTERP program header (a dynamic loader)?
fn has_interpreter(elf: &[u8]) -> bool {
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap()) as usize;
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| {
        let p = phoff + i * phentsize;
        u32::from_le_bytes(elf[p..p + 4].try_into().unwrap()) == 3 // PT_INTERP
    })
}

#[test]
fn the_sidecar_builds_as_a_static_musl_binary() {
    // Never a skip: hack/setup-tests.sh installs both on this project's machines.
    assert!(
        musl_target_installed(),
        "the {TARGET} target is not installed: run hack/setup-tests.sh (or `rustup target add {TARGET}`)"
    );
    // ring's C code needs a musl C compiler.
    assert!(
        Command::new("musl-gcc").arg("--version").output().is_ok(),
        "musl-gcc is not installed: run hack/setup-tests.sh (or apt-get install musl-tools)"
    );
    // A target directory of its own: the outer cargo may hold the workspace's build lock.
    let target_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("musl-build");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "build",
            "--locked",
            "--no-default-features", // as sidecar.Dockerfile ships it
            "--target",
            TARGET,
            "-p",
            "podprobe",
            "--bin",
            "podprobe",
        ])
        .env("CARGO_TARGET_DIR", &target_dir)
        .status()
        .expect("run cargo");
    assert!(status.success(), "cargo build --target {TARGET} failed");
    let binary = target_dir.join(TARGET).join("debug").join("podprobe");
    let elf = std::fs::read(&binary).expect("the musl binary");
    assert!(
        !has_interpreter(&elf),
        "{} is dynamically linked",
        binary.display()
    );
    let out = Command::new(&binary)
        .arg("version")
        .output()
        .expect("run the musl binary");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("podprobe "));
    // The shipped build carries no demo servers.
    let demo = Command::new(&binary).arg("demo").output().unwrap();
    assert_eq!(
        demo.status.code(),
        Some(2),
        "`podprobe demo` must be unknown"
    );
}

#[test]
fn the_elf_check_tells_dynamic_from_static() {
    // The test binary itself is dynamically linked (glibc): the check must say so.
    let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    assert!(has_interpreter(&me));
}
