//! The kubelet's downward-API annotations file (`key="go-quoted value"` per line): any text
//! parses or errors without a panic, and every value written the way the kubelet writes it
//! (Go's `%q`) reads back unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use podprobe::annotation::{go_quote, parse_downward_api};

fuzz_target!(|text: &str| {
    let _ = parse_downward_api(text);
    let file = format!("kruise.io/podprobe={}\n", go_quote(text));
    let read = parse_downward_api(&file).expect("what the kubelet writes parses");
    assert_eq!(
        read.get("kruise.io/podprobe").map(String::as_str),
        Some(text)
    );
});
