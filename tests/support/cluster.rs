//! The sidecar's cluster on a real kube-apiserver (testkit::real): the namespace, the sidecar's
//! ServiceAccount, Role and RoleBinding exactly as `examples/sidecar-by-hand.yaml` declares
//! them, pods whose status the test writes as the kubelet would, and `podprobe run` with a
//! pod-bound service-account token, as in a real pod. Every sidecar reaches the apiserver
//! through the cluster's fault proxy (TLS, the control plane's CA): a test injects faults and
//! reads the sidecar's requests there ([`Cluster::proxy`]); the test's own requests go to the
//! apiserver directly.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testkit::real::{AuditEvent, ClientSide, ControlPlane, FaultProxy};

use super::{NS, Sidecar, game_pod, long_ago, running_status, start_sidecar, wait_for_pod};

/// The sidecar's ServiceAccount in `examples/sidecar-by-hand.yaml`.
pub const SIDECAR_SA: &str = "podprobe-sidecar";

/// What [`Cluster::probed_pod`] set up.
pub struct ProbedPod {
    /// The pod once its condition was `True`.
    pub pod: Pod,
    pub sidecar: Sidecar,
    pub metrics_port: u16,
    /// The probe succeeds while this file exists (its content is the message).
    pub flag: PathBuf,
}

pub struct Cluster {
    /// In front of the apiserver for every sidecar; dropped before the control plane.
    pub proxy: FaultProxy,
    pub cp: ControlPlane,
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// A control plane with namespace [`NS`], the by-hand example's sidecar RBAC and the fault
    /// proxy.
    pub async fn start() -> Cluster {
        let cp = ControlPlane::start()
            .await
            .unwrap_or_else(|e| panic!("real control plane: {e}"));
        cp.create_namespace(NS).await.expect("namespace");
        apply_sidecar_rbac(&cp).await;
        let proxy = FaultProxy::start_with(&cp, ClientSide::Tls)
            .await
            .expect("fault proxy");
        Cluster {
            proxy,
            cp,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// Replaces pod `name`'s `kruise.io/podprobe` annotation, as the admin.
    pub async fn set_annotation(&self, name: &str, annotation: &str) {
        let patch = json!({"metadata": {"annotations": {"kruise.io/podprobe": annotation}}});
        self.pods()
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .expect("set the annotation");
    }

    /// The status writes the sidecars sent through the proxy so far (answered or not).
    pub fn status_patches(&self) -> usize {
        self.proxy.journal().count("PATCH", "pods/status")
    }

    /// Event creates through the proxy whose body names `reason`.
    pub fn events_sent(&self, reason: &str) -> usize {
        self.proxy
            .journal()
            .matching("POST", "events")
            .iter()
            .filter(|e| e.body.contains(reason))
            .count()
    }

    /// Pods, as the admin.
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.cp.client(), NS)
    }

    /// Deletes pod `name` at once (grace period 0), as a node that lost it would.
    pub async fn delete_now(&self, name: &str) {
        let now = kube::api::DeleteParams::default().grace_period(0);
        self.pods()
            .delete(name, &now)
            .await
            .expect("delete the pod");
    }

    /// The `events.k8s.io/v1` events stored in [`NS`]: what passed the apiserver's validation.
    pub async fn events(&self) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.cp.client(), NS);
        events.list(&ListParams::default()).await.unwrap().items
    }

    /// Creates a [`game_pod`] running as [`SIDECAR_SA`] and reports it running, started long
    /// ago, as the kubelet would.
    pub async fn create_pod(&self, name: &str, annotation: &str, ports: Value) -> Pod {
        self.create_pod_as(name, annotation, ports, SIDECAR_SA)
            .await
    }

    /// A [`Cluster::create_pod`] with one probe `p` (condition `c/p`) that succeeds while the
    /// file `flag` in the cluster's directory says `up` (written so here): the pod and the
    /// flag's path, which the test rewrites to flip the probe.
    pub async fn create_flagged_pod(&self, name: &str) -> (Pod, PathBuf) {
        let flag = self.dir.path().join("flag");
        std::fs::write(&flag, "up").unwrap();
        let annotation = super::array(&[super::file_probe("p", "c/p", &flag)]);
        (self.create_pod(name, &annotation, json!([])).await, flag)
    }

    pub async fn create_pod_as(
        &self,
        name: &str,
        annotation: &str,
        ports: Value,
        service_account: &str,
    ) -> Pod {
        let mut pod = game_pod(name, annotation, ports);
        pod.spec.as_mut().unwrap().service_account_name = Some(service_account.to_owned());
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
        self.kubelet_reports_started(name, "containerd://main-1", long_ago())
            .await
    }

    /// Writes the status a kubelet reports, with a strategic-merge patch as the kubelet does
    /// (conditions merge by type, so the sidecar's stay).
    pub async fn kubelet_reports_started(
        &self,
        name: &str,
        container_id: &str,
        started_at: jiff::Timestamp,
    ) -> Pod {
        let status = running_status(container_id, started_at);
        self.pods()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Strategic(json!({ "status": status })),
            )
            .await
            .expect("kubelet status")
    }

    /// `podprobe run` for `pod` with a token of [`SIDECAR_SA`] bound to that pod.
    pub async fn sidecar(&self, pod: &Pod, extra: &[&str]) -> Sidecar {
        let token = self.sidecar_token(pod).await;
        self.sidecar_with_token(pod.metadata.name.as_deref().unwrap(), &token, extra)
    }

    /// [`Cluster::sidecar`] talking to the apiserver itself, not through the fault proxy (which
    /// speaks HTTP/1.1 only): what a pod's sidecar reaches in a cluster.
    pub async fn sidecar_direct(&self, pod: &Pod, extra: &[&str]) -> Sidecar {
        let token = self.sidecar_token(pod).await;
        let name = pod.metadata.name.as_deref().unwrap();
        let kubeconfig = unique(self.dir.path(), name, "kubeconfig");
        self.cp
            .write_kubeconfig_for_token(&kubeconfig, &token)
            .expect("kubeconfig");
        start_sidecar(self.dir.path(), &kubeconfig, name, extra)
    }

    /// A token of [`SIDECAR_SA`] bound to `pod`.
    async fn sidecar_token(&self, pod: &Pod) -> String {
        self.cp
            .pod_token(SIDECAR_SA, pod)
            .await
            .expect("pod-bound token")
    }

    /// Pod `name` with one probe (`podConditionType` `condition_type`) reading a flag file
    /// that says "up", its sidecar serving metrics, once the condition is `True`.
    pub async fn probed_pod(&self, name: &str, condition_type: &str) -> ProbedPod {
        let flag = self.dir.path().join(format!("{name}.flag"));
        std::fs::write(&flag, "up").unwrap();
        let annotation = super::array(&[super::file_probe("p", condition_type, &flag)]);
        let pod = self.create_pod(name, &annotation, json!([])).await;
        let port = super::free_port();
        let sidecar = self
            .sidecar(&pod, &["--metrics-addr", &format!("127.0.0.1:{port}")])
            .await;
        let pod = self
            .wait_pod(name, Duration::from_secs(60), |p| {
                super::has_status(p, condition_type, "True")
            })
            .await;
        ProbedPod {
            pod,
            sidecar,
            metrics_port: port,
            flag,
        }
    }

    /// `podprobe run` for pod `name` authenticating with `token`.
    pub fn sidecar_with_token(&self, name: &str, token: &str, extra: &[&str]) -> Sidecar {
        let kubeconfig = self.kubeconfig_for(name, token);
        start_sidecar(self.dir.path(), &kubeconfig, name, extra)
    }

    /// `podprobe run --source file` for `pod` (a token bound to it, through the fault proxy):
    /// `annotation` in its downward-API file, its uid given as the downward API gives it.
    pub async fn file_source_sidecar(
        &self,
        pod: &Pod,
        annotation: &str,
        extra: &[&str],
    ) -> Sidecar {
        let mut args = self.file_source_args(pod, annotation);
        args.extend(extra.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.sidecar(pod, &args).await
    }

    /// `--source file` with `annotation` in a downward-API file, and the pod's uid as the
    /// downward API gives it.
    fn file_source_args(&self, pod: &Pod, annotation: &str) -> Vec<String> {
        let annotations = self.annotations_file(annotation);
        [
            "--source",
            "file",
            "--annotations-file",
            annotations.to_str().unwrap(),
            "--pod-uid",
            pod.metadata.uid.as_deref().unwrap(),
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// `podprobe run` as `pod` for as long as the test likes, also after the pod is gone: the
    /// downward-API file source (nothing follows the pod) and a plain token of [`SIDECAR_SA`]
    /// (as from a mounted Secret), which, unlike a pod-bound one, outlives the pod.
    pub async fn sidecar_outliving(&self, pod: &Pod, annotation: &str) -> Sidecar {
        let token = self
            .cp
            .service_account_token(NS, SIDECAR_SA)
            .await
            .expect("service-account token");
        let args = self.file_source_args(pod, annotation);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.sidecar_with_token(pod.metadata.name.as_deref().unwrap(), &token, &args)
    }

    /// `annotation` as a downward-API annotations file holds it, for a sidecar that must go on
    /// as its pod after the pod is gone (`--source file`: nothing follows the pod).
    pub fn annotations_file(&self, annotation: &str) -> PathBuf {
        let path = unique(self.dir.path(), "pod", "annotations");
        let quoted = podprobe::annotation::go_quote(annotation);
        std::fs::write(&path, format!("kruise.io/podprobe={quoted}")).unwrap();
        path
    }

    /// A kubeconfig for the proxy, authenticating with `token`.
    fn kubeconfig_for(&self, name: &str, token: &str) -> PathBuf {
        let path = unique(self.dir.path(), name, "kubeconfig");
        self.proxy
            .write_kubeconfig_for_token(&path, token)
            .expect("kubeconfig");
        path
    }

    pub async fn wait_pod(&self, name: &str, limit: Duration, check: impl Fn(&Pod) -> bool) -> Pod {
        wait_for_pod(&self.pods(), name, limit, check).await
    }

    /// The apiserver's audit record of every `PATCH pods/<name>/status` the sidecar's service
    /// account sent.
    pub fn sidecar_status_writes(&self, name: &str) -> Vec<AuditEvent> {
        self.audit_by_sidecar(|e| e.is("patch", "pods/status", Some(name)))
    }

    /// Audit events of requests by [`SIDECAR_SA`] for which `select` holds.
    pub fn audit_by_sidecar(&self, select: impl Fn(&AuditEvent) -> bool) -> Vec<AuditEvent> {
        let user = format!("system:serviceaccount:{NS}:{SIDECAR_SA}");
        self.cp
            .audit()
            .expect("audit log")
            .into_iter()
            .filter(|e| e.user.username == user && select(e))
            .collect()
    }

    /// Waits (up to `limit`) until the audit log holds an event for which `select` holds.
    pub async fn wait_audit(
        &self,
        what: &str,
        limit: Duration,
        select: impl Fn(&AuditEvent) -> bool,
    ) -> AuditEvent {
        let wait = async {
            loop {
                let found = self
                    .cp
                    .audit()
                    .expect("audit log")
                    .into_iter()
                    .find(&select);
                if let Some(event) = found {
                    return event;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(limit, wait)
            .await
            .unwrap_or_else(|_| panic!("no audit event for {what} within {limit:?}"))
    }
}

fn unique(dir: &Path, stem: &str, ext: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    dir.join(format!(
        "{stem}-{}.{ext}",
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// The ServiceAccount, Role and RoleBinding of `examples/sidecar-by-hand.yaml`, created as
/// committed (its pod is left out: the tests make their own).
pub async fn apply_sidecar_rbac(cp: &ControlPlane) {
    let (namespace, kinds) = testkit::real::sidecar_rbac::apply(cp)
        .await
        .expect("the by-hand example's RBAC");
    assert_eq!(namespace, NS, "the example's namespace");
    assert_eq!(kinds, ["ServiceAccount", "Role", "RoleBinding"]);
}
