//! The rules of an update (PUT, PATCH, and the status subresource), one function each and in
//! kube-apiserver's order: the name, the preconditions, what the endpoint may change, the
//! metadata the system owns, finalizers while deleting, validation, the generation.

use serde_json::{Value, json};

use super::{Endpoint, EventType, Store, finalizers_empty, meta, meta_mut, meta_str};
use crate::error::ApiError;
use crate::resources::{self, ResourceDef};
use crate::validation::{self, FieldError};

/// How a write arrived: its body uid is a precondition for PUT only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Put,
    Patch,
}

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

impl Store {
    /// PUT or PATCH result: store `new` over the existing object, applying
    /// the rules of the endpoint it came through.
    pub fn update(
        &self,
        r: &ResourceDef,
        ns: &str,
        name: &str,
        new: Value,
        endpoint: Endpoint,
    ) -> Result<Value, ApiError> {
        self.write(r, ns, name, endpoint, Verb::Put, |_| Ok(new))
    }

    /// PATCH (or any read-modify-write): `f` computes the new object from
    /// the stored one, atomically; then the rules of [`update`](Self::update)
    /// apply.
    pub fn patch(
        &self,
        r: &ResourceDef,
        ns: &str,
        name: &str,
        endpoint: Endpoint,
        f: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<Value, ApiError> {
        self.write(r, ns, name, endpoint, Verb::Patch, f)
    }

    /// The update rules over the stored object and `f`'s new one, then the
    /// write; a write that ends a deletion (no finalizers left and, for a pod,
    /// a grace period of 0) deletes the object.
    fn write(
        &self,
        r: &ResourceDef,
        ns: &str,
        name: &str,
        endpoint: Endpoint,
        verb: Verb,
        f: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<Value, ApiError> {
        let mut g = self.lock();
        let key = Self::key(r, ns, name);
        let old = g.existing(r, &key, name)?;
        let mut new = f(&old)?;
        Self::check_type(r, &mut new)?;
        let rules = Rules {
            r,
            ns,
            name,
            endpoint,
            verb,
        };
        rules.check_name(&new)?;
        rules.check_preconditions(&old, &new)?;
        rules.reset_for_endpoint(&old, &mut new);
        keep_system_metadata(&old, &mut new);
        rules.check_finalizers(&old, &new)?;
        rules.validate(&old, &new)?;
        rules.bump_generation(&old, &mut new);
        // A write that changes nothing is not a write: no new
        // resourceVersion, no watch event (as etcd's GuaranteedUpdate).
        if new == old {
            return Ok(old);
        }
        let deleting = meta(&new).get("deletionTimestamp").is_some();
        let grace_done = meta(&new)
            .get("deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            == 0;
        if deleting && finalizers_empty(&new) && (!r.is_pod() || grace_done) {
            return Ok(self.emit(&mut g, r, EventType::Deleted, new, None));
        }
        Ok(self.emit(&mut g, r, EventType::Modified, new, Some(old)))
    }
}

/// One write's target and how it arrived.
struct Rules<'a> {
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
fn keep_system_metadata(old: &Value, new: &mut Value) {
    let stored = meta(old).clone();
    let m = meta_mut(new);
    for field in SYSTEM_METADATA {
        match stored.get(field) {
            Some(v) => m.insert(field.into(), v.clone()),
            None => m.remove(field),
        };
    }
}

/// What a pod spec update may change on the real server (roughly): images,
/// activeDeadlineSeconds, tolerations and terminationGracePeriodSeconds.
fn pod_spec_normalized(spec: &Value) -> Value {
    let mut s = spec.clone();
    if let Some(m) = s.as_object_mut() {
        for f in [
            "activeDeadlineSeconds",
            "tolerations",
            "terminationGracePeriodSeconds",
        ] {
            m.remove(f);
        }
        for list in ["containers", "initContainers", "ephemeralContainers"] {
            if let Some(Value::Array(cs)) = m.get_mut(list) {
                for c in cs {
                    if let Some(c) = c.as_object_mut() {
                        c.remove("image");
                    }
                }
            }
        }
    }
    s
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
