//! The `kruise.io/podprobe` annotation as the sidecar parses it: any text, with and without the
//! pod's containers (named ports resolve against them), gives a probe set or an error, never a
//! panic.
#![no_main]

use k8s_openapi::api::core::v1::PodSpec;
use libfuzzer_sys::fuzz_target;
use podprobe::annotation::{PodContainers, parse};

fuzz_target!(|text: &str| {
    let _ = parse(text, None);
    let spec: PodSpec = serde_json::from_value(serde_json::json!({"containers": [{
        "name": "main",
        "ports": [{"name": "http", "containerPort": 8080}, {"name": "grpc", "containerPort": 9090}]
    }]}))
    .expect("a valid PodSpec");
    let _ = parse(text, Some(&PodContainers::from_spec(&spec)));
});
