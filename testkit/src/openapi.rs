//! A minimal OpenAPI v3 (`/openapi/v3`, `/openapi/v3/<group-version>`).
//!
//! kubectl (1.27+) downloads it before `create`/`apply`/`replace` to learn
//! whether the server validates fields itself (`fieldValidation` on the
//! PATCH operation of the kind). testkit declares that parameter, so kubectl
//! sends `fieldValidation=Strict` instead of validating client-side. The
//! documents carry paths and operations only, no schemas: `kubectl explain`
//! does not work.

use serde_json::{Map, Value, json};

use crate::resources::{self, RESOURCES};

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: the index of group-version documents.
pub fn index() -> Value {
    let mut paths = Map::new();
    let mut gvs = vec![("", "v1")];
    gvs.extend(resources::groups());
    for (g, v) in gvs {
        let p = gv_path(g, v);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=testkit")}),
        );
    }
    json!({"paths": paths})
}

/// `/openapi/v3/api/v1`, `/openapi/v3/apis/<group>/<version>`.
pub fn document(gv: &str) -> Option<Value> {
    let mut paths = Map::new();
    let field_validation =
        json!({"name": "fieldValidation", "in": "query", "schema": {"type": "string"}});
    for r in RESOURCES
        .iter()
        .filter(|r| gv_path(r.group, r.version) == gv)
    {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let base = if r.namespaced {
            format!("/{gv}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("/{gv}/{}", r.plural)
        };
        let op = |id: &str| {
            json!({
                "operationId": format!("{id}{}", r.kind),
                "parameters": [field_validation.clone()],
                "x-kubernetes-group-version-kind": gvk.clone(),
                "responses": {"200": {"description": "OK"}},
            })
        };
        paths.insert(
            base.clone(),
            json!({"get": op("list"), "post": op("create")}),
        );
        paths.insert(
            format!("{base}/{{name}}"),
            json!({"get": op("read"), "put": op("replace"), "patch": op("patch"), "delete": op("delete")}),
        );
        if r.status_subresource {
            paths.insert(
                format!("{base}/{{name}}/status"),
                json!({"get": op("readStatus"), "put": op("replaceStatus"), "patch": op("patchStatus")}),
            );
        }
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (testkit)", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}
