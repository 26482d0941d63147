//! Kubernetes name rules (apimachinery's `validation` package) that both binaries apply: the
//! sidecar to the condition types it is about to write (the apiserver refuses a whole status
//! update for one bad type), the manager to PodProbeMarkers and markers.

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`
pub fn is_qualified_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

/// apimachinery's message for a name part that is not `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`,
/// word for word (kube-apiserver returns it in its 422s).
pub const QUALIFIED_PART_RULE: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

/// apimachinery's message for a prefix that is not a lowercase RFC 1123 subdomain.
pub const DNS_SUBDOMAIN_RULE: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// apimachinery's `IsQualifiedName`, with its messages: optional DNS-subdomain prefix, `/`,
/// name ≤ 63 chars.
pub fn qualified_name_errors(value: &str) -> Vec<String> {
    const NAME_RULE: &str = QUALIFIED_PART_RULE;
    let mut msgs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                msgs.push("prefix part must be non-empty".to_owned());
            } else {
                msgs.extend(
                    dns_subdomain_errors(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            return vec![format!(
                "a qualified name {NAME_RULE} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )];
        }
    };
    if name.is_empty() {
        msgs.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        msgs.push("name part must be no more than 63 characters".to_owned());
    }
    if !is_qualified_part(name) {
        msgs.push(format!("name part {NAME_RULE}"));
    }
    msgs
}

pub fn dns_subdomain_errors(value: &str) -> Vec<&'static str> {
    let mut msgs = Vec::new();
    if value.len() > 253 {
        msgs.push("must be no more than 253 characters");
    }
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && !b.iter().any(u8::is_ascii_uppercase)
    };
    if !value.split('.').all(label_ok) {
        msgs.push(DNS_SUBDOMAIN_RULE);
    }
    msgs
}

#[cfg(test)]
mod tests {
    use super::qualified_name_errors;

    #[test]
    fn qualified_names_as_the_apiserver_judges_them() {
        for ok in [
            "Idle",
            "game.kruise.io/idle",
            "a",
            "x-y_z.1",
            "example.com/MyName",
        ] {
            assert!(qualified_name_errors(ok).is_empty(), "{ok}");
        }
        for bad in [
            "not a qualified name!",
            "",
            "/idle",
            "Game.io/idle",
            "a/b/c",
            "-idle",
            "idle-",
            &"x".repeat(64),
        ] {
            assert!(!qualified_name_errors(bad).is_empty(), "{bad:?}");
        }
    }
}
