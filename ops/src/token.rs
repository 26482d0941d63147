//! The TokenRequest both binaries make: a token of a pod's service account bound to that pod
//! (its claims name the pod and its uid, so it stops working when the pod is deleted), with
//! the apiserver's own audiences. The manager issues the first one of a virtual-node pod's
//! sidecar; the sidecar renews its own.

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};

/// A request for a token bound to pod `name` (uid `uid`), valid for `seconds`.
pub fn bound_to_pod(name: &str, uid: &str, seconds: i64) -> TokenRequest {
    TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
            }),
            expiration_seconds: Some(seconds),
        },
        ..Default::default()
    }
}
