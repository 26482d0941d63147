//! The rules of a create (POST): the namespace, the name (given or generated),
//! fresh system metadata, and the state each kind starts in.

use serde_json::{Map, Value, json};

use super::{EventType, Inner, Store, meta, meta_mut, new_uid, now};
use crate::error::ApiError;
use crate::resources::ResourceDef;

impl Store {
    /// POST: create an object in `ns` (`""` for cluster-scoped resources).
    pub fn create(&self, r: &ResourceDef, ns: &str, mut obj: Value) -> Result<Value, ApiError> {
        Self::check_type(r, &mut obj)?;
        let mut g = self.lock();
        let name = fresh_metadata(r, ns, meta_mut(&mut obj))?;
        let key = Self::key(r, ns, &name);
        if r.plural != "namespaces" || !r.group.is_empty() {
            Self::check_namespace(&g, r, ns, &name)?;
        }
        if g.objects.contains_key(&key) {
            return Err(ApiError::already_exists(r.group, r.plural, &name));
        }
        initial_state(r, &name, &mut obj)?;
        Ok(self.emit(&mut g, r, EventType::Added, obj, None))
    }

    fn check_namespace(g: &Inner, r: &ResourceDef, ns: &str, name: &str) -> Result<(), ApiError> {
        if !r.namespaced {
            return Ok(());
        }
        match g
            .objects
            .get(&(String::from("/namespaces"), String::new(), ns.to_string()))
        {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some(n) if meta(n).get("deletionTimestamp").is_some() => {
                let mut e = ApiError::forbidden("", "create", r.group, r.plural, "", ns, name);
                e.message = format!(
                    "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                    crate::error::qualified(r.group, r.plural)
                );
                Err(e)
            }
            Some(_) => Ok(()),
        }
    }
}

/// The metadata of a new object: the request's namespace, a name, a new uid and
/// creation time; whatever the client said of its deletion, resourceVersion or
/// generation is dropped. Returns the name.
fn fresh_metadata(
    r: &ResourceDef,
    ns: &str,
    m: &mut Map<String, Value>,
) -> Result<String, ApiError> {
    set_namespace(r, ns, m)?;
    let name = object_name(r, m)?;
    m.insert("name".into(), json!(name));
    m.insert("uid".into(), json!(new_uid()));
    m.insert("creationTimestamp".into(), json!(now()));
    for f in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "resourceVersion",
        "generation",
    ] {
        m.remove(f);
    }
    if r.generation {
        m.insert("generation".into(), json!(1));
    }
    Ok(name)
}

/// A namespaced object is in the request's namespace (the body may only
/// repeat it); a cluster-scoped object has none.
fn set_namespace(r: &ResourceDef, ns: &str, m: &mut Map<String, Value>) -> Result<(), ApiError> {
    if !r.namespaced {
        m.remove("namespace");
        return Ok(());
    }
    match m.get("namespace").and_then(Value::as_str) {
        None | Some("") => {
            m.insert("namespace".into(), json!(ns));
        }
        Some(x) if x == ns => {}
        Some(_) => {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    Ok(())
}

/// `metadata.name`, or else `generateName` with five random characters.
fn object_name(r: &ResourceDef, m: &Map<String, Value>) -> Result<String, ApiError> {
    match m.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => Ok(n.to_string()),
        _ => match m.get("generateName").and_then(Value::as_str) {
            Some(prefix) if !prefix.is_empty() => Ok(format!("{prefix}{}", random_suffix())),
            _ => Err(ApiError::invalid(
                r.group,
                r.kind,
                "",
                "metadata.name: Required value: name or generateName is required",
            )),
        },
    }
}

/// Five characters of `[0-9a-z]`.
fn random_suffix() -> String {
    (0..5)
        .map(|_| {
            let c = rand::random_range(0..36u8);
            (if c < 10 { b'0' + c } else { b'a' + c - 10 }) as char
        })
        .collect()
}

/// Status on create: dropped for pods and custom resources (their
/// strategies reset it), kept otherwise.
fn initial_state(r: &ResourceDef, name: &str, obj: &mut Value) -> Result<(), ApiError> {
    if r.is_pod() {
        return pod_defaults(r, name, obj);
    }
    if r.custom && r.status_subresource {
        if let Some(o) = obj.as_object_mut() {
            o.remove("status");
        }
    } else if r.plural == "namespaces" && r.group.is_empty() {
        obj["status"] = json!({"phase": "Active"});
        obj["spec"] = json!({"finalizers": ["kubernetes"]});
        let m = meta_mut(obj);
        let labels = m.entry("labels").or_insert_with(|| json!({}));
        labels["kubernetes.io/metadata.name"] = json!(name);
    }
    Ok(())
}

/// A new pod is Pending, with the spec defaults the apiserver fills in.
fn pod_defaults(r: &ResourceDef, name: &str, obj: &mut Value) -> Result<(), ApiError> {
    obj["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
    let spec = obj
        .get_mut("spec")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| {
            ApiError::invalid(r.group, r.kind, name, "spec.containers: Required value")
        })?;
    for (k, v) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
    ] {
        spec.entry(k).or_insert(v);
    }
    Ok(())
}
