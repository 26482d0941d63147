//! The verbs on a routed resource: get, list (with pagination and tables),
//! watch, create, update, patch and delete, each over the store.

use std::collections::HashMap;
use std::sync::Arc;

use http::Response;
use serde_json::{Value, json};

use super::routing::Target;
use super::{Req, Shared, watch};
use crate::error::ApiError;
use crate::patch::{self, PatchType};
use crate::resources::ResourceDef;
use crate::response::{Body, json_response};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{DeleteOpts, Endpoint};
use crate::table;

/// Serve `verb` (authorized) on the target.
pub(super) fn serve(
    shared: &Arc<Shared>,
    req: &Req,
    t: &Target,
    verb: &str,
    end_watch_after: Option<usize>,
) -> Result<Response<Body>, ApiError> {
    let r = t.r;
    let store = &shared.store;
    let ns = t.ns.as_deref().unwrap_or_default();
    let name = t.name.as_deref().unwrap_or_default();
    let endpoint = if t.sub.as_deref() == Some("status") {
        Endpoint::Status
    } else {
        Endpoint::Main
    };
    let as_table = req.accept.contains("as=Table");
    match verb {
        "get" => {
            let obj = store.get(r, ns, name)?;
            Ok(json_response(
                200,
                &if as_table {
                    table::table(r, &[obj], None)
                } else {
                    obj
                },
            ))
        }
        "list" => list(shared, r, t.ns.as_deref(), req, as_table),
        "watch" => watch::watch_stream(
            shared.clone(),
            r,
            t.ns.clone(),
            req,
            &watch_fields(req, t.name.as_deref()),
            end_watch_after,
            as_table,
        ),
        "create" => {
            let body = parse_body(&req.body)?;
            let obj = store.create(r, ns, body)?;
            Ok(json_response(201, &obj))
        }
        "update" => {
            let body = parse_body(&req.body)?;
            Ok(json_response(
                200,
                &store.update(r, ns, name, body, endpoint)?,
            ))
        }
        "patch" => {
            let pt = PatchType::from_content_type(r, &req.content_type)?;
            let obj = store.patch(r, ns, name, endpoint, |cur| {
                patch::apply(r, pt, cur, &req.body)
            })?;
            Ok(json_response(200, &obj))
        }
        "delete" => {
            let opts = delete_opts(req)?;
            Ok(json_response(200, &store.delete(r, ns, name, &opts)?))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// The field selector of a watch; watching one object by its path
/// (`…/pods/{name}?watch`) selects it by name as well.
fn watch_fields(req: &Req, name: Option<&str>) -> String {
    let mut fields = req.q.get("fieldSelector").cloned().unwrap_or_default();
    if let Some(name) = name {
        if !fields.is_empty() {
            fields.push(',');
        }
        fields.push_str(&format!("metadata.name={name}"));
    }
    fields
}

fn parse_body(b: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(b).map_err(|e| {
        ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type JSON): {e}"
        ))
    })
}

fn delete_opts(req: &Req) -> Result<DeleteOpts, ApiError> {
    let mut opts = DeleteOpts::default();
    if !req.body.is_empty() {
        let b = parse_body(&req.body)?;
        opts.grace = b.get("gracePeriodSeconds").and_then(Value::as_i64);
        opts.uid = b
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
        opts.rv = b
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    if let Some(g) = req.q.get("gracePeriodSeconds") {
        opts.grace = Some(
            g.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds: {g}")))?,
        );
    }
    Ok(opts)
}

fn selectors(
    r: &ResourceDef,
    q: &HashMap<String, String>,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let l = LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?;
    let f = FieldSelector::parse(r, q.get("fieldSelector").map(String::as_str).unwrap_or(""))?;
    Ok((l, f))
}

/// A list at an exact version other than the current one cannot be served:
/// 410 if it was compacted away, else 400 (testkit keeps no past states).
fn check_exact_version(
    shared: &Shared,
    q: &HashMap<String, String>,
    rv: u64,
) -> Result<(), ApiError> {
    if q.get("resourceVersionMatch").map(String::as_str) == Some("Exact")
        && let Some(v) = q.get("resourceVersion")
        && let Ok(v) = v.parse::<u64>()
        && v != rv
    {
        if v < shared.store.compacted() {
            return Err(ApiError::expired(format!(
                "too old resource version: {v} ({})",
                shared.store.compacted() + 1
            )));
        }
        return Err(ApiError::bad_request(
            "testkit: resourceVersionMatch=Exact for a past version is not supported",
        ));
    }
    Ok(())
}

fn list(
    shared: &Shared,
    r: &ResourceDef,
    ns: Option<&str>,
    req: &Req,
    as_table: bool,
) -> Result<Response<Body>, ApiError> {
    let limit = match req.q.get("limit") {
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit: {l}")))?,
        None => 0,
    };
    let (items, rv) = match req.q.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let (rv, items) = shared.store.take_continue(token)?;
            (items, rv)
        }
        None => {
            let (l, f) = selectors(r, &req.q)?;
            let (items, rv) = shared.store.list(r, ns, &l, &f);
            check_exact_version(shared, &req.q, rv)?;
            (items, rv)
        }
    };
    let mut meta = json!({"resourceVersion": rv.to_string()});
    let items = if limit > 0 && items.len() > limit {
        let mut items = items;
        let rest = items.split_off(limit);
        meta["remainingItemCount"] = json!(rest.len());
        meta["continue"] = json!(shared.store.save_continue(rv, rest));
        items
    } else {
        items
    };
    if as_table {
        return Ok(json_response(200, &table::table(r, &items, Some(meta))));
    }
    Ok(json_response(
        200,
        &json!({
            "kind": format!("{}List", r.kind),
            "apiVersion": r.api_version(),
            "metadata": meta,
            "items": items,
        }),
    ))
}
