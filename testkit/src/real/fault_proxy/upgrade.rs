//! Upgraded connections (`pods/exec`, `pods/portforward`): both sides joined byte for byte,
//! optionally dropped after so many bytes from the apiserver, as a network that fails
//! mid-stream would drop them (no status, no close frame).

use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio_util::sync::CancellationToken;

type Io = TokioIo<Upgraded>;

pub(crate) async fn splice(
    client: OnUpgrade,
    apiserver: OnUpgrade,
    drop_after: Option<u64>,
    outage: CancellationToken,
) {
    let (Ok(client), Ok(apiserver)) = (client.await, apiserver.await) else {
        return;
    };
    let (client_read, client_write) = tokio::io::split(TokioIo::new(client));
    let (apiserver_read, apiserver_write) = tokio::io::split(TokioIo::new(apiserver));
    // Whichever direction ends first ends both: dropping the halves closes both connections.
    tokio::select! {
        () = outage.cancelled() => {}
        _ = copy(client_read, apiserver_write, None) => {}
        _ = copy(apiserver_read, client_write, drop_after) => {}
    }
}

/// Copies until EOF, an error, or `limit` bytes (then stops without flushing a close).
async fn copy(
    mut from: ReadHalf<Io>,
    mut to: WriteHalf<Io>,
    limit: Option<u64>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    let mut left = limit;
    if left == Some(0) {
        return Ok(());
    }
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        let n = left.map_or(n, |left| n.min(usize::try_from(left).unwrap_or(usize::MAX)));
        to.write_all(&buf[..n]).await?;
        to.flush().await?;
        if let Some(left) = left.as_mut() {
            *left -= n as u64;
            if *left == 0 {
                return Ok(());
            }
        }
    }
}
