//! Object storage with etcd-like resourceVersions and a bounded watch
//! history.
//!
//! One global counter is bumped by every write; each write appends a
//! [`WatchRecord`] to the history, which keeps at most `history_limit`
//! records (older ones are *compacted*: a watch from a version before the
//! compaction point gets 410 Gone). Objects are stored as JSON.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use chrono::{SecondsFormat, Utc};
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::error::ApiError;
use crate::resources::{self, ResourceDef};
use crate::selectors::{FieldSelector, LabelSelector};

mod update;

/// Watch event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// `ADDED`
    Added,
    /// `MODIFIED`
    Modified,
    /// `DELETED`
    Deleted,
}

impl EventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One write, as kept in the watch history.
#[derive(Debug, Clone)]
pub struct WatchRecord {
    /// The resourceVersion of the write.
    pub rv: u64,
    /// Storage key of the resource (`group/plural`).
    pub res: String,
    /// Event type.
    pub kind: EventType,
    /// The object after the write (for DELETED: its last state, with `rv`).
    pub obj: Value,
    /// The object before the write (MODIFIED only).
    pub prev: Option<Value>,
}

type ObjKey = (String, String, String);

#[derive(Debug)]
struct Inner {
    rv: u64,
    objects: BTreeMap<ObjKey, Value>,
    history: VecDeque<WatchRecord>,
    compacted: u64,
    history_limit: usize,
    continues: HashMap<String, (u64, Vec<Value>)>,
    next_continue: u64,
}

/// Options of a DELETE.
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    /// `gracePeriodSeconds`.
    pub grace: Option<i64>,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub rv: Option<String>,
}

/// How a write arrived: its body uid is a precondition for PUT only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Put,
    Patch,
}

/// Which endpoint a write comes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// The object itself.
    Main,
    /// The `status` subresource.
    Status,
}

/// The store shared by the HTTP layer and the handle.
#[derive(Debug)]
pub struct Store {
    inner: Mutex<Inner>,
    notify: watch::Sender<u64>,
}

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn new_uid() -> String {
    let b: [u8; 16] = rand::random();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        u16::from_be_bytes([b[4], b[5]]),
        u16::from_be_bytes([b[6], b[7]]) & 0x0fff,
        (u16::from_be_bytes([b[8], b[9]]) & 0x3fff) | 0x8000,
        u64::from_be_bytes([0, 0, b[10], b[11], b[12], b[13], b[14], b[15]])
    )
}

fn meta(obj: &Value) -> &Value {
    obj.get("metadata").unwrap_or(&Value::Null)
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj).get(field).and_then(Value::as_str)
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"]
        .as_object_mut()
        .expect("metadata is an object")
}

fn finalizers_empty(obj: &Value) -> bool {
    meta(obj)
        .get("finalizers")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty)
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

impl Store {
    /// A store holding the namespaces every cluster has.
    pub fn new(history_limit: usize) -> Self {
        let (notify, _) = watch::channel(0);
        let s = Self {
            inner: Mutex::new(Inner {
                rv: 0,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                compacted: 0,
                history_limit: history_limit.max(1),
                continues: HashMap::new(),
                next_continue: 0,
            }),
            notify,
        };
        let ns = resources::find("", "v1", "namespaces").expect("namespaces served");
        for n in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            s.create(ns, "", json!({"metadata": {"name": n}}))
                .expect("fresh store");
        }
        s
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A receiver that changes whenever the resourceVersion does.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.notify.subscribe()
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// The oldest resourceVersion a watch may still start from.
    pub fn compacted(&self) -> u64 {
        self.lock().compacted
    }

    /// Drop all history: a watch from any version before now gets 410.
    pub fn compact(&self) -> u64 {
        let mut g = self.lock();
        g.history.clear();
        g.compacted = g.rv;
        g.continues.clear();
        g.rv
    }

    fn key(r: &ResourceDef, ns: &str, name: &str) -> ObjKey {
        (
            resources::storage_key(r),
            if r.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            name.to_string(),
        )
    }

    /// Record a write: set its resourceVersion, append to the history and
    /// wake watchers. Returns the object as stored.
    fn emit(
        &self,
        g: &mut Inner,
        r: &ResourceDef,
        kind: EventType,
        mut obj: Value,
        prev: Option<Value>,
    ) -> Value {
        g.rv += 1;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(g.rv.to_string()));
        let key = Self::key(
            r,
            meta_str(&obj, "namespace").unwrap_or(""),
            meta_str(&obj, "name").unwrap_or(""),
        );
        if kind == EventType::Deleted {
            g.objects.remove(&key);
        } else {
            g.objects.insert(key, obj.clone());
        }
        g.history.push_back(WatchRecord {
            rv: g.rv,
            res: resources::storage_key(r),
            kind,
            obj: obj.clone(),
            prev,
        });
        while g.history.len() > g.history_limit {
            if let Some(old) = g.history.pop_front() {
                g.compacted = old.rv;
            }
        }
        self.notify.send_replace(g.rv);
        if kind == EventType::Deleted && r.namespaced {
            let ns = meta_str(&obj, "namespace").unwrap_or("").to_string();
            self.reap_namespace(g, &ns);
        }
        obj
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

    /// Fill `kind`/`apiVersion` and check the body names this resource.
    fn check_type(r: &ResourceDef, obj: &mut Value) -> Result<(), ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        let api_version = r.api_version();
        match obj.get("apiVersion").and_then(Value::as_str) {
            None => obj["apiVersion"] = json!(api_version),
            Some(v) if v == api_version => {}
            Some(v) => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({v}) does not match the expected API version ({api_version})"
                )));
            }
        }
        match obj.get("kind").and_then(Value::as_str) {
            None => obj["kind"] = json!(r.kind),
            Some(k) if k == r.kind => {}
            Some(k) => {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    r.kind
                )));
            }
        }
        Ok(())
    }

    /// POST: create an object in `ns` (`""` for cluster-scoped resources).
    pub fn create(&self, r: &ResourceDef, ns: &str, mut obj: Value) -> Result<Value, ApiError> {
        Self::check_type(r, &mut obj)?;
        let mut g = self.lock();
        let m = meta_mut(&mut obj);
        if r.namespaced {
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
        } else {
            m.remove("namespace");
        }
        let name = match m.get("name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match m.get("generateName").and_then(Value::as_str) {
                Some(prefix) if !prefix.is_empty() => {
                    let suffix: String = (0..5)
                        .map(|_| {
                            let c = rand::random_range(0..36u8);
                            (if c < 10 { b'0' + c } else { b'a' + c - 10 }) as char
                        })
                        .collect();
                    format!("{prefix}{suffix}")
                }
                _ => {
                    return Err(ApiError::invalid(
                        r.group,
                        r.kind,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ));
                }
            },
        };
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
        let key = Self::key(r, ns, &name);
        if r.plural != "namespaces" || !r.group.is_empty() {
            Self::check_namespace(&g, r, ns, &name)?;
        }
        if g.objects.contains_key(&key) {
            return Err(ApiError::already_exists(r.group, r.plural, &name));
        }
        // Status on create: dropped for pods and custom resources (their
        // strategies reset it), kept otherwise.
        if r.is_pod() {
            obj["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
            let spec = obj
                .get_mut("spec")
                .and_then(Value::as_object_mut)
                .ok_or_else(|| {
                    ApiError::invalid(r.group, r.kind, &name, "spec.containers: Required value")
                })?;
            for (k, v) in [
                ("restartPolicy", json!("Always")),
                ("terminationGracePeriodSeconds", json!(30)),
                ("dnsPolicy", json!("ClusterFirst")),
                ("schedulerName", json!("default-scheduler")),
            ] {
                spec.entry(k).or_insert(v);
            }
        } else if r.custom && r.status_subresource {
            if let Some(o) = obj.as_object_mut() {
                o.remove("status");
            }
        } else if r.plural == "namespaces" && r.group.is_empty() {
            obj["status"] = json!({"phase": "Active"});
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            let m = meta_mut(&mut obj);
            let labels = m.entry("labels").or_insert_with(|| json!({}));
            labels["kubernetes.io/metadata.name"] = json!(name);
        }
        Ok(self.emit(&mut g, r, EventType::Added, obj, None))
    }

    /// GET one object.
    pub fn get(&self, r: &ResourceDef, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.lock()
            .objects
            .get(&Self::key(r, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(r.group, r.plural, name))
    }

    /// The objects of `r` in `ns` (all namespaces when `None`) that match
    /// the selectors, with the current resourceVersion — read atomically.
    pub fn list(
        &self,
        r: &ResourceDef,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> (Vec<Value>, u64) {
        let g = self.lock();
        let res = resources::storage_key(r);
        let items = g
            .objects
            .iter()
            .filter(|((k, n, _), _)| *k == res && ns.is_none_or(|x| x == n))
            .filter(|(_, o)| labels.matches(o) && fields.matches(r, o))
            .map(|(_, o)| o.clone())
            .collect();
        (items, g.rv)
    }

    /// Keep the rest of a paginated list for a `continue` token.
    pub fn save_continue(&self, rv: u64, rest: Vec<Value>) -> String {
        let mut g = self.lock();
        g.next_continue += 1;
        let token = format!("testkit-{}-{rv}", g.next_continue);
        g.continues.insert(token.clone(), (rv, rest));
        token
    }

    /// Take the rest of a paginated list; 410 if it was compacted away.
    pub fn take_continue(&self, token: &str) -> Result<(u64, Vec<Value>), ApiError> {
        self.lock().continues.remove(token).ok_or_else(|| {
            ApiError::expired(
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
            )
        })
    }

    /// The history records after `rv` (all of them, every resource), or
    /// 410 Gone if some were compacted away.
    pub fn events_after(&self, rv: u64) -> Result<Vec<WatchRecord>, ApiError> {
        let g = self.lock();
        if rv < g.compacted {
            return Err(ApiError::expired(format!(
                "too old resource version: {rv} ({})",
                g.compacted + 1
            )));
        }
        let start = g.history.partition_point(|e| e.rv <= rv);
        Ok(g.history.range(start..).cloned().collect())
    }

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
        let old = g
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(r.group, r.plural, name))?;
        let mut new = f(&old)?;
        Self::check_type(r, &mut new)?;
        let rules = update::Rules {
            r,
            ns,
            name,
            endpoint,
            verb,
        };
        rules.check_name(&new)?;
        rules.check_preconditions(&old, &new)?;
        rules.reset_for_endpoint(&old, &mut new);
        update::keep_system_metadata(&old, &mut new);
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

    fn delete_locked(
        &self,
        g: &mut Inner,
        r: &ResourceDef,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Value, ApiError> {
        let key = Self::key(r, ns, name);
        let old = g
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(r.group, r.plural, name))?;
        let uid = meta_str(&old, "uid").unwrap_or("");
        if let Some(u) = &opts.uid
            && u != uid
        {
            return Err(ApiError::conflict(
                r.group,
                r.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {u}, UID in object meta: {uid}"
                ),
            ));
        }
        let rv = meta_str(&old, "resourceVersion").unwrap_or("");
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
        if r.group.is_empty() && r.plural == "namespaces" {
            return self.delete_namespace(g, r, old);
        }
        // Graceful deletion of pods: a pod bound to a node and not finished
        // waits for its kubelet (the test) unless the grace period is 0.
        let mut grace = 0;
        if r.is_pod() {
            let bound = old
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            let phase = old.pointer("/status/phase").and_then(Value::as_str);
            let finished = matches!(phase, Some("Succeeded" | "Failed"));
            grace = opts.grace.unwrap_or_else(|| {
                old.pointer("/spec/terminationGracePeriodSeconds")
                    .and_then(Value::as_i64)
                    .unwrap_or(30)
            });
            if !bound || finished {
                grace = 0;
            }
            grace = grace.max(0);
            if let Some(cur) = meta(&old)
                .get("deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
            {
                // May only be shortened.
                grace = grace.min(cur);
            }
        }
        if grace == 0 && finalizers_empty(&old) {
            return Ok(self.emit(g, r, EventType::Deleted, old, None));
        }
        let mut new = old.clone();
        let when = (Utc::now() + chrono::Duration::seconds(grace))
            .to_rfc3339_opts(SecondsFormat::Secs, true);
        let m = meta_mut(&mut new);
        if !m.contains_key("deletionTimestamp") || r.is_pod() {
            m.insert("deletionTimestamp".into(), json!(when));
        }
        m.insert("deletionGracePeriodSeconds".into(), json!(grace));
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
    fn reap_namespace(&self, g: &mut Inner, ns: &str) -> Option<Value> {
        let key = (String::from("/namespaces"), String::new(), ns.to_string());
        let ns_obj = g.objects.get(&key)?.clone();
        meta(&ns_obj).get("deletionTimestamp")?;
        if g.objects.keys().any(|(_, n, _)| n == ns) {
            return None;
        }
        let r = resources::find("", "v1", "namespaces").expect("namespaces served");
        Some(self.emit(g, r, EventType::Deleted, ns_obj, None))
    }

    /// Write `obj` as given (as the kubelet or a controller outside the API
    /// would): create or replace, no endpoint rules, no preconditions.
    /// System metadata (uid, creationTimestamp) is filled if missing.
    pub fn put_raw(&self, r: &ResourceDef, mut obj: Value) -> Result<Value, ApiError> {
        Self::check_type(r, &mut obj)?;
        let mut g = self.lock();
        let ns = meta_str(&obj, "namespace").unwrap_or("").to_string();
        let name = meta_str(&obj, "name").unwrap_or("").to_string();
        if name.is_empty() {
            return Err(ApiError::bad_request(
                "set_object: metadata.name is required",
            ));
        }
        if r.namespaced && ns.is_empty() {
            return Err(ApiError::bad_request(
                "set_object: metadata.namespace is required",
            ));
        }
        let key = Self::key(r, &ns, &name);
        let old = g.objects.get(&key).cloned();
        let m = meta_mut(&mut obj);
        if let Some(o) = &old {
            for f in ["uid", "creationTimestamp"] {
                if !m.contains_key(f)
                    && let Some(v) = meta(o).get(f)
                {
                    m.insert(f.into(), v.clone());
                }
            }
        }
        m.entry("uid").or_insert_with(|| json!(new_uid()));
        m.entry("creationTimestamp").or_insert_with(|| json!(now()));
        m.remove("resourceVersion");
        Ok(match old {
            Some(o) => self.emit(&mut g, r, EventType::Modified, obj, Some(o)),
            None => self.emit(&mut g, r, EventType::Added, obj, None),
        })
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods() -> &'static ResourceDef {
        resources::find("", "v1", "pods").unwrap()
    }

    fn pod(name: &str) -> Value {
        json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
    }

    #[test]
    fn rv_is_global_and_noop_writes_do_not_bump_it() {
        let s = Store::new(100);
        let base = s.resource_version();
        let p = s.create(pods(), "default", pod("a")).unwrap();
        assert_eq!(s.resource_version(), base + 1);
        let same = s
            .update(pods(), "default", "a", p.clone(), Endpoint::Main)
            .unwrap();
        assert_eq!(same, p);
        assert_eq!(s.resource_version(), base + 1);
    }

    #[test]
    fn history_is_bounded_and_compaction_is_410() {
        let s = Store::new(2);
        for n in ["a", "b", "c"] {
            s.create(pods(), "default", pod(n)).unwrap();
        }
        let rv = s.resource_version();
        assert!(s.events_after(rv - 2).is_ok());
        assert_eq!(s.events_after(rv - 3).unwrap_err().code, 410);
        s.compact();
        assert_eq!(s.events_after(rv - 1).unwrap_err().code, 410);
        assert!(s.events_after(rv).unwrap().is_empty());
    }

    #[test]
    fn create_needs_the_namespace() {
        let s = Store::new(10);
        let e = s.create(pods(), "nope", pod("a")).unwrap_err();
        assert_eq!(e.message, "namespaces \"nope\" not found");
    }
}
