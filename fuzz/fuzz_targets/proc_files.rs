//! libFuzzer entry point for `podprobe_fuzz::proc_files` (the property, documented there).
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| podprobe_fuzz::proc_files(bytes));
