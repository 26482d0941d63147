//! A watch that ends early: the apiserver's stream passed on line by line (one JSON event per
//! line), ended cleanly after so many events, as an apiserver ends a watch at its timeout or
//! on shutdown. Bookmarks are not counted, as a client cannot rely on them.

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http_body_util::{BodyExt, BodyStream, StreamBody};
use hyper::body::{Frame, Incoming};

use super::forward::{BoxError, ProxyBody};

pub(crate) fn end_after(body: Incoming, events: usize) -> ProxyBody {
    let state = (BodyStream::new(body), BytesMut::new(), events);
    let stream = futures::stream::unfold(state, |(mut body, mut pending, left)| async move {
        if left == 0 {
            return None;
        }
        loop {
            if let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line = pending.split_to(end + 1).freeze();
                let left = if is_bookmark(&line) { left } else { left - 1 };
                return Some((Ok(Frame::data(line)), (body, pending, left)));
            }
            match body.next().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => pending.extend_from_slice(&data),
                    Err(_) => continue,
                },
                Some(Err(e)) => return Some((Err(BoxError::from(e)), (body, pending, 0))),
                None if pending.is_empty() => return None,
                None => {
                    let rest = pending.split().freeze();
                    return Some((Ok(Frame::data(rest)), (body, pending, 0)));
                }
            }
        }
    });
    BodyExt::boxed(StreamBody::new(stream))
}

fn is_bookmark(line: &Bytes) -> bool {
    serde_json::from_slice::<serde_json::Value>(line).is_ok_and(|event| event["type"] == "BOOKMARK")
}
