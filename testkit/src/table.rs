//! The `meta.k8s.io/v1` Table form that `kubectl get` asks for
//! (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`).
//!
//! Pods get kubectl's usual columns; everything else gets Name and Age, like
//! a custom resource without printer columns.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::resources::ResourceDef;

fn age(obj: &Value) -> String {
    let Some(ts) = obj
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
    else {
        return "<unknown>".into();
    };
    let secs = (Utc::now() - ts.with_timezone(&Utc)).num_seconds().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 3600 * 3 => format!("{}m", s / 60),
        s if s < 86400 * 2 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn col(name: &str, ty: &str, priority: u8) -> Value {
    json!({"name": name, "type": ty, "format": if name == "Name" { "name" } else { "" },
           "description": name, "priority": priority})
}

fn pod_cells(o: &Value) -> Vec<Value> {
    let name = o.pointer("/metadata/name").cloned().unwrap_or_default();
    let total = o
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let statuses = o
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ready = statuses
        .iter()
        .filter(|c| c.get("ready").and_then(Value::as_bool) == Some(true))
        .count();
    let restarts: i64 = statuses
        .iter()
        .filter_map(|c| c.get("restartCount").and_then(Value::as_i64))
        .sum();
    let mut status = o
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("Unknown")
        .to_string();
    if o.pointer("/metadata/deletionTimestamp").is_some() {
        status = "Terminating".into();
    }
    let s = |p: &str| {
        o.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("<none>")
            .to_string()
    };
    vec![
        name,
        json!(format!("{ready}/{total}")),
        json!(status),
        json!(restarts),
        json!(age(o)),
        json!(s("/status/podIP")),
        json!(s("/spec/nodeName")),
    ]
}

/// A Table of `items`; `meta` is the list metadata (for lists).
pub fn table(r: &ResourceDef, items: &[Value], meta: Option<Value>) -> Value {
    let columns = if r.is_pod() {
        vec![
            col("Name", "string", 0),
            col("Ready", "string", 0),
            col("Status", "string", 0),
            col("Restarts", "integer", 0),
            col("Age", "string", 0),
            col("IP", "string", 1),
            col("Node", "string", 1),
        ]
    } else {
        vec![col("Name", "string", 0), col("Age", "string", 0)]
    };
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let cells = if r.is_pod() {
                pod_cells(o)
            } else {
                vec![
                    o.pointer("/metadata/name").cloned().unwrap_or_default(),
                    json!(age(o)),
                ]
            };
            json!({
                "cells": cells,
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o.get("metadata").cloned().unwrap_or_default(),
                }
            })
        })
        .collect();
    let meta = meta.unwrap_or_else(|| {
        json!({"resourceVersion": items.first()
            .and_then(|o| o.pointer("/metadata/resourceVersion")).cloned().unwrap_or_default()})
    });
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns,
        "rows": rows,
    })
}
