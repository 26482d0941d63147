//! testkit's strategic-merge patch (what the sidecar's status writes and the manager's patches
//! go through in the fault tests): any original and patch merge or are refused, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|bytes: &[u8]| {
    let Ok(Value::Array(pair)) = serde_json::from_slice::<Value>(bytes) else {
        return;
    };
    let [original, patch] = pair.as_slice() else {
        return;
    };
    for kind in ["Pod", "PodProbeMarker"] {
        let _ = testkit::strategic::apply(kind, original, patch);
    }
});
