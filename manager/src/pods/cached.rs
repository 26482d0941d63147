//! What the pod cache keeps of each pod: its own type, holding only what the controllers read.
//! A pod as the apiserver sends it carries managedFields, every container's spec (env, volumes,
//! probes) and status; even trimmed to the fields read, a `Pod` of k8s-openapi is 2.1 KiB of
//! empty fields and each `Container` another 2.1 KiB, so a cache of `Pod`s cost about 12 KiB
//! per pod at 10 000 pods (docs/scale.md). A [`CachedPod`] holds the same facts in a few
//! hundred bytes plus the strings themselves.
//!
//! Kept: name, namespace, uid, resourceVersion (the written-patch bookkeeping), every label
//! and annotation (a marker policy may name any key, and markers are diffed against them),
//! the deletion timestamp, the node name, the names of the containers and of the native
//! sidecars (restartable init containers: the sidecar check and the annotation's container
//! rule), the phase, and each condition's type and status.
//!
//! The watch deserializes each pod as a `Pod` and keeps a `CachedPod` of it (`serde(from)`),
//! so a whole pod lives only while its list page or watch event is read. The decisions shared
//! with the webhook and the plugin read a `Pod`: [`CachedPod::to_pod`] rebuilds the trimmed
//! one for a reconcile.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{Container, Pod, PodCondition, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Deserialize;

/// One pod as the pod cache keeps it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "Pod")]
pub struct CachedPod {
    /// Name, namespace, uid, resourceVersion, labels, annotations, deletionTimestamp.
    pub metadata: ObjectMeta,
    pub node_name: Option<String>,
    /// The names of `spec.containers`.
    pub containers: Box<[String]>,
    /// The names of the restartable init containers (native sidecars).
    pub native_sidecars: Box<[String]>,
    pub phase: Option<String>,
    pub conditions: Box<[ConditionState]>,
}

/// A pod condition's type and status.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConditionState {
    pub type_: String,
    pub status: String,
}

impl From<Pod> for CachedPod {
    fn from(pod: Pod) -> Self {
        let metadata = pod.metadata;
        let spec = pod.spec.unwrap_or_default();
        let status = pod.status.unwrap_or_default();
        Self {
            metadata: ObjectMeta {
                name: metadata.name,
                namespace: metadata.namespace,
                uid: metadata.uid,
                resource_version: metadata.resource_version,
                labels: metadata.labels,
                annotations: metadata.annotations,
                deletion_timestamp: metadata.deletion_timestamp,
                ..ObjectMeta::default()
            },
            node_name: spec.node_name,
            containers: spec.containers.into_iter().map(|c| c.name).collect(),
            native_sidecars: spec
                .init_containers
                .into_iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"))
                .map(|c| c.name)
                .collect(),
            phase: status.phase,
            conditions: status
                .conditions
                .into_iter()
                .flatten()
                .map(|c| ConditionState {
                    type_: c.type_,
                    status: c.status,
                })
                .collect(),
        }
    }
}

impl CachedPod {
    /// The pod as the shared decisions read it: the kept facts in a `Pod`, nothing else.
    pub fn to_pod(&self) -> Pod {
        let named = |name: &String| Container {
            name: name.clone(),
            ..Container::default()
        };
        Pod {
            metadata: self.metadata.clone(),
            spec: Some(PodSpec {
                node_name: self.node_name.clone(),
                containers: self.containers.iter().map(named).collect(),
                init_containers: (!self.native_sidecars.is_empty()).then(|| {
                    self.native_sidecars
                        .iter()
                        .map(|n| Container {
                            restart_policy: Some("Always".into()),
                            ..named(n)
                        })
                        .collect()
                }),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: self.phase.clone(),
                conditions: Some(
                    self.conditions
                        .iter()
                        .map(|c| PodCondition {
                            type_: c.type_.clone(),
                            status: c.status.clone(),
                            ..PodCondition::default()
                        })
                        .collect(),
                ),
                ..PodStatus::default()
            }),
        }
    }

    /// Not terminating and not finished (as [`podprobe_protocol::pod::is_active`]).
    pub fn is_active(&self) -> bool {
        self.metadata.deletion_timestamp.is_none()
            && !matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
    }

    /// A container or native sidecar named `name` (as [`super::runs_sidecar`]).
    pub fn runs_sidecar(&self, name: &str) -> bool {
        self.containers
            .iter()
            .chain(&self.native_sidecars)
            .any(|c| c == name)
    }

    /// The status of the condition `type_`, if the pod has it.
    pub fn condition(&self, type_: &str) -> Option<&str> {
        self.conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| c.status.as_str())
    }

    /// The node the pod is scheduled on, if any.
    pub fn node(&self) -> Option<&str> {
        self.node_name.as_deref().filter(|n| !n.is_empty())
    }

    /// `namespace/name`, for logs and Events.
    pub fn key(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name.as_deref().unwrap_or_default()
        )
    }
}

/// The pod cache lists and watches `/api/v1/pods` as `CachedPod`s.
impl Resource for CachedPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Pod::kind(&())
    }
    fn group(_: &()) -> Cow<'_, str> {
        Pod::group(&())
    }
    fn version(_: &()) -> Cow<'_, str> {
        Pod::version(&())
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Pod::plural(&())
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::{MarkerScope, desired_patch, fingerprint, runs_sidecar};
    use podprobe_protocol::pod::is_active;
    use serde_json::json;

    /// A pod as the apiserver sends it once injected and running on a virtual node: managed
    /// fields, a full container spec, a native sidecar, container statuses, and conditions
    /// with times and messages.
    fn served(healthy: &str, labels: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "gs-0", "namespace": "test", "uid": "u-1", "resourceVersion": "42",
                "generateName": "gs-", "creationTimestamp": "2026-11-26T00:00:00Z",
                "labels": labels,
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{}",
                    "example.com/any": "kept",
                },
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "gs", "uid": "r-1"}],
                "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}],
            },
            "spec": {
                "nodeName": "vk-1",
                "containers": [{"name": "main", "image": "game:1",
                                "env": [{"name": "A", "value": "b"}],
                                "ports": [{"containerPort": 7777}]}],
                "initContainers": [
                    {"name": "setup", "image": "busybox"},
                    {"name": "podprobe", "image": "podprobe:dev", "restartPolicy": "Always"},
                ],
                "volumes": [{"name": "podinfo", "downwardAPI": {"items": []}}],
            },
            "status": {
                "phase": "Running", "podIP": "10.0.0.1",
                "conditions": [
                    {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-26T00:00:00Z"},
                    {"type": "game.kruise.io/healthy", "status": healthy, "message": "ok",
                     "lastProbeTime": "2026-11-26T00:00:01Z"},
                ],
                "containerStatuses": [{"name": "main", "ready": true, "restartCount": 0,
                                       "image": "game:1", "imageID": "sha256:1"}],
            },
        }))
        .unwrap()
    }

    fn ppm() -> crate::crd::PodProbeMarker {
        serde_json::from_value(json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
            "metadata": {"name": "ppm", "namespace": "test"},
            "spec": {"selector": {"matchLabels": {"app": "game"}}, "probes": [{
                "name": "healthy", "containerName": "main",
                "probe": {"exec": {"command": ["/healthy.sh"]}},
                "podConditionType": "game.kruise.io/healthy",
                "markerPolicy": [
                    {"state": "Succeeded", "labels": {"server-healthy": "true"},
                     "annotations": {"example.com/any": "healthy"}},
                    {"state": "Failed", "labels": {"server-healthy": "false"}}
                ]}]}
        }))
        .unwrap()
    }

    #[test]
    fn the_controllers_decide_the_same_on_the_cached_pod() {
        let scope = MarkerScope::default();
        let ppms = [ppm()];
        for (healthy, labels) in [
            ("True", json!({"app": "game"})),
            ("False", json!({"app": "game", "server-healthy": "true"})),
            ("True", json!({"app": "other"})),
        ] {
            let full = served(healthy, labels);
            let cached = CachedPod::from(full.clone());
            assert_eq!(
                desired_patch(&cached.to_pod(), &ppms, None, &scope),
                desired_patch(&full, &ppms, None, &scope),
                "{healthy}"
            );
            assert_eq!(
                cached.runs_sidecar("podprobe"),
                runs_sidecar(&full, "podprobe")
            );
        }
        // The cache's own checks are the shared ones, in every phase and while terminating.
        for phase in ["Pending", "Running", "Succeeded", "Failed"] {
            for deleting in [false, true] {
                let mut full = served("True", json!({"app": "game"}));
                full.status.as_mut().unwrap().phase = Some(phase.into());
                if deleting {
                    full.metadata.deletion_timestamp =
                        Some(serde_json::from_value(json!("2026-11-26T00:00:02Z")).unwrap());
                }
                let cached = CachedPod::from(full.clone());
                assert_eq!(cached.is_active(), is_active(&full), "{phase} {deleting}");
                assert_eq!(
                    cached.to_pod().status,
                    CachedPod::from(full).to_pod().status
                );
            }
        }
        let cached = CachedPod::from(served("True", json!({"app": "game"})));
        assert!(cached.runs_sidecar("podprobe"), "the native sidecar kept");
        assert!(
            !cached.runs_sidecar("setup"),
            "an init container is no sidecar"
        );
        assert!(desired_patch(&cached.to_pod(), &ppms, None, &scope).is_some());
    }

    #[test]
    fn only_what_the_decisions_read_changes_the_fingerprint() {
        let pod = served("True", json!({"app": "game"}));
        let before = fingerprint(&CachedPod::from(pod.clone()));
        let mut unread = pod.clone();
        let status = unread.status.as_mut().unwrap();
        status.conditions.as_mut().unwrap()[1].message = Some("other".into());
        status.pod_ip = Some("10.0.0.2".into());
        assert_eq!(fingerprint(&CachedPod::from(unread)), before);
        let mut flipped = pod;
        flipped
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()[1]
            .status = "False".into();
        assert_ne!(fingerprint(&CachedPod::from(flipped)), before);
    }

    #[test]
    fn what_no_controller_reads_is_dropped() {
        let full = served("True", json!({"app": "game"}));
        let pod = CachedPod::from(full.clone());
        assert!(pod.metadata.managed_fields.is_none());
        assert!(pod.metadata.owner_references.is_none());
        assert!(pod.metadata.generate_name.is_none());
        assert_eq!(&*pod.containers, ["main"]);
        assert_eq!(&*pod.native_sidecars, ["podprobe"], "only native sidecars");
        assert_eq!(pod.node(), Some("vk-1"));
        assert_eq!(pod.condition("game.kruise.io/healthy"), Some("True"));
        assert_eq!(
            pod.metadata.annotations.as_ref().unwrap().len(),
            2,
            "every annotation"
        );
        // The watch's path: straight from the apiserver's JSON.
        let read: CachedPod = serde_json::from_value(serde_json::to_value(&full).unwrap()).unwrap();
        assert_eq!(read, pod);
        // What a reconcile reads gives back the same cached pod.
        assert_eq!(CachedPod::from(pod.to_pod()), pod);
    }
}
