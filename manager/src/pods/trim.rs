//! What the pod cache keeps of each pod: only what the controllers read. A pod as the
//! apiserver sends it carries managedFields, every container's spec (env, volumes, probes)
//! and status; the cache held all of it for every pod of the cluster, which is most of the
//! manager's memory (docs/scale.md).
//!
//! Kept: name, namespace, uid, resourceVersion (the written-patch bookkeeping), every label
//! and annotation (a marker policy may name any key, and markers are diffed against them),
//! the deletion timestamp, the node name, the names of the containers and of the native
//! sidecars (restartable init containers: the sidecar check and the annotation's container
//! rule), the phase, and each condition's type and status.

use k8s_openapi::api::core::v1::{Container, Pod, PodCondition, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Drops from `pod` everything the pod controller and the status controller do not read.
pub fn trim(pod: &mut Pod) {
    let metadata = std::mem::take(&mut pod.metadata);
    pod.metadata = ObjectMeta {
        name: metadata.name,
        namespace: metadata.namespace,
        uid: metadata.uid,
        resource_version: metadata.resource_version,
        labels: metadata.labels,
        annotations: metadata.annotations,
        deletion_timestamp: metadata.deletion_timestamp,
        ..ObjectMeta::default()
    };
    pod.spec = pod.spec.take().map(|spec| PodSpec {
        node_name: spec.node_name,
        containers: spec.containers.into_iter().map(named).collect(),
        init_containers: spec.init_containers.map(|init| {
            init.into_iter()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"))
                .map(|c| Container {
                    restart_policy: c.restart_policy.clone(),
                    ..named(c)
                })
                .collect()
        }),
        ..PodSpec::default()
    });
    pod.status = pod.status.take().map(|status| PodStatus {
        phase: status.phase,
        conditions: status.conditions.map(|conditions| {
            conditions
                .into_iter()
                .map(|c| PodCondition {
                    type_: c.type_,
                    status: c.status,
                    ..PodCondition::default()
                })
                .collect()
        }),
        ..PodStatus::default()
    });
}

fn named(container: Container) -> Container {
    Container {
        name: container.name,
        ..Container::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::{MarkerScope, desired_patch, fingerprint, runs_sidecar};
    use crate::status::matched_pods;
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
    fn the_controllers_decide_the_same_on_a_trimmed_pod() {
        let scope = MarkerScope::default();
        let ppms = [ppm()];
        for (healthy, labels) in [
            ("True", json!({"app": "game"})),
            ("False", json!({"app": "game", "server-healthy": "true"})),
            ("True", json!({"app": "other"})),
        ] {
            let full = served(healthy, labels);
            let mut trimmed = full.clone();
            trim(&mut trimmed);
            assert_eq!(
                desired_patch(&trimmed, &ppms, None, &scope),
                desired_patch(&full, &ppms, None, &scope),
                "{healthy}"
            );
            assert_eq!(fingerprint(&trimmed), fingerprint(&full));
            assert_eq!(
                runs_sidecar(&trimmed, "podprobe"),
                runs_sidecar(&full, "podprobe")
            );
            assert_eq!(
                matched_pods(&ppms[0], [&trimmed].into_iter()),
                matched_pods(&ppms[0], [&full].into_iter())
            );
        }
        let mut trimmed = served("True", json!({"app": "game"}));
        trim(&mut trimmed);
        assert!(
            runs_sidecar(&trimmed, "podprobe"),
            "the native sidecar kept"
        );
        assert!(desired_patch(&trimmed, &ppms, None, &scope).is_some());
    }

    #[test]
    fn what_no_controller_reads_is_dropped() {
        let mut pod = served("True", json!({"app": "game"}));
        trim(&mut pod);
        assert!(pod.metadata.managed_fields.is_none());
        assert!(pod.metadata.owner_references.is_none());
        let spec = pod.spec.as_ref().unwrap();
        assert!(spec.volumes.is_none());
        assert!(spec.containers[0].env.is_none() && spec.containers[0].image.is_none());
        let init: Vec<&str> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(init, ["podprobe"], "only native sidecars");
        let status = pod.status.as_ref().unwrap();
        assert!(status.container_statuses.is_none() && status.pod_ip.is_none());
        assert!(
            status
                .conditions
                .iter()
                .flatten()
                .all(|c| c.message.is_none() && c.last_probe_time.is_none())
        );
        assert_eq!(
            pod.metadata.annotations.unwrap().len(),
            2,
            "every annotation"
        );
    }
}
