//! The pod's service-account token, for the sidecar alone.
//!
//! An injected pod runs as the sidecar's service account, and kube-apiserver mounts that
//! account's token into every container (`kube-api-access-*`, added by the ServiceAccount
//! admission plugin before the webhook and again on reinvocation). A game server holding it
//! could write its own probe conditions (and so its markers) and exec into its own pod. So,
//! unless the pod asks for the token everywhere (`automountServiceAccountToken: true`),
//! injection turns the automount off, takes the generated volume and its mounts out, and mounts
//! a projected volume of the same shape into the sidecar only: token, `ca.crt`, `namespace`,
//! where in-cluster clients look for them.
//!
//! On a virtual node the token cannot be projected: azure-aci resolves `serviceAccountToken`
//! from the account's legacy token Secret (a token bound to no pod, which the chart's admission
//! policy refuses, and absent since Kubernetes 1.24) and skips `downwardAPI` sources. So the
//! virtual-node shape mounts a Secret instead, which podprobe-manager fills with a token bound
//! to the pod once it exists ([`crate::sidecar_token`]), while a scheduling gate holds the pod
//! off every node until then. Nothing refreshes that token, so the sidecar renews it itself
//! before it expires, into a memory `emptyDir` of the pod (`podprobe run --renew-token-dir`).

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, DownwardAPIProjection, DownwardAPIVolumeFile, EmptyDirVolumeSource,
    EnvVar, KeyToPath, ObjectFieldSelector, PodSpec, ProjectedVolumeSource, SecretProjection,
    ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::Value;

use crate::patch::PatchOp;
use crate::sidecar_token::TOKEN_VOLUME;

/// Where in-cluster clients (client-go, kube-rs) read the token, CA and namespace.
pub const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The prefix of the volume kube-apiserver generates for the automounted token.
const GENERATED_PREFIX: &str = "kube-api-access-";
/// The generated token's lifetime, kept: the kubelet refreshes it at 80 %.
const EXPIRATION_SECONDS: i64 = 3607;
/// Where the sidecar keeps the issued token it renews (`podprobe run --renew-token-dir`): a
/// volume of the pod, so a restarted sidecar finds the token it renewed last.
pub const RENEWAL_VOLUME: &str = "podprobe-credential";
pub const RENEWAL_MOUNT_PATH: &str = "/var/run/podprobe/credential";

/// The token's move to the sidecar: ops to apply before any other (they remove by index), the
/// mount to give the sidecar and the volume it mounts; with an issued token, what the sidecar
/// needs to renew it.
pub struct TokenPlan {
    pub ops: Vec<PatchOp>,
    pub sidecar_mount: VolumeMount,
    pub volume: Volume,
    pub renewal: Option<Renewal>,
}

/// The issued token's renewal by the sidecar: its directory (an `emptyDir` in memory, which
/// azure-aci accepts) and the env that names it.
pub struct Renewal {
    pub sidecar_mount: VolumeMount,
    pub volume: Volume,
    pub sidecar_env: EnvVar,
}

fn renewal() -> Renewal {
    Renewal {
        sidecar_mount: VolumeMount {
            name: RENEWAL_VOLUME.into(),
            mount_path: RENEWAL_MOUNT_PATH.into(),
            ..Default::default()
        },
        volume: Volume {
            name: RENEWAL_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(Quantity("1Mi".into())),
            }),
            ..Default::default()
        },
        sidecar_env: EnvVar {
            name: "PODPROBE_RENEW_TOKEN_DIR".into(),
            value: Some(RENEWAL_MOUNT_PATH.into()),
            ..Default::default()
        },
    }
}

/// How to move `spec`'s token to the sidecar; `None` when the pod asked for the token in every
/// container (`automountServiceAccountToken: true`). With `issued_secret`, the token comes
/// from that Secret (the virtual-node shape) instead of a projection.
pub fn plan(spec: &PodSpec, issued_secret: Option<&str>) -> Option<TokenPlan> {
    if spec.automount_service_account_token == Some(true) {
        return None;
    }
    let mut ops = generated_token_removals(spec);
    ops.push(PatchOp::Add {
        path: "/spec/automountServiceAccountToken".into(),
        value: Value::Bool(false),
    });
    Some(TokenPlan {
        ops,
        sidecar_mount: VolumeMount {
            name: TOKEN_VOLUME.into(),
            mount_path: TOKEN_MOUNT_PATH.into(),
            read_only: Some(true),
            ..Default::default()
        },
        volume: match issued_secret {
            None => projected_token_volume(),
            Some(secret) => issued_token_volume(secret),
        },
        renewal: issued_secret.map(|_| renewal()),
    })
}

/// Ops taking out the token volume kube-apiserver generated and every container's mount of
/// it, highest index first in each list so that each removal leaves the next one's index be.
fn generated_token_removals(spec: &PodSpec) -> Vec<PatchOp> {
    let generated = |name: &str| {
        spec.volumes.iter().flatten().any(|v| {
            v.name == name
                && name.starts_with(GENERATED_PREFIX)
                && v.projected.as_ref().is_some_and(|p| {
                    p.sources
                        .iter()
                        .flatten()
                        .any(|s| s.service_account_token.is_some())
                })
        })
    };
    let mut ops = Vec::new();
    for (list, containers) in [
        ("containers", Some(&spec.containers)),
        ("initContainers", spec.init_containers.as_ref()),
    ] {
        for (i, container) in containers.into_iter().flatten().enumerate() {
            let mounts = container.volume_mounts.iter().flatten().enumerate();
            let generated_mounts: Vec<usize> = mounts
                .filter(|(_, m)| m.mount_path == TOKEN_MOUNT_PATH && generated(&m.name))
                .map(|(k, _)| k)
                .collect();
            for k in generated_mounts.into_iter().rev() {
                ops.push(PatchOp::Remove {
                    path: format!("/spec/{list}/{i}/volumeMounts/{k}"),
                });
            }
        }
    }
    let volumes = spec.volumes.iter().flatten().enumerate();
    let generated_volumes: Vec<usize> = volumes
        .filter(|(_, v)| generated(&v.name))
        .map(|(j, _)| j)
        .collect();
    for j in generated_volumes.into_iter().rev() {
        ops.push(PatchOp::Remove {
            path: format!("/spec/volumes/{j}"),
        });
    }
    ops
}

fn key_to_path(key: &str) -> KeyToPath {
    KeyToPath {
        key: key.into(),
        path: key.into(),
        mode: None,
    }
}

/// The cluster's CA, as kube-apiserver's generated volume has it.
fn ca_projection() -> VolumeProjection {
    VolumeProjection {
        config_map: Some(ConfigMapProjection {
            name: "kube-root-ca.crt".into(),
            items: Some(vec![key_to_path("ca.crt")]),
            optional: None,
        }),
        ..Default::default()
    }
}

fn projected(sources: Vec<VolumeProjection>) -> Volume {
    Volume {
        name: TOKEN_VOLUME.into(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o644),
            sources: Some(sources),
        }),
        ..Default::default()
    }
}

/// The same sources as kube-apiserver's generated volume.
fn projected_token_volume() -> Volume {
    projected(vec![
        VolumeProjection {
            service_account_token: Some(ServiceAccountTokenProjection {
                path: "token".into(),
                expiration_seconds: Some(EXPIRATION_SECONDS),
                audience: None,
            }),
            ..Default::default()
        },
        ca_projection(),
        VolumeProjection {
            downward_api: Some(DownwardAPIProjection {
                items: Some(vec![DownwardAPIVolumeFile {
                    path: "namespace".into(),
                    field_ref: Some(ObjectFieldSelector {
                        api_version: Some("v1".into()),
                        field_path: "metadata.namespace".into(),
                    }),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        },
    ])
}

/// Token and namespace from the issued Secret, the CA from the cluster's ConfigMap: sources
/// azure-aci copies (each with its `items` listed), nothing it skips.
fn issued_token_volume(secret: &str) -> Volume {
    projected(vec![
        VolumeProjection {
            secret: Some(SecretProjection {
                name: secret.into(),
                items: Some(vec![key_to_path("token"), key_to_path("namespace")]),
                // A pod released without a token (the issuer refused) must still start: a
                // kubelet waits for a missing required Secret forever.
                optional: Some(true),
            }),
            ..Default::default()
        },
        ca_projection(),
    ])
}
