//! Strategic merge patch, for the built-in schemas testkit serves.
//!
//! Only the list merge keys that podprobe touches are known (see
//! [`merge_strategy`]); every other list is replaced and every map is merged
//! as in RFC 7386, which is what the real server does for fields without a
//! `patchStrategy`. Directives: `$patch: replace|delete|merge` on maps and
//! list elements, `$deleteFromPrimitiveList/<field>`, `$retainKeys`, and
//! `$setElementOrder/<field>` (tolerated: the order of the merged list is the
//! original order with new elements appended, and the directive is dropped).

use serde_json::{Map, Value};

use crate::error::ApiError;

/// How a list field at a schema path is patched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStrategy {
    /// Replace the whole list (atomic; the default).
    Replace,
    /// Merge elements that have equal values under this key.
    MergeByKey(&'static str),
    /// A set of scalars: union (`metadata.finalizers`).
    MergePrimitives,
}

/// The strategy for the list at `path` (map keys from the object root;
/// list elements do not add a segment). `kind` is the object's kind.
pub fn merge_strategy(kind: &str, path: &[&str]) -> ListStrategy {
    use ListStrategy::*;
    match path {
        ["metadata", "finalizers"] => return MergePrimitives,
        ["metadata", "ownerReferences"] => return MergeByKey("uid"),
        _ => {}
    }
    match (kind, path) {
        (
            "Pod",
            [
                "spec",
                "containers" | "initContainers" | "ephemeralContainers",
            ],
        ) => MergeByKey("name"),
        (
            "Pod",
            [
                "spec",
                "containers" | "initContainers" | "ephemeralContainers",
                "ports",
            ],
        ) => MergeByKey("containerPort"),
        (
            "Pod",
            [
                "spec",
                "containers" | "initContainers" | "ephemeralContainers",
                "env" | "volumeMounts",
            ],
        ) => {
            if path[2] == "env" {
                MergeByKey("name")
            } else {
                MergeByKey("mountPath")
            }
        }
        ("Pod", ["spec", "volumes"]) => MergeByKey("name"),
        ("Pod", ["spec", "imagePullSecrets"]) => MergeByKey("name"),
        ("Pod", ["status", "conditions"]) => MergeByKey("type"),
        ("Pod", ["status", "podIPs" | "hostIPs"]) => MergeByKey("ip"),
        ("Node", ["status", "conditions"]) => MergeByKey("type"),
        ("Node", ["status", "addresses"]) => MergeByKey("type"),
        ("Node", ["spec", "podCIDRs"]) => MergePrimitives,
        ("Namespace", ["status", "conditions"]) => MergeByKey("type"),
        _ => Replace,
    }
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(msg)
}

/// Apply a strategic merge patch to `original` (an object of `kind`).
pub fn apply(kind: &str, original: &Value, patch: &Value) -> Result<Value, ApiError> {
    let Value::Object(p) = patch else {
        return Err(bad("strategic merge patch must be a JSON object"));
    };
    let orig = original.as_object().cloned().unwrap_or_default();
    match merge_map(kind, &mut Vec::new(), orig, p)? {
        Some(m) => Ok(Value::Object(m)),
        None => Ok(Value::Object(Map::new())),
    }
}

/// Merge a patch map into an original map. `None` means "delete this map".
fn merge_map(
    kind: &str,
    path: &mut Vec<String>,
    mut orig: Map<String, Value>,
    patch: &Map<String, Value>,
) -> Result<Option<Map<String, Value>>, ApiError> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("delete") => return Ok(None),
        Some("replace") => {
            let mut out = patch.clone();
            out.remove("$patch");
            strip_directives(&mut out);
            return Ok(Some(out));
        }
        Some("merge") | None => {}
        Some(other) => return Err(bad(format!("unknown patch type: {other}"))),
    }
    if let Some(Value::Array(keep)) = patch.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        orig.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, v) in patch {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let Value::Array(del) = v else {
                return Err(bad(format!("{k} must be a list")));
            };
            if let Some(Value::Array(list)) = orig.get_mut(field) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        if v.is_null() {
            orig.remove(k);
            continue;
        }
        path.push(k.clone());
        let merged = match (orig.remove(k), v) {
            (Some(Value::Object(o)), Value::Object(pm)) => {
                merge_map(kind, path, o, pm)?.map(Value::Object)
            }
            (_, Value::Object(pm)) => merge_map(kind, path, Map::new(), pm)?.map(Value::Object),
            (o, Value::Array(pl)) => {
                let ol = match o {
                    Some(Value::Array(ol)) => ol,
                    _ => Vec::new(),
                };
                let segs: Vec<&str> = path.iter().map(String::as_str).collect();
                Some(Value::Array(merge_list(
                    kind,
                    path,
                    merge_strategy(kind, &segs),
                    ol,
                    pl,
                )?))
            }
            (_, scalar) => Some(scalar.clone()),
        };
        path.pop();
        if let Some(m) = merged {
            orig.insert(k.clone(), m);
        }
    }
    Ok(Some(orig))
}

fn merge_list(
    kind: &str,
    path: &mut Vec<String>,
    strategy: ListStrategy,
    mut orig: Vec<Value>,
    patch: &[Value],
) -> Result<Vec<Value>, ApiError> {
    match strategy {
        ListStrategy::Replace => {
            let mut out = patch.to_vec();
            for v in &mut out {
                if let Value::Object(m) = v {
                    strip_directives(m);
                }
            }
            Ok(out)
        }
        ListStrategy::MergePrimitives => {
            for v in patch {
                if !orig.contains(v) {
                    orig.push(v.clone());
                }
            }
            Ok(orig)
        }
        ListStrategy::MergeByKey(key) => merge_by_key(kind, path, key, orig, patch),
    }
}

/// A list of objects merged element by element: patch elements meet the
/// original elements with the same value under `key`.
fn merge_by_key(
    kind: &str,
    path: &mut Vec<String>,
    key: &str,
    mut orig: Vec<Value>,
    patch: &[Value],
) -> Result<Vec<Value>, ApiError> {
    // `[{"$patch": "replace"}, ...]` replaces the whole list.
    if patch
        .iter()
        .any(|e| e.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return Ok(patch
            .iter()
            .filter(|e| e.get("$patch").is_none())
            .cloned()
            .collect());
    }
    let server_order: Vec<Value> = orig.iter().filter_map(|o| o.get(key).cloned()).collect();
    for pe in patch {
        merge_element(kind, path, key, &mut orig, pe)?;
    }
    let patch_order: Vec<&Value> = patch.iter().filter_map(|p| p.get(key)).collect();
    Ok(element_order(orig, key, &patch_order, &server_order))
}

/// One patch element into the list: deleted (`$patch: delete`), merged into
/// the element with its key (which goes if the merge deletes it), or appended.
fn merge_element(
    kind: &str,
    path: &mut Vec<String>,
    key: &str,
    orig: &mut Vec<Value>,
    pe: &Value,
) -> Result<(), ApiError> {
    let Value::Object(pm) = pe else {
        return Err(bad(format!(
            "strategic merge patch: element of {} is not an object",
            path.join(".")
        )));
    };
    let Some(kv) = pm.get(key) else {
        return Err(bad(format!(
            "map: {pm:?} does not contain declared merge key: {key}"
        )));
    };
    let pos = orig.iter().position(|o| o.get(key) == Some(kv));
    let delete = pm.get("$patch").and_then(Value::as_str) == Some("delete");
    match (pos, delete) {
        (Some(i), true) => {
            orig.remove(i);
        }
        (None, true) => {}
        (Some(i), false) => {
            let o = match orig[i].take() {
                Value::Object(o) => o,
                _ => Map::new(),
            };
            match merge_map(kind, path, o, pm)? {
                Some(m) => orig[i] = Value::Object(m),
                None => {
                    orig.remove(i);
                }
            }
        }
        (None, false) => {
            if let Some(m) = merge_map(kind, path, Map::new(), pm)? {
                orig.push(Value::Object(m));
            }
        }
    }
    Ok(())
}

/// The order kube-apiserver gives a merged list (apimachinery's `normalizeElementOrder` and
/// `mergeSortedSlice`): the patch's items in the patch's order, the server-only items in
/// their order, interleaved: a server-only item goes first only while it stood before the
/// patch item in the live list; an item new to the list goes before the server-only items
/// still waiting. So new conditions come before the kubelet's unless the patch also names an
/// existing one that follows them.
fn element_order(
    merged: Vec<Value>,
    key: &str,
    patch_order: &[&Value],
    server_order: &[Value],
) -> Vec<Value> {
    let position = |list: &[&Value], v: &Value| list.iter().position(|k| Some(*k) == v.get(key));
    let (mut from_patch, server_only): (Vec<Value>, Vec<Value>) = merged
        .into_iter()
        .partition(|v| position(patch_order, v).is_some());
    from_patch.sort_by_key(|v| position(patch_order, v));
    let server_index = |v: &Value| server_order.iter().position(|k| Some(k) == v.get(key));
    let mut out = Vec::with_capacity(from_patch.len() + server_only.len());
    let (mut left, mut right) = (
        server_only.into_iter().peekable(),
        from_patch.into_iter().peekable(),
    );
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (Some(l), Some(r)) => {
                matches!((server_index(l), server_index(r)), (Some(li), Some(ri)) if li < ri)
            }
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        out.extend(if take_left { left.next() } else { right.next() });
    }
    out
}

fn strip_directives(m: &mut Map<String, Value>) {
    m.retain(|k, _| !k.starts_with('$'));
    for v in m.values_mut() {
        match v {
            Value::Object(o) => strip_directives(o),
            Value::Array(a) => {
                for e in a {
                    if let Value::Object(o) = e {
                        strip_directives(o);
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({
            "metadata": {"name": "p", "labels": {"a": "1"}, "finalizers": ["x"]},
            "spec": {"containers": [
                {"name": "app", "image": "i:1", "ports": [{"containerPort": 80, "name": "http"}],
                 "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                {"name": "side", "image": "s:1"}
            ]},
            "status": {"conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "ContainersReady", "status": "False"},
                {"type": "PodScheduled", "status": "True"}
            ], "containerStatuses": [{"name": "app"}, {"name": "side"}]}
        })
    }

    #[test]
    fn one_condition_keeps_the_others() {
        let out = apply(
            "Pod",
            &pod(),
            &json!({"status": {"conditions": [{"type": "Ready", "status": "True"},
                                               {"type": "game.kruise.io/healthy", "status": "True"}]}}),
        )
        .unwrap();
        let conds = out["status"]["conditions"].as_array().unwrap();
        assert_eq!(conds.len(), 4);
        // kube-apiserver's order (testkit/tests/differential.rs): the patch's items in its
        // order, a new one before the server-only items that followed the last named one.
        let types: Vec<&str> = conds.iter().map(|c| c["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "Ready",
                "game.kruise.io/healthy",
                "ContainersReady",
                "PodScheduled"
            ]
        );
        assert_eq!(conds[0], json!({"type": "Ready", "status": "True"}));
    }

    #[test]
    fn lists_without_strategy_are_replaced() {
        let out = apply(
            "Pod",
            &pod(),
            &json!({"status": {"containerStatuses": [{"name": "only"}]}}),
        )
        .unwrap();
        assert_eq!(
            out["status"]["containerStatuses"],
            json!([{"name": "only"}])
        );
    }

    #[test]
    fn containers_by_name_ports_by_port_env_by_name() {
        let out = apply(
            "Pod",
            &pod(),
            &json!({"spec": {"containers": [{"name": "app", "image": "i:2",
                "ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 443}],
                "env": [{"name": "B", "value": "3"}, {"name": "A", "$patch": "delete"}]}]}}),
        )
        .unwrap();
        let c = &out["spec"]["containers"];
        assert_eq!(c.as_array().unwrap().len(), 2);
        assert_eq!(c[0]["image"], "i:2");
        assert_eq!(
            c[0]["ports"],
            json!([{"containerPort": 80, "name": "http", "protocol": "TCP"}, {"containerPort": 443}])
        );
        assert_eq!(c[0]["env"], json!([{"name": "B", "value": "3"}]));
        assert_eq!(c[1]["name"], "side");
    }

    #[test]
    fn delete_directive_and_null_and_set_element_order() {
        let out = apply(
            "Pod",
            &pod(),
            &json!({
                "metadata": {"labels": {"a": null, "b": "2"}},
                "spec": {"$setElementOrder/containers": [{"name": "side"}, {"name": "app"}],
                         "containers": [{"name": "side", "$patch": "delete"}]},
                "status": {"$setElementOrder/conditions": [{"type": "Ready"}],
                           "conditions": [{"type": "PodScheduled", "$patch": "delete"}]}
            }),
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"b": "2"}));
        assert_eq!(out["spec"]["containers"].as_array().unwrap().len(), 1);
        assert_eq!(out["status"]["conditions"].as_array().unwrap().len(), 2);
        assert!(out["spec"].get("$setElementOrder/containers").is_none());
    }

    #[test]
    fn finalizers_union_and_delete_from_primitive_list() {
        let out = apply(
            "Pod",
            &pod(),
            &json!({"metadata": {"finalizers": ["y", "x"]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["x", "y"]));
        let out = apply(
            "Pod",
            &out,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["y"]));
    }

    #[test]
    fn map_replace_directive_and_retain_keys() {
        let out = apply(
            "Pod",
            &pod(),
            &json!({"metadata": {"labels": {"$patch": "replace", "z": "9"}}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"z": "9"}));
        let out = apply(
            "Pod",
            &pod(),
            &json!({"metadata": {"$retainKeys": ["name"], "name": "p"}}),
        )
        .unwrap();
        assert_eq!(out["metadata"], json!({"name": "p"}));
    }

    #[test]
    fn missing_merge_key_is_an_error() {
        let e = apply(
            "Pod",
            &pod(),
            &json!({"status": {"conditions": [{"status": "True"}]}}),
        )
        .unwrap_err();
        assert_eq!(e.code, 400);
    }
}
