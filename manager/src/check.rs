//! `podprobe-manager check-webhooks`: wait until the apiserver reaches this release's
//! webhooks, as the chart's install check (a helm hook Job) runs it.
//!
//! A Deployment is available once its pods are Ready, but the apiserver reaches the webhooks
//! through the Service, which works only once the EndpointSlice controller and the node's
//! service proxy have caught up (seconds later). Until then a PodProbeMarker is refused
//! ("failed calling webhook") and a pod is created without probes or sidecar (the pod webhook
//! fails open). The check asks the apiserver itself with a server-side dry-run create, which
//! goes through the webhooks exactly as a user's would and stores nothing: in standalone mode
//! a PodProbeMarker (the validating webhook); in companion mode, where the pod webhook is the
//! only one, a pod labelled [`CHECK_LABEL`] in the release's namespace, which the chart's
//! `install-check.podprobe.io` entry of the pod webhook (failurePolicy Fail) alone selects.

use std::time::Duration;

use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

use k8s_openapi::api::core::v1::Pod;

use crate::crd::PodProbeMarker;

/// The name of the dry-run PodProbeMarker and pod (never stored).
pub const CHECK_MARKER: &str = "podprobe-install-check";
/// The label of the dry-run pod, which the pod webhook's install-check entry selects.
pub const CHECK_LABEL: &str = "podprobe.io/install-check";

/// Which of the release's webhooks the check goes through: the chart's `mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CheckMode {
    /// A PodProbeMarker, through the validating webhook.
    Standalone,
    /// A pod labelled `podprobe.io/install-check`, through the pod webhook.
    Companion,
}

impl CheckMode {
    fn webhook(self) -> &'static str {
        match self {
            Self::Standalone => "PodProbeMarker",
            Self::Companion => "pod",
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct CheckWebhooksArgs {
    /// Namespace to dry-run the PodProbeMarker in (the release's: the check's Role allows
    /// `create` on podprobemarkers there and nowhere else).
    #[arg(long, env = "POD_NAMESPACE", value_name = "NAMESPACE")]
    pub namespace: String,
    /// The chart's mode, which says which webhook to go through: standalone (a PodProbeMarker;
    /// the check's Role allows `create` on podprobemarkers) or companion (a pod labelled
    /// podprobe.io/install-check; the Role allows `create` on pods).
    #[arg(long, value_enum, default_value = "standalone")]
    pub mode: CheckMode,
    /// The ServiceAccount of the companion-mode check's pod: one that exists in the namespace
    /// (the apiserver refuses a pod naming a missing one before any webhook). The Job passes
    /// its own.
    #[arg(
        long,
        env = "POD_SERVICE_ACCOUNT",
        value_name = "NAME",
        default_value = "default"
    )]
    pub service_account: String,
    /// Give up after this long (e.g. 2m); the exit code is then 1 and the last refusal is
    /// printed.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Time between two attempts (more than 0).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
}

/// A humantime duration above zero: `0s` would ask the apiserver in a tight loop.
fn parse_interval(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err("must be more than 0 (e.g. 1s)".to_owned()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("no Kubernetes client (in-cluster service account or KUBECONFIG): {0}")]
    Client(#[source] kube::Error),
    #[error(
        "the apiserver did not reach the {webhook} webhook within {}; the last answer: {last}. \
         Check that the podprobe-manager pods are Ready, that the Service podprobe-manager has \
         endpoints, and that the control plane can reach pod IPs on the webhook port \
         (docs/troubleshooting.md)",
        humantime::format_duration(*.timeout)
    )]
    TimedOut {
        webhook: &'static str,
        timeout: Duration,
        last: String,
    },
}

/// The PodProbeMarker the check dry-runs: valid, selecting nothing that exists.
pub fn check_marker(namespace: &str) -> PodProbeMarker {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1",
        "kind": "PodProbeMarker",
        "metadata": {"name": CHECK_MARKER, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"podprobe.io/install-check": CHECK_MARKER}},
            "probes": [{
                "name": "check",
                "containerName": "check",
                "podConditionType": "podprobe.io/install-check",
                "probe": {"tcpSocket": {"port": 1}}
            }]
        }
    }))
    .expect("a valid PodProbeMarker literal")
}

/// The pod the companion-mode check dry-runs: labelled for the install-check webhook entry,
/// and within the `restricted` Pod Security Standard, so that a release namespace enforcing
/// it admits it too.
pub fn check_pod(namespace: &str, service_account: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": CHECK_MARKER,
            "namespace": namespace,
            "labels": {CHECK_LABEL: CHECK_MARKER}
        },
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": service_account,
            "automountServiceAccountToken": false,
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"}
            },
            "containers": [{
                "name": "check",
                "image": "podprobe.invalid/install-check",
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}
                }
            }]
        }
    }))
    .expect("a valid pod literal")
}

/// Dry-runs [`check_marker`] (standalone) or [`check_pod`] (companion) every `interval` until
/// the apiserver admits it (the webhook answered) or `timeout` passes. Each new refusal is
/// reported through `progress`. Returns how long it took.
pub async fn wait_for_webhooks(
    client: Client,
    args: &CheckWebhooksArgs,
    mut progress: impl FnMut(&str),
) -> Result<Duration, CheckError> {
    let markers: Api<PodProbeMarker> = Api::namespaced(client.clone(), &args.namespace);
    let pods: Api<Pod> = Api::namespaced(client, &args.namespace);
    let marker = check_marker(&args.namespace);
    let pod = check_pod(&args.namespace, &args.service_account);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let started = tokio::time::Instant::now();
    let mut last = String::new();
    loop {
        let attempt = match args.mode {
            CheckMode::Standalone => markers.create(&dry_run, &marker).await.map(drop),
            CheckMode::Companion => pods.create(&dry_run, &pod).await.map(drop),
        };
        match attempt {
            Ok(()) => return Ok(started.elapsed()),
            Err(e) => {
                let answer = refusal(&e);
                if answer != last {
                    progress(&answer);
                    last = answer;
                }
            }
        }
        if started.elapsed() + args.interval > args.timeout {
            return Err(CheckError::TimedOut {
                webhook: args.mode.webhook(),
                timeout: args.timeout,
                last,
            });
        }
        tokio::time::sleep(args.interval).await;
    }
}

/// The part of a refusal worth printing: the apiserver's message, or the transport error.
fn refusal(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

/// The binary's `check-webhooks`: 0 once the webhook answered, 1 on timeout, 2 without a client.
pub async fn main(args: &CheckWebhooksArgs) -> Result<Duration, CheckError> {
    let client = crate::run::default_client()
        .await
        .map_err(CheckError::Client)?;
    wait_for_webhooks(client, args, |refused| {
        eprintln!("waiting for the webhook: {refused}");
    })
    .await
}
