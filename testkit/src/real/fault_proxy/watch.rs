//! Watches changed on their way: the apiserver's stream passed on line by line (one JSON event
//! per line), ended cleanly after so many events, as an apiserver ends a watch at its timeout or
//! on shutdown (bookmarks are not counted, as a client cannot rely on them), or each event
//! held for a while, as a lagging watch delivers it.

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

/// Each line of `body` passed on `delay` after it arrived, in order; the stream ends (or fails)
/// as the apiserver's did, once the lines before have been passed on.
pub(crate) fn delay_events(body: Incoming, delay: std::time::Duration) -> ProxyBody {
    let (lines, mut held) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut body = BodyStream::new(body);
        let mut pending = BytesMut::new();
        loop {
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line = pending.split_to(end + 1).freeze();
                if lines.send((tokio::time::Instant::now(), Ok(line))).is_err() {
                    return; // the client went away
                }
            }
            match body.next().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        pending.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    let _ = lines.send((tokio::time::Instant::now(), Err(BoxError::from(e))));
                    return;
                }
                None => {
                    if !pending.is_empty() {
                        let rest = pending.split().freeze();
                        let _ = lines.send((tokio::time::Instant::now(), Ok(rest)));
                    }
                    return;
                }
            }
        }
    });
    let stream = futures::stream::poll_fn(move |cx| held.poll_recv(cx)).then(
        move |(arrived, line)| async move {
            tokio::time::sleep_until(arrived + delay).await;
            line.map(Frame::data)
        },
    );
    BodyExt::boxed(StreamBody::new(stream))
}

fn is_bookmark(line: &Bytes) -> bool {
    serde_json::from_slice::<serde_json::Value>(line).is_ok_and(|event| event["type"] == "BOOKMARK")
}
