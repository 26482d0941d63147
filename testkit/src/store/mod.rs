//! Object storage with etcd-like resourceVersions and a bounded watch
//! history.
//!
//! One global counter is bumped by every write; each write appends a
//! [`WatchRecord`] to the history, which keeps at most `history_limit`
//! records (older ones are *compacted*: a watch from a version before the
//! compaction point gets 410 Gone). Objects are stored as JSON.
//!
//! The rules of each kind of write have a module of their own: `create`,
//! `update` (PUT, PATCH, status) and `delete`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use chrono::{SecondsFormat, Utc};
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::error::ApiError;
use crate::resources::{self, ResourceDef};
use crate::selectors::{FieldSelector, LabelSelector};

mod create;
mod delete;
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

impl Inner {
    /// The stored object, or the apiserver's 404 for it.
    fn existing(&self, r: &ResourceDef, key: &ObjKey, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(r.group, r.plural, name))
    }
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

    /// GET one object.
    pub fn get(&self, r: &ResourceDef, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.lock().existing(r, &Self::key(r, ns, name), name)
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
