//! Two real control planes given the same inputs: one with OpenKruise's kruise-manager
//! (`EnablePodProbeMarkerOnServerless`), one with podprobe-manager standalone (the chart and
//! the manager as `installed` sets them up). Both have node `vk-1` (a virtual-kubelet node);
//! namespaces are made in both, labelled for podprobe's webhook.
#![allow(dead_code)] // each test binary uses a part of it

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use podprobe_manager::webhook::Mode;
use serde_json::{Value, json};
use testkit::real::{ControlPlane, KruiseAddrs};

use super::installed::{Running, install_and_run, start_control_plane};
pub use super::support::annotation;
use super::support::vk_node;

/// Where the "everything before this is cached" marker lives.
const SENTINEL_NS: &str = "sentinel";
const LIMIT: Duration = Duration::from_secs(60);

pub struct SideBySide {
    pub kruise: ControlPlane,
    pub kruise_addrs: KruiseAddrs,
    pub podprobe: Running,
    sentinels: u32,
}

/// One side's answer to the same request.
#[derive(Debug)]
pub struct Both<T> {
    pub kruise: T,
    pub podprobe: T,
}

/// OpenKruise's PodProbeMarker (the same GVK on both sides).
pub fn ppm_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "apps.kruise.io",
        "v1alpha1",
        "PodProbeMarker",
    ))
}

impl SideBySide {
    /// Both control planes, started together.
    pub async fn start() -> SideBySide {
        let kruise = async {
            let mut cp = start_control_plane().await;
            let addrs = cp
                .start_kruise_manager()
                .await
                .unwrap_or_else(|e| panic!("kruise-manager: {e}"));
            Api::<Node>::all(cp.client())
                .create(&PostParams::default(), &vk_node("vk-1"))
                .await
                .unwrap();
            (cp, addrs)
        };
        let podprobe =
            async { install_and_run(start_control_plane().await, Mode::Standalone).await };
        let ((kruise, kruise_addrs), podprobe) = tokio::join!(kruise, podprobe);
        let both = SideBySide {
            kruise,
            kruise_addrs,
            podprobe,
            sentinels: 0,
        };
        both.namespace(SENTINEL_NS).await;
        both
    }

    pub fn clients(&self) -> Both<Client> {
        Both {
            kruise: self.kruise.client(),
            podprobe: self.podprobe.cp.client(),
        }
    }

    /// Namespace `name` (opted in to podprobe's webhook) with its default ServiceAccount.
    pub async fn namespace(&self, name: &str) {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name,
            "labels": {"podprobe.io/inject": "enabled"}}}))
        .unwrap();
        for cp in [&self.kruise, &self.podprobe.cp] {
            Api::<Namespace>::all(cp.client())
                .create(&PostParams::default(), &ns)
                .await
                .unwrap_or_else(|e| panic!("namespace {name}: {e}"));
            cp.create_service_account(name, "default").await.unwrap();
        }
    }

    /// Creates the PodProbeMarker on both sides; each side's webhook may refuse it.
    pub async fn create_ppm(&self, ppm: &Value) -> Both<Result<(), Box<kube::core::Status>>> {
        let ns = ppm["metadata"]["namespace"].as_str().expect("a namespace");
        let object: DynamicObject = serde_json::from_value(ppm.clone()).unwrap();
        let clients = self.clients();
        let create = |client: Client| {
            let object = object.clone();
            async move {
                let api: Api<DynamicObject> = Api::namespaced_with(client, ns, &ppm_resource());
                match api.create(&PostParams::default(), &object).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) => Err(e),
                    Err(e) => panic!("create PodProbeMarker: {e}"),
                }
            }
        };
        let (kruise, podprobe) = tokio::join!(create(clients.kruise), create(clients.podprobe));
        Both { kruise, podprobe }
    }

    /// Creates the pod on both sides through the admission chain; the objects as admitted.
    pub async fn create_pod(&self, pod: &Pod) -> Both<Pod> {
        let ns = pod.metadata.namespace.as_deref().expect("a namespace");
        let clients = self.clients();
        let create = |client: Client| async move {
            Api::<Pod>::namespaced(client, ns)
                .create(&PostParams::default(), pod)
                .await
        };
        let (kruise, podprobe) = tokio::join!(create(clients.kruise), create(clients.podprobe));
        // kruise-manager serves its webhooks from the process: when they fail, its log says why.
        let kruise = kruise.unwrap_or_else(|e| {
            panic!(
                "create pod (Kruise side): {e}\nkruise-manager's log ends:\n{}",
                self.kruise.kruise_log_tail(40)
            )
        });
        let podprobe = podprobe.unwrap_or_else(|e| panic!("create pod (podprobe side): {e}"));
        Both { kruise, podprobe }
    }

    /// Returns once both webhooks see every PodProbeMarker created so far. Both read
    /// PodProbeMarkers from a cluster-wide watch cache, which applies events in the order
    /// they were written: a new PodProbeMarker (in its own namespace) that a dry-run pod
    /// create gets annotated by proves the cache has caught up with everything before it.
    pub async fn wait_caches(&mut self) {
        self.sentinels += 1;
        let name = format!("sentinel-{}", self.sentinels);
        let ppm = json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
            "metadata": {"name": name, "namespace": SENTINEL_NS},
            "spec": {"selector": {"matchLabels": {"sentinel": name}},
                     "probes": [{"name": "s", "containerName": "main",
                                 "probe": {"tcpSocket": {"port": 1}},
                                 "podConditionType": "podprobe.test/sentinel"}]}
        });
        let created = self.create_ppm(&ppm).await;
        created.kruise.unwrap();
        created.podprobe.unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "probe", "namespace": SENTINEL_NS,
                         "labels": {"sentinel": name}},
            "spec": {"containers": [{"name": "main", "image": "game:1"}]}
        }))
        .unwrap();
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        for client in [self.kruise.client(), self.podprobe.cp.client()] {
            let pods: Api<Pod> = Api::namespaced(client, SENTINEL_NS);
            let seen = async {
                loop {
                    let admitted = pods.create(&dry_run, &pod).await.unwrap();
                    if annotation(&admitted, "kruise.io/podprobemarker-list").as_deref()
                        == Some(name.as_str())
                    {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            tokio::time::timeout(LIMIT, seen)
                .await
                .unwrap_or_else(|_| panic!("{name} not in a webhook's cache within {LIMIT:?}"));
        }
    }
}
