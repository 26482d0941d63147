//! The properties the fuzz targets check, one function per parser of outside input. Each takes
//! the raw input and panics when the property fails, so the same function serves two callers:
//! libFuzzer (`fuzz_targets/`, through `cargo fuzz` with the `libfuzzer` feature) explores new
//! inputs, and `tests/replay.rs` runs every committed input on the stable toolchain as part of
//! the ordinary test suite, so a regression fails there in seconds without a fuzzing build.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PodSpec;
use podprobe::annotation::{PodContainers, go_quote, parse, parse_downward_api};
use podprobe::probe::exec::procfs::{ProcIds, ProcStatus, parse_environ};
use podprobe::probe::url::ProbeUrl;
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
pub const TARGETS: [(&str, Property); 7] = [
    ("admission_review", admission_review),
    ("annotation", annotation),
    ("downward_api", downward_api),
    ("go_json", go_json),
    ("ppm_validation", ppm_validation),
    ("proc_files", proc_files),
    ("redirect_location", redirect_location),
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
        nodes: None,
        issuer: "manager-0".into(),
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

/// The `/proc/<pid>` files procfs exec reads from processes it does not control (`status`,
/// `environ`): any bytes parse without a panic; every environment pair read back has a
/// non-empty key without `=` or NUL and a value without NUL; and a status written the way the
/// kernel writes it reads back the values it was written with.
pub fn proc_files(bytes: &[u8]) {
    for (key, value) in parse_environ(bytes) {
        let (key, value) = (key.as_encoded_bytes(), value.as_encoded_bytes());
        assert!(
            !key.is_empty() && !key.contains(&b'=') && !key.contains(&0),
            "{key:?}"
        );
        assert!(!value.contains(&0), "{value:?}");
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let _ = ProcStatus::parse(text);
    // The input's first line as the process name (a process sets its own), then the fields.
    let name = text.lines().next().unwrap_or_default().trim();
    let seed = bytes
        .iter()
        .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(*b)));
    let written = format!(
        "Name:\t{name}\nUmask:\t0022\nState:\tS (sleeping)\nPPid:\t{}\n\
         Uid:\t{seed}\t{}\t{seed}\t{seed}\nGid:\t{}\t{}\t1\t1\nGroups:\t{} {}\n\
         CapInh:\t0000000000000000\nCapPrm:\t{:016x}\nCapEff:\t{:016x}\n\
         CapBnd:\t000001ffffffffff\nNoNewPrivs:\t1\n",
        seed % 4_000_000,
        seed / 3,
        seed / 5,
        seed / 7,
        seed / 11,
        seed / 13,
        u64::from(seed) << 9,
        u64::from(seed) << 9,
    );
    let read = ProcStatus::parse(&written);
    // A name line holding another field's prefix cannot be told apart: the kernel escapes
    // newlines in names, so only a name that is a single line is expected back.
    assert_eq!(read.name, name, "{written:?}");
    assert_eq!(read.ppid, Some(i32::try_from(seed % 4_000_000).unwrap()));
    let ids = ProcIds {
        uid: seed / 3,
        gid: seed / 7,
        groups: vec![seed / 11, seed / 13],
    };
    assert_eq!(read.ids, Some(ids));
    let caps = read.caps.expect("all four capability sets");
    assert_eq!(
        (caps.permitted, caps.effective),
        (u64::from(seed) << 9, u64::from(seed) << 9)
    );
    assert_eq!((caps.inheritable, caps.bounding), (0, 0x1ff_ffff_ffff));
    assert!(read.no_new_privs);
}

/// A redirect's `Location` header, resolved against an httpGet probe's URL as the prober
/// follows it: any text resolves or errors without a panic, and a resolved URL, printed and
/// resolved again, is itself (the printed form is what the next hop's request uses).
pub fn redirect_location(bytes: &[u8]) {
    let Ok(location) = std::str::from_utf8(bytes) else {
        return;
    };
    let base = ProbeUrl::for_probe("http", "10.0.0.7", 8080, "/healthz/ready?probe=1");
    let Ok((next, _)) = base.resolve(location) else {
        return;
    };
    let printed = next.to_string();
    let (again, absolute) = base
        .resolve(&printed)
        .unwrap_or_else(|e| panic!("{location:?} resolved to {printed:?}, which does not: {e}"));
    assert!(absolute, "{printed:?}");
    assert_eq!(again.to_string(), printed, "{location:?}");
    let _ = next.request_target();
}
