//! Response bodies and the JSON/Status responses every handler answers with (one room, so the
//! server and the exec endpoint share them without importing each other).

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use serde_json::Value;

use crate::error::ApiError;

pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

pub(crate) fn empty() -> Body {
    full(Bytes::new())
}

pub(crate) fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed_unsync()
}

pub(crate) fn json_response(code: u16, v: &Value) -> Response<Body> {
    let mut r = Response::new(full(serde_json::to_vec(v).unwrap_or_default()));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// A `Status` object with the error's code (and `Retry-After`, when it has one).
pub(crate) fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = json_response(e.code, &e.to_status());
    if let Some(s) = e.retry_after {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}
