//! The `/testkit/*` control endpoints: the journal, the fault rules, and
//! compaction, for a test that drives the server over HTTP.

use http::{HeaderValue, Method, Response, header};
use serde_json::json;

use super::Shared;
use crate::error::ApiError;
use crate::faults::Fault;
use crate::response::{Body, error_response, full, json_response};

/// `/testkit/journal` (GET: JSON lines; DELETE: clear), `/testkit/faults`
/// (POST: add a rule; GET: list; DELETE: clear), `/testkit/compact` (POST).
pub(super) fn control(shared: &Shared, method: &Method, path: &str, body: &[u8]) -> Response<Body> {
    match (method.as_str(), path) {
        ("GET", "/testkit/journal") => {
            let mut r = Response::new(full(shared.journal.to_json_lines()));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-ndjson"),
            );
            r
        }
        ("DELETE", "/testkit/journal") => {
            shared.journal.clear();
            json_response(200, &json!({}))
        }
        ("POST", "/testkit/faults") => match serde_json::from_slice::<Fault>(body) {
            Ok(f) => {
                shared.faults.add(f.clone());
                json_response(201, &serde_json::to_value(f).unwrap_or_default())
            }
            Err(e) => error_response(&ApiError::bad_request(format!("bad fault rule: {e}"))),
        },
        ("GET", "/testkit/faults") => json_response(
            200,
            &serde_json::to_value(shared.faults.rules()).unwrap_or_default(),
        ),
        ("DELETE", "/testkit/faults") => {
            shared.faults.clear();
            json_response(200, &json!({}))
        }
        ("POST", "/testkit/compact") => {
            let rv = shared.store.compact();
            json_response(200, &json!({"compactedTo": rv.to_string()}))
        }
        _ => error_response(&ApiError::no_route()),
    }
}
