//! The test vectors of `shared/specs/kruise-podprobemarker.md`, side by side: the same
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
