//! `podprobe-manager check-webhooks`: wait until the apiserver reaches this release's
//! webhooks, as the chart's install check (a helm hook Job) runs it.
//!
//! A Deployment is available once its pods are Ready, but the apiserver reaches the webhooks
//! through the Service, which works only once the EndpointSlice controller and the node's
//! service proxy have caught up (seconds later). Until then a PodProbeMarker is refused
//! ("failed calling webhook") and a pod is created without probes or sidecar (the pod webhook
//! fails open). The check asks the apiserver itself: a server-side dry-run create of a
//! PodProbeMarker goes through the validating webhook exactly as a user's would, and stores
//! nothing.

use std::time::Duration;

use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

use crate::crd::PodProbeMarker;

/// The name of the dry-run PodProbeMarker (never stored).
pub const CHECK_MARKER: &str = "podprobe-install-check";

#[derive(Debug, clap::Args)]
pub struct CheckWebhooksArgs {
    /// Namespace to dry-run the PodProbeMarker in (the release's: the check's Role allows
    /// `create` on podprobemarkers there and nowhere else).
    #[arg(long, env = "POD_NAMESPACE", value_name = "NAMESPACE")]
    pub namespace: String,
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
        "the apiserver did not reach the PodProbeMarker webhook within {}; the last answer: {last}. \
         Check that the podprobe-manager pods are Ready, that the Service podprobe-manager has \
         endpoints, and that the control plane can reach pod IPs on the webhook port \
         (docs/troubleshooting.md)",
        humantime::format_duration(*.timeout)
    )]
    TimedOut { timeout: Duration, last: String },
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

/// Dry-runs [`check_marker`] every `interval` until the apiserver admits it (its validating
/// webhook answered) or `timeout` passes. Each new refusal is reported through `progress`.
/// Returns how long it took.
pub async fn wait_for_webhooks(
    client: Client,
    args: &CheckWebhooksArgs,
    mut progress: impl FnMut(&str),
) -> Result<Duration, CheckError> {
    let markers: Api<PodProbeMarker> = Api::namespaced(client, &args.namespace);
    let marker = check_marker(&args.namespace);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let started = tokio::time::Instant::now();
    let mut last = String::new();
    loop {
        match markers.create(&dry_run, &marker).await {
            Ok(_) => return Ok(started.elapsed()),
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
    let client = Client::try_default().await.map_err(CheckError::Client)?;
    wait_for_webhooks(client, args, |refused| {
        eprintln!("waiting for the webhook: {refused}");
    })
    .await
}
