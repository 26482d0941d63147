//! The manager's admission webhooks on any request body: decoding an AdmissionReview, the pod
//! mutation and the PodProbeMarker validation answer every body (400 for what is not a review),
//! never panic, and an OK answer is itself a well-formed AdmissionReview.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use podprobe_manager::cache::PpmCache;
use podprobe_manager::metrics::Metrics;
use podprobe_manager::webhook::{MUTATE_PODS_PATH, Mode, VALIDATE_PPM_PATH, Webhooks};

fuzz_target!(|bytes: &[u8]| {
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
            let review: serde_json::Value =
                serde_json::from_slice(&answer.body).expect("an answer is JSON");
            assert_eq!(review["kind"], "AdmissionReview", "{review}");
        }
    }
});
