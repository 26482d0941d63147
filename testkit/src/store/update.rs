//! The rules of an update (PUT, PATCH, and the status subresource), one function each and in
//! kube-apiserver's order: the name, the preconditions, what the endpoint may change, the
//! metadata the system owns, finalizers while deleting, validation, the generation.

use serde_json::{Value, json};

use super::{Endpoint, Verb, meta, meta_mut, meta_str, pod_spec_normalized};
use crate::error::ApiError;
use crate::resources::{self, ResourceDef};
use crate::validation::{self, FieldError};

/// Metadata fields the server keeps from the stored object whatever a write says.
const SYSTEM_METADATA: [&str; 8] = [
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "resourceVersion",
];

/// One write's target and how it arrived.
pub(super) struct Rules<'a> {
    pub r: &'a ResourceDef,
    pub ns: &'a str,
    pub name: &'a str,
    pub endpoint: Endpoint,
    pub verb: Verb,
}

impl Rules<'_> {
    /// The name in the body must be the one in the path.
    pub fn check_name(&self, new: &Value) -> Result<(), ApiError> {
        match meta_str(new, "name") {
            Some(n) if n != self.name => Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({})",
                self.name
            ))),
            _ => Ok(()),
        }
    }

    /// uid, then resourceVersion. A PATCH carries no preconditions: the uid it sets is refused
    /// as a change of an immutable field (422). A PUT's body uid is a precondition (409).
    pub fn check_preconditions(&self, old: &Value, new: &Value) -> Result<(), ApiError> {
        let (r, name) = (self.r, self.name);
        let old_uid = meta_str(old, "uid").unwrap_or("");
        match meta_str(new, "uid") {
            Some(u) if !u.is_empty() && u != old_uid && self.verb == Verb::Patch => {
                let immutable = FieldError {
                    field: "metadata.uid".into(),
                    value: format!("{u:?}"),
                    detail: "field is immutable".into(),
                };
                return Err(ApiError::invalid_fields(
                    r.group,
                    r.kind,
                    name,
                    &[immutable],
                ));
            }
            Some(u) if !u.is_empty() && u != old_uid => {
                let ns = if self.ns.is_empty() {
                    String::new()
                } else {
                    format!("{}/", self.ns)
                };
                return Err(ApiError::conflict(
                    r.group,
                    r.plural,
                    name,
                    &format!(
                        "StorageError: invalid object, Code: 4, Key: /registry/{}/{ns}{name}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: {u}, UID in object meta: {old_uid}",
                        resources::qualified_plural(r),
                    ),
                ));
            }
            _ => {}
        }
        let old_rv = meta_str(old, "resourceVersion").unwrap_or("");
        match meta_str(new, "resourceVersion") {
            Some(v) if !v.is_empty() && v != old_rv => {
                Err(ApiError::stale_resource_version(r.group, r.plural, name))
            }
            Some(v) if !v.is_empty() => Ok(()),
            _ if r.custom => Err(ApiError::invalid(
                r.group,
                r.kind,
                name,
                "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
            )),
            _ => Ok(()),
        }
    }

    /// What an endpoint may not change is put back from the stored object: the main endpoint
    /// keeps the status (when there is a status subresource); the status endpoint keeps a custom
    /// resource's everything but status, a built-in's spec (and a pod's ownerReferences).
    pub fn reset_for_endpoint(&self, old: &Value, new: &mut Value) {
        let r = self.r;
        match (self.endpoint, r.status_subresource) {
            (Endpoint::Main, true) => keep(old, new, "status"),
            (Endpoint::Status, _) if r.custom => {
                let status = new.get("status").cloned();
                *new = old.clone();
                set_or_remove(new, "status", status);
            }
            (Endpoint::Status, _) => {
                keep(old, new, "spec");
                if r.is_pod() {
                    let old_owners = meta(old).get("ownerReferences").cloned();
                    let m = meta_mut(new);
                    match old_owners {
                        Some(o) => m.insert("ownerReferences".into(), o),
                        None => m.remove("ownerReferences"),
                    };
                }
            }
            (Endpoint::Main, false) => {}
        }
    }

    /// No new finalizers once the object is being deleted.
    pub fn check_finalizers(&self, old: &Value, new: &Value) -> Result<(), ApiError> {
        if meta(old).get("deletionTimestamp").is_none() {
            return Ok(());
        }
        let olds = meta(old)
            .get("finalizers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let added: Vec<String> = meta(new)
            .get("finalizers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|f| !olds.contains(f))
            .map(|f| format!("{:?}", f.as_str().unwrap_or_default()))
            .collect();
        if added.is_empty() {
            return Ok(());
        }
        Err(ApiError::invalid(
            self.r.group,
            self.r.kind,
            self.name,
            &format!(
                "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                added.join(", ")
            ),
        ))
    }

    /// A pod's status as the apiserver validates it; a pod's spec is immutable but for images.
    pub fn validate(&self, old: &Value, new: &Value) -> Result<(), ApiError> {
        let (r, name) = (self.r, self.name);
        if !r.is_pod() {
            return Ok(());
        }
        if self.endpoint == Endpoint::Status {
            let errors = validation::pod_status_errors(new);
            if !errors.is_empty() {
                return Err(ApiError::invalid_fields(r.group, r.kind, name, &errors));
            }
        }
        if self.endpoint == Endpoint::Main
            && pod_spec_normalized(&new["spec"]) != pod_spec_normalized(&old["spec"])
        {
            return Err(ApiError::invalid(
                r.group,
                r.kind,
                name,
                "spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
            ));
        }
        Ok(())
    }

    /// `metadata.generation` moves with the spec (a custom resource: with everything but
    /// metadata and status).
    pub fn bump_generation(&self, old: &Value, new: &mut Value) {
        let r = self.r;
        if !r.generation {
            return;
        }
        let changed = if r.custom {
            let strip = |v: &Value| {
                let mut v = v.clone();
                if let Some(o) = v.as_object_mut() {
                    o.remove("metadata");
                    o.remove("status");
                }
                v
            };
            strip(new) != strip(old)
        } else {
            new.get("spec") != old.get("spec")
        };
        if changed {
            let generation = meta(old)
                .get("generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(new).insert("generation".into(), json!(generation + 1));
        }
    }
}

/// The metadata the system owns comes from the stored object.
pub(super) fn keep_system_metadata(old: &Value, new: &mut Value) {
    let stored = meta(old).clone();
    let m = meta_mut(new);
    for field in SYSTEM_METADATA {
        match stored.get(field) {
            Some(v) => m.insert(field.into(), v.clone()),
            None => m.remove(field),
        };
    }
}

/// `new[field]` as stored in `old` (absent if absent there).
fn keep(old: &Value, new: &mut Value, field: &str) {
    set_or_remove(new, field, old.get(field).cloned());
}

fn set_or_remove(obj: &mut Value, field: &str, value: Option<Value>) {
    match value {
        Some(v) => obj[field] = v,
        None => {
            if let Some(o) = obj.as_object_mut() {
                o.remove(field);
            }
        }
    }
}
