//! A plain-HTTP GET, for the endpoints the bench scrapes (managers' and etcd's `/metrics`,
//! `/readyz`).

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

/// `GET path` on `addr`: the status code and the body.
pub async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), std::io::Error> {
    let io = |e: hyper::Error| std::io::Error::other(e);
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(io)?;
    tokio::spawn(conn);
    let request = http::Request::get(path)
        .header("host", addr.to_string())
        .body(Full::new(Bytes::new()))
        .map_err(std::io::Error::other)?;
    let response = sender.send_request(request).await.map_err(io)?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.map_err(io)?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}
