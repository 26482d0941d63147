//! The chart with the real helm: lint, template in both modes, and install into a real
//! kube-apiserver in both modes (every object accepted: CRD, RBAC, webhook configurations,
//! the ValidatingAdmissionPolicy, the Deployment, which nothing runs here).

mod cluster;

use cluster::{KUBE_VERSION, RELEASE_NS, documents, helm, kinds_and_names, render, run};
use testkit::real::ControlPlane;

const GAMES: &str = "games";

fn sets(cp: &ControlPlane, mode: &str) -> Vec<String> {
    let mut sets = cluster::cert_values(cp, &["podprobe-manager.podprobe-system.svc"]);
    sets.push(format!("mode={mode}"));
    sets.push(format!("sidecar.namespaces={{{GAMES}}}"));
    sets
}

async fn control_plane() -> ControlPlane {
    let cp = ControlPlane::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    cp.create_namespace(GAMES).await.unwrap();
    cp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lint_and_template_in_both_modes() {
    let cp = control_plane().await;
    let lint = run(
        helm(
            &cp,
            "lint",
            &sets(&cp, "standalone"),
            &["--strict", "--kube-version", KUBE_VERSION],
        ),
        "helm lint",
    );
    assert!(lint.contains("0 chart(s) failed"), "{lint}");

    let standalone = kinds_and_names(&documents(&render(&cp, &sets(&cp, "standalone"), &[])));
    let companion = kinds_and_names(&documents(&render(&cp, &sets(&cp, "companion"), &[])));
    for expected in [
        "ClusterRole/podprobe-manager",
        "ClusterRoleBinding/podprobe-manager",
        "ConfigMap/podprobe-manager",
        "Deployment/podprobe-manager",
        "MutatingWebhookConfiguration/podprobe-manager",
        "Role/podprobe-sidecar",
        "RoleBinding/podprobe-sidecar",
        "Secret/podprobe-manager-tls",
        "Service/podprobe-manager",
        "ServiceAccount/podprobe-manager",
        "ServiceAccount/podprobe-sidecar",
        // The hook that releases pods still waiting for their sidecar's token (before an
        // uninstall, or an upgrade that turns injection off).
        "Job/podprobe-release-gates",
        "ValidatingAdmissionPolicy/podprobe-sidecar-pod-status",
        "ValidatingAdmissionPolicyBinding/podprobe-sidecar-pod-status",
        "ValidatingAdmissionPolicy/podprobe-sidecar-pods-exec",
        "ValidatingAdmissionPolicyBinding/podprobe-sidecar-pods-exec",
        // The sidecars renew their issued tokens, for their own pods only.
        "ValidatingAdmissionPolicy/podprobe-sidecar-token-renewal",
        "ValidatingAdmissionPolicyBinding/podprobe-sidecar-token-renewal",
        "ValidatingAdmissionPolicy/podprobe-manager-tokens",
        // The sidecars' own API Priority and Fairness level.
        "FlowSchema/podprobe-sidecars",
        "PriorityLevelConfiguration/podprobe-sidecars",
        // The install check, in each mode through that mode's webhook.
        "Job/podprobe-install-check",
        "Role/podprobe-install-check",
    ] {
        assert!(
            standalone.iter().any(|k| k == expected),
            "standalone lacks {expected}: {standalone:?}"
        );
        assert!(
            companion.iter().any(|k| k == expected),
            "companion lacks {expected}: {companion:?}"
        );
    }
    // Standalone owns PodProbeMarkers: their validating webhook and the controllers' Lease.
    for standalone_only in [
        "ValidatingWebhookConfiguration/podprobe-manager",
        "Role/podprobe-manager-leader-election",
    ] {
        assert!(
            standalone.iter().any(|k| k == standalone_only),
            "{standalone:?}"
        );
        assert!(
            !companion.iter().any(|k| k == standalone_only),
            "{companion:?}"
        );
    }

    // The standard labels on every object; selectors keep only name and instance, which do
    // not change on upgrade.
    let docs = documents(&render(&cp, &sets(&cp, "standalone"), &[]));
    for doc in &docs {
        let labels = &doc["metadata"]["labels"];
        assert!(
            labels["helm.sh/chart"]
                .as_str()
                .is_some_and(|c| c.starts_with("podprobe-"))
                && labels["app.kubernetes.io/managed-by"] == "Helm"
                && labels["app.kubernetes.io/version"].is_string(),
            "{}/{}: {labels}",
            doc["kind"],
            doc["metadata"]["name"]
        );
    }
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    assert_eq!(
        deployment["spec"]["selector"]["matchLabels"],
        serde_json::json!({"app.kubernetes.io/name": "podprobe-manager",
                           "app.kubernetes.io/instance": "podprobe"})
    );

    // One replica: no PodDisruptionBudget, which would block every drain. No pods/exec for
    // the sidecar when turned off: neither the Role's rule nor its admission policy.
    let mut one = sets(&cp, "standalone");
    one.extend(["replicas=1".to_owned(), "sidecar.podsExec=false".to_owned()]);
    let one = render(&cp, &one, &[]);
    let one_kinds = kinds_and_names(&documents(&one));
    assert!(
        standalone.contains(&"PodDisruptionBudget/podprobe-manager".to_owned())
            && !one_kinds.contains(&"PodDisruptionBudget/podprobe-manager".to_owned()),
        "{one_kinds:?}"
    );
    assert!(
        !one.contains("pods/exec") && !one.contains("pods-exec"),
        "{one}"
    );

    // Without --kube-version, helm template assumes an old Kubernetes and the chart's
    // kubeVersion constraint refuses it (the chart README says so).
    let mut bare = helm(&cp, "template", &sets(&cp, "standalone"), &[]);
    let out = bare.output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("kubeVersion"));
}

/// The chart's `appVersion`: the tag its default images carry, and what a user's own build of
/// the same commit is tagged with (charts/podprobe/README.md, "Install").
fn app_version() -> String {
    let chart = std::fs::read_to_string(cluster::chart_dir().join("Chart.yaml")).unwrap();
    let chart: serde_json::Value = serde_saphyr::from_str(&chart).unwrap();
    chart["appVersion"].as_str().unwrap().to_owned()
}

/// A user's own registry (README "Install"): installed with the manager's image, a pull
/// secret and the sidecar's image from there, the apiserver holds them in the Deployment and
/// the injection config; by default the Deployment names no pull secret. An image tagged with
/// an older version than the chart's is refused at render, with what to do instead; a newer
/// one, a digest or a tag that is no version are the user's choice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_registry_values_reach_the_deployment_and_the_injection() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;

    let cp = control_plane().await;
    let version = app_version();
    let default = render(
        &cp,
        &sets(&cp, "standalone"),
        &["templates/deployment.yaml"],
    );
    assert!(!default.contains("imagePullSecrets"), "{default}");
    assert!(
        default.contains(&format!(
            "image: \"ghcr.io/podprobe/podprobe-manager:{version}\""
        )),
        "{default}"
    );

    let template = |set: &str| {
        let mut with = sets(&cp, "standalone");
        with.push(set.to_owned());
        helm(&cp, "template", &with, &["--kube-version", KUBE_VERSION])
            .output()
            .unwrap()
    };
    for older in [
        "image.tag=0.1.0",
        "injection.config.image=registry.example.com/podprobe/podprobe:0.1.0",
        "injection.config.image=registry.example.com:5000/podprobe/podprobe:v0.0.9",
    ] {
        let out = template(older);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let value = older.split_once('=').unwrap().0;
        assert!(
            !out.status.success()
                && stderr.contains(&format!("{value}: tag "))
                && stderr.contains(&format!("is older than this chart ({version})"))
                && stderr.contains("Build the images from the chart's own commit"),
            "{older}: {stderr}"
        );
    }
    for accepted in [
        "image.tag=99.0.0",
        "image.tag=latest",
        "injection.config.image=registry.example.com/podprobe/podprobe@sha256:0123456789abcdef",
        "injection.config.image=registry.example.com:5000/podprobe/podprobe",
    ] {
        let out = template(accepted);
        assert!(
            out.status.success(),
            "{accepted}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let sidecar = format!("registry.example.com/podprobe/podprobe:{version}");
    let sidecar_set = format!("injection.config.image={sidecar}");
    install(
        &cp,
        "standalone",
        &[
            "--set",
            "image.repository=registry.example.com/podprobe/podprobe-manager",
            "--set",
            "imagePullSecrets[0].name=regcred",
            "--set",
            &sidecar_set,
        ],
    );
    let deployment = Api::<Deployment>::namespaced(cp.client(), RELEASE_NS)
        .get("podprobe-manager")
        .await
        .unwrap();
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod.containers[0].image,
        Some(format!(
            "registry.example.com/podprobe/podprobe-manager:{version}"
        ))
    );
    let secrets: Vec<String> = pod
        .image_pull_secrets
        .into_iter()
        .flatten()
        .map(|s| s.name)
        .collect();
    assert_eq!(secrets, ["regcred"]);
    let config = Api::<ConfigMap>::namespaced(cp.client(), RELEASE_NS)
        .get("podprobe-manager")
        .await
        .unwrap();
    let injection = &config.data.unwrap()["injection.yaml"];
    assert!(
        injection.contains(&format!("image: {sidecar}")),
        "{injection}"
    );
}

/// `helm install` and what the apiserver then holds.
fn install(cp: &ControlPlane, mode: &str, extra: &[&str]) -> String {
    // No node runs the manager here, nor the install check's Job (a hook helm would wait
    // for): `--no-hooks`, as values.yaml tells users who skip it.
    let mut args = vec!["--create-namespace", "--wait=false", "--no-hooks"];
    args.extend(extra);
    let out = run(helm(cp, "install", &sets(cp, mode), &args), "helm install");
    assert!(out.contains("STATUS: deployed"), "{out}");
    // NOTES.txt: what to do next, for the namespaces given.
    assert!(
        out.contains("kubectl label namespace games podprobe.io/inject=enabled"),
        "{out}"
    );
    let objects = run(
        {
            let mut k = cp.kubectl().unwrap();
            k.args([
                "get",
                "customresourcedefinitions,clusterroles,clusterrolebindings,\
                 mutatingwebhookconfigurations,validatingwebhookconfigurations,\
                 validatingadmissionpolicies,validatingadmissionpolicybindings",
                "-o",
                "name",
            ]);
            k
        },
        "kubectl get",
    );
    let namespaced = run(
        {
            let mut k = cp.kubectl().unwrap();
            k.args([
                "get",
                "serviceaccounts,roles,rolebindings,deployments,services,secrets,configmaps",
                "-A",
                "-o",
                "name",
            ]);
            k
        },
        "kubectl get -A",
    );
    format!("{objects}{namespaced}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installs_into_a_real_apiserver_standalone() {
    let cp = control_plane().await;
    let objects = install(&cp, "standalone", &[]);
    for expected in [
        "customresourcedefinition.apiextensions.k8s.io/podprobemarkers.apps.kruise.io",
        "clusterrole.rbac.authorization.k8s.io/podprobe-manager",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/podprobe-manager",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/podprobe-manager",
        "validatingadmissionpolicy.admissionregistration.k8s.io/podprobe-sidecar-pod-status",
        "deployment.apps/podprobe-manager",
        "role.rbac.authorization.k8s.io/podprobe-sidecar",
        "role.rbac.authorization.k8s.io/podprobe-manager-leader-election",
    ] {
        assert!(
            objects.lines().any(|l| l == expected),
            "{expected} not in:\n{objects}"
        );
    }
    let status = run(
        {
            let mut h = cp.helm().unwrap();
            h.args(["status", "podprobe", "-n", RELEASE_NS]);
            h
        },
        "helm status",
    );
    assert!(status.contains("STATUS: deployed"), "{status}");

    // The install check as its Job runs it, here with no manager behind the Service: it
    // keeps asking, then fails saying what the apiserver answered.
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_podprobe-manager"))
        .args(["check-webhooks", "--namespace", RELEASE_NS])
        .args(["--timeout", "3s", "--interval", "500ms"])
        .env("KUBECONFIG", cp.admin_kubeconfig())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("failed calling webhook \"podprobemarkers.podprobe.io\"")
            && stderr.contains("did not reach the PodProbeMarker webhook within 3s"),
        "{stderr}"
    );
}

/// The FlowSchema and priority level `podprobe-sidecars` of the chart's defaults, as the real
/// apiserver classifies requests (its `X-Kubernetes-PF-*` answer headers): the sidecar's
/// account in a namespace of sidecar.namespaces lands there; podprobe-manager's account, and
/// an account of the same name in a namespace the chart was not given, stay in the built-in
/// `service-accounts` schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecars_requests_have_a_priority_level_of_their_own() {
    use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
    use kube::{Api, Resource};

    let cp = control_plane().await;
    install(&cp, "standalone", &[]);
    let uid = |meta: &kube::api::ObjectMeta| meta.uid.clone().expect("a uid");
    let schemas = Api::<FlowSchema>::all(cp.client());
    let ours_uid = uid(schemas.get("podprobe-sidecars").await.unwrap().meta());
    let built_in_uid = uid(schemas.get("service-accounts").await.unwrap().meta());
    let level_uid = uid(Api::<PriorityLevelConfiguration>::all(cp.client())
        .get("podprobe-sidecars")
        .await
        .unwrap()
        .meta());

    cp.create_namespace("arena").await.unwrap();
    cp.create_service_account("arena", "podprobe-sidecar")
        .await
        .unwrap();
    for (namespace, account, expected) in [
        (GAMES, "podprobe-sidecar", &ours_uid),
        (RELEASE_NS, "podprobe-manager", &built_in_uid),
        ("arena", "podprobe-sidecar", &built_in_uid),
    ] {
        let token = cp.service_account_token(namespace, account).await.unwrap();
        let request = http::Request::get("/version")
            .body(kube::client::Body::empty())
            .unwrap();
        let answer = cp.client_for_token(&token).send(request).await.unwrap();
        let header = |name: &str| {
            answer
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let schema = header("X-Kubernetes-PF-FlowSchema-UID");
        assert_eq!(
            schema.as_ref(),
            Some(expected),
            "{namespace}/{account}: flow schema (ours {ours_uid}, service-accounts {built_in_uid})"
        );
        let in_ours = header("X-Kubernetes-PF-PriorityLevel-UID").as_ref() == Some(&level_uid);
        assert_eq!(in_ours, expected == &ours_uid, "{namespace}/{account}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installs_into_a_real_apiserver_as_companion_with_skip_crds() {
    let cp = control_plane().await;
    // Companion mode: OpenKruise's CRD is already there (schema-identical to the chart's).
    let crd =
        std::fs::read_to_string(cluster::chart_dir().join("crds/podprobemarkers.yaml")).unwrap();
    cluster::kubectl_apply(&cp, &crd);
    let objects = install(&cp, "companion", &["--skip-crds"]);
    assert!(
        objects
            .lines()
            .any(|l| l
                == "mutatingwebhookconfiguration.admissionregistration.k8s.io/podprobe-manager"),
        "{objects}"
    );
    assert!(
        !objects.contains("validatingwebhookconfiguration"),
        "{objects}"
    );
    assert!(
        !objects.contains("podprobe-manager-leader-election"),
        "{objects}"
    );

    // The install check in companion mode goes through the pod webhook's install-check entry
    // (failurePolicy Fail, so no manager behind the Service is a refusal, where the injection
    // entry would admit the pod without a sidecar); it keeps asking, then fails saying so.
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_podprobe-manager"))
        .args([
            "check-webhooks",
            "--mode",
            "companion",
            "--namespace",
            RELEASE_NS,
        ])
        .args(["--service-account", "podprobe-manager"])
        .args(["--timeout", "3s", "--interval", "500ms"])
        .env("KUBECONFIG", cp.admin_kubeconfig())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("failed calling webhook \"install-check.podprobe.io\"")
            && stderr.contains("did not reach the pod webhook within 3s"),
        "{stderr}"
    );
}

/// With no certificate value (the README's install), helm generates the webhooks' certificate:
/// the Secret holds it with its CA, both webhook configurations trust that CA, and an upgrade
/// keeps all three (a new one on every upgrade would break the running manager's webhooks
/// until it re-read its files, and GitOps diffs would never settle).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generates_the_webhook_certificate_once_and_keeps_it_on_upgrade() {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    use k8s_openapi::api::core::v1::Secret;
    use kube::Api;

    let cp = control_plane().await;
    let sets = [format!("sidecar.namespaces={{{GAMES}}}")];
    let read = || async {
        let secret = Api::<Secret>::namespaced(cp.client(), RELEASE_NS)
            .get("podprobe-manager-tls")
            .await
            .unwrap();
        let data = secret.data.unwrap();
        let pem = |key: &str| String::from_utf8(data[key].0.clone()).unwrap();
        let mutating = Api::<MutatingWebhookConfiguration>::all(cp.client())
            .get("podprobe-manager")
            .await
            .unwrap();
        let validating = Api::<ValidatingWebhookConfiguration>::all(cp.client())
            .get("podprobe-manager")
            .await
            .unwrap();
        let bundles: Vec<String> = mutating
            .webhooks
            .into_iter()
            .flatten()
            .map(|w| w.client_config.ca_bundle)
            .chain(
                validating
                    .webhooks
                    .into_iter()
                    .flatten()
                    .map(|w| w.client_config.ca_bundle),
            )
            .map(|b| String::from_utf8(b.unwrap().0).unwrap())
            .collect();
        (pem("tls.crt"), pem("tls.key"), pem("ca.crt"), bundles)
    };

    run(
        helm(
            &cp,
            "install",
            &sets,
            &["--create-namespace", "--wait=false", "--no-hooks"],
        ),
        "helm install",
    );
    let (crt, key, ca, bundles) = read().await;
    assert!(crt.starts_with("-----BEGIN CERTIFICATE-----"), "{crt}");
    assert!(key.contains("PRIVATE KEY-----"), "a PEM key");
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
    assert_ne!(crt, ca, "a serving certificate apart from its CA");
    assert_eq!(
        bundles,
        [ca.clone(), ca.clone()],
        "both webhooks trust the CA"
    );

    run(
        helm(
            &cp,
            "upgrade",
            &sets,
            &["--reuse-values", "--wait=false", "--no-hooks"],
        ),
        "helm upgrade",
    );
    assert_eq!(read().await, (crt, key, ca.clone(), vec![ca.clone(), ca]));
}

/// The values platform teams set on every chart reach the manager's pod as set, and the
/// schema refuses a misspelt or out-of-range value instead of ignoring it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conventional_values_reach_the_manager_and_the_schema_refuses_typos() {
    let cp = control_plane().await;
    let mut values = sets(&cp, "standalone");
    values.extend(
        [
            "nodeSelector.type=virtual-kubelet",
            "tolerations[0].key=virtual-kubelet.io/provider",
            "tolerations[0].operator=Exists",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=zone",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
            "topologySpreadConstraints[0].maxSkew=1",
            "topologySpreadConstraints[0].topologyKey=zone",
            "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
            "priorityClassName=system-cluster-critical",
            "hostNetwork=true",
            "podAnnotations.team=games",
            "podLabels.tier=control",
            "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/r",
            "extraArgs={--tls-reload-interval=30s}",
            "extraEnv[0].name=TZ",
            "extraEnv[0].value=UTC",
            "webhook.objectSelector.matchLabels.game=arena",
            "logFormat=json",
        ]
        .map(str::to_owned),
    );
    let docs = documents(&render(&cp, &values, &[]));
    let find = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
    };
    let deployment = find("Deployment");
    let template = &deployment["spec"]["template"];
    let pod = &template["spec"];
    assert_eq!(pod["nodeSelector"]["type"], "virtual-kubelet");
    assert_eq!(pod["tolerations"][0]["key"], "virtual-kubelet.io/provider");
    assert!(pod["affinity"]["podAntiAffinity"].is_null(), "{pod}");
    assert_eq!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["key"],
        "zone"
    );
    assert_eq!(pod["topologySpreadConstraints"][0]["topologyKey"], "zone");
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(template["metadata"]["annotations"]["team"], "games");
    assert_eq!(template["metadata"]["labels"]["tier"], "control");
    assert_eq!(
        template["metadata"]["labels"]["app.kubernetes.io/name"], "podprobe-manager",
        "the selector's labels stay"
    );
    // The install check's Job runs where the manager can: same node selection, no
    // anti-affinity and no host network (it only talks to the apiserver).
    let check = &find("Job")["spec"]["template"]["spec"];
    assert_eq!(check["nodeSelector"]["type"], "virtual-kubelet");
    assert_eq!(
        check["tolerations"][0]["key"],
        "virtual-kubelet.io/provider"
    );
    assert_eq!(check["priorityClassName"], "system-cluster-critical");
    assert!(check["hostNetwork"].is_null(), "{check}");
    assert_eq!(check["containers"][0]["args"][0], "check-webhooks");
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--tls-reload-interval=30s"), "{args:?}");
    assert!(args.contains(&"--log-format=json"), "{args:?}");
    assert!(
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "TZ" && e["value"] == "UTC"),
        "{container}"
    );
    let account = docs
        .iter()
        .find(|d| d["kind"] == "ServiceAccount" && d["metadata"]["name"] == "podprobe-manager")
        .unwrap();
    assert_eq!(
        account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"],
        "arn:aws:iam::1:role/r"
    );
    assert_eq!(
        find("MutatingWebhookConfiguration")["webhooks"][0]["objectSelector"]["matchLabels"]["game"],
        "arena"
    );
    // The defaults: the chart's anti-affinity, no host network.
    let default = documents(&render(&cp, &sets(&cp, "standalone"), &[]));
    let pod =
        &default.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"];
    assert!(!pod["affinity"]["podAntiAffinity"].is_null(), "{pod}");
    assert!(pod["hostNetwork"].is_null(), "{pod}");

    for (typo, refusal) in [
        ("replcias=3", "additional properties 'replcias' not allowed"),
        ("logFormat=xml", "value must be one of"),
        (
            "webhook.namespaceSelecter.x=y",
            "additional properties 'namespaceSelecter' not allowed",
        ),
    ] {
        let mut with_typo = sets(&cp, "standalone");
        with_typo.push(typo.to_owned());
        let out = helm(
            &cp,
            "template",
            &with_typo,
            &["--kube-version", KUBE_VERSION],
        )
        .output()
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(refusal),
            "{typo}: {stderr}"
        );
    }
}

/// The monitoring kit: nothing by default; each object when asked, with the labels a
/// Prometheus selects by; the PodMonitor refused without sidecar metrics to scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitoring_kit_is_off_by_default_and_rendered_when_asked() {
    let cp = control_plane().await;
    let kinds = |docs: &[serde_json::Value]| kinds_and_names(docs);
    let default = kinds(&documents(&render(&cp, &sets(&cp, "standalone"), &[])));
    for absent in [
        "ServiceMonitor/",
        "PodMonitor/",
        "PrometheusRule/",
        "ConfigMap/podprobe-dashboard",
    ] {
        assert!(
            !default.iter().any(|k| k.starts_with(absent)),
            "{absent} by default: {default:?}"
        );
    }

    let mut values = sets(&cp, "standalone");
    values.extend(
        [
            "injection.config.metricsPort=9102",
            "monitoring.serviceMonitor.enabled=true",
            "monitoring.serviceMonitor.labels.release=prom",
            "monitoring.podMonitor.enabled=true",
            "monitoring.podMonitor.labels.release=prom",
            "monitoring.prometheusRule.enabled=true",
            "monitoring.prometheusRule.labels.release=prom",
            "monitoring.dashboard.enabled=true",
        ]
        .map(str::to_owned),
    );
    let docs = documents(&render(&cp, &values, &[]));
    let find = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
    };
    let service_monitor = find("ServiceMonitor");
    assert_eq!(service_monitor["metadata"]["labels"]["release"], "prom");
    assert_eq!(service_monitor["spec"]["endpoints"][0]["port"], "metrics");
    let service = find("Service");
    assert!(
        service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "metrics"),
        "the ServiceMonitor's port is the Service's: {service}"
    );
    for (k, v) in service_monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &service["metadata"]["labels"][k], v,
            "the ServiceMonitor selects the Service"
        );
    }
    let pod_monitor = find("PodMonitor");
    assert_eq!(pod_monitor["metadata"]["labels"]["release"], "prom");
    assert_eq!(
        pod_monitor["spec"]["podMetricsEndpoints"][0]["port"],
        podprobe_manager::inject::SIDECAR_METRICS_PORT_NAME
    );
    assert_eq!(
        pod_monitor["spec"]["namespaceSelector"]["matchNames"][0],
        GAMES
    );
    let injection = find("ConfigMap")["data"]["injection.yaml"]
        .as_str()
        .unwrap();
    assert!(injection.contains("metricsPort: 9102"), "{injection}");
    let rule = find("PrometheusRule");
    assert_eq!(rule["metadata"]["labels"]["release"], "prom");
    assert!(
        rule["spec"]["groups"].as_array().unwrap().len() >= 2,
        "{rule}"
    );
    let dashboard = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "podprobe-dashboard")
        .expect("the dashboard ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: serde_json::Value =
        serde_json::from_str(dashboard["data"]["podprobe.json"].as_str().unwrap())
            .expect("the dashboard is JSON");
    assert_eq!(json["uid"], "podprobe");

    let mut without_port = sets(&cp, "standalone");
    without_port.push("monitoring.podMonitor.enabled=true".to_owned());
    let out = helm(
        &cp,
        "template",
        &without_port,
        &["--kube-version", KUBE_VERSION],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("needs injection.config.metricsPort"),
        "{stderr}"
    );

    // Rules whose PodProbeManagerAbsent nothing would ever satisfy: no scrape of the manager.
    let render_rules = |extra: &[&str]| {
        let mut values = sets(&cp, "standalone");
        values.push("monitoring.prometheusRule.enabled=true".to_owned());
        values.extend(extra.iter().map(|s| s.to_string()));
        helm(&cp, "template", &values, &["--kube-version", KUBE_VERSION])
            .output()
            .unwrap()
    };
    let out = render_rules(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("needs the manager scraped"),
        "{stderr}"
    );
    let out = render_rules(&["monitoring.prometheusRule.managerScrapedElsewhere=true"]);
    assert!(
        out.status.success(),
        "a scrape of the user's own: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The absent-manager alert is this release's: its namespace, and the clusters' selector.
    let out = render_rules(&[
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.prometheusRule.managerSelector=cluster=\"eu\"",
    ]);
    let rendered = String::from_utf8_lossy(&out.stdout);
    let absent =
        format!("absent(podprobe_manager_build_info{{namespace=\"{RELEASE_NS}\",cluster=\"eu\"}})");
    assert!(
        out.status.success() && rendered.contains(&absent),
        "{absent} in:\n{rendered}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Not label matchers (the value unquoted): refused by the chart's schema, not left for
    // Prometheus to reject the whole rule group.
    let out = render_rules(&[
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.prometheusRule.managerSelector=cluster=eu",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("managerSelector"),
        "{stderr}"
    );
}

/// The sidecar's exec grant is rendered only with an enforcing admission policy: without one
/// it would reach every pod of the namespace. So is the manager's Secret grant for
/// virtual-node sidecars' tokens: without one the manager could create any Secret there. The
/// status grant without one renders (the observe-first mode) with a warning in the notes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_grant_needs_an_enforcing_admission_policy() {
    let cp = control_plane().await;
    let template = |extra: &[&str]| {
        let mut with = sets(&cp, "standalone");
        with.extend(extra.iter().map(|s| s.to_string()));
        helm(&cp, "template", &with, &["--kube-version", KUBE_VERSION])
            .output()
            .unwrap()
    };
    // Whether a rendered Role grants `resource`.
    let grants = |out: &std::process::Output, resource: &str| {
        let docs = documents(&String::from_utf8_lossy(&out.stdout));
        docs.iter().any(|d| {
            d["kind"] == "Role"
                && d["rules"].as_array().unwrap().iter().any(|r| {
                    r["resources"]
                        .as_array()
                        .unwrap()
                        .contains(&resource.into())
                })
        })
    };
    let grants_exec = |out: &std::process::Output| grants(out, "pods/exec");
    let grants_secrets = |out: &std::process::Output| grants(out, "secrets");
    // The manager's, and the sidecar's own (renewing its issued token).
    let grants_tokens = |out: &std::process::Output| grants(out, "serviceaccounts/token");
    let defaults = template(&[]);
    assert!(
        defaults.status.success()
            && grants_exec(&defaults)
            && grants_secrets(&defaults)
            && grants_tokens(&defaults)
    );

    for unenforced in [
        &["admissionPolicy.enabled=false"][..],
        &["admissionPolicy.validationActions={Warn,Audit}"],
    ] {
        let refused = template(unenforced);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success()
                && stderr.contains("sidecar.podsExec=true grants pods/exec")
                && stderr.contains("it is not enforced"),
            "{unenforced:?}: {stderr}"
        );
        let mut without_exec = unenforced.to_vec();
        without_exec.push("sidecar.podsExec=false");
        let refused = template(&without_exec);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success()
                && stderr.contains("`create secrets`")
                && stderr.contains("`create serviceaccounts/token`")
                && stderr.contains("they are not enforced"),
            "{without_exec:?}: {stderr}"
        );
        let mut kubelet_pods_only = without_exec.clone();
        kubelet_pods_only.push("injection.config.podShape=kubelet");
        let rendered = template(&kubelet_pods_only);
        assert!(
            rendered.status.success()
                && !grants_exec(&rendered)
                && !grants_secrets(&rendered)
                && !grants_tokens(&rendered),
            "{kubelet_pods_only:?}: {}",
            String::from_utf8_lossy(&rendered.stderr)
        );
    }

    // What `helm install` prints: a warning while the status grant is not confined.
    let notes = |extra: &[&str]| {
        let mut with = sets(&cp, "standalone");
        with.extend(extra.iter().map(|s| s.to_string()));
        let out = helm(&cp, "install", &with, &["--dry-run=server"]);
        run(out, "helm install --dry-run")
    };
    let warning = "the sidecar's admission policy is not enforced";
    assert!(!notes(&[]).contains(warning));
    let observing = notes(&[
        "admissionPolicy.validationActions={Warn,Audit}",
        "sidecar.podsExec=false",
        "injection.config.podShape=kubelet",
    ]);
    assert!(observing.contains(warning), "{observing}");
}
