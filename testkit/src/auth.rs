//! Authentication (bearer tokens mapped to users) and authorization
//! (allow-rules by verb, resource and subresource).
//!
//! Authorization is off until the first rule is added with
//! [`Auth::allow`]: then every request by a user other than the admin is
//! denied (403) unless a rule allows it. Unknown tokens are always 401;
//! requests without a token are `system:anonymous`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// The token of the built-in admin user (in `system:masters`, always allowed).
pub const ADMIN_TOKEN: &str = "testkit-admin-token";
/// The admin's username.
pub const ADMIN_USER: &str = "testkit-admin";

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct User {
    /// Username, e.g. `system:serviceaccount:ns:sa`.
    pub name: String,
    /// Extra attributes, e.g. `authentication.kubernetes.io/pod-name`.
    #[serde(default)]
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    fn anonymous() -> Self {
        Self {
            name: "system:anonymous".into(),
            extra: BTreeMap::new(),
        }
    }
}

/// An allow rule. Empty lists match anything; `"*"` does too.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    /// Usernames the rule applies to (any when empty).
    #[serde(default)]
    pub users: Vec<String>,
    /// Verbs: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`.
    #[serde(default)]
    pub verbs: Vec<String>,
    /// API groups (`""` for core).
    #[serde(default)]
    pub groups: Vec<String>,
    /// Resources, optionally with a subresource: `pods`, `pods/status`.
    #[serde(default)]
    pub resources: Vec<String>,
    /// Namespaces (any when empty).
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Object names (any when empty).
    #[serde(default)]
    pub names: Vec<String>,
}

fn any_or(list: &[String], v: &str) -> bool {
    list.is_empty() || list.iter().any(|x| x == "*" || x == v)
}

impl Rule {
    /// A rule allowing `verbs` on `resources` (e.g. `["pods/status"]`) in
    /// any group, for any user.
    pub fn new(verbs: &[&str], resources: &[&str]) -> Self {
        Self {
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            resources: resources.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    /// Only for this user.
    pub fn user(mut self, u: impl Into<String>) -> Self {
        self.users.push(u.into());
        self
    }

    /// Only in this API group.
    pub fn group(mut self, g: impl Into<String>) -> Self {
        self.groups.push(g.into());
        self
    }

    /// Only in this namespace.
    pub fn namespace(mut self, n: impl Into<String>) -> Self {
        self.namespaces.push(n.into());
        self
    }

    /// Only objects with this name.
    pub fn name(mut self, n: impl Into<String>) -> Self {
        self.names.push(n.into());
        self
    }

    fn allows(&self, user: &str, a: &Attributes<'_>) -> bool {
        let res = if a.subresource.is_empty() {
            a.resource.to_string()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        any_or(&self.users, user)
            && any_or(&self.verbs, a.verb)
            && any_or(&self.groups, a.group)
            && any_or(&self.resources, &res)
            && any_or(&self.namespaces, a.namespace)
            && (self.names.is_empty() || any_or(&self.names, a.name))
    }
}

/// What a request does, for authorization.
#[derive(Debug, Clone)]
pub struct Attributes<'a> {
    /// Verb.
    pub verb: &'a str,
    /// API group.
    pub group: &'a str,
    /// Resource plural.
    pub resource: &'a str,
    /// Subresource or `""`.
    pub subresource: &'a str,
    /// Namespace or `""`.
    pub namespace: &'a str,
    /// Name or `""`.
    pub name: &'a str,
}

#[derive(Debug, Default)]
struct Inner {
    tokens: HashMap<String, User>,
    rules: Vec<Rule>,
    enabled: bool,
}

/// Tokens and rules, cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct Auth {
    inner: Arc<Mutex<Inner>>,
}

impl Auth {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Map `token` to a user.
    pub fn add_token(&self, token: &str, user: &str, extra: BTreeMap<String, Vec<String>>) {
        self.lock().tokens.insert(
            token.to_string(),
            User {
                name: user.to_string(),
                extra,
            },
        );
    }

    /// Add an allow rule, and turn authorization on.
    pub fn allow(&self, rule: Rule) {
        let mut g = self.lock();
        g.rules.push(rule);
        g.enabled = true;
    }

    /// Turn authorization on (with the rules so far; none: deny all but the admin).
    pub fn enable(&self) {
        self.lock().enabled = true;
    }

    /// The user for an `Authorization` header value; `None` for an unknown
    /// token (401).
    pub fn authenticate(&self, header: Option<&str>) -> Option<User> {
        let Some(h) = header else {
            return Some(User::anonymous());
        };
        let token = h.strip_prefix("Bearer ").unwrap_or(h).trim();
        if token == ADMIN_TOKEN {
            return Some(User {
                name: ADMIN_USER.into(),
                extra: BTreeMap::new(),
            });
        }
        self.lock().tokens.get(token).cloned()
    }

    /// Whether `user` may do `a`.
    pub fn authorize(&self, user: &User, a: &Attributes<'_>) -> bool {
        let g = self.lock();
        !g.enabled || user.name == ADMIN_USER || g.rules.iter().any(|r| r.allows(&user.name, a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs<'a>(verb: &'a str, sub: &'a str) -> Attributes<'a> {
        Attributes {
            verb,
            group: "",
            resource: "pods",
            subresource: sub,
            namespace: "ns",
            name: "p",
        }
    }

    #[test]
    fn rules_by_verb_and_subresource() {
        let a = Auth::default();
        a.add_token("t", "sidecar", BTreeMap::new());
        let u = a.authenticate(Some("Bearer t")).unwrap();
        assert!(a.authorize(&u, &attrs("patch", "status")));
        a.allow(Rule::new(&["patch"], &["pods/status"]).user("sidecar"));
        assert!(a.authorize(&u, &attrs("patch", "status")));
        assert!(!a.authorize(&u, &attrs("patch", "")));
        assert!(a.authenticate(Some("Bearer nope")).is_none());
        let admin = a.authenticate(Some("Bearer testkit-admin-token")).unwrap();
        assert!(a.authorize(&admin, &attrs("delete", "")));
    }
}
