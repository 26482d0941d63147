//! What the tests ask of the apiserver as the admin: namespaces, ServiceAccounts and their
//! tokens, admission dry-runs, `/metrics`.

use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use super::{ControlPlane, Error, metrics};

impl ControlPlane {
    /// Creates a namespace and its `default` ServiceAccount (without a node no
    /// controller-manager runs to create it, and the ServiceAccount admission plugin refuses
    /// pods without it; with one, its serviceaccount controller may have been first).
    pub async fn create_namespace(&self, name: &str) -> Result<Namespace, Error> {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        let ns = Api::<Namespace>::all(self.client())
            .create(&PostParams::default(), &ns)
            .await?;
        match self.create_service_account(name, "default").await {
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 409 => {}
            other => {
                other?;
            }
        }
        Ok(ns)
    }

    /// Dry-run creates `pod` as the admin, through the whole admission chain, until the object
    /// the webhooks return satisfies `admitted` (up to a minute). Webhooks that read
    /// PodProbeMarkers from a watch cache (kruise-manager's, podprobe-manager's) lag behind a
    /// create: this is how a test knows they have caught up before it creates the real pod.
    pub async fn wait_admission(
        &self,
        pod: &Pod,
        admitted: impl Fn(&Pod) -> bool,
    ) -> Result<Pod, Error> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let pods: Api<Pod> = Api::namespaced(self.client(), namespace);
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let started = Instant::now();
        loop {
            let answer = pods.create(&dry_run, pod).await?;
            if admitted(&answer) {
                return Ok(answer);
            }
            if started.elapsed() > Duration::from_secs(60) {
                return Err(Error::Other(format!(
                    "the admission chain did not give the expected pod within 60 s; last: {:?}",
                    answer.metadata.annotations
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn create_service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<ServiceAccount, Error> {
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        Ok(Api::<ServiceAccount>::namespaced(self.client(), namespace)
            .create(&PostParams::default(), &sa)
            .await?)
    }

    /// A token of `service_account` bound to `pod` (TokenRequest with a Pod `boundObjectRef`),
    /// exactly what the kubelet mounts into that pod: it carries the
    /// `authentication.kubernetes.io/pod-name` / `pod-uid` extras and stops working when the
    /// pod is deleted.
    pub async fn pod_token(&self, service_account: &str, pod: &Pod) -> Result<String, Error> {
        let bound = BoundObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        self.token_request(namespace, service_account, Some(bound))
            .await
    }

    /// A token of `service_account` bound to nothing (as `kubectl create token` makes).
    pub async fn service_account_token(
        &self,
        namespace: &str,
        service_account: &str,
    ) -> Result<String, Error> {
        self.token_request(namespace, service_account, None).await
    }

    async fn token_request(
        &self,
        namespace: &str,
        service_account: &str,
        bound: Option<BoundObjectReference>,
    ) -> Result<String, Error> {
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec!["https://kubernetes.default.svc.cluster.local".to_owned()],
                bound_object_ref: bound,
                expiration_seconds: Some(3600),
            },
            ..TokenRequest::default()
        };
        let issued = Api::<ServiceAccount>::namespaced(self.client(), namespace)
            .create_token_request(service_account, &PostParams::default(), &request)
            .await?;
        issued
            .status
            .map(|s| s.token)
            .ok_or_else(|| Error::Other("TokenRequest answered without a token".into()))
    }

    /// The apiserver's own Prometheus metrics.
    pub async fn metrics(&self) -> Result<String, Error> {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| Error::Other(e.to_string()))?;
        Ok(self.client().request_text(request).await?)
    }

    /// The apiserver's live Go heap in bytes: `HeapAlloc` right after a collection it is asked
    /// to run (`/debug/pprof/heap?gc=1`). Steadier than RSS or `heap_inuse`, which carry what
    /// the next collection would free.
    pub async fn live_heap_bytes(&self) -> Result<u64, Error> {
        let request = http::Request::get("/debug/pprof/heap?gc=1&debug=1")
            .body(Vec::new())
            .map_err(|e| Error::Other(e.to_string()))?;
        let profile = self.client().request_text(request).await?;
        profile
            .lines()
            .find_map(|l| l.strip_prefix("# HeapAlloc = ")?.trim().parse().ok())
            .ok_or_else(|| Error::Other("the heap profile carries no HeapAlloc line".into()))
    }

    /// `apiserver_request_total` summed over response codes for one verb (as the metric spells
    /// it: `PATCH`, `POST`, `WATCH`, ...), resource and subresource (`""` for none).
    pub async fn request_count(
        &self,
        verb: &str,
        resource: &str,
        subresource: &str,
    ) -> Result<u64, Error> {
        let counts = metrics::request_counts(&self.metrics().await?);
        let key = (verb.to_owned(), resource.to_owned(), subresource.to_owned());
        Ok(counts.get(&key).copied().unwrap_or(0))
    }
}
