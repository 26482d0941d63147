//! The sidecar's RBAC as `examples/sidecar-by-hand.yaml` declares it (ServiceAccount, Role,
//! RoleBinding), created in the namespace the example names: what the real-apiserver tests and
//! benchmarks give their sidecars, exactly as a user adding the sidecar by hand would.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::PostParams;
use serde_json::Value;

use super::{ControlPlane, Error};

/// Creates the example's ServiceAccount, Role and RoleBinding (its Pod is left out) and returns
/// the namespace and the kinds created, in the file's order.
pub async fn apply(cp: &ControlPlane) -> Result<(String, Vec<String>), Error> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/sidecar-by-hand.yaml");
    let text = std::fs::read_to_string(&path)?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .map_err(|e| Error::Other(format!("{}: {e}", path.display())))?;
    let client = cp.client();
    let pp = PostParams::default();
    let mut namespace = None;
    let mut kinds = Vec::new();
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        let ns = doc["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match kind.as_str() {
            "ServiceAccount" => {
                let sa: ServiceAccount = serde_json::from_value(doc)?;
                Api::<ServiceAccount>::namespaced(client.clone(), &ns)
                    .create(&pp, &sa)
                    .await?;
            }
            "Role" => {
                let role: Role = serde_json::from_value(doc)?;
                Api::<Role>::namespaced(client.clone(), &ns)
                    .create(&pp, &role)
                    .await?;
            }
            "RoleBinding" => {
                let binding: RoleBinding = serde_json::from_value(doc)?;
                Api::<RoleBinding>::namespaced(client.clone(), &ns)
                    .create(&pp, &binding)
                    .await?;
            }
            _ => continue,
        }
        if namespace.get_or_insert_with(|| ns.clone()) != &ns {
            return Err(Error::Other(format!(
                "{}: the RBAC objects are in more than one namespace",
                path.display()
            )));
        }
        kinds.push(kind);
    }
    Ok((namespace.unwrap_or_default(), kinds))
}
