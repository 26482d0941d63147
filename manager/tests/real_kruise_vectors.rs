//! The test vectors (docs/kruise-compatibility.md, TV-01…TV-07, 13, 14) side by side: the same
//! PodProbeMarkers and pods given to the real kruise-manager and to podprobe-manager
//! standalone, each on its own real control plane, and their answers compared.
//!
//! Vectors taken from Kruise's unit tests that bypass its validating webhook (TV-01, TV-02:
//! duplicate probe names or condition types in one PodProbeMarker, probes without a handler)
//! are adapted so that the real webhook admits them; what they test is kept.

mod cluster;
mod installed;
mod side_by_side;
mod support;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use side_by_side::{SideBySide, annotation};
use support::{LIST, PODPROBE, TV03_PODPROBE, tv03_ppm};

const EXEC: &str = r#"{"exec":{"command":["/bin/sh","-c","/healthy.sh"]}}"#;

fn exec() -> Value {
    serde_json::from_str(EXEC).unwrap()
}

fn ppm(ns: &str, name: &str, selector: Value, probes: Value) -> Value {
    json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
           "metadata": {"name": name, "namespace": ns},
           "spec": {"selector": {"matchLabels": selector}, "probes": probes}})
}

fn probe(name: &str, container: &str, condition: &str, handler: Value) -> Value {
    json!({"name": name, "containerName": container, "podConditionType": condition,
           "probe": handler})
}

/// One entry of `kruise.io/podprobe` as both should write it, for a probe of [`exec`].
fn entry(name: &str, container: &str, condition: &str) -> String {
    format!(
        r#"{{"name":"{name}","containerName":"{container}","probe":{EXEC},"podConditionType":"{condition}"}}"#
    )
}

/// TV-01's pod: a plain and a native-sidecar init container, two containers.
fn tv01_pod(ns: &str, name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "web"},
                     "annotations": {"version": "test"}},
        "spec": {
            "initContainers": [{"name": "init-1", "image": "i"},
                               {"name": "init-2", "image": "i", "restartPolicy": "Always"}],
            "containers": [{"name": "main", "image": "m"}, {"name": "envoy", "image": "e"}]
        }
    }))
    .unwrap()
}

fn pod(ns: &str, name: &str, labels: Value, annotations: Value, ports: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": labels,
                     "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "m", "ports": ports}]}
    }))
    .unwrap()
}

/// What a vector expects of the admitted pod's `kruise.io/podprobe` and list annotations.
enum Expect {
    /// Both write exactly this (`None`: neither annotation).
    Same(Option<(String, String)>),
    /// Kruise takes the PodProbeMarkers in its informer's map order, so which of these it
    /// writes varies from pod to pod (spec §8 gap 4); podprobe sorts them by name and always
    /// writes the first.
    KruiseEitherPodprobeFirst([(String, String); 2]),
}

struct Vector {
    id: &'static str,
    ppms: Vec<Value>,
    pod: Pod,
    expect: Expect,
}

fn some(probes: &[String], list: &str) -> Option<(String, String)> {
    Some((format!("[{}]", probes.join(",")), list.to_owned()))
}

fn tv01_and_tv02() -> Vec<Vector> {
    let healthy = "game.kruise.io/healthy";
    vec![
        Vector {
            id: "TV-01 no condition type / unknown container",
            ppms: vec![ppm(
                "tv01",
                "healthy",
                json!({"app": "web"}),
                json!([
                    {"name": "healthy", "containerName": "main", "probe": exec(),
                     "markerPolicy": [{"state": "Succeeded", "labels": {"healthy": "true"}}]},
                    probe("healthy-other", "invalid", healthy, exec())
                ]),
            )],
            pod: tv01_pod("tv01", "pod-1"),
            expect: Expect::Same(None),
        },
        Vector {
            id: "TV-02 two PodProbeMarkers, init containers",
            ppms: vec![
                ppm(
                    "tv02",
                    "healthy",
                    json!({"app": "web"}),
                    json!([probe("healthy", "main", healthy, exec())]),
                ),
                ppm(
                    "tv02",
                    "init",
                    json!({"app": "web"}),
                    json!([
                        probe("init", "init-1", "game.kruise.io/init-1", exec()),
                        probe("init-2", "init-2", "game.kruise.io/init", exec())
                    ]),
                ),
            ],
            pod: tv01_pod("tv02", "pod-1"),
            expect: Expect::KruiseEitherPodprobeFirst([
                some(
                    &[
                        entry("healthy", "main", healthy),
                        entry("init-2", "init-2", "game.kruise.io/init"),
                    ],
                    "healthy,init",
                )
                .unwrap(),
                some(
                    &[
                        entry("init-2", "init-2", "game.kruise.io/init"),
                        entry("healthy", "main", healthy),
                    ],
                    "healthy,init",
                )
                .unwrap(),
            ]),
        },
        Vector {
            id: "TV-02 a condition type in two PodProbeMarkers: the first taken wins",
            ppms: vec![
                ppm(
                    "tv02b",
                    "a-main",
                    json!({"app": "web"}),
                    json!([probe("healthy", "main", healthy, exec())]),
                ),
                ppm(
                    "tv02b",
                    "b-envoy",
                    json!({"app": "web"}),
                    json!([probe("healthy", "envoy", healthy, exec())]),
                ),
            ],
            pod: tv01_pod("tv02b", "pod-1"),
            expect: Expect::KruiseEitherPodprobeFirst([
                some(&[entry("healthy", "main", healthy)], "a-main").unwrap(),
                some(&[entry("healthy", "envoy", healthy)], "b-envoy").unwrap(),
            ]),
        },
    ]
}

fn tv03_to_tv07() -> Vec<Vector> {
    let mut tv03 = tv03_ppm();
    tv03["metadata"]["namespace"] = json!("tv03");
    // TV-05's PodProbeMarkers; in `tv05b` all three name their probe `healthy`.
    let v = |ns: &str, n: &str, app: &str| {
        let name = if ns == "tv05" { n } else { "healthy" };
        ppm(
            ns,
            &format!("game-server-probe-{n}"),
            json!({"app": app}),
            json!([probe(name, "main", &format!("game.kruise.io/{n}"), exec())]),
        )
    };
    let tv05 = |ns: &str| {
        vec![
            v(ns, "v1", "test-v1"),
            v(ns, "v2", "test-v2"),
            v(ns, "v3", "test-v2"),
        ]
    };
    let list = |l: &str| json!({"kruise.io/podprobemarker-list": l});
    vec![
        Vector {
            id: "TV-03 full exec probe, markerPolicy stripped, timings kept",
            ppms: vec![tv03],
            pod: pod("tv03", "pod-1", json!({"app": "test"}), json!({}), json!([])),
            expect: Expect::Same(some(&[TV03_PODPROBE[1..TV03_PODPROBE.len() - 1].to_owned()], "ppm-test")),
        },
        Vector {
            id: "TV-04 named ports stay strings",
            ppms: vec![ppm("tv04", "ports", json!({"app": "web"}), json!([
                probe("httpCheckHealthy", "main", "game.kruise.io/healthy",
                      json!({"httpGet": {"path": "/index.html", "port": "main-port", "scheme": "HTTP"}})),
                probe("tcpCheckHealthy", "main", "game.kruise.io/tcp",
                      json!({"tcpSocket": {"port": "main-port"}}))
            ]))],
            pod: pod("tv04", "pod-1", json!({"app": "web"}), json!({}),
                     json!([{"name": "main-port", "containerPort": 80}])),
            expect: Expect::Same(some(&[
                r#"{"name":"httpCheckHealthy","containerName":"main","probe":{"httpGet":{"path":"/index.html","port":"main-port","scheme":"HTTP"}},"podConditionType":"game.kruise.io/healthy"}"#.to_owned(),
                r#"{"name":"tcpCheckHealthy","containerName":"main","probe":{"tcpSocket":{"port":"main-port"}},"podConditionType":"game.kruise.io/tcp"}"#.to_owned(),
            ], "ports")),
        },
        Vector {
            id: "TV-05 the list annotation overrides selectors",
            ppms: tv05("tv05"),
            pod: pod("tv05", "pod-1", json!({"app": "test-v2"}),
                     list("game-server-probe-v1,game-server-probe-v2"), json!([])),
            expect: Expect::Same(some(&[entry("v1", "main", "game.kruise.io/v1"),
                                        entry("v2", "main", "game.kruise.io/v2")],
                                      "game-server-probe-v1,game-server-probe-v2")),
        },
        Vector {
            id: "TV-05 in the list's order: the first of two probes with one container/name wins",
            ppms: tv05("tv05b"),
            pod: pod("tv05b", "pod-1", json!({"app": "test-v2"}),
                     list("game-server-probe-v2,game-server-probe-v1"), json!([])),
            expect: Expect::Same(some(&[entry("healthy", "main", "game.kruise.io/v2")],
                                      "game-server-probe-v2")),
        },
        Vector {
            id: "TV-06 no matching PodProbeMarker",
            ppms: vec![],
            pod: pod("tv05", "pod-2", json!({"app": "test"}), json!({}), json!([])),
            expect: Expect::Same(None),
        },
        Vector {
            id: "TV-07 JSON escaping as Go's encoder does it",
            ppms: vec![ppm("tv07", "escape", json!({"app": "web"}), json!([
                probe("ready", "main", "game.kruise.io/ready",
                      json!({"exec": {"command": ["sh", "-c", "test -f /ready && echo <ok>"]}}))
            ]))],
            pod: pod("tv07", "pod-1", json!({"app": "web"}), json!({}), json!([])),
            expect: Expect::Same(some(&[
                r#"{"name":"ready","containerName":"main","probe":{"exec":{"command":["sh","-c","test -f /ready \u0026\u0026 echo \u003cok\u003e"]}},"podConditionType":"game.kruise.io/ready"}"#.to_owned(),
            ], "escape")),
        },
    ]
}

fn written(pod: &Pod) -> Option<(String, String)> {
    match (annotation(pod, PODPROBE), annotation(pod, LIST)) {
        (None, None) => None,
        (probes, list) => Some((probes.unwrap_or_default(), list.unwrap_or_default())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tv01_to_tv07_annotations_byte_for_byte() {
    let mut both = SideBySide::start().await;
    let vectors: Vec<Vector> = tv01_and_tv02().into_iter().chain(tv03_to_tv07()).collect();
    let mut namespaces: Vec<&str> = vectors
        .iter()
        .map(|v| v.pod.metadata.namespace.as_deref().unwrap())
        .collect();
    namespaces.sort();
    namespaces.dedup();
    for ns in namespaces {
        both.namespace(ns).await;
    }
    for vector in &vectors {
        for ppm in &vector.ppms {
            let created = both.create_ppm(ppm).await;
            assert!(
                created.kruise.is_ok() && created.podprobe.is_ok(),
                "{}: {created:?}",
                vector.id
            );
        }
    }
    both.wait_caches().await;

    let mut kruise_orders = Vec::new();
    for vector in &vectors {
        let admitted = both.create_pod(&vector.pod).await;
        let (kruise, podprobe) = (written(&admitted.kruise), written(&admitted.podprobe));
        match &vector.expect {
            Expect::Same(expected) => {
                assert_eq!(&kruise, expected, "{}: Kruise", vector.id);
                assert_eq!(&podprobe, expected, "{}: podprobe", vector.id);
            }
            Expect::KruiseEitherPodprobeFirst(alternatives) => {
                assert_eq!(
                    podprobe.as_ref(),
                    Some(&alternatives[0]),
                    "{}: podprobe",
                    vector.id
                );
                let at = alternatives.iter().position(|a| Some(a) == kruise.as_ref());
                assert!(at.is_some(), "{}: Kruise wrote {kruise:?}", vector.id);
                kruise_orders.push((vector.id, at.unwrap()));
            }
        }
    }
    println!("Kruise's pick among the order-dependent alternatives: {kruise_orders:?}");
}

/// TV-13 and TV-14: `ppmDemo` (TV-03's PodProbeMarker) and one change each.
fn validation_cases() -> Vec<(&'static str, Value)> {
    let base = |ns: &str| {
        let mut v = tv03_ppm();
        v["metadata"]["namespace"] = json!(ns);
        v
    };
    let with = |name: &str, change: &dyn Fn(&mut Value)| {
        let mut v = base("validation");
        v["metadata"]["name"] = json!(name);
        change(&mut v);
        v
    };
    let handler = |h: Value| move |v: &mut Value| v["spec"]["probes"][0]["probe"] = h.clone();
    let http = |path: &str, port: Value, scheme: &str| json!({"httpGet": {"path": path, "port": port, "scheme": scheme}});
    let extra_probe =
        |p: Value| move |v: &mut Value| v["spec"]["probes"].as_array_mut().unwrap().push(p.clone());
    vec![
        ("tv13-valid", with("tv13-valid", &|_| {})),
        (
            "tv13-test1-no-selector",
            with("t1", &|v| v["spec"]["selector"] = Value::Null),
        ),
        (
            "tv13-test1b-empty-selector",
            with("t1b", &|v| v["spec"]["selector"] = json!({})),
        ),
        (
            "tv13-test2-no-probes",
            with("t2", &|v| v["spec"]["probes"] = json!([])),
        ),
        (
            "tv13-test3-duplicate-name",
            with(
                "t3",
                &extra_probe(probe("healthy", "other", "game.kruise.io/other", exec())),
            ),
        ),
        (
            "tv13-test4-http-probe",
            with(
                "t4",
                &extra_probe(probe(
                    "check",
                    "other",
                    "game.kruise.io/check",
                    http("/index.html", json!(80), "HTTP"),
                )),
            ),
        ),
        (
            "tv13-test5-empty-exec",
            with(
                "t5",
                &extra_probe(probe(
                    "check",
                    "other",
                    "game.kruise.io/check",
                    json!({"exec": {}}),
                )),
            ),
        ),
        (
            "tv13-test6-state-unknown",
            with("t6", &|v| {
                v["spec"]["probes"][0]["markerPolicy"][0]["state"] = json!("Unknown")
            }),
        ),
        (
            "tv13-test7-bad-label-key",
            with("t7", &|v| {
                v["spec"]["probes"][0]["markerPolicy"][0]["labels"] =
                    json!({"server-/$healthy": "true"})
            }),
        ),
        (
            "tv13-test8-reserved-name",
            with("t8", &|v| {
                v["spec"]["probes"][0]["name"] = json!("Initialized")
            }),
        ),
        (
            "tv13-test9-bad-condition",
            with("t9", &|v| {
                v["spec"]["probes"][0]["podConditionType"] = json!("#5invalid")
            }),
        ),
        (
            "tv13-test10-empty-name",
            with("t10", &|v| v["spec"]["probes"][0]["name"] = json!("")),
        ),
        (
            "tv13-test11-empty-container",
            with("t11", &|v| {
                v["spec"]["probes"][0]["containerName"] = json!("")
            }),
        ),
        (
            "tv14-valid",
            with("h0", &handler(http("/healthz", json!(8080), "HTTP"))),
        ),
        (
            "tv14-no-path",
            with("h1", &handler(http("", json!(8080), "HTTP"))),
        ),
        (
            "tv14-port-65536",
            with("h2", &handler(http("/healthz", json!(65536), "HTTP"))),
        ),
        (
            "tv14-bad-port-name",
            with(
                "h3",
                &handler(http("/healthz", json!("invalid-port-name-!@#"), "HTTP")),
            ),
        ),
        (
            "tv14-scheme-ftp",
            with("h4", &handler(http("/healthz", json!(8080), "FTP"))),
        ),
        (
            "tv14-no-scheme",
            with(
                "h4b",
                &handler(json!({"httpGet": {"path": "/healthz", "port": 8080}})),
            ),
        ),
        (
            "tv14-underscore-header",
            with(
                "h5b",
                &handler(
                    json!({"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP",
                    "httpHeaders": [{"name": "X_Custom", "value": "v"}]}}),
                ),
            ),
        ),
        (
            "tv14-bad-header",
            with(
                "h5",
                &handler(
                    json!({"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP",
            "httpHeaders": [{"name": "Invalid Header:Name", "value": "v"}]}}),
                ),
            ),
        ),
        (
            "tv14-four-errors",
            with(
                "h6",
                &handler(
                    json!({"httpGet": {"path": "", "port": 99999, "scheme": "FTP",
            "httpHeaders": [{"name": "Invalid:Header", "value": "v"}]}}),
                ),
            ),
        ),
        (
            "tv14-path-escape",
            with("h7", &handler(http("path%notvalid", json!(8080), "HTTP"))),
        ),
        (
            "tv14-host",
            with(
                "h8",
                &handler(
                    json!({"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP", "host": "127.0.0.1"}}),
                ),
            ),
        ),
        ("tv14-no-handler", with("h9", &handler(json!({})))),
        (
            "tv14-tcp-port-name",
            with(
                "h10",
                &handler(json!({"tcpSocket": {"port": "container-port"}})),
            ),
        ),
        (
            "tv14-tcp-port-name-too-long",
            with(
                "h11",
                &handler(json!({"tcpSocket": {"port": "container-port-v2"}})),
            ),
        ),
        (
            "tv14-two-handlers",
            with(
                "h12",
                &handler(json!({"exec": {"command": ["true"]}, "tcpSocket": {"port": 80}})),
            ),
        ),
        (
            "tv14-grpc-alone",
            with("h13", &handler(json!({"grpc": {"port": 9000}}))),
        ),
        (
            "tv14-grpc-beside-exec",
            with(
                "h14",
                &handler(json!({"exec": {"command": ["true"]}, "grpc": {"port": 9000}})),
            ),
        ),
        (
            "negative-period",
            with("n1", &|v| {
                v["spec"]["probes"][0]["probe"]["periodSeconds"] = json!(-1)
            }),
        ),
        (
            "condition-type-ready",
            with("n2", &|v| {
                v["spec"]["probes"][0]["podConditionType"] = json!("Ready")
            }),
        ),
    ]
}

/// Cases podprobe-manager answers differently on purpose (`docs/kruise-compatibility.md`):
/// (id, Kruise accepts, podprobe accepts).
const DIFFERENT_ON_PURPOSE: [(&str, bool, bool); 3] = [
    // Kruise counts no gRPC handler (its daemon has no gRPC prober); podprobe runs gRPC
    // probes with the kubelet's semantics, so gRPC alone is a handler...
    ("tv14-grpc-alone", false, true),
    // ...and, as the kubelet's validation has it, one too many beside exec.
    ("tv14-grpc-beside-exec", true, false),
    // Kruise checks the reserved names against the probe name only (spec §8 gap 12); a probe
    // writing the kubelet's `Ready` would fight the kubelet.
    ("condition-type-ready", true, false),
];

/// What a side answered: accepted, or the HTTP code and the number of field errors.
fn verdict(result: &Result<(), Box<kube::core::Status>>) -> Option<(u16, usize)> {
    match result {
        Ok(()) => None,
        // apimachinery's ErrorList: "spec...: ..." or "[spec...: ..., spec...: ...]".
        Err(status) => Some((status.code, 1 + status.message.matches(", spec").count())),
    }
}

fn message(result: &Result<(), Box<kube::core::Status>>) -> String {
    match result {
        Ok(()) => "accepted".to_owned(),
        Err(status) => format!("{} {}", status.code, status.message),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tv13_tv14_validation_answers_side_by_side() {
    let both = SideBySide::start().await;
    both.namespace("validation").await;
    let mut differ = Vec::new();
    for (id, ppm) in validation_cases() {
        let answers = both.create_ppm(&ppm).await;
        println!(
            "{id}\n  kruise:   {}\n  podprobe: {}",
            message(&answers.kruise),
            message(&answers.podprobe)
        );
        let (kruise, podprobe) = (verdict(&answers.kruise), verdict(&answers.podprobe));
        match DIFFERENT_ON_PURPOSE.iter().find(|(case, ..)| *case == id) {
            Some(&(_, kruise_accepts, podprobe_accepts)) => {
                assert_eq!(kruise.is_none(), kruise_accepts, "{id}: Kruise");
                assert_eq!(podprobe.is_none(), podprobe_accepts, "{id}: podprobe");
            }
            None if kruise != podprobe => differ.push((id, kruise, podprobe)),
            None => {}
        }
    }
    assert!(
        differ.is_empty(),
        "answers (code, errors) differ: {differ:?}"
    );
}
