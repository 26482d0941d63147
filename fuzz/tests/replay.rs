//! Every committed fuzz input replayed against its property on the stable toolchain: the seeds
//! and corpus under `corpus/<target>/`, and any crash input libFuzzer left in
//! `artifacts/<target>/` (it fails here until the bug is fixed and the input becomes a
//! regression test). This is the fuzzing check CI runs; `hack/fuzz-smoke.sh` explores new inputs.

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use podprobe_fuzz::TARGETS;

fn fuzz_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The files of `dir`, sorted; none when it does not exist.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("a readable directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_fuzz_target_has_a_property_here() {
    let binaries: BTreeSet<String> = inputs(&fuzz_dir().join("fuzz_targets"))
        .iter()
        .map(|path| path.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    let replayed: BTreeSet<String> = TARGETS.iter().map(|(name, _)| name.to_string()).collect();
    assert_eq!(
        binaries, replayed,
        "fuzz_targets/ and TARGETS must name the same targets"
    );
}

#[test]
fn every_committed_input_holds_its_property() {
    let mut failures = Vec::new();
    for (name, property) in TARGETS {
        let seeds = inputs(&fuzz_dir().join("corpus").join(name));
        assert!(
            !seeds.is_empty(),
            "corpus/{name} holds no seed: run fuzz/seed.py"
        );
        let artifacts = inputs(&fuzz_dir().join("artifacts").join(name));
        for path in seeds.iter().chain(&artifacts) {
            let bytes = std::fs::read(path).expect("a readable input");
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| property(&bytes))) {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("{name}: {}: {message}", path.display()));
            }
        }
        println!(
            "{name}: {} corpus inputs, {} artifacts replayed",
            seeds.len(),
            artifacts.len()
        );
    }
    assert!(
        failures.is_empty(),
        "properties failed:\n{}",
        failures.join("\n")
    );
}
