//! `kubectl-podprobe`, the real binary, against a real kube-apiserver (testkit::real): one pod
//! per broken link of the chain, each explained, and `get` over all of them. The test plays
//! the manager (it writes the annotation as podprobe-manager computes it and the markers), the
//! kubelet (container statuses) and the sidecar (conditions, Events).

use std::process::Command;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use podprobe_model::crd::PodProbeMarker;
use serde_json::{Value, json};
use testkit::real::ControlPlane;

const NS: &str = "games";

struct Cluster {
    cp: ControlPlane,
    markers: Vec<PodProbeMarker>,
    /// 5.5 minutes before the test started: every age prints as `5m`.
    then: String,
}

fn ppm(name: &str, app: &str, probe: Value, policies: Value) -> Value {
    json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
           "metadata": {"name": name, "namespace": NS},
           "spec": {"selector": {"matchLabels": {"app": app}}, "probes": [{
               "name": "idle", "containerName": "main", "podConditionType": format!("game.io/{name}"),
               "probe": probe, "markerPolicy": policies}]}})
}

fn exec() -> Value {
    json!({"exec": {"command": ["cat", "/tmp/idle"]}, "periodSeconds": 1})
}

/// How a pod is set up; every field a way to break one link.
struct Spec<'a> {
    name: &'a str,
    app: &'a str,
    node: &'a str,
    sidecar: bool,
    /// `None`: as the managers compute it; `Some("")`: none; else this value.
    annotation: Option<&'a str>,
    /// (condition type, status, message)
    condition: Option<(&'a str, &'a str, &'a str)>,
    labels: &'a [(&'a str, &'a str)],
    /// The condition was last probed an hour ago (more than twice the 10 min refresh).
    stale: bool,
}

impl Cluster {
    async fn start() -> Cluster {
        let cp = ControlPlane::start()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        cp.create_namespace(NS).await.unwrap();
        let crds = Api::all(cp.client());
        crds.create(&PostParams::default(), &podprobe_model::crd::crd())
            .await
            .unwrap();
        let mut status = Command::new(testkit::real::tools::tool("kubectl").unwrap());
        status.env("KUBECONFIG", cp.admin_kubeconfig()).args([
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
        ]);
        assert!(status.status().unwrap().success());
        for (name, labels) in [
            ("vk-1", json!({"type": "virtual-kubelet"})),
            ("node-1", json!({})),
        ] {
            let node: Node =
                serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                    .unwrap();
            Api::<Node>::all(cp.client())
                .create(&PostParams::default(), &node)
                .await
                .unwrap();
        }
        let both = json!([{"state": "Succeeded", "labels": {"idle": "true"}},
                          {"state": "Failed", "labels": {"idle": "false"}}]);
        let failed_only = json!([{"state": "Failed", "labels": {"half": "down"}}]);
        let risky =
            json!({"httpGet": {"path": "/", "port": 80, "scheme": "HTTP", "host": "10.0.0.1"}});
        let mut markers = Vec::new();
        for v in [
            ppm("game", "game", exec(), both.clone()),
            ppm("half", "half", exec(), failed_only),
            ppm("risky", "risky", risky, both),
        ] {
            let marker: PodProbeMarker = serde_json::from_value(v).unwrap();
            Api::<PodProbeMarker>::namespaced(cp.client(), NS)
                .create(&PostParams::default(), &marker)
                .await
                .unwrap();
            markers.push(marker);
        }
        let then = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(330);
        Cluster {
            cp,
            markers,
            then: then.to_string(),
        }
    }

    async fn pod(&self, spec: Spec<'_>) {
        let mut containers = vec![json!({"name": "main", "image": "game:1"})];
        if spec.sidecar {
            containers.push(json!({"name": "podprobe", "image": "podprobe:dev"}));
        }
        let labels: serde_json::Map<String, Value> = [("app", spec.app)]
            .iter()
            .chain(spec.labels)
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect();
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": spec.name, "namespace": NS, "labels": labels},
            "spec": {"nodeName": spec.node, "containers": containers}
        }))
        .unwrap();
        let computed = podprobe_model::annotate::compute(&pod, &self.markers);
        let annotations = pod.metadata.annotations.get_or_insert_default();
        match (spec.annotation, computed) {
            (Some(""), _) | (None, None) => {}
            (Some(value), _) => {
                annotations.insert("kruise.io/podprobe".into(), value.into());
            }
            (None, Some(c)) => {
                for (k, v) in c.pairs() {
                    annotations.insert(k.into(), v.into());
                }
            }
        }
        let pods: Api<Pod> = Api::namespaced(self.cp.client(), NS);
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let running = |name: &str| {
            json!({"name": name, "ready": true, "restartCount": 0,
            "image": "img", "imageID": "", "started": true,
            "state": {"running": {"startedAt": self.then}}})
        };
        let mut statuses = vec![running("main")];
        if spec.sidecar {
            statuses.push(running("podprobe"));
        }
        let mut conditions = vec![json!({"type": "Initialized", "status": "True"})];
        if let Some((type_, status, message)) = spec.condition {
            let probed = if spec.stale {
                (jiff::Timestamp::now() - jiff::SignedDuration::from_secs(3600)).to_string()
            } else {
                self.then.clone()
            };
            conditions.push(json!({"type": type_, "status": status, "message": message,
                "lastProbeTime": probed, "lastTransitionTime": self.then}));
        }
        let status = json!({"status": {"phase": "Running", "conditions": conditions,
            "containerStatuses": statuses}});
        // As the node agent writes it (a field manager explain names).
        let agent = PatchParams {
            field_manager: Some("virtual-kubelet".into()),
            ..PatchParams::default()
        };
        pods.patch_status(spec.name, &agent, &Patch::Strategic(&status))
            .await
            .unwrap();
    }

    /// An Event as the sidecar emits it when another writer removed its condition.
    async fn overwritten_event(&self, pod: &str, condition: &str) {
        let uid = Api::<Pod>::namespaced(self.cp.client(), NS)
            .get(pod)
            .await
            .unwrap()
            .metadata
            .uid;
        let event: Event = serde_json::from_value(json!({
            "metadata": {"name": format!("{pod}.overwritten"), "namespace": NS},
            "involvedObject": {"kind": "Pod", "namespace": NS, "name": pod, "uid": uid, "apiVersion": "v1"},
            "reason": "PodProbeConditionOverwritten", "type": "Warning",
            "message": format!("condition {condition} was removed; managedFields do not say which writer; written back"),
            "firstTimestamp": self.then, "lastTimestamp": self.then, "count": 1,
            "source": {"component": "podprobe"}
        }))
        .unwrap();
        Api::<Event>::namespaced(self.cp.client(), NS)
            .create(&PostParams::default(), &event)
            .await
            .unwrap();
    }

    /// A kubeconfig whose service account may get and list pods and PodProbeMarkers in the
    /// namespace, and nothing else.
    async fn viewer_kubeconfig(&self) -> tempfile::NamedTempFile {
        use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
        self.cp.create_service_account(NS, "viewer").await.unwrap();
        let role: Role = serde_json::from_value(json!({
            "metadata": {"name": "viewer"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                      {"apiGroups": ["apps.kruise.io"], "resources": ["podprobemarkers"],
                       "verbs": ["get", "list"]}]
        }))
        .unwrap();
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "viewer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "viewer"},
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": NS}]
        }))
        .unwrap();
        let pp = PostParams::default();
        Api::<Role>::namespaced(self.cp.client(), NS)
            .create(&pp, &role)
            .await
            .unwrap();
        Api::<RoleBinding>::namespaced(self.cp.client(), NS)
            .create(&pp, &binding)
            .await
            .unwrap();
        let token = self.viewer_token().await;
        let file = tempfile::NamedTempFile::new().unwrap();
        self.cp
            .write_kubeconfig_for_token(file.path(), &token)
            .unwrap();
        file
    }

    /// A token of the viewer account ([`Cluster::viewer_kubeconfig`] creates it).
    async fn viewer_token(&self) -> String {
        self.cp.service_account_token(NS, "viewer").await.unwrap()
    }

    /// The plugin as the admin; panics unless it exited 0.
    fn plugin(&self, args: &[&str]) -> String {
        let (code, stdout, stderr) = self.plugin_as(&self.cp.admin_kubeconfig(), args);
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
        stdout
    }

    /// The plugin with `kubeconfig`: its exit code, stdout and stderr.
    fn plugin_as(
        &self,
        kubeconfig: &std::path::Path,
        args: &[&str],
    ) -> (Option<i32>, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_kubectl-podprobe"))
            .args(["--kubeconfig", kubeconfig.to_str().unwrap(), "-n", NS])
            .args(args)
            .env_remove("KUBECONFIG")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

const IDLE: &str = "game.io/game";

fn ok(name: &str) -> Spec<'_> {
    Spec {
        name,
        app: "game",
        node: "vk-1",
        sidecar: true,
        annotation: None,
        condition: Some((IDLE, "True", "idle")),
        labels: &[("idle", "true")],
        stale: false,
    }
}

/// The expected `explain` text of a pod whose chain holds up to `broken`, and its exit code:
/// 0 when every link holds, 3 when one is broken.
fn assert_explains(cluster: &Cluster, pod: &str, expected: &str) {
    let admin = cluster.cp.admin_kubeconfig();
    let (code, got, stderr) = cluster.plugin_as(&admin, &["explain", pod]);
    let got = real_write_ages(&got);
    assert_eq!(got, expected, "explain {pod}:\n{got}{stderr}");
    let holds = expected.contains("Every link holds.");
    assert_eq!(
        code,
        Some(if holds { 0 } else { 3 }),
        "explain {pod}: {stderr}"
    );
}

/// The ages of the status writes managedFields list (`(Update, 3s ago)`) as `Ns`: those are
/// real times of this run's writes, not the test's timestamps.
fn real_write_ages(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("(Update, ") {
        let (head, tail) = rest.split_at(at + "(Update, ".len());
        out += head;
        let digits = tail.chars().take_while(char::is_ascii_digit).count();
        if digits > 0 && tail[digits..].starts_with("s ago)") {
            out += "N";
            rest = &tail[digits..];
        } else {
            rest = tail;
        }
    }
    out + rest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_the_first_broken_link_for_each_cause() {
    let cluster = Cluster::start().await;
    let stale = r#"[{"name":"idle","containerName":"main","probe":{"exec":{"command":["cat","/tmp/idle"]},"periodSeconds":5},"podConditionType":"game.io/game"}]"#;
    cluster.pod(ok("gs-ok")).await;
    cluster
        .pod(Spec {
            app: "other",
            annotation: Some(""),
            condition: None,
            labels: &[],
            ..ok("gs-no-marker")
        })
        .await;
    cluster
        .pod(Spec {
            annotation: Some(""),
            condition: None,
            labels: &[],
            ..ok("gs-no-annotation")
        })
        .await;
    cluster
        .pod(Spec {
            annotation: Some(stale),
            ..ok("gs-stale")
        })
        .await;
    cluster
        .pod(Spec {
            app: "risky",
            ..ok("gs-invalid")
        })
        .await;
    cluster
        .pod(Spec {
            sidecar: false,
            condition: None,
            labels: &[],
            ..ok("gs-no-sidecar")
        })
        .await;
    cluster
        .pod(Spec {
            node: "node-1",
            labels: &[],
            ..ok("gs-regular-node")
        })
        .await;
    cluster
        .pod(Spec {
            condition: Some((IDLE, "False", "busy: 3 players")),
            labels: &[("idle", "false")],
            ..ok("gs-false")
        })
        .await;
    cluster
        .pod(Spec {
            app: "half",
            condition: Some(("game.io/half", "True", "idle")),
            labels: &[],
            ..ok("gs-no-policy")
        })
        .await;
    cluster
        .pod(Spec {
            condition: None,
            labels: &[],
            ..ok("gs-wiped")
        })
        .await;
    cluster.overwritten_event("gs-wiped", IDLE).await;
    cluster
        .pod(Spec {
            stale: true,
            ..ok("gs-silent")
        })
        .await;

    for (pod, expected) in expectations() {
        assert_explains(&cluster, pod, expected);
    }

    // A game team's namespace-scoped credentials, which may read pods and PodProbeMarkers but
    // not nodes (cluster-scoped) or events: explain says what it skipped and walks the rest.
    let viewer = cluster.viewer_kubeconfig().await;
    let (code, got, stderr) = cluster.plugin_as(viewer.path(), &["explain", "gs-ok"]);
    assert_eq!(code, Some(0), "{got}{stderr}");
    assert!(
        got.contains("ok   node           node vk-1 not checked: your credentials may not read it"),
        "{got}"
    );
    assert!(
        stderr.contains("warning: cannot read the pod's node, node checks skipped")
            && stderr.contains("warning: cannot read events, none shown"),
        "{stderr}"
    );
    let (code, _, stderr) = cluster.plugin_as(viewer.path(), &["get"]);
    assert_eq!(code, Some(0), "{stderr}");
    // kubectl's connection flags over the admin's kubeconfig: the viewer's token, and the
    // viewer impersonated; both are refused the node as the viewer is.
    let admin = cluster.cp.admin_kubeconfig();
    let token = cluster.viewer_token().await;
    let as_viewer = format!("system:serviceaccount:{NS}:viewer");
    for flags in [["--token", token.as_str()], ["--as", as_viewer.as_str()]] {
        let mut args = flags.to_vec();
        args.extend(["explain", "gs-ok"]);
        let (code, got, stderr) = cluster.plugin_as(&admin, &args);
        assert_eq!(code, Some(0), "{flags:?}: {got}{stderr}");
        assert!(got.contains("node vk-1 not checked"), "{flags:?}: {got}");
    }
    // --server and --request-timeout: a server that accepts connections and never answers is
    // given up on (exit 1) instead of waited for; coreutils' `timeout` (exit 124) bounds the
    // wait, which without the flag would outlast it.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = format!("https://{}", silent.local_addr().unwrap());
    std::thread::spawn(move || {
        let held: Vec<_> = silent.incoming().take(4).collect();
        std::thread::park();
        drop(held);
    });
    let out = Command::new("timeout")
        .arg("20")
        .arg(env!("CARGO_BIN_EXE_kubectl-podprobe"))
        .args(["--kubeconfig", admin.to_str().unwrap(), "-n", NS])
        .args(["--server", &server, "--request-timeout", "2s", "get"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("list pods"), "{stderr}");

    // -o name and --no-headers, for scripts and pipes to kubectl.
    let names = cluster.plugin(&["get", "gs-false", "gs-ok", "-o", "name"]);
    assert_eq!(names, "pod/gs-false\npod/gs-ok\n");
    let bare = cluster.plugin(&["get", "gs-ok", "--no-headers"]);
    assert!(bare.starts_with("gs-ok "), "{bare}");
    assert_eq!(cluster.plugin(&["get"]), GET);

    // -o json: the same rows, in full, for scripts.
    let json: Value =
        serde_json::from_str(&cluster.plugin(&["get", "gs-false", "-o", "json"])).unwrap();
    let row = &json["items"][0];
    assert_eq!(
        json["items"],
        json!([{"namespace": NS, "pod": "gs-false", "probe": "idle", "container": "main",
                "conditionType": IDLE, "status": "False", "message": "busy: 3 players",
                "sinceTransitionSeconds": row["sinceTransitionSeconds"],
                "sinceProbeSeconds": row["sinceProbeSeconds"],
                "markers": ["label idle=false"], "warnings": []}])
    );
    let age = row["sinceProbeSeconds"].as_i64().unwrap();
    assert!((330..400).contains(&age), "{age}");
}

/// What `explain` prints for each pod: every link until the end, the first broken one
/// pointed at, and the sidecar's Events.
fn expectations() -> Vec<(&'static str, &'static str)> {
    vec![
        (
            "gs-ok",
            "Pod games/gs-ok
  ok   PodProbeMarker its kruise.io/podprobemarker-list names PodProbeMarker game
  ok   annotation     kruise.io/podprobe lists idle (game.io/game)
  ok   probes         every probe is valid
  ok   sidecar        container podprobe is ready
  ok   node           node vk-1 is labelled type=virtual-kubelet
  ok   exec           exec probes on container main go through pods/exec, the provider's exec (an apiserver request per attempt; azure-aci's reports no exit status, so they read success whatever the command does): the container gives no command, so injection could not run it under podprobe's exec agent; give it its command (the image's ENTRYPOINT and CMD) and recreate the pod
  ok   condition      condition game.io/game is True (\"idle\"): probe idle succeeds
  ok   markers        the Succeeded policy's markers are on the pod: label idle=true
Every link holds.
Events:
  <none>
",
        ),
        (
            "gs-no-marker",
            "Pod games/gs-no-marker
  FAIL PodProbeMarker no PodProbeMarker in namespace games selects the pod: no selector matches its labels (app=other)   <- first broken link
  FAIL annotation     the pod has no kruise.io/podprobe annotation
  ok   probes         every probe is valid
  ok   sidecar        container podprobe is ready
  ok   node           node vk-1 is labelled type=virtual-kubelet
First broken link: PodProbeMarker: no PodProbeMarker in namespace games selects the pod: no selector matches its labels (app=other)
Events:
  <none>
",
        ),
        (
            "gs-no-annotation",
            "Pod games/gs-no-annotation
  ok   PodProbeMarker selected by PodProbeMarker game
  FAIL annotation     the pod has no kruise.io/podprobe annotation although its PodProbeMarkers give it probes: it was created before them or without the pod webhook (OpenKruise writes the annotation only at creation: recreate the pod; podprobe-manager backfills it)   <- first broken link
  ok   probes         every probe is valid
  ok   sidecar        container podprobe is ready
  ok   node           node vk-1 is labelled type=virtual-kubelet
First broken link: annotation: the pod has no kruise.io/podprobe annotation although its PodProbeMarkers give it probes: it was created before them or without the pod webhook (OpenKruise writes the annotation only at creation: recreate the pod; podprobe-manager backfills it)
Events:
  <none>
",
        ),
        (
            "gs-stale",
            "Pod games/gs-stale
  ok   PodProbeMarker selected by PodProbeMarker game
  FAIL annotation     kruise.io/podprobe is out of date with its PodProbeMarkers (probe idle (game.io/game) changed): OpenKruise never updates it, recreate the pod; podprobe-manager rewrites it   <- first broken link
  ok   probes         every probe is valid
  ok   sidecar        container podprobe is ready
  ok   node           node vk-1 is labelled type=virtual-kubelet
  ok   exec           exec probes on container main go through pods/exec, the provider's exec (an apiserver request per attempt; azure-aci's reports no exit status, so they read success whatever the command does): the container gives no command, so injection could not run it under podprobe's exec agent; give it its command (the image's ENTRYPOINT and CMD) and recreate the pod
  ok   condition      condition game.io/game is True (\"idle\"): probe idle succeeds
  ok   markers        the Succeeded policy's markers are on the pod: label idle=true
First broken link: annotation: kruise.io/podprobe is out of date with its PodProbeMarkers (probe idle (game.io/game) changed): OpenKruise never updates it, recreate the pod; podprobe-manager rewrites it
Events:
  <none>
",
        ),
        (
            "gs-invalid",
            "Pod games/gs-invalid
  ok   PodProbeMarker its kruise.io/podprobemarker-list names PodProbeMarker risky
  ok   annotation     kruise.io/podprobe lists idle (game.io/risky)
  FAIL probes         the sidecar refuses probe #0 \"idle\" (podConditionType \"game.io/risky\"): probe.httpGet.host: Forbidden: probes always target the pod IP; a host would let a probe reach other endpoints (SSRF)   <- first broken link
  ok   sidecar        container podprobe is ready
  ok   node           node vk-1 is labelled type=virtual-kubelet
  FAIL condition      condition game.io/risky is missing: the sidecar has not written it
First broken link: probes: the sidecar refuses probe #0 \"idle\" (podConditionType \"game.io/risky\"): probe.httpGet.host: Forbidden: probes always target the pod IP; a host would let a probe reach other endpoints (SSRF)
Events:
  <none>
",
        ),
        (
            "gs-no-sidecar",
            "Pod games/gs-no-sidecar
  ok   PodProbeMarker its kruise.io/podprobemarker-list names PodProbeMarker game
  ok   annotation     kruise.io/podprobe lists idle (game.io/game)
  ok   probes         every probe is valid
  FAIL sidecar        the pod has no podprobe container: nothing runs its probes (with podprobe-manager, label the namespace podprobe.io/inject=enabled and recreate the pod)   <- first broken link
  ok   node           node vk-1 is labelled type=virtual-kubelet
  FAIL condition      condition game.io/game is missing: the sidecar has not written it
First broken link: sidecar: the pod has no podprobe container: nothing runs its probes (with podprobe-manager, label the namespace podprobe.io/inject=enabled and recreate the pod)
Events:
  <none>
",
        ),
        (
            "gs-regular-node",
            "Pod games/gs-regular-node
  ok   PodProbeMarker its kruise.io/podprobemarker-list names PodProbeMarker game
  ok   annotation     kruise.io/podprobe lists idle (game.io/game)
  ok   probes         every probe is valid
  ok   sidecar        container podprobe is ready
  FAIL node           node node-1 is not labelled type=virtual-kubelet: the managers write markers only for pods of serverless nodes (kruise-daemon probes pods of other nodes)   <- first broken link
  ok   exec           exec probes on container main go through pods/exec (an apiserver request and a kubelet exec per attempt): the pod was not injected with the exec agent (execAgent disabled, or created before podprobe-manager); recreate it to get the agent
  ok   condition      condition game.io/game is True (\"idle\"): probe idle succeeds
  FAIL markers        the Succeeded policy's label idle=true is not on the pod: is the manager (kruise-manager or podprobe-manager) running?
First broken link: node: node node-1 is not labelled type=virtual-kubelet: the managers write markers only for pods of serverless nodes (kruise-daemon probes pods of other nodes)
Events:
  <none>
",
        ),
        (
            "gs-false",
            "Pod games/gs-false
  ok   PodProbeMarker its kruise.io/podprobemarker-list names PodProbeMarker game
  ok   annotation     kruise.io/podprobe lists idle (game.io/game)
  ok   probes         every probe is valid
  ok   sidecar        container podprobe is ready
  ok   node           node vk-1 is labelled type=virtual-kubelet
  ok   exec           exec probes on container main go through pods/exec, the provider's exec (an apiserver request per attempt; azure-aci's reports no exit status, so they read success whatever the command does): the container gives no command, so injection could not run it under podprobe's exec agent; give it its command (the image's ENTRYPOINT and CMD) and recreate the pod
  FAIL condition      condition game.io/game is False (\"busy: 3 players\"): probe idle does not succeed   <- first broken link
  ok   markers        the Failed policy's markers are on the pod: label idle=false
First broken link: condition: condition game.io/game is False (\"busy: 3 players\"): probe idle does not succeed
Events:
  <none>
",
        ),
        (
            "gs-no-policy",
            "Pod games/gs-no-policy
  ok   PodProbeMarker its kruise.io/podprobemarker-list names PodProbeMarker half
  ok   annotation     kruise.io/podprobe lists idle (game.io/half)
  ok   probes         every probe is valid
  ok   sidecar        container podprobe is ready
  ok   node           node vk-1 is labelled type=virtual-kubelet
  ok   exec           exec probes on container main go through pods/exec, the provider's exec (an apiserver request per attempt; azure-aci's reports no exit status, so they read success whatever the command does): the container gives no command, so injection could not run it under podprobe's exec agent; give it its command (the image's ENTRYPOINT and CMD) and recreate the pod
  ok   condition      condition game.io/half is True (\"idle\"): probe idle succeeds
  FAIL policy         PodProbeMarker half has no markerPolicy for state Succeeded of probe idle: nothing is written for it   <- first broken link
First broken link: policy: PodProbeMarker half has no markerPolicy for state Succeeded of probe idle: nothing is written for it
Events:
  <none>
",
        ),
        (
            "gs-wiped",
            "Pod games/gs-wiped
  ok   PodProbeMarker its kruise.io/podprobemarker-list names PodProbeMarker game
  ok   annotation     kruise.io/podprobe lists idle (game.io/game)
  ok   probes         every probe is valid
  ok   sidecar        container podprobe is ready
  ok   node           node vk-1 is labelled type=virtual-kubelet
  ok   exec           exec probes on container main go through pods/exec, the provider's exec (an apiserver request per attempt; azure-aci's reports no exit status, so they read success whatever the command does): the container gives no command, so injection could not run it under podprobe's exec agent; give it its command (the image's ENTRYPOINT and CMD) and recreate the pod
  FAIL condition      condition game.io/game is missing: another writer removed it (Event PodProbeConditionOverwritten: condition game.io/game was removed; managedFields do not say which writer; written back)   <- first broken link
  ok   overwrites     conditions overwritten: 1 PodProbeConditionOverwritten Event(s) in the last 5m (the sidecar publishes at most one per condition per 10m; its metric podprobe_condition_overwrites_total counts each), the last: \"condition game.io/game was removed; managedFields do not say which writer; written back\"; the status is also written by virtual-kubelet (Update, Ns ago). The sidecar writes them back (--overwrite-repair after-change, the default: at once for 30 s after a probe's result changed, so the managers see each change, then 1 s … 1 m apart while overwrites go on); where a provider replaces the whole status every few seconds, --overwrite-repair=immediate keeps them present at one write per overwrite (docs/providers.md)
First broken link: condition: condition game.io/game is missing: another writer removed it (Event PodProbeConditionOverwritten: condition game.io/game was removed; managedFields do not say which writer; written back)
Events:
  5m ago\tWarning\tPodProbeConditionOverwritten\tcondition game.io/game was removed; managedFields do not say which writer; written back
",
        ),
    ]
}

/// `get` over the namespace: pods sorted by name, every age `5m` (the test's timestamps).
const GET: &str = "POD                PROBE   CONDITION       STATUS   MESSAGE           TRANSITION   PROBED   MARKERS            WARNINGS
gs-false           idle    game.io/game    False    busy: 3 players   5m           5m       label idle=false   -
gs-invalid         idle    game.io/risky   <none>                     <none>       <none>   label idle=true    condition-missing,probe-invalid
gs-no-annotation   idle    game.io/game    <none>                     <none>       <none>   -                  condition-missing,annotation-missing,not-in-annotation
gs-no-policy       idle    game.io/half    True     idle              5m           5m       -                  -
gs-no-sidecar      idle    game.io/game    <none>                     <none>       <none>   -                  condition-missing,sidecar-missing
gs-ok              idle    game.io/game    True     idle              5m           5m       label idle=true    -
gs-regular-node    idle    game.io/game    True     idle              5m           5m       -                  node-not-serverless
gs-silent          idle    game.io/game    True     idle              5m           60m      label idle=true    stale
gs-stale           idle    game.io/game    True     idle              5m           5m       label idle=true    annotation-out-of-date
gs-wiped           idle    game.io/game    <none>                     <none>       <none>   -                  condition-missing
";
