//! Routing: from a request's path and method to a resource, a verb and an
//! authorization decision; the discovery, OpenAPI and health paths on the way.

use std::sync::Arc;

use http::{Method, Response};

use super::{Req, Shared, is_true, verbs};
use crate::auth::{Attributes, User};
use crate::discovery;
use crate::error::ApiError;
use crate::openapi;
use crate::resources::{self, ResourceDef};
use crate::response::{Body, full, json_response};

/// Discovery, OpenAPI and health: the GETs that name no resource.
fn non_resource(shared: &Shared, segs: &[&str]) -> Option<Response<Body>> {
    let doc = match segs {
        ["version"] => Some(discovery::version()),
        ["api"] => Some(discovery::api(&shared.address)),
        ["apis"] => Some(discovery::apis()),
        ["api", v] => discovery::resource_list("", v),
        ["apis", g] => discovery::group(g),
        ["apis", g, v] => discovery::resource_list(g, v),
        ["openapi", "v3"] => Some(openapi::index()),
        ["openapi", "v3", rest @ ..] => openapi::document(&rest.join("/")),
        ["healthz" | "readyz" | "livez"] => return Some(Response::new(full("ok"))),
        _ => None,
    };
    doc.map(|d| json_response(200, &d))
}

/// The authorization verb of a request, as the apiserver's request info names it.
fn verb_of(method: &Method, named: bool, watch: bool) -> Result<&'static str, ApiError> {
    Ok(match (method, named) {
        (&Method::GET, _) if watch => "watch",
        (&Method::GET, false) => "list",
        (&Method::GET, true) => "get",
        (&Method::POST, false) => "create",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => return Err(ApiError::method_not_allowed()),
    })
}

/// A request for a resource, after routing.
pub(super) struct Target {
    pub r: &'static ResourceDef,
    pub ns: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
}

fn resolve(segs: &[&str]) -> Result<Option<Target>, ApiError> {
    let (group, version, rest) = match segs {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Ok(None),
    };
    if rest.is_empty() {
        return Ok(None);
    }
    let namespaced_path = rest[0] == "namespaces"
        && rest.len() >= 3
        && resources::find(group, version, rest[2]).is_some_and(|r| r.namespaced);
    let (ns, rest) = if namespaced_path {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    let Some(r) = resources::find(group, version, rest[0]) else {
        return Err(ApiError::no_route());
    };
    if !r.namespaced && ns.is_some() {
        return Err(ApiError::no_route());
    }
    let name = rest.get(1).map(|s| s.to_string());
    let sub = rest.get(2).map(|s| s.to_string());
    if rest.len() > 3 {
        return Err(ApiError::no_route());
    }
    if let Some(s) = &sub
        && !(s == "status" && r.status_subresource)
    {
        return Err(ApiError::no_route());
    }
    if r.namespaced && ns.is_none() && name.is_some() {
        return Err(ApiError::no_route());
    }
    Ok(Some(Target { r, ns, name, sub }))
}

/// 403 unless `user` may `verb` the target.
fn authorize(shared: &Shared, user: &User, t: &Target, verb: &str) -> Result<(), ApiError> {
    let ns = t.ns.as_deref().unwrap_or_default();
    let name = t.name.as_deref().unwrap_or_default();
    let sub = t.sub.as_deref().unwrap_or_default();
    let attrs = Attributes {
        verb,
        group: t.r.group,
        resource: t.r.plural,
        subresource: sub,
        namespace: ns,
        name,
    };
    if shared.auth.authorize(user, &attrs) {
        return Ok(());
    }
    Err(ApiError::forbidden(
        &user.name, verb, t.r.group, t.r.plural, sub, ns, name,
    ))
}

/// A non-exec API request: a path that names no resource, or a resource
/// request that is authorized and then served by its verb.
pub(super) async fn route(
    shared: &Arc<Shared>,
    req: &Req,
    end_watch_after: Option<usize>,
) -> Result<Response<Body>, ApiError> {
    let segs: Vec<&str> = req
        .path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    if req.method == Method::GET
        && let Some(response) = non_resource(shared, &segs)
    {
        return Ok(response);
    }
    let Some(t) = resolve(&segs)? else {
        return Err(ApiError::no_route());
    };
    let verb = verb_of(&req.method, t.name.is_some(), is_true(&req.q, "watch"))?;
    authorize(shared, &req.user, &t, verb)?;
    if req.q.contains_key("dryRun") {
        return Err(ApiError::bad_request(
            "testkit: dryRun is not supported (the real server would evaluate the request without persisting it)",
        ));
    }
    verbs::serve(shared, req, &t, verb, end_watch_after)
}
