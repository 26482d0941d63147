//! The `PodProbeMarker` custom resource (`apps.kruise.io/v1alpha1`), wire-compatible with
//! OpenKruise so existing manifests, OpenKruise Game and kubectl plugins keep working.
//!
//! Field optionality mirrors the Go types (`omitempty` ⇒ skipped when empty) so that a manifest
//! written for OpenKruise deserializes and serializes back to the same JSON value. The schema is
//! derived, then [`crd`] adjusts the few places where the derived schema would accept or reject
//! different objects than OpenKruise's CRD.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSON, JSONSchemaProps, JSONSchemaPropsOrArray,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One probe, the same type as an element of the `kruise.io/podprobe` annotation.
pub use podprobe_protocol::annotation::{PodContainerProbe, ProbeMarkerPolicy};

/// Spec of a PodProbeMarker: which pods, and which probes to run in them.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "apps.kruise.io",
    version = "v1alpha1",
    kind = "PodProbeMarker",
    namespaced,
    status = "PodProbeMarkerStatus",
    doc = "PodProbeMarker is the Schema for the PodProbeMarker API"
)]
#[serde(rename_all = "camelCase")]
pub struct PodProbeMarkerSpec {
    /// Label query over the pods that run the probes; immutable after creation.
    // Required by the CRD schema; an Option here so the validating webhook can report a
    // missing selector as a field error instead of failing to decode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// The probes; each records its result as the pod condition `podConditionType`.
    pub probes: Vec<PodContainerProbe>,
}

/// Status written by the manager's PodProbeMarker controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodProbeMarkerStatus {
    /// The generation this status reflects.
    pub observed_generation: i64,
    /// Number of pods that matched the selector at the last reconcile.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub matched_pods: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// The CRD to install, aligned with OpenKruise's schema where the derived one differs in ways
/// the apiserver would notice.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = PodProbeMarker::crd();
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            align_schema(schema);
        }
    }
    crd
}

fn align_schema(root: &mut JSONSchemaProps) {
    // OpenKruise's status is a plain object; `nullable` would let clients store `status: null`.
    if let Some(status) = property(root, "status") {
        status.nullable = None;
    }
    let Some(spec) = property(root, "spec") else {
        return;
    };
    // OpenKruise requires the selector at the schema level; the Option exists only so the
    // webhook can produce a readable error for objects that bypass the schema (dry runs, CLI).
    require(spec, "selector");
    if let Some(selector) = property(spec, "selector") {
        selector.nullable = None;
    }
    let Some(entry) = property(spec, "probes").and_then(items) else {
        return;
    };
    // The probe type is the annotation's too, whose parse decodes a missing name, container or
    // probe and refuses it with a field error; OpenKruise's CRD requires them, without
    // defaults.
    for field in ["containerName", "name", "probe"] {
        require(entry, field);
        if let Some(schema) = property(entry, field) {
            schema.default = None;
        }
    }
    let Some(probe) = property(entry, "probe") else {
        return;
    };
    // controller-gen emits the `+default=""` marker of core/v1 GRPCAction.Service.
    if let Some(service) = property(probe, "grpc").and_then(|g| property(g, "service")) {
        service.default = Some(JSON(serde_json::Value::String(String::new())));
    }
    // controller-gen spells int-or-string as `anyOf: [integer, string]` next to the extension;
    // kubectl explain and schema-driven tools show the alternatives only with it.
    for action in ["httpGet", "tcpSocket"] {
        if let Some(port) = property(probe, action).and_then(|a| property(a, "port")) {
            port.any_of = Some(vec![
                JSONSchemaProps {
                    type_: Some("integer".into()),
                    ..Default::default()
                },
                JSONSchemaProps {
                    type_: Some("string".into()),
                    ..Default::default()
                },
            ]);
        }
    }
}

fn property<'a>(schema: &'a mut JSONSchemaProps, name: &str) -> Option<&'a mut JSONSchemaProps> {
    schema.properties.as_mut()?.get_mut(name)
}

fn items(schema: &mut JSONSchemaProps) -> Option<&mut JSONSchemaProps> {
    match schema.items.as_mut()? {
        JSONSchemaPropsOrArray::Schema(s) => Some(s),
        JSONSchemaPropsOrArray::Schemas(v) => v.first_mut(),
    }
}

fn require(schema: &mut JSONSchemaProps, name: &str) {
    let required = schema.required.get_or_insert_with(Vec::new);
    if !required.iter().any(|r| r == name) {
        required.push(name.to_owned());
        required.sort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// The user-manual example (with `exec` in its valid object form).
    pub(crate) const MANUAL_EXAMPLE: &str = r#"
apiVersion: apps.kruise.io/v1alpha1
kind: PodProbeMarker
metadata:
  name: game-server-probe
  namespace: ns
spec:
  selector:
    matchLabels:
      app: game-server
  probes:
  - name: Idle
    containerName: game-server
    probe:
      exec:
        command:
        - /home/game/idle.sh
      initialDelaySeconds: 10
      timeoutSeconds: 3
      periodSeconds: 10
      successThreshold: 1
      failureThreshold: 3
    markerPolicy:
    - state: Succeeded
      labels:
        gameserver-idle: 'true'
      annotations:
        controller.kubernetes.io/pod-deletion-cost: '-10'
    - state: Failed
      labels:
        gameserver-idle: 'false'
      annotations:
        controller.kubernetes.io/pod-deletion-cost: '10'
    podConditionType: game.kruise.io/idle
"#;

    /// TV-03's PPM plus the TV-04 named-port probes and a status, to cover int-or-string.
    const TV03_FIXTURE: &str = r#"
apiVersion: apps.kruise.io/v1alpha1
kind: PodProbeMarker
metadata: {name: ppm-test, namespace: default}
spec:
  selector: {matchLabels: {app: test}}
  probes:
  - name: healthy
    containerName: main
    probe:
      exec: {command: ["/bin/sh", "-c", "/healthy.sh"]}
      initialDelaySeconds: 10
      timeoutSeconds: 3
      periodSeconds: 10
      successThreshold: 1
      failureThreshold: 3
    podConditionType: game.kruise.io/healthy
    markerPolicy:
    - {state: Succeeded, labels: {server-healthy: "true"}}
    - {state: Failed, labels: {server-healthy: "false"}}
  - name: httpCheckHealthy
    containerName: main
    probe: {httpGet: {path: /index.html, port: main-port, scheme: HTTP}}
    podConditionType: game.kruise.io/http
  - name: tcpCheckHealthy
    containerName: main
    probe: {tcpSocket: {port: 8080}}
    podConditionType: game.kruise.io/tcp
status: {observedGeneration: 2, matchedPods: 3}
"#;

    fn round_trip(yaml: &str) {
        let input: Value = serde_saphyr::from_str(yaml).unwrap();
        let ppm: PodProbeMarker = serde_json::from_value(input.clone()).unwrap();
        assert_eq!(serde_json::to_value(&ppm).unwrap(), input);
    }

    #[test]
    fn manual_example_round_trips_unchanged() {
        round_trip(MANUAL_EXAMPLE);
    }

    #[test]
    fn tv03_fixture_round_trips_unchanged_with_named_and_numeric_ports() {
        round_trip(TV03_FIXTURE);
    }

    fn schema_json() -> Value {
        serde_json::to_value(crd()).unwrap()
    }

    #[test]
    fn crd_identity_scope_and_subresources_match_openkruise() {
        let crd = schema_json();
        assert_eq!(crd["metadata"]["name"], "podprobemarkers.apps.kruise.io");
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert_eq!(crd["spec"]["names"]["kind"], "PodProbeMarker");
        assert_eq!(crd["spec"]["names"]["plural"], "podprobemarkers");
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["name"], "v1alpha1");
        assert_eq!(version["subresources"], json!({"status": {}}));
        assert!(version.get("additionalPrinterColumns").is_none());
    }

    fn spec_schema() -> Value {
        schema_json()["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
    }

    #[test]
    fn ports_are_int_or_string_and_grpc_service_defaults_to_empty() {
        let root = spec_schema();
        let probe = &root["properties"]["spec"]["properties"]["probes"]["items"]["properties"]["probe"]
            ["properties"];
        for action in ["httpGet", "tcpSocket"] {
            let port = &probe[action]["properties"]["port"];
            assert_eq!(port["x-kubernetes-int-or-string"], true, "{action}");
            assert_eq!(
                port["anyOf"],
                json!([{"type": "integer"}, {"type": "string"}])
            );
            assert_eq!(probe[action]["required"], json!(["port"]));
        }
        assert_eq!(probe["grpc"]["properties"]["service"]["default"], "");
        assert_eq!(probe["grpc"]["properties"]["port"]["type"], "integer");
    }

    #[test]
    fn required_fields_match_openkruise() {
        let root = spec_schema();
        let spec = &root["properties"]["spec"];
        assert_eq!(spec["required"], json!(["probes", "selector"]));
        let probe = &spec["properties"]["probes"]["items"];
        assert_eq!(probe["required"], json!(["containerName", "name", "probe"]));
        let policy = &probe["properties"]["markerPolicy"]["items"];
        assert_eq!(policy["required"], json!(["state"]));
        assert_eq!(
            root["properties"]["status"]["required"],
            json!(["observedGeneration"])
        );
    }

    /// Structural: every node has a type (or is int-or-string), nothing is nullable, and no
    /// default exists except grpc.service.
    #[test]
    fn schema_is_structural_without_nullable_or_stray_defaults() {
        fn walk(path: &str, node: &Value, defaults: &mut Vec<String>) {
            let Some(obj) = node.as_object() else { return };
            assert!(obj.get("nullable").is_none(), "nullable at {path}");
            if obj.contains_key("default") {
                defaults.push(path.to_owned());
            }
            if !path.ends_with(".anyOf") {
                assert!(
                    obj.contains_key("type") || obj.contains_key("x-kubernetes-int-or-string"),
                    "no type at {path}"
                );
            }
            for (key, child) in obj
                .get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                walk(&format!("{path}.{key}"), child, defaults);
            }
            for key in ["items", "additionalProperties"] {
                if let Some(child) = obj.get(key) {
                    walk(&format!("{path}.{key}"), child, defaults);
                }
            }
        }
        let mut defaults = Vec::new();
        walk("", &spec_schema(), &mut defaults);
        assert_eq!(defaults, [".spec.probes.items.probe.grpc.service"]);
    }
}
