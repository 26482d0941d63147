//! The HTTP prober's request headers: canonical names, repeated names merged, defaults and
//! removals (kubelet-probes.md H15, H16).

use super::*;

fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// H16: canonical MIME header names.
#[test]
fn h16_canonical_names() {
    assert_eq!(canonical_header_key("HOST"), "Host");
    assert_eq!(canonical_header_key("FOO-bAR"), "Foo-Bar");
    assert_eq!(canonical_header_key("x-custom-header"), "X-Custom-Header");
    assert_eq!(canonical_header_key("user-agent"), "User-Agent");
    // Not a token: left alone (Go does the same).
    assert_eq!(canonical_header_key("bad header"), "bad header");
}

/// H15: case variants merge into one key, values kept in order.
#[test]
fn h15_repeated_names_merge() {
    let headers = RequestHeaders::new(
        &h(&[("accept", "application/json"), ("Accept", "*/*")]),
        DEFAULT_USER_AGENT,
    );
    assert_eq!(
        headers.fields,
        vec![
            (
                "Accept".into(),
                vec!["application/json".into(), "*/*".into()]
            ),
            ("User-Agent".into(), vec![DEFAULT_USER_AGENT.into()]),
        ]
    );
}

#[test]
fn defaults_and_removals() {
    let wire = |user: &[(&str, &str)]| RequestHeaders::new(&h(user), "kube-probe/1.33").wire();
    let pairs = |v: &[(&str, &str)]| h(v);
    assert_eq!(
        wire(&[]),
        pairs(&[
            ("User-Agent", "kube-probe/1.33"),
            ("Accept", "*/*"),
            ("Connection", "close")
        ])
    );
    assert_eq!(
        wire(&[("User-Agent", ""), ("Accept", "")]),
        pairs(&[("Connection", "close")])
    );
    assert_eq!(
        wire(&[("accept-encoding", ""), ("user-agent", "foo/1.0")]),
        pairs(&[
            ("Accept-Encoding", ""),
            ("User-Agent", "foo/1.0"),
            ("Accept", "*/*"),
            ("Connection", "close")
        ])
    );
    let headers = RequestHeaders::new(&h(&[("HOST", "muffins.cupcakes.org")]), "ua");
    assert_eq!(headers.host.as_deref(), Some("muffins.cupcakes.org"));
    assert!(headers.wire().iter().all(|(n, _)| n != "Host"));
}
