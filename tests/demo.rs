//! The README's first command: `podprobe demo` shows every probe of the example pod succeed,
//! fail when its target goes down, and recover.

use std::collections::BTreeMap;
use std::process::Command;

#[test]
fn every_example_probe_flips_and_recovers() {
    let out = Command::new(env!("CARGO_BIN_EXE_podprobe"))
        .args(["demo", "--output", "json"])
        .env("RUST_LOG", "warn")
        .output()
        .expect("run podprobe demo");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut states: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut conditions = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        if let Some(c) = v.get("conditions") {
            conditions = Some(c.clone());
            continue;
        }
        let states_of = states
            .entry(v["podConditionType"].as_str().unwrap().to_owned())
            .or_default();
        let state = v["state"].as_str().unwrap().to_owned();
        if states_of.last() != Some(&state) {
            states_of.push(state);
        }
    }
    assert_eq!(states.len(), 4, "{states:?}");
    for (condition, seen) in &states {
        assert_eq!(seen, &["Succeeded", "Failed", "Succeeded"], "{condition}");
    }
    let conditions = conditions.expect("the conditions at the end");
    assert!(
        conditions
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["status"] == "True")
    );
}
