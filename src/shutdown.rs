//! Waiting for the signal that ends a long-running command (`podprobe run`, the manager).

/// Resolves on SIGTERM (what the kubelet sends) or SIGINT (Ctrl-C). If SIGTERM cannot be
/// listened for, only Ctrl-C ends the wait, and a warning says so.
pub async fn termination() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!("cannot listen for SIGTERM ({e}); only Ctrl-C stops this process");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
