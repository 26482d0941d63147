//! The token of a sidecar on a virtual node, issued by the manager.
//!
//! Virtual-kubelet providers do not project service-account tokens as a kubelet does (azure-aci
//! copies the account's legacy token Secret, bound to no pod, which the chart's admission
//! policy refuses, and which Kubernetes no longer creates). So for a pod in the virtual-node
//! shape (chosen at injection) that is not bound yet, injection mounts a Secret named
//! after the admission request, labels the pod [`LABEL`]`=`[`PENDING`] and holds it off every
//! node with the scheduling gate [`GATE`]. (A pod bound at creation cannot be held: it keeps
//! the projected token, which providers that project tokens serve.) Once the pod exists (it has a uid),
//! [`issue`] asks for a token of the pod's service account bound to the pod (a TokenRequest,
//! as the kubelet does), writes it into that Secret (owned by the pod, so it goes with it),
//! and lifts the gate. The token carries the pod's name and uid, so the admission policy
//! confines it to the pod exactly as a projected one; it stops working when the pod is deleted.

pub mod decide;
pub mod issue;

use serde_json::{Value, json};

use crate::patch::{PatchOp, escape};
use k8s_openapi::api::core::v1::{Pod, PodSpec};

/// The scheduling gate that holds a pod until its sidecar's token is issued.
pub const GATE: &str = "podprobe.io/sidecar-token";
/// The label the issuer selects pods by; [`PENDING`] until issued, [`REFUSED`] when the
/// apiserver refused the token or the Secret (the pod is released without it).
pub const LABEL: &str = "podprobe.io/sidecar-token";
pub const PENDING: &str = "pending";
pub const REFUSED: &str = "refused";
/// [`LABEL`] of a virtual-node pod that keeps its projected token ([`KeptProjected`]): no
/// token is issued for it, and its provider may replace or drop the projected one.
pub const PROJECTED: &str = "projected";
/// The label that names the replica whose webhook admitted the pod, which issues its token;
/// another replica takes it over only after [`decide::TAKEOVER`] (so each pod costs one
/// TokenRequest, one Secret and one release, unless that replica went away).
pub const ISSUER_LABEL: &str = "podprobe.io/sidecar-token-issuer";
/// The sidecar's token volume: injection mounts the token there, the issuer reads from it
/// which Secret to write.
pub const TOKEN_VOLUME: &str = "podprobe-api-access";
/// Prefix of the issued Secrets' names.
pub const SECRET_PREFIX: &str = "podprobe-token-";

/// The Secret for the pod admitted by request `request_uid` (a UUID: unique, and a valid name).
pub fn secret_name(request_uid: &str) -> String {
    let id: String = request_uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    format!(
        "{SECRET_PREFIX}{}",
        if id.is_empty() { "rendered" } else { &id }
    )
}

/// `identity` (a replica's) as a label value: its last 63 characters, starting with a letter
/// or digit.
pub fn issuer_value(identity: &str) -> String {
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let cleaned: String = identity
        .chars()
        .map(|c| if valid(c) { c } else { '-' })
        .collect();
    let tail = &cleaned[cleaned.len().saturating_sub(63)..];
    tail.trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
        .trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

/// Admission ops for a pod not bound yet: the labels the issuer finds it by (pending, and by
/// which replica, `issuer`), and the gate that holds it until then.
pub fn await_issue_ops(pod: &Pod, issuer: &str) -> Vec<PatchOp> {
    let mut ops = match &pod.metadata.labels {
        Some(_) => vec![
            PatchOp::Add {
                path: format!("/metadata/labels/{}", escape(LABEL)),
                value: Value::String(PENDING.into()),
            },
            PatchOp::Add {
                path: format!("/metadata/labels/{}", escape(ISSUER_LABEL)),
                value: Value::String(issuer.into()),
            },
        ],
        None => vec![PatchOp::Add {
            path: "/metadata/labels".into(),
            value: json!({ LABEL: PENDING, ISSUER_LABEL: issuer }),
        }],
    };
    let gate = json!({ "name": GATE });
    let gated = match pod.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref()) {
        Some(_) => PatchOp::Add {
            path: "/spec/schedulingGates/-".into(),
            value: gate,
        },
        None => PatchOp::Add {
            path: "/spec/schedulingGates".into(),
            value: json!([gate]),
        },
    };
    ops.push(gated);
    ops
}

/// Why a pod in the virtual-node shape keeps its projected token instead of an issued one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeptProjected {
    /// `spec.nodeName` at creation: no scheduling gate can hold it until a token exists.
    BoundAtCreation,
    /// `automountServiceAccountToken: true`: the pod asked for the token in every container.
    AutomountEverywhere,
}

impl KeptProjected {
    /// Why `spec` (in the virtual-node shape, not issued a token) keeps the projected one.
    pub fn of(spec: &PodSpec) -> Self {
        if spec.node_name.is_some() {
            KeptProjected::BoundAtCreation
        } else {
            KeptProjected::AutomountEverywhere
        }
    }

    /// The admission warning (kubectl prints it to whoever created the pod).
    pub fn warning(self) -> String {
        let why = match self {
            KeptProjected::BoundAtCreation => {
                "it is bound to its node at creation (spec.nodeName), so no scheduling gate can hold it until a token is issued"
            }
            KeptProjected::AutomountEverywhere => {
                "it asks for the token in every container (automountServiceAccountToken: true)"
            }
        };
        format!(
            "podprobe: this virtual-node pod keeps its projected service-account token, as {why}; \
             a provider that does not project tokens (azure-aci) replaces or drops it, and its \
             sidecar then cannot write probe conditions. Labelled {LABEL}={PROJECTED}"
        )
    }
}

/// Admission ops recording on the pod that it keeps its projected token ([`PROJECTED`]).
pub fn kept_projected_ops(pod: &Pod) -> Vec<PatchOp> {
    match &pod.metadata.labels {
        Some(_) => vec![PatchOp::Add {
            path: format!("/metadata/labels/{}", escape(LABEL)),
            value: Value::String(PROJECTED.into()),
        }],
        None => vec![PatchOp::Add {
            path: "/metadata/labels".into(),
            value: json!({ LABEL: PROJECTED }),
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_are_valid_and_unique_per_request() {
        let a = secret_name("0D7B3F7E-5A4C-4C3B-9E8F-1A2B3C4D5E6F");
        assert_eq!(a, "podprobe-token-0d7b3f7e5a4c4c3b9e8f1a2b3c4d5e6f");
        assert!(
            podprobe_protocol::names::dns_subdomain_errors(&a).is_empty(),
            "{a}"
        );
        assert_ne!(a, secret_name("another"));
    }

    #[test]
    fn an_issuer_is_a_valid_label_value() {
        assert_eq!(issuer_value("manager-0"), "manager-0");
        let long = format!(
            "_{}_123_00ff00ff",
            "podprobe-manager-7d9f8c6b5-xk2lp".repeat(3)
        );
        let value = issuer_value(&long);
        assert!(
            value.len() <= 63 && value.ends_with("_123_00ff00ff"),
            "{value}"
        );
        assert!(
            value.starts_with(|c: char| c.is_ascii_alphanumeric()),
            "{value}"
        );
        assert_eq!(issuer_value("a/b c"), "a-b-c");
    }
}
