//! What admission does to a new pod, in one place: the `kruise.io/podprobe` annotations its
//! PodProbeMarkers give it (written by podprobe in standalone mode; in companion mode
//! OpenKruise's webhook writes them) and, with injection configured, the sidecar. The pod
//! webhook and `podprobe-manager render` both call [`mutate`], so what `render` shows is what
//! the webhook does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use podprobe_protocol::annotation::PodContainerProbe;

use crate::annotate::{self, ProbeAnnotations};
use crate::config::InjectionConfig;
use crate::crd::PodProbeMarker;
use crate::inject::{InjectContext, inject};
use crate::patch::PatchOp;

/// Injection's settings and what it needs to know beyond the pod.
#[derive(Debug, Clone, Copy)]
pub struct Injection<'a> {
    pub config: &'a InjectionConfig,
    /// Labels of the pod's namespace (opt-in), when known.
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    pub native_sidecars_supported: bool,
    /// The admission request's uid (names a virtual-node pod's token Secret).
    pub request_uid: &'a str,
    /// Companion mode: the sidecar probes only on `type=virtual-kubelet` nodes, kruise-daemon
    /// elsewhere.
    pub companion: bool,
    /// The cluster's virtual nodes (none known to `render`).
    pub virtual_nodes: &'a [crate::inject::placement::VirtualNode],
    /// This replica, as the label value naming the issuer of a virtual-node pod's token.
    pub issuer: &'a str,
}

/// The patch for one pod, and what went into it.
#[derive(Debug, Clone, Default)]
pub struct Mutation {
    pub ops: Vec<PatchOp>,
    /// The annotations the pod's markers give it; `None` when no probe was accepted.
    pub annotations: Option<ProbeAnnotations>,
    /// Whether the sidecar was injected.
    pub injected: bool,
    /// What the pod's creator should know (admission warnings).
    pub warnings: Vec<String>,
}

/// The mutation of `pod` by the PodProbeMarkers of its namespace: their annotations when
/// `write_annotations` (standalone mode), and the sidecar when `injection` is given and the
/// pod opted in.
pub fn mutate(
    pod: &Pod,
    namespace_ppms: &[PodProbeMarker],
    write_annotations: bool,
    injection: Option<Injection<'_>>,
) -> Mutation {
    let annotations = annotate::compute(pod, namespace_ppms);
    let mut ops = match (&annotations, write_annotations) {
        (Some(a), true) => annotate::patch_ops(pod, a),
        _ => vec![],
    };
    let mut injected = false;
    let mut warnings = Vec::new();
    if let Some(injection) = injection {
        let probes = annotations
            .as_ref()
            .map(|a| probes(&a.probes))
            .unwrap_or_default();
        let conditions: Vec<String> = probes
            .iter()
            .map(|p| p.pod_condition_type.clone())
            .filter(|c| !c.is_empty())
            .collect();
        let exec_containers = exec_containers(&probes);
        let ctx = InjectContext {
            namespace_labels: injection.namespace_labels,
            native_sidecars_supported: injection.native_sidecars_supported,
            probe_condition_types: &conditions,
            exec_probe_containers: &exec_containers,
            request_uid: injection.request_uid,
            companion: injection.companion,
            virtual_nodes: injection.virtual_nodes,
            issuer: injection.issuer,
        };
        let sidecar = inject(pod, injection.config, &ctx);
        injected = !sidecar.ops.is_empty();
        ops.extend(sidecar.ops);
        warnings = sidecar.warnings;
    }
    Mutation {
        ops,
        annotations,
        injected,
        warnings,
    }
}

/// The containers that exec probes among `probes` target.
pub fn exec_containers(probes: &[PodContainerProbe]) -> Vec<String> {
    probes
        .iter()
        .filter(|p| p.probe.exec.is_some())
        .map(|p| p.container_name.clone())
        .collect()
}

/// The probes of a `kruise.io/podprobe` value (for readiness gates and the exec agent).
pub fn probes(probes_json: &str) -> Vec<PodContainerProbe> {
    serde_json::from_str(probes_json).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "gs-0", "namespace": "games",
                         "labels": {"app": "game", "podprobe.io/inject": "enabled"}},
            "spec": {"containers": [{"name": "main", "image": "game:1"}]}
        }))
        .unwrap()
    }

    fn ppm() -> PodProbeMarker {
        serde_json::from_value(json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
            "metadata": {"name": "healthy", "namespace": "games"},
            "spec": {"selector": {"matchLabels": {"app": "game"}}, "probes": [{
                "name": "healthy", "containerName": "main", "podConditionType": "game.io/healthy",
                "probe": {"tcpSocket": {"port": 7777}}
            }]}
        }))
        .unwrap()
    }

    fn injection(config: &InjectionConfig) -> Injection<'_> {
        Injection {
            config,
            namespace_labels: None,
            native_sidecars_supported: true,
            request_uid: "uid-1",
            companion: false,
            virtual_nodes: &[],
            issuer: "manager-0",
        }
    }

    fn paths(mutation: &Mutation) -> Vec<String> {
        mutation
            .ops
            .iter()
            .map(|op| {
                serde_json::to_value(op).unwrap()["path"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn standalone_writes_the_annotations_and_gates_the_probes_conditions() {
        let config =
            InjectionConfig::from_yaml("image: podprobe:dev\nreadinessGates: [\"*\"]\n", "t")
                .unwrap();
        let mutation = mutate(&pod(), &[ppm()], true, Some(injection(&config)));
        assert!(mutation.injected);
        assert!(mutation.annotations.is_some());
        let paths = paths(&mutation);
        assert!(
            paths.iter().any(|p| p.starts_with("/metadata/annotations")),
            "{paths:?}"
        );
        let mut doc = serde_json::to_value(pod()).unwrap();
        crate::patch::apply(&mut doc, &mutation.ops).unwrap();
        assert_eq!(
            doc["spec"]["readinessGates"],
            json!([{"conditionType": "game.io/healthy"}])
        );
    }

    #[test]
    fn companion_leaves_the_annotations_to_openkruise_and_still_injects() {
        let config = InjectionConfig::from_yaml("image: podprobe:dev\n", "t").unwrap();
        let mutation = mutate(&pod(), &[ppm()], false, Some(injection(&config)));
        assert!(mutation.injected);
        assert!(mutation.annotations.is_some(), "what OpenKruise will write");
        let paths = paths(&mutation);
        assert!(
            !paths.iter().any(|p| p.starts_with("/metadata/annotations")),
            "{paths:?}"
        );
        let without_injection = mutate(&pod(), &[ppm()], false, None);
        assert!(without_injection.ops.is_empty() && !without_injection.injected);
    }
}
