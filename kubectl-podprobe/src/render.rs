//! Printing: `get` as a kubectl-style table (`-o wide` for every column in full), JSON or
//! YAML; `explain` as one line per link.
//!
//! Most of what is printed was written by pods or by whoever can edit them (condition
//! messages, probe names, marker values, Events), so the table and `explain` print it through
//! [`terminal_safe`]: a message must not be able to move the cursor, retitle the terminal or
//! hide text from the operator reading it. JSON and YAML escape control characters themselves.

use std::io::{self, Write};

use crate::args::Output;
use crate::explain::Link;
use crate::get::ProbeRow;
use crate::inspect::human_age;

/// Longest message the narrow table shows.
const MESSAGE_WIDTH: usize = 40;

/// `get`'s output; `namespaces` adds the NAMESPACE column (`-A`), as kubectl does.
pub fn rows(
    out: &mut impl Write,
    rows: &[ProbeRow],
    format: Option<Output>,
    namespaces: bool,
    headers: bool,
) -> io::Result<()> {
    match format {
        Some(Output::Name) => {
            let mut seen = std::collections::BTreeSet::new();
            for r in rows {
                // kubectl's -o name; with -A the namespace is not part of it either.
                if seen.insert((&r.namespace, &r.pod)) {
                    writeln!(out, "pod/{}", r.pod)?;
                }
            }
            Ok(())
        }
        Some(Output::Json) => {
            let list = serde_json::json!({"items": rows});
            writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&list).map_err(io::Error::other)?
            )
        }
        Some(Output::Yaml) => {
            let list = serde_json::json!({"items": rows});
            let yaml = serde_saphyr::to_string(&list).map_err(io::Error::other)?;
            write!(out, "{yaml}")
        }
        Some(Output::Wide) => table(out, rows, true, namespaces, headers),
        None => table(out, rows, false, namespaces, headers),
    }
}

fn table(
    out: &mut impl Write,
    rows: &[ProbeRow],
    wide: bool,
    all_namespaces: bool,
    headers: bool,
) -> io::Result<()> {
    let mut lines: Vec<Vec<String>> = Vec::new();
    let mut header = vec![
        "POD",
        "PROBE",
        "CONDITION",
        "STATUS",
        "MESSAGE",
        "TRANSITION",
        "PROBED",
        "MARKERS",
        "WARNINGS",
    ];
    if all_namespaces {
        header.insert(0, "NAMESPACE");
    }
    if wide {
        let after_probe = header.iter().position(|h| *h == "PROBE").unwrap_or(0) + 1;
        header.insert(after_probe, "CONTAINER");
    }
    lines.push(header.iter().map(|h| (*h).to_owned()).collect());
    for r in rows {
        let mut line = Vec::new();
        if all_namespaces {
            line.push(r.namespace.clone());
        }
        line.push(r.pod.clone());
        line.push(r.probe.clone());
        if wide {
            line.push(r.container.clone());
        }
        line.push(r.condition_type.clone());
        line.push(r.status.clone().unwrap_or_else(|| "<none>".into()));
        let message = r.message.clone().unwrap_or_default();
        line.push(if wide { message } else { shorten(&message) });
        let age = |s: Option<i64>| s.map(human_age).unwrap_or_else(|| "<none>".into());
        line.push(age(r.since_transition_seconds));
        line.push(age(r.since_probe_seconds));
        line.push(dash_if_empty(&r.markers, wide));
        line.push(dash_if_empty(&r.warnings, true));
        // Escaped before the widths are taken, so the columns line up as printed.
        lines.push(line.iter().map(|c| terminal_safe(c).into_owned()).collect());
    }
    let widths: Vec<usize> = (0..lines[0].len())
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let skip = usize::from(!headers);
    for line in lines.iter().skip(skip) {
        let cells: Vec<String> = line
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        writeln!(out, "{}", cells.join("   ").trim_end())?;
    }
    Ok(())
}

/// `text` with every character a terminal would act on instead of print (C0 and C1 controls
/// such as ESC, BEL, CR, LF; bidirectional overrides; other non-printable characters) replaced
/// by its Rust escape (`\u{1b}`, `\r`, `\n`, `\u{202e}`), so what the operator reads is what
/// is stored, and a message cannot forge a line of its own. Quotes and backslashes stay as they
/// are (printable), and so does a tab: it only moves to the next column stop, and the Events
/// lines use it as their separator.
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char =
        |c: char| !matches!(c, '\\' | '\'' | '"' | '\t') && c.escape_debug().len() > 1;
    if !text.chars().any(unsafe_char) {
        return text.into();
    }
    text.chars()
        .map(|c| {
            if unsafe_char(c) {
                c.escape_debug().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

fn shorten(message: &str) -> String {
    let one_line = message.replace('\n', " ");
    if one_line.chars().count() <= MESSAGE_WIDTH {
        return one_line;
    }
    let cut: String = one_line.chars().take(MESSAGE_WIDTH - 3).collect();
    format!("{cut}...")
}

/// The items joined (all of them, or the count beyond the first when narrow), `-` if none.
fn dash_if_empty(items: &[String], all: bool) -> String {
    match items {
        [] => "-".into(),
        [one] => one.clone(),
        [first, rest @ ..] if !all => format!("{first} +{}", rest.len()),
        _ => items.join(","),
    }
}

/// `explain`: one line per link, the first broken one pointed out, then the events.
pub fn explain(
    out: &mut impl Write,
    pod: &str,
    links: &[Link],
    events: &[String],
) -> io::Result<()> {
    writeln!(out, "Pod {}", terminal_safe(pod))?;
    let first_broken = links.iter().position(|l| !l.ok);
    for (i, l) in links.iter().enumerate() {
        let mark = if l.ok { "ok  " } else { "FAIL" };
        let pointer = if Some(i) == first_broken {
            "   <- first broken link"
        } else {
            ""
        };
        let finding = terminal_safe(&l.finding);
        writeln!(out, "  {mark} {:<14} {finding}{pointer}", l.name)?;
    }
    match first_broken {
        Some(i) => writeln!(
            out,
            "First broken link: {}: {}",
            links[i].name,
            terminal_safe(&links[i].finding)
        )?,
        None => writeln!(out, "Every link holds.")?,
    }
    writeln!(out, "Events:")?;
    if events.is_empty() {
        writeln!(out, "  <none>")?;
    }
    for e in events {
        writeln!(out, "  {}", terminal_safe(e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_on_a_char_boundary() {
        let m = "é".repeat(50);
        let s = shorten(&m);
        assert_eq!(s.chars().count(), MESSAGE_WIDTH);
        assert!(s.ends_with("..."));
        assert_eq!(shorten("short"), "short");
    }

    fn row(message: &str) -> ProbeRow {
        ProbeRow {
            namespace: "games".into(),
            pod: "gs-0".into(),
            probe: "idle\u{1b}[8m".into(),
            container: "game".into(),
            condition_type: "game.kruise.io/idle".into(),
            status: Some("True".into()),
            message: Some(message.into()),
            since_transition_seconds: Some(5),
            since_probe_seconds: Some(1),
            markers: vec!["label idle=\u{7}".into()],
            warnings: vec![],
        }
    }

    /// What a terminal would act on: ESC, BEL, CR, other C0/C1 controls, bidi overrides (the
    /// output's own line ends and tabs aside).
    fn acts_on_terminal(text: &str) -> bool {
        text.chars().any(|c| {
            (c.is_control() && !matches!(c, '\n' | '\t')) || ('\u{202a}'..='\u{202e}').contains(&c)
        })
    }

    #[test]
    fn pod_written_text_cannot_drive_the_terminal() {
        // Retitle the window, hide the rest, return to column 0 and overwrite, reverse text.
        let hostile = "\u{1b}]0;owned\u{7}ok\u{1b}[8mhidden\rFAILED \u{9b}2J \u{202e}ssap";
        for format in [None, Some(Output::Wide)] {
            let mut out = Vec::new();
            rows(&mut out, &[row(hostile)], format, true, true).unwrap();
            let text = String::from_utf8(out).unwrap();
            assert!(!acts_on_terminal(&text), "{format:?}: {text:?}");
            assert!(text.contains(r"\u{1b}]0;owned"), "{text}");
        }
        let wide = {
            let mut out = Vec::new();
            rows(&mut out, &[row(hostile)], Some(Output::Wide), false, false).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert!(
            wide.contains(r#"\u{1b}[8mhidden\rFAILED \u{9b}2J \u{202e}ssap"#),
            "{wide}"
        );

        let link = Link {
            name: "conditions",
            ok: false,
            finding: hostile.into(),
        };
        let mut out = Vec::new();
        explain(&mut out, "gs-0\u{1b}c", &[link], &[hostile.into()]).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(!acts_on_terminal(&text), "{text:?}");
        assert_eq!(text.matches(r"\u{1b}]0;owned").count(), 3, "{text}");

        // A newline in a finding cannot forge a line of the report; a tab stays a tab.
        let link = Link {
            name: "condition",
            ok: false,
            finding: "missing\n  ok   condition      all is well".into(),
        };
        let mut out = Vec::new();
        let events = ["5m ago\tWarning\tX\tmessage".to_owned()];
        explain(&mut out, "gs-0", &[link], &events).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("\n  ok   condition"), "{text}");
        assert!(text.contains("5m ago\tWarning\tX\tmessage"), "{text}");
    }

    #[test]
    fn json_and_yaml_escape_control_characters_themselves() {
        for format in [Output::Json, Output::Yaml] {
            let mut out = Vec::new();
            rows(
                &mut out,
                &[row("\u{1b}]0;owned\u{7}\r")],
                Some(format),
                false,
                true,
            )
            .unwrap();
            let text = String::from_utf8(out).unwrap();
            assert!(!acts_on_terminal(&text), "{format:?}: {text:?}");
        }
    }

    #[test]
    fn printable_text_is_left_alone() {
        let text = r#"HTTP probe failed with statuscode: 503 "busy" C:\ é 游戏"#;
        assert!(matches!(terminal_safe(text), std::borrow::Cow::Borrowed(t) if t == text));
    }

    #[test]
    fn lists_collapse_when_narrow() {
        let items = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
        assert_eq!(dash_if_empty(&items, false), "a +2");
        assert_eq!(dash_if_empty(&items, true), "a,b,c");
        assert_eq!(dash_if_empty(&[], false), "-");
    }
}
