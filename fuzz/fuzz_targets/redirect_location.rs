//! libFuzzer entry point for `podprobe_fuzz::redirect_location` (the property, documented there).
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| podprobe_fuzz::redirect_location(bytes));
