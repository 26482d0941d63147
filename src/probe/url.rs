//! The little of Go's `net/url` that httpGet probes need: building the probe URL from
//! scheme/host/port/path like kubelet's `formatURL`, printing it like `URL.String`, the
//! request-target like `URL.RequestURI`, and resolving a redirect's `Location` like
//! `URL.Parse` (RFC 3986 reference resolution).

use std::fmt;

use podprobe_protocol::rules::{UrlViolation, url_violation};

use super::tcp::join_host_port;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeUrl {
    /// Lower-case scheme.
    pub scheme: String,
    /// `host[:port]` as written (IPv6 bracketed), without user info. Default Host line.
    pub authority: String,
    /// Host without brackets and port (Go's `URL.Hostname()`); compared across redirects.
    pub hostname: String,
    /// Explicit port, if the authority has one.
    pub port: Option<u16>,
    /// Escaped path; may be empty.
    pub path: String,
    /// Raw query without `?` (`Some("")` for a bare `?`).
    pub query: Option<String>,
    pub fragment: Option<String>,
}

/// A parsed (possibly relative) reference.
#[derive(Debug, Default)]
struct Reference {
    scheme: Option<String>,
    authority: Option<String>,
    path: String,
    query: Option<String>,
    fragment: Option<String>,
}

impl ProbeUrl {
    /// kubelet's `formatURL(scheme, host, port, path)`: `path` is parsed as a relative
    /// reference (query and fragment kept); scheme and `host:port` are then forced onto it. A
    /// path that does not parse is used as a literal path and escaped.
    pub fn for_probe(scheme: &str, host: &str, port: u16, path: &str) -> ProbeUrl {
        let hostname = host.trim_start_matches('[').trim_end_matches(']');
        let reference = parse_reference(path).unwrap_or_else(|_| Reference {
            path: escape_path(path),
            ..Reference::default()
        });
        ProbeUrl {
            scheme: scheme.to_ascii_lowercase(),
            authority: join_host_port(hostname, port),
            hostname: hostname.to_string(),
            port: Some(port),
            path: reference.path,
            query: reference.query,
            fragment: reference.fragment,
        }
    }

    /// The port to dial: explicit, else the scheme's default.
    pub fn dial_port(&self) -> Option<u16> {
        self.port.or(match self.scheme.as_str() {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        })
    }

    /// Go's `URL.RequestURI` of the URL re-parsed from its string form (kubelet builds the
    /// request from `url.String()`): never empty, always starting with `/`.
    pub fn request_target(&self) -> String {
        let mut target = String::with_capacity(self.path.len() + 1);
        if !self.path.starts_with('/') {
            target.push('/');
        }
        target.push_str(&self.path);
        if let Some(query) = &self.query {
            target.push('?');
            target.push_str(query);
        }
        target
    }

    /// Resolves a `Location` header against this URL (Go's `URL.Parse`). Returns the new URL
    /// and whether the reference was absolute (had a scheme).
    pub fn resolve(&self, location: &str) -> Result<(ProbeUrl, bool), String> {
        let r = parse_reference(location).map_err(|v| format!("net/url: {v}"))?;
        let absolute = r.scheme.is_some();
        let scheme = r
            .scheme
            .map(|s| s.to_ascii_lowercase())
            .unwrap_or_else(|| self.scheme.clone());
        let (authority, hostname, port, path, query, fragment) = match r.authority {
            Some(authority) => {
                let (hostname, port) = split_authority(&authority)?;
                let authority = strip_userinfo(&authority).to_string();
                let path = remove_dot_segments(&r.path);
                (authority, hostname, port, path, r.query, r.fragment)
            }
            None => {
                let (path, query, fragment) = if r.path.is_empty() {
                    let query = r.query.or_else(|| self.query.clone());
                    (self.path.clone(), query, r.fragment)
                } else if r.path.starts_with('/') {
                    (remove_dot_segments(&r.path), r.query, r.fragment)
                } else {
                    let base_dir = match self.path.rfind('/') {
                        Some(i) => &self.path[..=i],
                        None => "/",
                    };
                    let merged = format!("{base_dir}{}", r.path);
                    (remove_dot_segments(&merged), r.query, r.fragment)
                };
                (
                    self.authority.clone(),
                    self.hostname.clone(),
                    self.port,
                    path,
                    query,
                    fragment,
                )
            }
        };
        Ok((
            ProbeUrl {
                scheme,
                authority,
                hostname,
                port,
                path,
                query,
                fragment,
            },
            absolute,
        ))
    }
}

/// Go's `URL.String()`.
impl fmt::Display for ProbeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme, self.authority)?;
        if !self.path.is_empty() && !self.path.starts_with('/') {
            f.write_str("/")?;
        }
        f.write_str(&self.path)?;
        if let Some(q) = &self.query {
            write!(f, "?{q}")?;
        }
        if let Some(fragment) = &self.fragment {
            write!(f, "#{fragment}")?;
        }
        Ok(())
    }
}

fn strip_userinfo(authority: &str) -> &str {
    match authority.rfind('@') {
        Some(i) => &authority[i + 1..],
        None => authority,
    }
}

/// `host[:port]` → (hostname without brackets, explicit port).
fn split_authority(authority: &str) -> Result<(String, Option<u16>), String> {
    let hostport = strip_userinfo(authority);
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let end = rest
            .find(']')
            .ok_or_else(|| format!("missing ']' in host {hostport:?}"))?;
        let after = &rest[end + 1..];
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("invalid port {p:?} after host"))?,
            ),
        };
        (&rest[..end], port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    let port = match port {
        None | Some("") => None,
        Some(p) => Some(
            p.parse::<u16>()
                .map_err(|_| format!("invalid port {:?} after host", format!(":{p}")))?,
        ),
    };
    Ok((host.to_string(), port))
}

fn is_hex(b: u8) -> bool {
    b.is_ascii_hexdigit()
}

/// Go's `getScheme`: a scheme is letters then letters/digits/`+-.` up to the first `:` (a
/// leading `:` is refused before this is asked).
fn split_scheme(s: &str) -> (Option<&str>, &str) {
    for (i, c) in s.bytes().enumerate() {
        match c {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' if i > 0 => {}
            b':' if i > 0 => return (Some(&s[..i]), &s[i + 1..]),
            _ => return (None, s),
        }
    }
    (None, s)
}

/// Go's `url.Parse`: refused as the protocol's rule refuses it (the same rule the manager and
/// the sidecar's validation apply to httpGet paths), then split into its parts.
fn parse_reference(raw: &str) -> Result<Reference, UrlViolation> {
    if let Some(violation) = url_violation(raw) {
        return Err(violation);
    }
    let (rest, fragment) = match raw.split_once('#') {
        Some((r, f)) => (r, Some(f.to_string())),
        None => (raw, None),
    };
    let (scheme, rest) = split_scheme(rest);
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(escape_query(q))),
        None => (rest, None),
    };
    let (authority, path) = match rest.strip_prefix("//") {
        Some(after) => {
            let end = after.find('/').unwrap_or(after.len());
            (Some(after[..end].to_string()), &after[end..])
        }
        None => (None, rest),
    };
    Ok(Reference {
        scheme: scheme.map(str::to_string),
        authority,
        path: escape_path(path),
        query,
        fragment,
    })
}

/// `%XX` with two hex digits at `i`.
fn escape_at(b: &[u8], i: usize) -> bool {
    i + 2 < b.len() && is_hex(b[i + 1]) && is_hex(b[i + 2])
}

/// Characters Go's `validEncoded(s, encodePath)` accepts verbatim.
fn valid_encoded_path_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-_.~!$&'()*+,;=:@[]/".contains(&b)
}

/// Go's `EscapedPath`: the path as written when it is validly encoded, else each byte that
/// `shouldEscape(encodePath)` flags is percent-encoded (after decoding valid escapes).
fn escape_path(path: &str) -> String {
    let bytes = path.as_bytes();
    let valid = bytes.iter().enumerate().all(|(i, &b)| {
        if b == b'%' {
            escape_at(bytes, i)
        } else {
            valid_encoded_path_byte(b)
        }
    });
    if valid {
        return path.to_string();
    }
    // Decode valid escapes, keep stray '%' as a literal, then escape.
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && escape_at(bytes, i) {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("00");
            decoded.push(u8::from_str_radix(hex, 16).unwrap_or(0));
            i += 3;
        } else {
            decoded.push(bytes[i]);
            i += 1;
        }
    }
    let mut out = String::with_capacity(decoded.len() * 3);
    for b in decoded {
        if b.is_ascii_alphanumeric() || b"-_.~$&+,/:;=@".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Go keeps the raw query verbatim; bytes that cannot appear in an HTTP/1 request line are
/// percent-encoded so the request can be written at all.
fn escape_query(query: &str) -> String {
    let mut out = String::with_capacity(query.len());
    for &b in query.as_bytes() {
        if b > 0x20 && b < 0x7f && !b"\"<>\\^`{|}".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// RFC 3986 §5.2.4, keeping a trailing slash after a final `.` or `..` as Go does.
fn remove_dot_segments(path: &str) -> String {
    if path.is_empty() {
        return String::new();
    }
    let absolute = path.starts_with('/');
    let segments: Vec<&str> = path.split('/').collect();
    let mut out: Vec<&str> = Vec::new();
    let last = segments.len() - 1;
    let mut trailing_slash = false;
    for (i, seg) in segments.iter().enumerate() {
        if i == 0 && absolute {
            continue;
        }
        match *seg {
            "." => trailing_slash = i == last,
            ".." => {
                out.pop();
                trailing_slash = i == last;
            }
            s => {
                out.push(s);
                trailing_slash = false;
            }
        }
    }
    let mut result = String::with_capacity(path.len());
    if absolute {
        result.push('/');
    }
    result.push_str(&out.join("/"));
    if trailing_slash && !result.ends_with('/') {
        result.push('/');
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// H27 (kubelet TestFormatURL) and TV-17 (OpenKruise formatURL).
    #[test]
    fn h27_format_url() {
        let cases = [
            ("http", "localhost", 93, "", "http://localhost:93"),
            ("http", "localhost", 93, "?foo", "http://localhost:93?foo"),
            (
                "https",
                "localhost",
                93,
                "/path?bar",
                "https://localhost:93/path?bar",
            ),
            (
                "http",
                "localhost",
                93,
                "/path#foo",
                "http://localhost:93/path#foo",
            ),
            (
                "HTTP",
                "10.0.0.1",
                9090,
                "/metrics",
                "http://10.0.0.1:9090/metrics",
            ),
            ("http", "h", 1, "path", "http://h:1/path"),
        ];
        for (scheme, host, port, path, want) in cases {
            assert_eq!(
                ProbeUrl::for_probe(scheme, host, port, path).to_string(),
                want
            );
        }
    }

    /// H28: IPv6 hosts are bracketed in the URL and the Host line.
    #[test]
    fn h28_ipv6_url() {
        let u = ProbeUrl::for_probe("http", "fd00::5", 8080, "");
        assert_eq!(u.to_string(), "http://[fd00::5]:8080");
        assert_eq!(u.authority, "[fd00::5]:8080");
        assert_eq!(u.hostname, "fd00::5");
        assert_eq!(u.request_target(), "/");
    }

    #[test]
    fn request_targets() {
        let t = |p: &str| ProbeUrl::for_probe("http", "h", 1, p).request_target();
        assert_eq!(t(""), "/");
        assert_eq!(t("?foo"), "/?foo");
        assert_eq!(t("?"), "/?");
        assert_eq!(t("path"), "/path");
        assert_eq!(t("/healthz?x=1#frag"), "/healthz?x=1");
        assert_eq!(t("/a b"), "/a%20b");
        assert_eq!(t("/a(b)%41"), "/a(b)%41");
        assert_eq!(t("/100%"), "/100%25");
        // A full URL as path: only its path is used (scheme and host are forced).
        assert_eq!(t("http://elsewhere:1/x"), "/x");
    }

    #[test]
    fn resolve_references() {
        let base = ProbeUrl::for_probe("http", "127.0.0.1", 8080, "/a/b?q=1");
        let r = |loc: &str| {
            let (u, abs) = base.resolve(loc).unwrap();
            (u.to_string(), abs)
        };
        assert_eq!(r("/new"), ("http://127.0.0.1:8080/new".into(), false));
        assert_eq!(r("c"), ("http://127.0.0.1:8080/a/c".into(), false));
        assert_eq!(r("../c"), ("http://127.0.0.1:8080/c".into(), false));
        assert_eq!(r("?x"), ("http://127.0.0.1:8080/a/b?x".into(), false));
        assert_eq!(r(""), ("http://127.0.0.1:8080/a/b?q=1".into(), false));
        assert_eq!(r("//other:9/z"), ("http://other:9/z".into(), false));
        assert_eq!(
            r("HTTPS://127.0.0.1:8443/s"),
            ("https://127.0.0.1:8443/s".into(), true)
        );
        let (u, _) = base.resolve("http://[::1]:81/v6").unwrap();
        assert_eq!((u.hostname.as_str(), u.port), ("::1", Some(81)));
        let (u, _) = base.resolve("http://0.0.0.0/fail").unwrap();
        assert_eq!((u.hostname.as_str(), u.dial_port()), ("0.0.0.0", Some(80)));
        assert!(base.resolve("/%zz").is_err());
        assert!(base.resolve("http://h:port/").is_err());
    }

    #[test]
    fn dot_segments() {
        assert_eq!(remove_dot_segments("/a/b/../c"), "/a/c");
        assert_eq!(remove_dot_segments("/a/./b/."), "/a/b/");
        assert_eq!(remove_dot_segments("/../x"), "/x");
        assert_eq!(remove_dot_segments("/a/.."), "/");
    }
}
