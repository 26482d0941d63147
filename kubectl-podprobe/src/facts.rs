//! What the plugin reads from the cluster for a pod: the pod, the PodProbeMarkers of its
//! namespace, its node and the events about it. Read-only; one list of PodProbeMarkers per
//! namespace and one GET per node, however many pods.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use podprobe_model::crd::PodProbeMarker;

use crate::args::Global;

#[derive(Debug, thiserror::Error)]
pub enum FactsError {
    #[error("cannot load the kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("pod {namespace}/{name} not found")]
    PodNotFound { namespace: String, name: String },
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
}

/// Everything known about one pod.
#[derive(Debug, Clone)]
pub struct PodFacts {
    pub pod: Pod,
    /// The PodProbeMarkers of the pod's namespace (shared by its pods); `None` when the CRD is
    /// not installed.
    pub markers: Option<Arc<Vec<PodProbeMarker>>>,
    /// The pod's node, when it is scheduled and the node exists.
    pub node: Option<Node>,
    /// Events about the pod, oldest first (empty when not asked for).
    pub events: Vec<Event>,
    /// What could not be read for this pod because the credentials may not (403), with the
    /// apiserver's reason: the checks that need it are skipped, not failed.
    pub unread: Unread,
}

/// Reads refused by RBAC: nodes are cluster-scoped, and a namespace-scoped user (a game team's
/// kubeconfig) often may not read them or events; the rest of the chain still holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unread {
    pub node: Option<String>,
    pub events: Option<String>,
}

impl Unread {
    /// One line per refused read, for a warning on stderr.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if let Some(why) = &self.node {
            notes.push(format!(
                "cannot read the pod's node, node checks skipped: {why}"
            ));
        }
        if let Some(why) = &self.events {
            notes.push(format!("cannot read events, none shown: {why}"));
        }
        notes
    }
}

/// Whether to read each pod's events: one request per pod, which only `explain` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Events {
    Read,
    Skip,
}

/// A connection as kubectl makes it, and the namespace it defaults to.
pub struct Cluster {
    client: Client,
    pub namespace: String,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// `--kubeconfig` (else `$KUBECONFIG`, else `~/.kube/config`), `--context`, `--cluster`,
    /// `--user`, `-n`, then kubectl's overrides: `--server`, `--token`, `--as`, `--as-group`,
    /// `--request-timeout`.
    pub async fn connect(global: &Global) -> Result<Cluster, FactsError> {
        let options = KubeConfigOptions {
            context: global.context.clone(),
            cluster: global.cluster.clone(),
            user: global.user.clone(),
        };
        let loaded = match &global.kubeconfig {
            Some(path) => {
                let file = Kubeconfig::read_from(path)
                    .map_err(|e| FactsError::Kubeconfig(format!("{}: {e}", path.display())))?;
                Config::from_custom_kubeconfig(file, &options).await
            }
            None => Config::from_kubeconfig(&options).await,
        };
        let mut config = loaded.map_err(|e| FactsError::Kubeconfig(e.to_string()))?;
        override_connection(&mut config, global)?;
        let namespace = global
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = Client::try_from(config).map_err(|e| FactsError::Kubeconfig(e.to_string()))?;
        Ok(Cluster { client, namespace })
    }

    pub async fn pod(&self, name: &str) -> Result<Pod, FactsError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        pods.get_opt(name)
            .await
            .map_err(|source| api(format!("get pod {name}"), source))?
            .ok_or_else(|| FactsError::PodNotFound {
                namespace: self.namespace.clone(),
                name: name.to_owned(),
            })
    }

    /// The pods of the namespace (or all), with an optional label selector.
    pub async fn pods(
        &self,
        all_namespaces: bool,
        selector: Option<&str>,
    ) -> Result<Vec<Pod>, FactsError> {
        let pods: Api<Pod> = if all_namespaces {
            Api::all(self.client.clone())
        } else {
            Api::namespaced(self.client.clone(), &self.namespace)
        };
        let mut params = ListParams::default();
        if let Some(selector) = selector {
            params = params.labels(selector);
        }
        Ok(pods
            .list(&params)
            .await
            .map_err(|source| api("list pods".into(), source))?
            .items)
    }

    /// The facts of each pod, in the order given.
    pub async fn facts(&self, pods: Vec<Pod>, events: Events) -> Result<Vec<PodFacts>, FactsError> {
        let mut markers: BTreeMap<String, Option<Arc<Vec<PodProbeMarker>>>> = BTreeMap::new();
        let mut nodes: BTreeMap<String, Result<Option<Node>, String>> = BTreeMap::new();
        let mut all = Vec::with_capacity(pods.len());
        for pod in pods {
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            if !markers.contains_key(&namespace) {
                let listed = self.markers(&namespace).await?.map(Arc::new);
                markers.insert(namespace.clone(), listed);
            }
            let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            if let Some(name) = &node_name
                && !nodes.contains_key(name)
            {
                let node = match Api::<Node>::all(self.client.clone()).get_opt(name).await {
                    Ok(node) => Ok(node),
                    Err(e) => Err(forbidden(&e).ok_or_else(|| api(format!("get node {name}"), e))?),
                };
                nodes.insert(name.clone(), node);
            }
            let mut unread = Unread::default();
            let events = match events {
                Events::Read => match self.events(&pod).await {
                    Err(FactsError::Api { source, .. }) if forbidden(&source).is_some() => {
                        unread.events = forbidden(&source);
                        Vec::new()
                    }
                    read => read?,
                },
                Events::Skip => Vec::new(),
            };
            let node = match node_name.map(|n| nodes[&n].clone()) {
                Some(Ok(node)) => node,
                Some(Err(why)) => {
                    unread.node = Some(why);
                    None
                }
                None => None,
            };
            all.push(PodFacts {
                markers: markers[&namespace].clone(),
                node,
                events,
                unread,
                pod,
            });
        }
        Ok(all)
    }

    async fn markers(&self, namespace: &str) -> Result<Option<Vec<PodProbeMarker>>, FactsError> {
        let api: Api<PodProbeMarker> = Api::namespaced(self.client.clone(), namespace);
        match api.list(&ListParams::default()).await {
            Ok(list) => Ok(Some(list.items)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(source) => Err(api_error(namespace, source)),
        }
    }

    async fn events(&self, pod: &Pod) -> Result<Vec<Event>, FactsError> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let events_api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let params = ListParams::default().fields(&format!(
            "involvedObject.kind=Pod,involvedObject.name={name}"
        ));
        let mut events = events_api
            .list(&params)
            .await
            .map_err(|source| api(format!("list events of pod {name}"), source))?
            .items;
        events.retain(|e| e.involved_object.uid == pod.metadata.uid);
        events.sort_by_key(event_time);
        Ok(events)
    }
}

/// kubectl's flags that override the kubeconfig.
fn override_connection(config: &mut Config, global: &Global) -> Result<(), FactsError> {
    if let Some(server) = &global.server {
        config.cluster_url = server
            .parse()
            .map_err(|e| FactsError::Kubeconfig(format!("--server {server:?}: {e}")))?;
    }
    if let Some(token) = &global.token {
        // The token alone, as kubectl: the user's certificates or exec plugin are not used.
        config.auth_info = serde_json::from_value(serde_json::json!({ "token": token }))
            .map_err(|e| FactsError::Kubeconfig(format!("--token: {e}")))?;
    }
    if let Some(user) = &global.as_user {
        config.auth_info.impersonate = Some(user.clone());
    }
    if !global.as_group.is_empty() {
        config.auth_info.impersonate_groups = Some(global.as_group.clone());
    }
    if let Some(timeout) = global.request_timeout.filter(|t| !t.is_zero()) {
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
    }
    Ok(())
}

/// When an event last happened (core/v1 or events.k8s.io/v1 writers fill different fields).
pub fn event_time(event: &Event) -> Option<jiff::Timestamp> {
    event
        .last_timestamp
        .as_ref()
        .map(|t| t.0)
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
        .or_else(|| event.first_timestamp.as_ref().map(|t| t.0))
}

fn api(what: String, source: kube::Error) -> FactsError {
    FactsError::Api { what, source }
}

fn api_error(namespace: &str, source: kube::Error) -> FactsError {
    api(format!("list PodProbeMarkers in {namespace}"), source)
}

/// The apiserver's message when `e` is a 403 (RBAC refused the read).
fn forbidden(e: &kube::Error) -> Option<String> {
    match e {
        kube::Error::Api(status) if status.code == 403 => Some(status.message.clone()),
        _ => None,
    }
}

/// The resource is not served (the PodProbeMarker CRD is not installed).
fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 404)
}
