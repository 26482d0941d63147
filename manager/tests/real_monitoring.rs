//! The chart's monitoring kit against what the binaries really expose. The chart is installed
//! with sidecar metrics on (`injection.config.metricsPort`), a pod is injected and probed by the
//! real sidecar, the manager writes its marker; then both `/metrics` are scraped and:
//! - the PrometheusRule (rendered by the real helm) passes `promtool check rules`;
//! - every metric name an alert or a dashboard query uses is one the binaries expose;
//! - `promtool test rules` on the scraped series: no alert fires on the healthy scrape, and
//!   each alert fires, with its labels, when the series it watches moves as in its failure.
//!   The series, names and labels are the scraped ones (a second sidecar's writes are refused
//!   for real, so its 403 series exists); only the driven series' values over time are the
//!   test's, as a failure lasting ten minutes cannot be waited out in a test.

mod cluster;
mod installed;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use podprobe_manager::webhook::Mode;
use serde_json::{Value, json};

use installed::{
    NS, admitted_game_pod, install_and_run_with, listening_target, run_injected_sidecar_with,
    wait_marked,
};

const LIMIT: Duration = Duration::from_secs(60);

/// One scraped sample: metric name, labels in exposition order, value.
#[derive(Clone, Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: String,
}

/// What one binary exposes. (A family without samples is not in the exposition at all, so
/// every series a scenario drives must have been scraped: the binaries start the series alerts
/// watch at 0, and the test causes the rest for real.)
#[derive(Debug)]
struct Exposition {
    samples: Vec<Sample>,
}

fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut rest = text;
    while let Some((name, after)) = rest.split_once("=\"") {
        let end = after.find('"').expect("label value ends");
        labels.push((
            name.trim_start_matches(',').to_owned(),
            after[..end].to_owned(),
        ));
        rest = &after[end + 1..];
    }
    labels
}

fn parse(text: &str) -> Exposition {
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, parse_labels(labels.trim_end_matches('}'))),
            None => (series, Vec::new()),
        };
        samples.push(Sample {
            name: name.to_owned(),
            labels,
            value: value.to_owned(),
        });
    }
    Exposition { samples }
}

impl Exposition {
    /// Every series name a query may use.
    fn names(&self) -> BTreeSet<String> {
        self.samples.iter().map(|s| s.name.clone()).collect()
    }

    /// Adds the labels Prometheus attaches to every series of the scrape target.
    fn with_target(mut self, target: &[(&str, &str)]) -> Self {
        for s in &mut self.samples {
            s.labels
                .extend(target.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        }
        self
    }
}

fn series(name: &str, labels: &[(String, String)]) -> String {
    let inner: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{name}{{{}}}", inner.join(","))
}

/// How a scenario moves one series: the scraped series named `name` whose labels include
/// `matching` gets `values` (promtool's notation).
struct Drive {
    name: &'static str,
    matching: Vec<(String, String)>,
    values: String,
}

struct Scenario {
    alert: &'static str,
    drives: Vec<Drive>,
    expect: Vec<(String, String)>,
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The promtool input: every scraped sample at its scraped value (a counter standing still),
/// with the scenario's driven series moved.
fn input_series(scraped: &[Sample], drives: &[Drive]) -> Vec<Value> {
    let mut driven = vec![false; drives.len()];
    let out = scraped
        .iter()
        .map(|sample| {
            let drive = drives.iter().position(|d| {
                d.name == sample.name && d.matching.iter().all(|m| sample.labels.contains(m))
            });
            let values = match drive {
                Some(i) => {
                    driven[i] = true;
                    drives[i].values.clone()
                }
                None => format!("{}x40", sample.value),
            };
            json!({"series": series(&sample.name, &sample.labels), "values": values})
        })
        .collect();
    for (drive, done) in drives.iter().zip(driven) {
        assert!(
            done,
            "no scraped series {} with {:?}",
            drive.name, drive.matching
        );
    }
    out
}

/// Metric names a PromQL expression uses (podprobe's own and the process metrics).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (i, _) in expr.match_indices(['p']) {
        let word: String = expr[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let boundary = i == 0
            || !expr[..i]
                .chars()
                .last()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if boundary && (word.starts_with("podprobe_") || word.starts_with("process_")) {
            names.insert(word);
        }
    }
    names
}

fn promtool(args: &[&str], dir: &std::path::Path) -> (bool, String) {
    let out = Command::new(testkit::real::tools::tool("promtool").unwrap())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_and_dashboard_fit_the_metrics_the_binaries_expose() {
    let cp = installed::start_control_plane().await;
    check_monitoring(cp, Mode::Standalone).await;
}

/// Companion mode: kruise-manager writes the markers and no replica leads, so the leader
/// alert must have nothing to fire on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_and_dashboard_fit_the_metrics_the_binaries_expose_in_companion_mode() {
    let mut cp = installed::start_control_plane().await;
    cp.start_kruise_manager()
        .await
        .unwrap_or_else(|e| panic!("kruise-manager: {e}"));
    check_monitoring(cp, Mode::Companion).await;
}

/// Metrics the manager does not export in `mode`: the alerts on them cannot fire there, the
/// dashboard's panels on them stay empty.
fn not_exported(mode: Mode) -> BTreeSet<String> {
    match mode {
        Mode::Standalone => BTreeSet::new(),
        // No Lease, no controllers.
        Mode::Companion => BTreeSet::from(["podprobe_manager_leader".to_owned()]),
    }
}

async fn check_monitoring(cp: testkit::real::ControlPlane, mode: Mode) {
    let metrics_port = testkit::port::free_port().unwrap();
    let set = format!("injection.config.metricsPort={metrics_port}");
    let running = install_and_run_with(cp, mode, &["--set", &set]).await;

    // A probe target, a PodProbeMarker, a pod the webhook injects.
    let _target = listening_target(&running).await;
    let pod = admitted_game_pod(&running, "game-0").await;
    let sidecar_container = &pod.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0];
    assert_eq!(
        sidecar_container.ports.as_ref().unwrap()[0].container_port,
        i32::from(metrics_port),
        "the injected sidecar declares its metrics port"
    );
    // Renewing its own token, as the sidecar of a virtual-node pod does: the renewal's series
    // are scraped with the rest.
    let renewal_dir = tempfile::tempdir().unwrap();
    let token = running
        .cp
        .pod_token("podprobe-sidecar", &pod)
        .await
        .unwrap();
    let _sidecar = run_injected_sidecar_with(
        &running,
        &pod,
        &token,
        &[(
            "PODPROBE_RENEW_TOKEN_DIR",
            renewal_dir.path().to_str().unwrap(),
        )],
    );
    wait_marked(&running, "game-0").await;

    // A sidecar whose writes the apiserver refuses, for real: game-1's, run with a token bound
    // to game-0, which the pods/status admission policy turns away (403).
    let refused_pod = admitted_game_pod(&running, "game-1").await;
    let game0_token = running
        .cp
        .pod_token("podprobe-sidecar", &pod)
        .await
        .unwrap();
    let refused_port = testkit::port::free_port().unwrap();
    let refused_addr = format!("127.0.0.1:{refused_port}");
    let _refused = run_injected_sidecar_with(
        &running,
        &refused_pod,
        &game0_token,
        &[("PODPROBE_METRICS_ADDR", refused_addr.as_str())],
    );

    // The three scrapes, once the sidecars have published (or been refused) and the manager leads.
    let sidecar_addr = format!("127.0.0.1:{metrics_port}").parse().unwrap();
    let refused_addr = refused_addr.parse().unwrap();
    let manager_addr = running.manager.metrics_addr.unwrap();
    let get = |addr| async move {
        // The refused sidecar's listener may not be up yet.
        match tokio::net::TcpStream::connect(addr).await {
            Ok(_) => support::http_get(addr, "/metrics").await.1,
            Err(_) => String::new(),
        }
    };
    let scrape = async {
        loop {
            let (sidecar, refused, manager) = (
                get(sidecar_addr).await,
                get(refused_addr).await,
                get(manager_addr).await,
            );
            if sidecar.contains("podprobe_probe_state{")
                && sidecar.contains("podprobe_token_renewal_timestamp_seconds{")
                && refused.contains("podprobe_status_write_errors_total{code=\"403\"}")
                && (mode == Mode::Companion || manager.contains("podprobe_manager_leader 1"))
                && manager.contains("podprobe_manager_build_info")
            {
                return (sidecar, refused, manager);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let scrapes = tokio::time::timeout(LIMIT, scrape).await.expect(
        "the sidecar publishes a probe state, the refused one counts its 403s, the manager leads",
    );
    let sidecar = parse(&scrapes.0).with_target(&[
        ("namespace", NS),
        ("pod", "game-0"),
        ("container", "podprobe"),
    ]);
    let refused = parse(&scrapes.1).with_target(&[
        ("namespace", NS),
        ("pod", "game-1"),
        ("container", "podprobe"),
    ]);
    let manager = parse(&scrapes.2).with_target(&[
        ("namespace", cluster::RELEASE_NS),
        ("pod", "podprobe-manager-0"),
        ("container", "manager"),
    ]);
    for (who, exposition, build_info) in [
        ("sidecar", &sidecar, "podprobe_build_info"),
        ("manager", &manager, "podprobe_manager_build_info"),
    ] {
        for name in [
            build_info,
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
        ] {
            assert!(
                exposition.samples.iter().any(|s| s.name == name),
                "the {who} exposes no {name}"
            );
        }
    }
    let exposed: BTreeSet<String> = [&sidecar, &refused, &manager]
        .iter()
        .flat_map(|e| e.names())
        .collect();
    let scraped: Vec<Sample> = [&sidecar, &refused, &manager]
        .iter()
        .flat_map(|e| e.samples.iter().cloned())
        .collect();

    // The PrometheusRule as the chart renders it.
    let rendered = cluster::render(
        &running.cp,
        &[
            "monitoring.prometheusRule.enabled=true".to_owned(),
            "monitoring.serviceMonitor.enabled=true".to_owned(),
        ],
        &["templates/prometheusrule.yaml"],
    );
    let rule = &cluster::documents(&rendered)[0];
    assert_eq!(rule["kind"], "PrometheusRule");
    let groups = rule["spec"]["groups"].as_array().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rules.json"),
        json!({"groups": groups}).to_string(),
    )
    .unwrap();
    let (ok, out) = promtool(&["check", "rules", "rules.json"], dir.path());
    assert!(ok, "promtool check rules: {out}");

    let alerts: Vec<&Value> = groups
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter(|r| r.get("alert").is_some())
        .collect();
    let not_exported = not_exported(mode);
    assert!(
        exposed.is_disjoint(&not_exported),
        "{mode:?} mode exports {not_exported:?}"
    );
    let mut silent = BTreeSet::new();
    for alert in &alerts {
        let name = alert["alert"].as_str().unwrap();
        let watched = metric_names(alert["expr"].as_str().unwrap());
        let unknown: Vec<&String> = watched
            .iter()
            .filter(|n| !exposed.contains(*n) && !not_exported.contains(*n))
            .collect();
        assert!(unknown.is_empty(), "{name}: not exposed: {unknown:?}");
        if !watched.is_disjoint(&not_exported) {
            silent.insert(name);
        }
    }

    // The dashboard's queries: valid PromQL (as recording rules) on exposed names.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(cluster::chart_dir().join("files/dashboard.json")).unwrap(),
    )
    .unwrap();
    let queries: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            t["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "5m")
                .replace("$namespace", ".*")
        })
        .collect();
    assert!(queries.len() >= 10, "{queries:?}");
    let recording: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, q)| json!({"record": format!("dashboard:query{i}"), "expr": q}))
        .collect();
    std::fs::write(
        dir.path().join("dashboard-rules.json"),
        json!({"groups": [{"name": "dashboard", "rules": recording}]}).to_string(),
    )
    .unwrap();
    let (ok, out) = promtool(&["check", "rules", "dashboard-rules.json"], dir.path());
    assert!(ok, "the dashboard's queries: {out}");
    for q in &queries {
        let unknown: Vec<String> = metric_names(q)
            .into_iter()
            .filter(|n| !exposed.contains(n) && !not_exported.contains(n))
            .collect();
        assert!(
            unknown.is_empty(),
            "dashboard query {q}: not exposed: {unknown:?}"
        );
    }

    // Each alert's failure, on the scraped series. Annotations are left out of the evaluated
    // copy (promtool compares them whole; `check rules` above parsed their templates).
    let probe_labels: Vec<(String, String)> = sidecar
        .samples
        .iter()
        .find(|s| s.name == "podprobe_probe_state")
        .expect("a probe_state sample")
        .labels
        .clone();
    let label_of = |k: &str| {
        probe_labels
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    let sidecar_target = [("namespace", NS), ("pod", "game-0")];
    let manager_target = [
        ("namespace", cluster::RELEASE_NS),
        ("pod", "podprobe-manager-0"),
    ];
    let on = |target: &[(&str, &str)], more: &[(&str, &str)]| {
        let mut labels = owned(target);
        labels.extend(owned(more));
        labels
    };
    let rising = "0+2x40".to_owned();
    // The manager's answers slow to between 0.25 s and 1 s: only the buckets from 1 s up grow.
    let slow_buckets: Vec<Drive> = manager
        .samples
        .iter()
        .filter(|s| s.name == "podprobe_manager_webhook_duration_seconds_bucket")
        .filter(|s| s.labels.contains(&("path".into(), "/mutate-pods".into())))
        .map(|s| {
            let le = &s.labels.iter().find(|(k, _)| k == "le").unwrap().1;
            let grows = le == "+Inf" || le.parse::<f64>().unwrap() >= 1.0;
            Drive {
                name: "podprobe_manager_webhook_duration_seconds_bucket",
                matching: s.labels.clone(),
                values: if grows {
                    format!("{}+10x40", s.value)
                } else {
                    format!("{}x40", s.value)
                },
            }
        })
        .collect();
    assert!(
        !slow_buckets.is_empty(),
        "no /mutate-pods histogram scraped"
    );
    let no_results = on(
        &sidecar_target,
        &[
            ("probe", &label_of("probe")),
            ("condition", &label_of("condition")),
            ("severity", "warning"),
        ],
    );
    let token_drives = |expiry: &str| {
        vec![
            Drive {
                name: "podprobe_token_renewal_timestamp_seconds",
                matching: owned(&sidecar_target),
                values: "0x40".into(),
            },
            Drive {
                name: "podprobe_token_expiry_timestamp_seconds",
                matching: owned(&sidecar_target),
                values: expiry.into(),
            },
        ]
    };
    let mut scenarios = vec![
        Scenario {
            alert: "PodProbeStatusWriteErrors",
            drives: vec![Drive {
                name: "podprobe_status_write_errors_total",
                matching: owned(&[("pod", "game-1"), ("code", "403")]),
                values: rising.clone(),
            }],
            expect: owned(&[
                ("namespace", NS),
                ("pod", "game-1"),
                ("code", "403"),
                ("severity", "warning"),
            ]),
        },
        Scenario {
            alert: "PodProbeConditionsOverwritten",
            drives: vec![Drive {
                // Absent 6 s of every minute: over the alert's 5 %.
                name: "podprobe_condition_absent_seconds_total",
                matching: on(
                    &sidecar_target,
                    &[
                        ("condition", &label_of("condition")),
                        ("container", "podprobe"),
                    ],
                ),
                values: "0+6x40".into(),
            }],
            expect: on(
                &sidecar_target,
                &[
                    ("condition", &label_of("condition")),
                    ("severity", "warning"),
                ],
            ),
        },
        Scenario {
            alert: "PodProbeNoResults",
            drives: vec![Drive {
                name: "podprobe_probe_state",
                matching: probe_labels.clone(),
                values: "-1x40".into(),
            }],
            expect: no_results.clone(),
        },
        // Every attempt errors: the state keeps its last result.
        Scenario {
            alert: "PodProbeNoResults",
            drives: vec![Drive {
                name: "podprobe_probe_erroring",
                matching: probe_labels.clone(),
                values: "1x40".into(),
            }],
            expect: no_results,
        },
        // The renewal came due half an hour ago and the apiserver keeps refusing it; then no
        // token at all (the sidecar shows it as one that expired at the epoch).
        Scenario {
            alert: "PodProbeSidecarTokenFailing",
            drives: token_drives("3600x40"),
            expect: on(&sidecar_target, &[("severity", "warning")]),
        },
        Scenario {
            alert: "PodProbeSidecarTokenFailing",
            drives: token_drives("0x40"),
            expect: on(&sidecar_target, &[("severity", "warning")]),
        },
        Scenario {
            alert: "PodProbeManagerWebhookErrors",
            drives: vec![Drive {
                name: "podprobe_manager_webhook_requests_total",
                matching: on(
                    &manager_target,
                    &[
                        ("path", "/mutate-pods"),
                        ("result", "error"),
                        ("container", "manager"),
                    ],
                ),
                values: rising.clone(),
            }],
            expect: owned(&[
                ("namespace", cluster::RELEASE_NS),
                ("path", "/mutate-pods"),
                ("severity", "warning"),
            ]),
        },
        Scenario {
            alert: "PodProbeManagerWebhookSlow",
            drives: slow_buckets,
            expect: owned(&[
                ("namespace", cluster::RELEASE_NS),
                ("path", "/mutate-pods"),
                ("severity", "warning"),
            ]),
        },
        Scenario {
            alert: "PodProbeManagerNoLeader",
            drives: vec![Drive {
                name: "podprobe_manager_leader",
                matching: owned(&manager_target),
                values: "0x40".into(),
            }],
            expect: owned(&[("namespace", cluster::RELEASE_NS), ("severity", "critical")]),
        },
        Scenario {
            alert: "PodProbeManagerCertReloadFailing",
            drives: vec![Drive {
                name: "podprobe_manager_cert_reload_errors_total",
                matching: owned(&manager_target),
                values: rising.clone(),
            }],
            expect: on(&manager_target, &[("severity", "warning")]),
        },
        Scenario {
            // Every replica gone: its series stop.
            alert: "PodProbeManagerAbsent",
            drives: vec![Drive {
                name: "podprobe_manager_build_info",
                matching: owned(&manager_target),
                values: "_x40".into(),
            }],
            expect: owned(&[("namespace", cluster::RELEASE_NS), ("severity", "critical")]),
        },
        Scenario {
            alert: "PodProbeManagerSidecarTokensPending",
            drives: vec![Drive {
                name: "podprobe_manager_sidecar_tokens_pending",
                matching: owned(&manager_target),
                values: "1x40".into(),
            }],
            expect: owned(&[("namespace", cluster::RELEASE_NS), ("severity", "warning")]),
        },
        Scenario {
            alert: "PodProbeManagerPodsWithoutSidecar",
            drives: vec![Drive {
                name: "podprobe_manager_pods_without_sidecar",
                matching: owned(&manager_target),
                values: "2x40".into(),
            }],
            expect: owned(&[("namespace", cluster::RELEASE_NS), ("severity", "warning")]),
        },
        Scenario {
            alert: "PodProbeManagerPodsWithoutConditions",
            drives: vec![Drive {
                name: "podprobe_manager_pods_without_conditions",
                matching: owned(&manager_target),
                values: "1x40".into(),
            }],
            expect: owned(&[("namespace", cluster::RELEASE_NS), ("severity", "warning")]),
        },
        Scenario {
            alert: "PodProbeManagerPodPatchErrors",
            drives: vec![Drive {
                name: "podprobe_manager_pod_patches_total",
                matching: on(
                    &manager_target,
                    &[("outcome", "error"), ("container", "manager")],
                ),
                values: rising,
            }],
            expect: on(&manager_target, &[("severity", "warning")]),
        },
    ];
    scenarios.retain(|s| !silent.contains(s.alert));
    let names: BTreeSet<&str> = alerts
        .iter()
        .map(|a| a["alert"].as_str().unwrap())
        .collect();
    let covered: BTreeSet<&str> = scenarios.iter().map(|s| s.alert).collect();
    assert_eq!(
        names.difference(&silent).copied().collect::<BTreeSet<_>>(),
        covered,
        "every alert that can fire in {mode:?} mode has its failure scenario here"
    );

    let bare_groups: Vec<Value> = groups
        .iter()
        .map(|g| {
            let mut g = g.clone();
            for r in g["rules"].as_array_mut().unwrap() {
                r.as_object_mut().unwrap().remove("annotations");
            }
            g
        })
        .collect();
    std::fs::write(
        dir.path().join("bare.json"),
        json!({"groups": bare_groups}).to_string(),
    )
    .unwrap();
    let eval = |alert: &str, exp: Vec<Value>| json!({"eval_time": "30m", "alertname": alert, "exp_alerts": exp});
    let mut tests = vec![json!({
        "name": "the healthy scrape fires nothing",
        "interval": "1m",
        "input_series": input_series(&scraped, &[]),
        "alert_rule_test": names.iter().map(|a| eval(a, vec![])).collect::<Vec<_>>(),
    })];
    // One promtool test: `input` fires `alert` alone, with `labels`.
    let firing_alone = |name: &str, input: Vec<Value>, alert: &str, labels: Value| {
        json!({
            "name": name,
            "interval": "1m",
            "input_series": input,
            "alert_rule_test": names.iter().map(|a| {
                eval(a, if *a == alert { vec![json!({"exp_labels": labels})] } else { vec![] })
            }).collect::<Vec<_>>(),
        })
    };
    for s in &scenarios {
        let labels: BTreeMap<String, String> = s.expect.iter().cloned().collect();
        let input = input_series(&scraped, &s.drives);
        tests.push(firing_alone(s.alert, input, s.alert, json!(labels)));
    }
    // This release's managers gone while another release's (another namespace, or another
    // cluster's in the same Prometheus) go on reporting: the alert is this release's.
    if covered.contains("PodProbeManagerAbsent") {
        let gone = Drive {
            name: "podprobe_manager_build_info",
            matching: owned(&manager_target),
            values: "_x40".into(),
        };
        let mut input = input_series(&scraped, &[gone]);
        let other = owned(&[
            ("namespace", "another-release"),
            ("pod", "podprobe-manager-0"),
        ]);
        input.push(
            json!({"series": series("podprobe_manager_build_info", &other), "values": "1x40"}),
        );
        tests.push(firing_alone(
            "PodProbeManagerAbsent beside another release's manager",
            input,
            "PodProbeManagerAbsent",
            json!({"namespace": cluster::RELEASE_NS, "severity": "critical"}),
        ));
    }
    std::fs::write(
        dir.path().join("tests.json"),
        json!({"rule_files": ["bare.json"], "evaluation_interval": "1m", "tests": tests})
            .to_string(),
    )
    .unwrap();
    let (ok, out) = promtool(&["test", "rules", "tests.json"], dir.path());
    assert!(ok, "promtool test rules:\n{out}");
    running.manager.shutdown().await;
}
