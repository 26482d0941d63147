//! The manager's Go-compatible JSON writer for the `kruise.io/podprobe` annotation: every
//! string it escapes parses back to itself, and for any probe list what it writes is JSON that
//! decodes to probes it writes again byte for byte (the annotation is stable under re-encoding).
#![no_main]

use libfuzzer_sys::fuzz_target;
use podprobe_manager::gojson::{probes_to_go_json, string};
use podprobe_protocol::annotation::PodContainerProbe;

fuzz_target!(|bytes: &[u8]| {
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
});
