//! A stand-in for `helm template`, which CI does not have: just enough to read the chart's
//! templates as YAML in tests. The chart keeps its templates simple so that this suffices.
//!
//! Rules, applied to each line of a template:
//! 1. a line that is nothing but one `{{ ... }}` action (`if`, `else`, `range`, `end`,
//!    `toYaml ... | nindent N`) is dropped: both branches of an `if` stay, a `range` body
//!    appears once, and an inserted block renders as nothing (templates are written so that this
//!    is still valid YAML, e.g. no key set in both branches of an `if`);
//! 2. every other `{{ ... }}` is replaced: `.Values.a.b` or `$.Values.a.b` (optionally
//!    `| quote`) by the scalar at
//!    `a.b` in values.yaml, `.Release.Name`/`.Release.Namespace` by `podprobe`/
//!    `podprobe-system`, anything else by the word `TEMPLATED`.

#![allow(dead_code)] // each test binary uses a part of it

use std::path::{Path, PathBuf};

pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/podprobe")
}

pub fn values() -> serde_json::Value {
    let text = std::fs::read_to_string(chart_dir().join("values.yaml")).expect("values.yaml");
    serde_saphyr::from_str(&text).expect("values.yaml is YAML")
}

fn replacement(action: &str, values: &serde_json::Value) -> String {
    let expr = action
        .trim_start_matches('-')
        .trim_end_matches('-')
        .trim()
        .trim_end_matches("| quote")
        .trim()
        .trim_start_matches('$');
    match expr {
        ".Release.Name" => return "podprobe".into(),
        ".Release.Namespace" => return "podprobe-system".into(),
        _ => {}
    }
    if let Some(path) = expr.strip_prefix(".Values.")
        && !path.contains(' ')
    {
        let pointer = format!("/{}", path.replace('.', "/"));
        match values.pointer(&pointer) {
            Some(serde_json::Value::String(s)) => return s.clone(),
            Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                return v.to_string();
            }
            _ => {}
        }
    }
    "TEMPLATED".into()
}

/// `text` with the rules above applied.
pub fn render(text: &str, values: &serde_json::Value) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("{{")
            && trimmed.ends_with("}}")
            && trimmed.matches("{{").count() == 1
        {
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("{{") {
            let end = rest[start..]
                .find("}}")
                .map(|e| start + e)
                .unwrap_or_else(|| panic!("unclosed action in: {line}"));
            out.push_str(&rest[..start]);
            out.push_str(&replacement(&rest[start + 2..end], values));
            rest = &rest[end + 2..];
        }
        out.push_str(rest);
        out.push('\n');
    }
    out
}

/// The documents of template `name`, rendered and parsed (empty documents dropped).
pub fn documents(name: &str) -> Vec<serde_json::Value> {
    let path = chart_dir().join("templates").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let rendered = render(&text, &values());
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&rendered)
        .unwrap_or_else(|e| panic!("{name} is not YAML after rendering: {e}\n{rendered}"));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}
