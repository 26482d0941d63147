//! The rules of a delete: preconditions, graceful pod deletion, finalizers, and
//! namespaces, which go Terminating, delete their content, and go once empty.

use chrono::{SecondsFormat, Utc};
use serde_json::{Value, json};

use super::{DeleteOpts, EventType, Inner, Store, finalizers_empty, meta, meta_mut, meta_str, now};
use crate::error::ApiError;
use crate::resources::{self, ResourceDef};

impl Store {
    /// DELETE. Returns the object (deleted, or marked for deletion).
    pub fn delete(
        &self,
        r: &ResourceDef,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Value, ApiError> {
        let mut g = self.lock();
        self.delete_locked(&mut g, r, ns, name, opts)
    }

    /// The kubelet's last step of a graceful pod deletion: delete with grace
    /// period 0 (the pod goes once it has no finalizers).
    pub fn finish_pod_deletion(&self, ns: &str, name: &str) -> Result<Value, ApiError> {
        let r = resources::find("", "v1", "pods").expect("pods served");
        let opts = DeleteOpts {
            grace: Some(0),
            ..Default::default()
        };
        self.delete(r, ns, name, &opts)
    }

    fn delete_locked(
        &self,
        g: &mut Inner,
        r: &ResourceDef,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Value, ApiError> {
        let key = Self::key(r, ns, name);
        let old = g.existing(r, &key, name)?;
        check_preconditions(r, name, &old, opts)?;
        if r.group.is_empty() && r.plural == "namespaces" {
            return self.delete_namespace(g, r, old);
        }
        let grace = if r.is_pod() { pod_grace(&old, opts) } else { 0 };
        if grace == 0 && finalizers_empty(&old) {
            return Ok(self.emit(g, r, EventType::Deleted, old, None));
        }
        let new = marked_for_deletion(r, &old, grace);
        if new == old {
            return Ok(old);
        }
        Ok(self.emit(g, r, EventType::Modified, new, Some(old)))
    }

    /// A namespace goes Terminating, its content is deleted (with the usual
    /// rules: finalizers and graceful pod deletion may keep objects), and it
    /// goes once empty.
    fn delete_namespace(
        &self,
        g: &mut Inner,
        r: &ResourceDef,
        old: Value,
    ) -> Result<Value, ApiError> {
        let name = meta_str(&old, "name").unwrap_or("").to_string();
        let mut ns_obj = old.clone();
        if meta(&old).get("deletionTimestamp").is_none() {
            meta_mut(&mut ns_obj).insert("deletionTimestamp".into(), json!(now()));
            ns_obj["status"] = json!({"phase": "Terminating"});
            ns_obj = self.emit(g, r, EventType::Modified, ns_obj, Some(old));
        }
        let content: Vec<(String, String)> = g
            .objects
            .keys()
            .filter(|(_, n, _)| *n == name)
            .map(|(res, _, obj)| (res.clone(), obj.clone()))
            .collect();
        for (res, obj) in content {
            if let Some(rd) = resources::RESOURCES
                .iter()
                .find(|d| resources::storage_key(d) == res)
            {
                let _ = self.delete_locked(g, rd, &name, &obj, &DeleteOpts::default());
            }
        }
        Ok(self.reap_namespace(g, &name).unwrap_or(ns_obj))
    }

    /// Remove a Terminating namespace that has become empty.
    pub(super) fn reap_namespace(&self, g: &mut Inner, ns: &str) -> Option<Value> {
        let key = (String::from("/namespaces"), String::new(), ns.to_string());
        let ns_obj = g.objects.get(&key)?.clone();
        meta(&ns_obj).get("deletionTimestamp")?;
        if g.objects.keys().any(|(_, n, _)| n == ns) {
            return None;
        }
        let r = resources::find("", "v1", "namespaces").expect("namespaces served");
        Some(self.emit(g, r, EventType::Deleted, ns_obj, None))
    }
}

/// The uid, then the resourceVersion, of `preconditions` (409 on a mismatch).
fn check_preconditions(
    r: &ResourceDef,
    name: &str,
    old: &Value,
    opts: &DeleteOpts,
) -> Result<(), ApiError> {
    let uid = meta_str(old, "uid").unwrap_or("");
    if let Some(u) = &opts.uid
        && u != uid
    {
        return Err(ApiError::conflict(
            r.group,
            r.plural,
            name,
            &format!("Precondition failed: UID in precondition: {u}, UID in object meta: {uid}"),
        ));
    }
    let rv = meta_str(old, "resourceVersion").unwrap_or("");
    if let Some(v) = &opts.rv
        && v != rv
    {
        return Err(ApiError::conflict(
            r.group,
            r.plural,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {v}, ResourceVersion in object meta: {rv}"
            ),
        ));
    }
    Ok(())
}

/// Graceful deletion of pods: a pod bound to a node and not finished waits
/// for its kubelet (the test) unless the grace period is 0. The grace period
/// is the request's, else the pod's (30 s by default).
fn pod_grace(old: &Value, opts: &DeleteOpts) -> i64 {
    let bound = old
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let phase = old.pointer("/status/phase").and_then(Value::as_str);
    let finished = matches!(phase, Some("Succeeded" | "Failed"));
    let mut grace = opts.grace.unwrap_or_else(|| {
        old.pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(30)
    });
    if !bound || finished {
        grace = 0;
    }
    grace = grace.max(0);
    if let Some(cur) = meta(old)
        .get("deletionGracePeriodSeconds")
        .and_then(Value::as_i64)
    {
        // May only be shortened.
        grace = grace.min(cur);
    }
    grace
}

/// `old` marked as being deleted, `grace` seconds from now. A pod's deletion
/// time moves with its grace period; other objects keep the first one.
fn marked_for_deletion(r: &ResourceDef, old: &Value, grace: i64) -> Value {
    let mut new = old.clone();
    let when =
        (Utc::now() + chrono::Duration::seconds(grace)).to_rfc3339_opts(SecondsFormat::Secs, true);
    let m = meta_mut(&mut new);
    if !m.contains_key("deletionTimestamp") || r.is_pod() {
        m.insert("deletionTimestamp".into(), json!(when));
    }
    m.insert("deletionGracePeriodSeconds".into(), json!(grace));
    new
}
