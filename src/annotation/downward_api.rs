//! The kubelet's downward-API annotations file: `key="value"` lines, keys sorted, values
//! quoted like Go's `%q`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Errors reading the downward-API annotations file format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DownwardApiError {
    #[error("line {line}: expected key=\"value\"")]
    MissingEquals { line: usize },
    #[error("line {line}: value is not a Go-quoted string: {reason}")]
    BadQuoting { line: usize, reason: &'static str },
}

/// Parses the kubelet's `metadata.annotations` downward-API file.
pub fn parse_downward_api(text: &str) -> Result<BTreeMap<String, String>, DownwardApiError> {
    let mut map = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let line_no = i + 1;
        let (key, quoted) = line
            .split_once('=')
            .ok_or(DownwardApiError::MissingEquals { line: line_no })?;
        let value = go_unquote(quoted).map_err(|reason| DownwardApiError::BadQuoting {
            line: line_no,
            reason,
        })?;
        map.insert(key.to_owned(), value);
    }
    Ok(map)
}

/// Writes annotations in the kubelet's downward-API format (for tests and tooling).
pub fn format_downward_api(annotations: &BTreeMap<String, String>) -> String {
    annotations
        .iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Projects `annotations` into the downward-API volume at `volume` as the kubelet's atomic
/// writer does (for tests and tooling that stand in for a kubelet): the content in a new
/// `..<timestamp>` directory, the `..data` link swapped to it by a rename, `annotations ->
/// ..data/annotations`, the previous content removed. Returns the file's path.
pub fn project_downward_api(
    volume: &Path,
    annotations: &BTreeMap<String, String>,
) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::symlink;
    std::fs::create_dir_all(volume)?;
    let data_link = volume.join("..data");
    let previous = std::fs::read_link(&data_link).ok();
    let stamp = jiff::Timestamp::now().strftime("%Y_%m_%d_%H_%M_%S.%f");
    let name = format!("..{stamp}");
    std::fs::create_dir(volume.join(&name))?;
    std::fs::write(
        volume.join(&name).join("annotations"),
        format_downward_api(annotations) + "\n",
    )?;
    let staged = volume.join("..data_tmp");
    let _ = std::fs::remove_file(&staged);
    symlink(&name, &staged)?;
    std::fs::rename(&staged, &data_link)?;
    let file = volume.join("annotations");
    if std::fs::symlink_metadata(&file).is_err() {
        symlink("..data/annotations", &file)?;
    }
    if let Some(previous) = previous {
        std::fs::remove_dir_all(volume.join(previous))?;
    }
    Ok(file)
}

/// Go `strconv.Quote` for valid UTF-8: `\a \b \f \n \r \t \v \\ \"`, other non-printable
/// characters as `\xHH` (< 0x80), `\uHHHH` or `\UHHHHHHHH`.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if go_is_print(c) => out.push(c),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// An approximation of Go's `unicode.IsPrint` sufficient for quoting: control characters,
/// line/paragraph separators and other format/space characters beyond ASCII space are escaped.
fn go_is_print(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    !(c.is_control()
        || c.is_whitespace()
        || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{2060}'..='\u{2064}' | '\u{feff}'))
}

/// Go `strconv.Unquote` for double-quoted strings.
pub fn go_unquote(quoted: &str) -> Result<String, &'static str> {
    let inner = quoted
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .ok_or("missing surrounding double quotes")?;
    let mut bytes: Vec<u8> = Vec::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Err("unescaped double quote"),
            '\\' => {}
            c => {
                let mut buf = [0u8; 4];
                bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                continue;
            }
        }
        let escape = chars.next().ok_or("dangling backslash")?;
        let simple = match escape {
            'a' => Some(0x07),
            'b' => Some(0x08),
            'f' => Some(0x0c),
            'n' => Some(b'\n'),
            'r' => Some(b'\r'),
            't' => Some(b'\t'),
            'v' => Some(0x0b),
            '\\' => Some(b'\\'),
            '"' => Some(b'"'),
            '\'' => Some(b'\''),
            _ => None,
        };
        if let Some(b) = simple {
            bytes.push(b);
            continue;
        }
        match escape {
            'x' => bytes.push(hex_value(&mut chars, 2)? as u8),
            'u' | 'U' => {
                let digits = if escape == 'u' { 4 } else { 8 };
                let c = char::from_u32(hex_value(&mut chars, digits)?)
                    .ok_or("escape is not a Unicode scalar value")?;
                let mut buf = [0u8; 4];
                bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
            '0'..='7' => {
                let mut v = escape.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    let d = chars
                        .next()
                        .and_then(|c| c.to_digit(8))
                        .ok_or("octal escape needs three digits")?;
                    v = v * 8 + d;
                }
                bytes.push(u8::try_from(v).map_err(|_| "octal escape above \\377")?);
            }
            _ => return Err("unknown escape sequence"),
        }
    }
    String::from_utf8(bytes).map_err(|_| "escapes produce invalid UTF-8")
}

fn hex_value(chars: &mut std::str::Chars<'_>, digits: usize) -> Result<u32, &'static str> {
    let mut v = 0u32;
    for _ in 0..digits {
        let d = chars
            .next()
            .and_then(|c| c.to_digit(16))
            .ok_or("hex escape too short")?;
        v = v * 16 + d;
    }
    Ok(v)
}
