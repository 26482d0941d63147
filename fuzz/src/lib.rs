//! The properties the fuzz targets check, one function per parser of outside input. Each takes
//! the raw input and panics when the property fails, so the same function serves two callers:
//! libFuzzer (`fuzz_targets/`, through `cargo fuzz` with the `libfuzzer` feature) explores new
//! inputs, and `tests/replay.rs` runs every committed input on the stable toolchain as part of
//! the ordinary test suite, so a regression fails there in seconds without a fuzzing build.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PodSpec;
use podprobe::annotation::{PodContainers, go_quote, parse, parse_downward_api};
use podprobe_manager::cache::PpmCache;
use podprobe_manager::crd::PodProbeMarker;
use podprobe_manager::gojson::{probes_to_go_json, string};
use podprobe_manager::metrics::Metrics;
use podprobe_manager::validate::validate;
use podprobe_manager::webhook::{MUTATE_PODS_PATH, Mode, VALIDATE_PPM_PATH, Webhooks};
use podprobe_protocol::annotation::PodContainerProbe;
use serde_json::Value;

/// A property over one input, as both the fuzz targets and the replay test call it.
pub type Property = fn(&[u8]);

/// Every target by the name of its `fuzz_targets/<name>.rs` and its corpus directory.
pub const TARGETS: [(&str, Property); 5] = [
    ("admission_review", admission_review),
    ("annotation", annotation),
    ("downward_api", downward_api),
    ("go_json", go_json),
    ("ppm_validation", ppm_validation),
];

/// The manager's admission webhooks on any request body: decoding an AdmissionReview, the pod
/// mutation and the PodProbeMarker validation answer every body (400 for what is not a review),
/// never panic, and an OK answer is itself a well-formed AdmissionReview.
pub fn admission_review(bytes: &[u8]) {
    let hooks = Webhooks {
        mode: Mode::Standalone,
        injection: None,
        native_sidecars_supported: true,
        ppms: Arc::new(PpmCache::default()),
        namespaces: None,
        metrics: Arc::new(Metrics::default()),
    };
    for path in [MUTATE_PODS_PATH, VALIDATE_PPM_PATH] {
        let answer = hooks.handle(path, bytes);
        if answer.status.as_u16() == 200 {
            let review: Value = serde_json::from_slice(&answer.body).expect("an answer is JSON");
            assert_eq!(review["kind"], "AdmissionReview", "{review}");
        }
    }
}

/// The `kruise.io/podprobe` annotation as the sidecar parses it: any text, with and without the
/// pod's containers (named ports resolve against them), gives a probe set or an error, never a
/// panic.
pub fn annotation(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let _ = parse(text, None);
    let spec: PodSpec = serde_json::from_value(serde_json::json!({"containers": [{
        "name": "main",
        "ports": [{"name": "http", "containerPort": 8080}, {"name": "grpc", "containerPort": 9090}]
    }]}))
    .expect("a valid PodSpec");
    let _ = parse(text, Some(&PodContainers::from_spec(&spec)));
}

/// The kubelet's downward-API annotations file (`key="go-quoted value"` per line): any text
/// parses or errors without a panic, and every value written the way the kubelet writes it
/// (Go's `%q`) reads back unchanged.
pub fn downward_api(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let _ = parse_downward_api(text);
    let file = format!("kruise.io/podprobe={}\n", go_quote(text));
    let read = parse_downward_api(&file).expect("what the kubelet writes parses");
    assert_eq!(
        read.get("kruise.io/podprobe").map(String::as_str),
        Some(text)
    );
}

/// The manager's Go-compatible JSON writer for the `kruise.io/podprobe` annotation: every
/// string it escapes parses back to itself, and for any probe list what it writes is JSON that
/// decodes to probes it writes again byte for byte (the annotation is stable under re-encoding).
pub fn go_json(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        let mut quoted = String::new();
        string(&mut quoted, text);
        let back: String = serde_json::from_str(&quoted).expect("escaped strings are JSON");
        assert_eq!(back, text);
    }
    let Ok(probes) = serde_json::from_slice::<Vec<PodContainerProbe>>(bytes) else {
        return;
    };
    let written = probes_to_go_json(&probes);
    let again: Vec<PodContainerProbe> =
        serde_json::from_str(&written).unwrap_or_else(|e| panic!("{e}: {written}"));
    assert_eq!(probes_to_go_json(&again), written);
}

/// PodProbeMarker validation (the manager's validating webhook rules): any PodProbeMarker the
/// JSON decodes into is accepted or refused with field errors, on create and on update, never
/// with a panic; and a refusal always names at least one field.
pub fn ppm_validation(bytes: &[u8]) {
    let Ok(ppm) = serde_json::from_slice::<PodProbeMarker>(bytes) else {
        return;
    };
    for old in [None, Some(&ppm)] {
        if let Err(errors) = validate(&ppm, old) {
            assert!(!errors.0.is_empty());
            assert!(errors.0.iter().all(|e| !e.field.is_empty()));
        }
    }
}
