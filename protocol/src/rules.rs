//! The field rules a probe must pass, shared by the manager's webhook (which refuses the
//! PodProbeMarker, as OpenKruise does) and the sidecar (which skips the probe as invalid). Each
//! rule returns typed violations; their messages are apimachinery's, so both binaries word a
//! broken rule alike.

/// Why a port is refused (`IsValidPortNum`, `IsValidPortName`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PortViolation {
    #[error("must be between 1 and 65535, inclusive")]
    OutOfRange,
    #[error("must be no more than 15 characters")]
    NameTooLong,
    #[error("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")]
    NameCharacters,
    #[error("must contain at least one letter (a-z)")]
    NameWithoutLetter,
    #[error("must not contain consecutive hyphens")]
    NameDoubleHyphen,
    #[error("must not begin or end with a hyphen")]
    NameEdgeHyphen,
}

/// apimachinery's `IsValidPortNum`.
pub fn port_number_violation(n: i64) -> Option<PortViolation> {
    (!(1..=65535).contains(&n)).then_some(PortViolation::OutOfRange)
}

/// apimachinery's `IsValidPortName` (an IANA service name), one violation per broken rule.
pub fn port_name_violations(name: &str) -> Vec<PortViolation> {
    let mut found = Vec::new();
    if name.len() > 15 {
        found.push(PortViolation::NameTooLong);
    }
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b == b'-' || b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        found.push(PortViolation::NameCharacters);
    }
    if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        found.push(PortViolation::NameWithoutLetter);
    }
    if name.contains("--") {
        found.push(PortViolation::NameDoubleHyphen);
    }
    if name.starts_with('-') || name.ends_with('-') {
        found.push(PortViolation::NameEdgeHyphen);
    }
    found
}

/// What [`is_header_name`] requires, as apimachinery words it (`RegexError`).
pub const HEADER_NAME_RULE: &str = "a valid HTTP header must consist of alphanumeric characters \
     or '-' (e.g. 'X-Header-Name', regex used for validation is '[-A-Za-z0-9]+')";

/// apimachinery's `IsHTTPHeaderName` (`[-A-Za-z0-9]+`), which OpenKruise's PodProbeMarker
/// webhook and the apiserver's own probe validation apply: narrower than an RFC 7230 token
/// (no `_`, `.`, ...), so a probe the sidecar accepts is one a kubelet could have been given.
pub fn is_header_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Why Go's `url.Parse` refuses a URL reference (an httpGet path, a redirect's `Location`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UrlViolation {
    #[error("invalid control character in URL")]
    ControlCharacter,
    #[error("missing protocol scheme")]
    MissingScheme,
    #[error("first path segment in URL cannot contain colon")]
    ColonInFirstSegment,
    #[error("invalid URL escape")]
    BadEscape,
}

/// The failures of Go's `url.Parse` that a probe path or a redirect can hit: control
/// characters, a leading `:`, a colon in the first segment of a scheme-less relative path, and
/// bad `%` escapes anywhere but the query (which Go does not check either). The kubelet and
/// OpenKruise parse httpGet paths with it, so what fails here fails there.
pub fn url_violation(raw: &str) -> Option<UrlViolation> {
    if raw.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Some(UrlViolation::ControlCharacter);
    }
    let (rest, fragment) = raw.split_once('#').unwrap_or((raw, ""));
    if !valid_escapes(fragment) {
        return Some(UrlViolation::BadEscape);
    }
    if rest.starts_with(':') {
        return Some(UrlViolation::MissingScheme);
    }
    let scheme_len = rest.split_once(':').and_then(|(s, _)| {
        let is_scheme = s.starts_with(|c: char| c.is_ascii_alphabetic())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
        is_scheme.then_some(s.len())
    });
    let rest = rest.split_once('?').map_or(rest, |(p, _)| p);
    let path = match scheme_len {
        Some(len) => rest.get(len + 1..).unwrap_or(""),
        None => {
            let first_segment = rest.split('/').next().unwrap_or("");
            if !rest.starts_with('/') && first_segment.contains(':') {
                return Some(UrlViolation::ColonInFirstSegment);
            }
            rest
        }
    };
    (!valid_escapes(path)).then_some(UrlViolation::BadEscape)
}

/// Every `%` is followed by two hex digits.
pub fn valid_escapes(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if !(b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
            {
                return false;
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_names_break_each_rule_on_its_own() {
        assert!(port_name_violations("http").is_empty());
        assert!(port_name_violations("web-8080").is_empty());
        assert_eq!(
            port_name_violations("a-very-long-port-name"),
            [PortViolation::NameTooLong]
        );
        assert_eq!(
            port_name_violations("HTTP"),
            [
                PortViolation::NameCharacters,
                PortViolation::NameWithoutLetter
            ]
        );
        assert_eq!(
            port_name_violations("1234"),
            [PortViolation::NameWithoutLetter]
        );
        assert_eq!(
            port_name_violations("a--b"),
            [PortViolation::NameDoubleHyphen]
        );
        assert_eq!(port_name_violations("-ab"), [PortViolation::NameEdgeHyphen]);
        assert_eq!(port_number_violation(0), Some(PortViolation::OutOfRange));
        assert_eq!(
            port_number_violation(65536),
            Some(PortViolation::OutOfRange)
        );
        assert_eq!(port_number_violation(65535), None);
    }

    #[test]
    fn header_names_are_alphanumerics_and_hyphens() {
        assert!(is_header_name("X-Probe-2"));
        for bad in [
            "",
            "X Probe",
            "X:Probe",
            "Ünicode",
            "a\tb",
            "X_Probe",
            "X.Probe",
            "!#$%&'*+.^_`|~",
        ] {
            assert!(!is_header_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn url_references_as_go_url_parse_judges_them() {
        for ok in [
            "",
            "/healthz",
            "/a%20b?x=%zz",
            "/path?q=1#frag",
            "http://host/x",
            "a/b:c",
            "a:b/c",
            "/a:b",
            "https://[::1]:8080/",
        ] {
            assert_eq!(url_violation(ok), None, "{ok:?}");
        }
        for (bad, why) in [
            ("/a\nb", UrlViolation::ControlCharacter),
            ("/a\u{7f}", UrlViolation::ControlCharacter),
            (":x", UrlViolation::MissingScheme),
            ("1a:b/c", UrlViolation::ColonInFirstSegment),
            ("/path%notvalid", UrlViolation::BadEscape),
            ("/ok#%z", UrlViolation::BadEscape),
            ("http://ho%st/", UrlViolation::BadEscape),
            ("/a%2", UrlViolation::BadEscape),
        ] {
            assert_eq!(url_violation(bad), Some(why), "{bad:?}");
        }
    }
}
