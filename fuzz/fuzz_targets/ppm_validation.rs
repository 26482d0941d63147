//! PodProbeMarker validation (the manager's validating webhook rules): any PodProbeMarker the
//! JSON decodes into is accepted or refused with field errors, on create and on update, never
//! with a panic; and a refusal always names at least one field.
#![no_main]

use libfuzzer_sys::fuzz_target;
use podprobe_manager::crd::PodProbeMarker;
use podprobe_manager::validate::validate;

fuzz_target!(|bytes: &[u8]| {
    let Ok(ppm) = serde_json::from_slice::<PodProbeMarker>(bytes) else {
        return;
    };
    for old in [None, Some(&ppm)] {
        if let Err(errors) = validate(&ppm, old) {
            assert!(!errors.0.is_empty());
            assert!(errors.0.iter().all(|e| !e.field.is_empty()));
        }
    }
});
